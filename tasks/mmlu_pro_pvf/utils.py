"""MMLU-Pro with decoding-cost metrics: the counterpart of lm-eval's ``mmlu_pro`` group.

The built-in is a group of 14 per-category subtasks; ``mmlu_pro_pvf`` is ONE task over the whole
test set that builds, for every question, exactly the prompt the built-in subtask of its category
builds: the category's description ("... about {category}. Think step by step ..."), the first
``num_fewshot`` (default 5) validation questions *of the same category* as chain-of-thought
exemplars, then ``Question:\\n...\\nOptions:\\nA. ...\\nAnswer: Let's think step by step.``.
Its ``exact_match`` (mean over all questions) equals the group's size-weighted mean, and cost
rates are ratios of sums over the whole set. ``--limit N`` takes the first N test questions.

Scoring replicates the built-in ``custom-extract`` filter (the first ``answer is (X)``) and its
exact_match (ignore case and punctuation) inside ``process_results``, so ``.meta`` survives.
Data: the hub only (``TIGER-Lab/MMLU-Pro``); no local copy exists.
"""

from __future__ import annotations

import re
import string
from functools import partial
from pathlib import Path

from pvf_lmeval.lmeval.oc_prompt import oc_fill
from pvf_lmeval.lmeval.task_fewshot import GroupFewshotTask
from pvf_lmeval.lmeval.task_loading import quiet_custom_dataset_notice
from pvf_lmeval.lmeval.task_metrics import cost_metrics, mean_of_group_means, metric_list

quiet_custom_dataset_notice(Path(__file__).resolve().parent)  # our data loaders take no --metadata

CHOICES = ["A", "B", "C", "D", "E", "F", "G", "H", "I", "J"]
ANSWER = re.compile(r"answer is \(?([ABCDEFGHIJ])\)?")
FALLBACK = "[invalid]"


def format_cot_example(example: dict, including_answer: bool = True) -> str:
    """The built-in's prompt of one question (``lm_eval/tasks/mmlu_pro/utils.py``)."""
    prompt = "Question:\n"
    prompt += example["question"] + "\n"
    prompt += "Options:\n"
    for i, opt in enumerate(example["options"]):
        if i >= len(CHOICES):
            break
        prompt += f"{CHOICES[i]}. {opt.strip()}\n"
    if including_answer:
        cot_content = example["cot_content"].replace(
            "A: Let's think step by step.", "Answer: Let's think step by step.")
        prompt += cot_content + "\n\n"
    else:
        prompt += "Answer: Let's think step by step."
    return prompt


def format_cot_target(example: dict, including_answer: bool = True) -> str:
    return example["cot_content"].replace("A: Let's think step by step. ", "")


# As in the built-in: exemplars are the question prompt (ending "Answer: Let's think step by
# step.") followed by the target delimiter and the exemplar's chain of thought.
doc_to_text = partial(format_cot_example, including_answer=False)
fewshot_to_text = partial(format_cot_example, including_answer=False)
fewshot_to_target = partial(format_cot_target, including_answer=True)


class MMLUProTask(GroupFewshotTask):
    """A task whose few-shot pool is the validation questions of the doc's category."""

    group_field = "category"


def extract_answer(text: str) -> str:
    """The built-in filter: regex ``answer is \\(?([A-J])\\)?``, first match, else ``[invalid]``."""
    m = ANSWER.search(text if isinstance(text, str) else "")
    return m.group(1).strip() if m else FALLBACK


def exact_match(prediction: str, reference: str) -> float:
    """lm-eval's exact_match with ``ignore_case`` and ``ignore_punctuation`` (the built-in's)."""
    table = str.maketrans("", "", string.punctuation)
    return float(prediction.lower().translate(table) == str(reference).lower().translate(table))


def process_results(doc: dict, results: list) -> dict:
    generation = results[0]
    out = {"exact_match": exact_match(extract_answer(str(generation)), doc["answer"])}
    out.update(cost_metrics(generation))  # read .meta from the raw generation
    return out


#: the PVF authors' prompt (``encode_for_llada_instruct``); ``{options}``: "A. ...", one a line
PVF_PAPER_PROMPT = (
    "You are an expert. Answer the multiple-choice question below.\n\nQuestion:\n{question}\n\n"
    "Options:\n{options}\n\nInstruction:\n1. Briefly explain your reasoning for the correct "
    "choice. Keep the analysis concise and direct.\n2. State the final answer clearly at the "
    "end.\n\nFormat:\nAnalysis: [Your concise reasoning]\nAnswer: [Option]\n")


