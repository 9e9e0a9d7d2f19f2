"""MMLU as LLaDA's EVAL.md Instruct row ran it on OpenCompass (ML-GSAI/LLaDA @ b7e6c35,
``opencompass/opencompass/configs/datasets/mmlu/mmlu_gen_a484b3.py``, ``datasets/mmlu.py``):
ONE task over the 57 subjects (OpenCompass runs one dataset per subject); each question gets its
subject's five dev questions as exemplars (``FixKRetriever``, ids 0-4), each exemplar asked as
"Question: ... Answer:" and the question itself as "Q: ... A:", under the subject's hint; scored
by OpenCompass's ``first_option_postprocess`` and ``AccEvaluator``.

Data: the hub only (``cais/mmlu``, ``all``: the test and dev splits of every subject).
"""

from __future__ import annotations

from pvf_lmeval.lmeval.oc_prompt import oc_fill
from pvf_lmeval.lmeval.task_fewshot import GroupFewshotTask
from pvf_lmeval.lmeval.task_metrics import mean_of_group_means, metric_list, oc_letter_results

LETTERS = "ABCD"
#: the subject's hint, opening every turn
HINT = ("There is a single choice question about {subject}. Answer the question by replying "
        "A, B, C or D.")


#: the key under which an exemplar carries the asked question's columns (see :class:`MMLUTask`)
ASKED = "_oc_asked_columns"


class MMLUTask(GroupFewshotTask):
    """A task whose few-shot pool is the dev questions of the doc's subject. OpenCompass fills
    the finished exemplars once more with the asked question's columns (``generate_item``
    formats the whole prompt, the exemplars set into it included), so each exemplar drawn for
    a question carries that question's columns (``ASKED``)."""

    group_field = "subject"

    def exemplars(self, doc: dict, pool: list) -> list:
        asked = _columns(doc, "")
        return [{**d, ASKED: asked} for d in pool]


def _columns(doc: dict, target: str) -> list[tuple[str, str]]:
    """``MMLUDataset``'s columns in its order: ``input``, ``A``-``D``, ``target``."""
    return [("input", doc["question"]), *zip(LETTERS, doc["choices"]), ("target", target)]


def _ask(doc: dict, question: str, answer: str, target: str) -> str:
    """A turn as OpenCompass fills it (:func:`oc_fill`) with the doc's columns, ``target``
    blanked for the question asked and the letter for an exemplar. The hint is set into the
    template by the config, before any filling."""
    hint = HINT.format(subject=doc["subject"].replace("_", " "))
    template = (f"{hint}\n{question} {{input}}" + "".join(f"\n{k}. {{{k}}}" for k in LETTERS)
                + f"\n{answer} ")
    return oc_fill(template, _columns(doc, target))


def doc_to_text_llada_oc(doc: dict) -> str:
    """The question's turn (the config's ``prompt_template``)."""
    return _ask(doc, "Q:", "A:", "")


def fewshot_to_text_llada_oc(doc: dict) -> str:
    """An exemplar's question turn (the config's ``ice_template``), filled with its own
    columns, then with the asked question's (``ASKED``: :class:`MMLUTask` gives them)."""
    return oc_fill(_ask(doc, "Question:", "Answer:", doc_to_target_llada_oc(doc)), doc[ASKED])


def doc_to_target_llada_oc(doc: dict) -> str:
    """The answer's letter (an exemplar's assistant turn)."""
    return LETTERS[doc["answer"]]


def process_results_llada_oc(doc: dict, results: list) -> dict:
    """``mmlu_llada_oc``: the first option ``first_option_postprocess`` finds (options "ABCD") is
    the answer's letter (``AccEvaluator``); per question and per subject."""
    out = oc_letter_results(results[0], doc_to_target_llada_oc(doc), LETTERS)
    out["subject_mean"] = (doc["subject"], out["exact_match"])
    return out


#: the YAML's metric_list: exact match over the questions (OpenCompass's ``mmlu-weighted``), the
#: mean of the subject accuracies (its ``mmlu``), then the decoding costs
METRICS = metric_list("exact_match", {"metric": "subject_mean", "aggregation": mean_of_group_means,
                                      "higher_is_better": True})
