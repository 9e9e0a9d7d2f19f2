"""HellaSwag as LLaDA's EVAL.md Instruct row ran it on OpenCompass (ML-GSAI/LLaDA @ b7e6c35,
``opencompass/opencompass/configs/datasets/hellaswag/hellaswag_gen_6faab5.py``,
``datasets/hellaswag.py``: ``HellaswagDataset_V2``); scored by OpenCompass's
``first_option_postprocess`` and ``AccEvaluator``.

OpenCompass reads its own ``hellaswag.jsonl`` (fields ``query``, ``choices``, ``gold``). Those
fields are lm-eval's ``hellaswag`` ``process_docs`` output on Rowan/hellaswag's validation split
(``query``: the activity label, ": ", ``ctx_a``, a space and ``ctx_b`` capitalised, cleaned of
WikiHow's bracket tags; ``choices``: the endings, cleaned alike; ``gold``: the label as an int),
so the task builds them with lm-eval's own function and then does what ``HellaswagDataset_V2``
does to a line: the context is the query's text after its first ": ", the endings are ``A``-``D``
and ``label`` is the gold ending's letter. docs/benchmarks.md says which lines of the file were
compared.

Data: the hub only (``Rowan/hellaswag``, ``validation``).
"""

from __future__ import annotations

from pvf_lmeval.lmeval.oc_prompt import oc_fill
from pvf_lmeval.lmeval.task_metrics import metric_list, oc_letter_results

LETTERS = "ABCD"
#: OpenCompass hellaswag_gen_6faab5's prompt (one user turn)
LLADA_OC_PROMPT = ("{ctx}\nQuestion: Which ending makes the most sense?\n"
                   "A. {A}\nB. {B}\nC. {C}\nD. {D}\n"
                   "You may choose from 'A', 'B', 'C', 'D'.\nAnswer:")
#: ``HellaswagDataset_V2``'s columns, in its order: the order OpenCompass fills them in
V2_COLUMNS = ("ctx", *LETTERS, "label")


def process_docs_llada_oc(dataset):
    """lm-eval's ``hellaswag`` ``process_docs`` (the jsonl's ``query``, ``choices``, ``gold``),
    then ``HellaswagDataset_V2.load``'s fields: ``ctx`` (the query after its first ": "),
    ``A``-``D`` (the choices) and ``label`` (the gold choice's letter)."""
    from lm_eval.tasks.hellaswag.utils import process_docs

    def fields(doc: dict) -> dict:
        return {"ctx": doc["query"].split(": ", 1)[-1], **dict(zip(LETTERS, doc["choices"])),
                "label": LETTERS[doc["gold"]]}

    return process_docs(dataset).map(fields)


def doc_to_text_llada_oc(doc: dict) -> str:
    """The prompt as OpenCompass's ``PromptTemplate.generate_item`` fills it: ``safe_format``
    replaces each column's ``{name}`` in turn, in the loader's column order (the output column
    ``label`` blanked), so a field holding a later column's ``{name}`` is filled too."""
    return oc_fill(LLADA_OC_PROMPT, [(c, "" if c == "label" else doc[c]) for c in V2_COLUMNS])


def process_results_llada_oc(doc: dict, results: list) -> dict:
    """``hellaswag_llada_oc``: OpenCompass's first option against the label, and the costs."""
    return oc_letter_results(results[0], doc["label"], LETTERS)


#: the YAML's metric_list: exact match, then the decoding costs
METRICS = metric_list("exact_match")