def doc_to_text_pvf_paper(doc: dict) -> str:
    """``mmlu_pro_pvf_paper``: the PVF authors' prompt, each option as written (not stripped)."""
    options = "\n".join(f"{label}. {opt}" for label, opt in zip(CHOICES, doc["options"]))
    return PVF_PAPER_PROMPT.format(question=doc["question"], options=options)


def process_results_pvf_paper(doc: dict, results: list) -> dict:
    """``mmlu_pro_pvf_paper``: the PVF authors' ``accuracy_MMLU_Pro`` for one question."""
    from pvf_lmeval.lmeval import published_answers as pa

    generation = results[0]
    out = {"exact_match": float(pa.pvf_mmlu_pro_correct(str(generation), doc["answer"]))}
    out.update(cost_metrics(generation))
    return out


#: the YAMLs' metric_list: exact match, then the decoding costs
METRICS = metric_list("exact_match")


# ----------------------------------------------------------------------------- LLaDA's OpenCompass row

#: OpenCompass mmlu_pro_0shot_cot_gen_08c1de's QUERY_TEMPLATE as it reaches the model (the
#: config's ``.strip()``ped string; ``{options_str}``: :func:`options_llada_oc`)
LLADA_OC_PROMPT = (
    "Answer the following multiple choice question. The last line of your response should be of "
    "the following format: 'ANSWER: $LETTER' (without quotes) where LETTER is one of Options(e.g. "
    "one of ABCDEFGHIJKLMNOP). Think step by step before answering.\n\nQuestion:\n\n{question}\n\n"
    "Options:\n\n{options_str}")
#: the letters OpenCompass's MMLU-Pro reader gives the options, by position
OC_LETTERS = "ABCDEFGHIJKLMNOP"


def _option_lines_llada_oc(doc: dict) -> list[tuple[str, str]]:
    """``_parse``'s option lines: (letter, "L. option\n") by position, an ``N/A`` option left
    out (its letter skipped, not reused)."""
    return [(letter, f"{letter}. {opt}\n") for letter, opt in zip(OC_LETTERS, doc["options"])
            if opt != "N/A"]


def options_llada_oc(doc: dict) -> str:
    """OpenCompass's ``options_str``: the option lines, the whole stripped."""
    return "".join(line for _, line in _option_lines_llada_oc(doc)).strip()


def _answer_string_llada_oc(doc: dict) -> str:
    """``_parse``'s ``answer_string``: the answer's option line, empty when the answer's
    option is ``N/A``."""
    return "".join(line for letter, line in _option_lines_llada_oc(doc) if letter == doc["answer"])


def doc_to_text_llada_oc(doc: dict) -> str:
    """``mmlu_pro_llada_oc``: the question and its options as OpenCompass fills its template
    (:func:`oc_fill`) in the columns' order: the hub's (``answer``, the output column, blanked;
    ``options`` as ``str`` of the list), then the two ``MMLUProDataset``'s ``_parse`` adds;
    ``cot_content`` as ``_parse`` leaves it."""
    cot = doc["cot_content"].removeprefix("A: Let's think step by step.").strip()
    return oc_fill(LLADA_OC_PROMPT, [
        ("question_id", doc["question_id"]), ("question", doc["question"]),
        ("options", doc["options"]), ("answer", ""), ("answer_index", doc["answer_index"]),
        ("cot_content", cot), ("category", doc["category"]), ("src", doc["src"]),
        ("answer_string", _answer_string_llada_oc(doc)), ("options_str", options_llada_oc(doc))])


def process_results_llada_oc(doc: dict, results: list) -> dict:
    """``mmlu_pro_llada_oc``: OpenCompass's ``match_answer_pattern`` (the letter after the first
    "answer:", any case) and ``AccEvaluator`` (that letter is the answer, case included); per
    question and as the mean of the category accuracies."""
    from pvf_lmeval.lmeval import published_answers as pa

    generation = results[0]
    right = float(pa.oc_choice_correct(pa.oc_mmlu_pro_prediction(str(generation)), doc["answer"]))
    out = {"exact_match": right, "category_mean": (doc["category"], right)}
    out.update(cost_metrics(generation))
    return out


#: mmlu_pro_llada_oc's metric_list: exact match over the questions, the mean of the category
#: accuracies (the figure OpenCompass prints as mmlu_pro), then the decoding costs
LLADA_OC_METRICS = metric_list("exact_match", {"metric": "category_mean",
                                               "aggregation": mean_of_group_means,
                                               "higher_is_better": True})
