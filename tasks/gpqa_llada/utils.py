"""GPQA (main) as lm-eval 0.4.8's ``gpqa_main_n_shot`` presented it to LLaDA's
``eval_llada.py`` (ML-GSAI/LLaDA @ b7e6c35, ``eval_llada_lm_eval.sh`` l.12).

lm-eval's ``gpqa/n_shot/utils.py`` shuffles each question's four answers with one module-level
``random.Random(42)`` every time the task maps its split, so the order a question's answers get
depends on how many passes over the split came before. lm-eval 0.4.8 made four passes before
its first request (``ConfigurableTask.__init__``: two over the few-shot split, the sampler keeping
the second; one over the evaluation split; ``build_all_requests`` the fourth, which it
evaluates); 0.4.13 makes three. Here both splits are built once from the hub's ``train`` split
(which 0.4.8 used for both): ``fewshot`` as the second pass, ``eval`` as the fourth, with 0.4.8's
answer preprocessing (bracketed text deleted). The task's ``fewshot_split`` and ``test_split``
stay unset, as 0.4.8's: the sampler then drops a drawn exemplar equal to the question, as there.
"""

from __future__ import annotations

import random
import re
from pathlib import Path

from pvf_lmeval.lmeval.task_loading import quiet_custom_dataset_notice
from pvf_lmeval.lmeval.oc_prompt import oc_fill
from pvf_lmeval.lmeval.task_metrics import cost_metrics, metric_list

quiet_custom_dataset_notice(Path(__file__).resolve().parent)  # our data loaders take no --metadata

#: lm-eval 0.4.8's pass over the split that fed the few-shot pool, and the one it evaluated
FEWSHOT_PASS, EVAL_PASS = 1, 3


def preprocess(text: str | None) -> str:
    """lm-eval 0.4.8's ``preprocess``: stripped, " [title]" as ". ", bracketed text deleted,
    double spaces made single; a missing answer a space."""
    if text is None:
        return " "
    text = text.strip().replace(" [title]", ". ")
    return re.sub("\\[.*?\\]", "", text).replace("  ", " ")


def _shuffled(doc: dict, rng: random.Random) -> dict:
    """lm-eval's ``_process_doc``: the three wrong answers and the right one, preprocessed,
    shuffled by ``rng``; ``answer`` the right one's letter in parentheses."""
    right = preprocess(doc["Correct Answer"])
    choices = [preprocess(doc[f"Incorrect Answer {i}"]) for i in (1, 2, 3)] + [right]
    rng.shuffle(choices)
    return {**doc, **{f"choice{i + 1}": c for i, c in enumerate(choices)},
            "answer": f"({chr(65 + choices.index(right))})"}


def passes(docs: list[dict], count: int) -> list[list[dict]]:
    """``count`` successive passes of :func:`_shuffled` over ``docs``, one ``Random(42)``."""
    rng = random.Random(42)
    return [[_shuffled(d, rng) for d in docs] for _ in range(count)]


def load_gpqa_main(**kwargs):
    """The ``fewshot`` and ``eval`` splits (the hub's ``Idavidrein/gpqa`` ``gpqa_main``, gated:
    log in to the hub first)."""
    import datasets

    train = list(datasets.load_dataset("Idavidrein/gpqa", "gpqa_main", split="train"))
    made = passes(train, EVAL_PASS + 1)
    return datasets.DatasetDict({"fewshot": datasets.Dataset.from_list(made[FEWSHOT_PASS]),
                                 "eval": datasets.Dataset.from_list(made[EVAL_PASS])})


# ----------------------------------------------------------------------------- LLaDA's OpenCompass row

#: OpenCompass gpqa_fewshot_gen's five worked exemplars (its ``five_shot_prompt``, as the
#: config's string literal evaluates: it opens with a newline), ahead of every question
LLADA_OC_FIVE_SHOT = (Path(__file__).resolve().parent / "llada_oc_five_shot.txt").read_text(
    encoding="utf-8")
LLADA_OC_QUESTION = (
    "\nQuestion:\n{question}\nChoices:\nA. {A}\nB. {B}\nC. {C}\nD. {D}\nWhen you're ready to "
    "answer, please use the format 'The correct answer is (X)' where X is the correct letter "
    "choice from 'ABCD'.")
#: the seed OpenCompass's ``GPQADataset_.load`` gives ``random`` before shuffling the answers
LLADA_OC_SEED = 0


def process_docs_llada_oc(dataset):
    """``GPQADataset_.load``: in the split's order, one ``Random(0)`` shuffles each question's
    answers (correct first, then the three incorrect ones) into A-D; ``answer`` is the letter
    of the first choice equal to the correct answer. Built once, eagerly, so that the shuffle
    does not depend on how often or in which order the rows are read."""
    import datasets

    rng = random.Random(LLADA_OC_SEED)
    rows = []
    for doc in dataset:
        choices = [doc["Correct Answer"], doc["Incorrect Answer 1"], doc["Incorrect Answer 2"],
                   doc["Incorrect Answer 3"]]
        rng.shuffle(choices)
        letter = "ABCD"[choices.index(doc["Correct Answer"])]
        rows.append({"question": doc["Question"], **dict(zip("ABCD", choices)), "answer": letter})
    return datasets.Dataset.from_list(rows)


def doc_to_text_llada_oc(doc: dict) -> str:
    """The exemplars and the question as OpenCompass fills its template (:func:`oc_fill`) in
    ``GPQADataset_``'s column order: ``question``, ``A``-``D``, ``answer`` (the output column,
    blanked)."""
    return oc_fill(LLADA_OC_FIVE_SHOT + LLADA_OC_QUESTION,
                   [("question", doc["question"]), *((k, doc[k]) for k in "ABCD"), ("answer", "")])


def process_results_llada_oc(doc: dict, results: list) -> dict:
    """``gpqa_diamond_llada_oc``: ``GPQA_Simple_Eval_postprocess_`` then ``GPQAEvaluator``
    (the extracted text is the answer letter, exactly)."""
    from pvf_lmeval.lmeval import published_answers as pa

    generation = results[0]
    right = pa.oc_choice_correct(pa.oc_gpqa_prediction(str(generation)), doc["answer"])
    out = {"exact_match": float(right)}
    out.update(cost_metrics(generation))
    return out


#: gpqa_diamond_llada_oc's metric_list: exact match, then the decoding costs
LLADA_OC_METRICS = metric_list("exact_match")
