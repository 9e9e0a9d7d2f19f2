"""ARC-Challenge as LLaDA's EVAL.md Instruct row ran it on OpenCompass (ML-GSAI/LLaDA @ b7e6c35,
``opencompass/opencompass/configs/datasets/ARC_c/ARC_c_gen_1e0de5.py``, ``datasets/arc.py``):
the validation ("Dev") questions that have exactly four choices, lettered A-D in their order;
scored by OpenCompass's ``first_option_postprocess`` and ``AccEvaluator``.

Data: the hub only (``allenai/ai2_arc``, ``ARC-Challenge``).
"""

from __future__ import annotations

from pvf_lmeval.lmeval.oc_prompt import oc_fill
from pvf_lmeval.lmeval.task_metrics import metric_list, oc_letter_results

LETTERS = "ABCD"
#: OpenCompass ARC_c_gen_1e0de5's prompt (one user turn), its column names
LLADA_OC_PROMPT = "Question: {question}\nA. {textA}\nB. {textB}\nC. {textC}\nD. {textD}\nAnswer:"


def process_docs_llada_oc(dataset):
    """``ARCDataset.load``: only the questions with four choices; each gets its choices as
    ``A``-``D`` and ``label``, the letter of the answer's position among the choice labels
    (ARC labels some questions 1-4)."""
    def fields(doc: dict) -> dict:
        texts, labels = doc["choices"]["text"], doc["choices"]["label"]
        return {**dict(zip(LETTERS, texts)), "label": LETTERS[labels.index(doc["answerKey"])]}

    four = dataset.filter(lambda doc: len(doc["choices"]["text"]) == 4)
    return four.map(fields)


def doc_to_text_llada_oc(doc: dict) -> str:
    """The prompt as OpenCompass fills it (:func:`oc_fill`) in ``ARCDataset``'s column order:
    ``question``, ``answerKey`` (the output column, blanked), ``textA``-``textD``."""
    return oc_fill(LLADA_OC_PROMPT, [("question", doc["question"]), ("answerKey", ""),
                                     *((f"text{k}", doc[k]) for k in LETTERS)])


def process_results_llada_oc(doc: dict, results: list) -> dict:
    """``arc_challenge_llada_oc``: OpenCompass's first option against the label, and the costs."""
    return oc_letter_results(results[0], doc["label"], LETTERS)


#: the YAML's metric_list: exact match, then the decoding costs
METRICS = metric_list("exact_match")
