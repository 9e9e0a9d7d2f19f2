"""BBH as LLaDA's EVAL.md Base rows ran it: on OpenCompass (``bbh_llada_oc_base``) and on
lm-eval 0.4.8 (the ``bbh_llada`` group).

OpenCompass (ML-GSAI/LLaDA @ b7e6c35,
``opencompass/opencompass/configs/datasets/bbh/bbh_gen_ee62e9.py``, ``datasets/bbh.py``): ONE task
over the 27 subtasks (OpenCompass runs one dataset per subtask), each question after its
subtask's chain-of-thought exemplars (``lib_prompt/<subtask>.txt``, OpenCompass's files) in
"Follow the given examples and answer the question.\\n{exemplars}\\n\\nQ: {input}\\nA: Let's think
step by step.", no chat template; scored by OpenCompass's ``bbh_mcq_postprocess`` (outputs and
targets of the multiple-choice subtasks) or ``bbh_freeform_postprocess`` (``BBHEvaluator``).

lm-eval 0.4.8 (``eval_llada_lm_eval.sh``'s ``--tasks bbh``: its ``cot_fewshot`` group): 27
tasks, each its subtask's description, its three chain-of-thought exemplars as few-shot turns
(``Q: {input}\\nA: Let's think step by step.\\n`` + " " + the exemplar's answer, which 0.4.8 starts
with a second "Let's think step by step." but in boolean_expressions), the question, stop
strings ``</s>``, ``Q``, a blank line; scored by ``process_results_lmeval048``. The exemplars
are read from the same files (``lmeval048_exemplars``).

Data: the hub only (``SaylorTwift/bbh``, one config per subtask, ``test``).
"""

from __future__ import annotations

from pathlib import Path

from pvf_lmeval.lmeval.oc_prompt import oc_fill
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
    """The subtask's exemplars (set into the template by the config, before any filling) and
    the question as OpenCompass fills them (:func:`oc_fill`): ``input``, then ``target`` (the
    output column, blanked)."""
    template = LLADA_OC_PROMPT.replace("{exemplars}", _exemplars(doc["subtask"]))
    return oc_fill(template, [("input", doc["input"]), ("target", "")])


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


# ----------------------------------------------------------------------------- lm-eval 0.4.8

#: lm-eval 0.4.8's ``get-answer`` filter: the first match of this pattern (lm-eval's ``regex``
#: filter strips it; no match is "[invalid]"), then ``take_first``
LMEVAL048_ANSWER = r"(?<=the answer is )(.*)(?=.)"
#: the exemplar answers 0.4.8 wrote without the prompt's own "Let's think step by step.\n"
LMEVAL048_NO_COT_PREFIX = ("boolean_expressions",)
COT_PREFIX = "Let's think step by step.\n"


def lmeval048_exemplars(subtask: str) -> tuple[str, list[dict]]:
    """lm-eval 0.4.8's ``description`` and few-shot ``samples`` of ``bbh_cot_fewshot_<subtask>``:
    the text before the first question ("\\n\\n" kept), then each "Q: {input}\\nA: {target}"
    exemplar of the subtask's chain-of-thought prompt."""
    description, *shots = _exemplars(subtask).split("\n\nQ: ")
    samples = []
    for shot in shots:
        question, answer = shot.split("\nA: ", 1)
        if subtask in LMEVAL048_NO_COT_PREFIX:
            answer = answer.removeprefix(COT_PREFIX)
        samples.append({"input": question, "target": answer})
    return description + "\n\n", samples


def load_lmeval048(subtask: str, **kwargs):
    """``custom_dataset`` of ``bbh_llada_<subtask>``: the subtask's test questions from the hub,
    each with the subtask's ``description``, and its three exemplars as the ``fewshot`` split."""
    import datasets

    if subtask not in SUBTASKS:
        raise ValueError(f"bbh_llada: subtask {subtask!r} is not one of "
                         f"{', '.join(sorted(SUBTASKS))}")
    description, samples = lmeval048_exemplars(subtask)
    test = datasets.load_dataset(HUB_PATH, subtask, split="test")
    test = test.add_column("description", [description] * len(test))
    fewshot = datasets.Dataset.from_list([dict(s, description=description) for s in samples])
    return datasets.DatasetDict({"test": test, "fewshot": fewshot})


def answer_lmeval048(text: str) -> str:
    """The answer lm-eval 0.4.8's ``get-answer`` filter reads from an output."""
    from lm_eval.filters.extraction import RegexFilter

    return RegexFilter(regex_pattern=LMEVAL048_ANSWER).apply([[text]], [{}])[0][0]


def process_results_lmeval048(doc: dict, results: list) -> dict:
    """``bbh_llada_*``: 0.4.8's ``exact_match`` of the filtered answer and the target (case and
    punctuation count), and the decoding costs."""
    from lm_eval.api.metrics import exact_match_hf_evaluate

    generation = results[0]
    answer = answer_lmeval048(str(generation))
    out = {"exact_match": float(exact_match_hf_evaluate([answer], [doc["target"]])["exact_match"])}
    out.update(cost_metrics(generation))
    return out


#: the bbh_llada subtasks' metric_list: exact match (the group averages it weighted by the
#: subtasks' sizes, as 0.4.8's bbh does), then the decoding costs
LMEVAL048_METRICS = metric_list("exact_match")
