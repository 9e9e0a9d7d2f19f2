"""BBH as LLaDA's EVAL.md Base row ran it on OpenCompass (ML-GSAI/LLaDA @ b7e6c35,
``opencompass/opencompass/configs/datasets/bbh/bbh_gen_ee62e9.py``, ``datasets/bbh.py``): ONE task
over the 27 subtasks (OpenCompass runs one dataset per subtask), each question after its
subtask's chain-of-thought exemplars (``lib_prompt/<subtask>.txt``, OpenCompass's files) in
"Follow the given examples and answer the question.\\n{exemplars}\\n\\nQ: {input}\\nA: Let's think
step by step.", no chat template; scored by OpenCompass's ``bbh_mcq_postprocess`` (outputs and
targets of the multiple-choice subtasks) or ``bbh_freeform_postprocess`` (``BBHEvaluator``).

Data: the hub only (``SaylorTwift/bbh``, one config per subtask, ``test``).
"""

from __future__ import annotations

from pathlib import Path

from pvf_lmeval.lmeval.task_loading import quiet_custom_dataset_notice
from pvf_lmeval.lmeval.task_metrics import cost_metrics, mean_of_group_means, metric_list

quiet_custom_dataset_notice(Path(__file__).resolve().parent)  # our data loaders take no --metadata

HUB_PATH = "SaylorTwift/bbh"
#: the config's two lists, in its order (the task's item order: subtask by subtask)
MULTIPLE_CHOICE = (
    "temporal_sequences", "disambiguation_qa", "date_understanding",
    "tracking_shuffled_objects_three_objects", "penguins_in_a_table", "geometric_shapes", "snarks",
    "ruin_names", "tracking_shuffled_objects_seven_objects", "tracking_shuffled_objects_five_objects",
    "logical_deduction_three_objects", "hyperbaton", "logical_deduction_five_objects",
    "logical_deduction_seven_objects", "movie_recommendation", "salient_translation_error_detection",
    "reasoning_about_colored_objects")
FREE_FORM = (
    "multistep_arithmetic_two", "navigate", "dyck_languages", "word_sorting", "sports_understanding",
    "boolean_expressions", "object_counting", "formal_fallacies", "causal_judgement", "web_of_lies")
SUBTASKS = MULTIPLE_CHOICE + FREE_FORM
PROMPTS = Path(__file__).resolve().parent / "lib_prompt"
LLADA_OC_PROMPT = ("Follow the given examples and answer the question.\n{exemplars}\n\nQ: {input}\n"
                   "A: Let's think step by step.")


def load(**kwargs):
    """``custom_dataset``: every subtask's test questions from the hub, in the config's order,
    each with its ``subtask``."""
    import datasets

    parts = []
    for name in SUBTASKS:
        part = datasets.load_dataset(HUB_PATH, name, split="test")
        parts.append(part.add_column("subtask", [name] * len(part)))
    return datasets.DatasetDict({"test": datasets.concatenate_datasets(parts)})


def _exemplars(subtask: str) -> str:
    return (PROMPTS / f"{subtask}.txt").read_text(encoding="utf-8")


def doc_to_text_llada_oc(doc: dict) -> str:
    return LLADA_OC_PROMPT.format(exemplars=_exemplars(doc["subtask"]), input=doc["input"])


def correct_llada_oc(doc: dict, text: str) -> bool:
    """OpenCompass's rule for the doc's subtask: both sides through ``bbh_mcq_postprocess`` on
    a multiple-choice subtask (``BBHEvaluator_mcq``), the output through
    ``bbh_freeform_postprocess`` against the target as it is otherwise (``BBHEvaluator``)."""
    from pvf_lmeval.lmeval import published_answers as pa

    if doc["subtask"] in MULTIPLE_CHOICE:
        return pa.oc_bbh_mcq(text) == pa.oc_bbh_mcq(doc["target"])
    return pa.oc_bbh_freeform(text) == doc["target"]


def process_results_llada_oc(doc: dict, results: list) -> dict:
    """``bbh_llada_oc``: per question and per subtask (OpenCompass's ``bbh`` summary is the
    mean of the 27 subtask accuracies)."""
    generation = results[0]
    right = float(correct_llada_oc(doc, str(generation)))
    out = {"exact_match": right, "subtask_mean": (doc["subtask"], right)}
    out.update(cost_metrics(generation))
    return out


#: the YAML's metric_list: exact match over the questions, the mean of the subtask accuracies
#: (the figure OpenCompass prints as bbh), then the decoding costs
METRICS = metric_list("exact_match", {"metric": "subtask_mean", "aggregation": mean_of_group_means,
                                      "higher_is_better": True})
