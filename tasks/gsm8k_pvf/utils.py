"""GSM8K tasks with decoding-cost metrics: counterparts of lm-eval's ``gsm8k`` and ``gsm8k_cot``.

Prompts, few-shot setup and stop sequences are those of the built-ins (lm-eval 0.4.13). Scoring
replicates their two filter pipelines inside ``process_results`` instead of ``filter_list`` (a regex
filter would turn the generation into a plain ``str`` and lose its ``.meta`` statistics):

* ``exact_match`` -- the built-in's ``strict-match`` row (``#### N`` for ``gsm8k``,
  ``The answer is N.`` for ``gsm8k_cot``);
* ``exact_match_flexible`` -- its ``flexible-extract`` row (the last number in the text);

both compared with lm-eval's ``exact_match`` metric and the built-in's ``regexes_to_ignore``.

Data: the hub (``openai/gsm8k``, config ``main``) when online; with ``HF_DATASETS_OFFLINE=1`` /
``HF_HUB_OFFLINE=1`` (or when the hub fails) the local copies written by ``pvf-data fetch``.
"""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path

from pvf_lmeval.lmeval.task_loading import quiet_custom_dataset_notice
from pvf_lmeval.lmeval.task_metrics import cost_metrics, metric_list

quiet_custom_dataset_notice(Path(__file__).resolve().parent)  # our data loaders take no --metadata

log = logging.getLogger("pvf_lmeval.tasks")

HUB_PATH, HUB_NAME = "openai/gsm8k", "main"
FIELDS = ("question", "answer")

#: the built-ins' filter regexes
STRICT = {
    "gsm8k": re.compile(r"#### (\-?[0-9\.\,]+)"),
    "gsm8k_cot": re.compile(r"The answer is (\-?[0-9\.\,]+)."),
    "llama": re.compile(r"The final answer is ((-?[$0-9.,]{2,})|(-?[0-9]+))"),
}
FLEXIBLE = re.compile(r"(-?[$0-9.,]{2,})|(-?[0-9]+)")
FALLBACK = "[invalid]"
#: the built-ins' exact_match options
IGNORE = (",", "\\$", "(?s).*#### ", "\\.$")


# ----------------------------------------------------------------------------- data


def _offline() -> bool:
    return any(os.environ.get(k, "").strip().lower() in ("1", "true", "yes", "on")
               for k in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"))


def local_file(name: str) -> Path:
    """The ``pvf-data fetch`` copy of dataset ``name`` (SHA-256 checked); FileNotFoundError if absent."""
    try:
        from pvf_lmeval.data import dataset_file
    except ImportError:  # pragma: no cover  (an install without pvf_lmeval.data)
        raise FileNotFoundError(f"no local copy of {name}: pvf_lmeval.data is unavailable") from None
    return Path(dataset_file(name))


def _has_local(*names: str) -> bool:
    try:
        return all(local_file(n).is_file() for n in names)
    except FileNotFoundError:
        return False


def load_local():
    """``DatasetDict`` (test, train) of the local copies, with the hub's columns only."""
    import datasets

    files = {"test": str(local_file("gsm8k_test")), "train": str(local_file("gsm8k_train"))}
    return datasets.load_dataset("json", data_files=files).select_columns(list(FIELDS))


def load_gsm8k(**kwargs):
    """Hub ``openai/gsm8k`` (``main``) when online; the local copies when offline
    (``HF_DATASETS_OFFLINE=1`` / ``HF_HUB_OFFLINE=1``) or when the hub fails."""
    if not _offline():
        import datasets

        try:
            return datasets.load_dataset(HUB_PATH, HUB_NAME)
        except Exception as exc:  # noqa: BLE001  (any hub failure: fall back to local copies)
            if not _has_local("gsm8k_test", "gsm8k_train"):
                raise
            log.warning("gsm8k: hub load failed (%s); using the pvf-data local copies", exc)
    return load_local()


# ----------------------------------------------------------------------------- scoring


def regex_extract(pattern: re.Pattern, text: str, group_select: int = 0) -> str:
    """lm-eval's ``regex`` filter on one response (``RegexFilter.apply``)."""
    if not isinstance(text, str):
        text = ""
    match = pattern.findall(text)
    if not match:
        return FALLBACK
    match = match[group_select]
    if isinstance(match, tuple):
        match = [m for m in match if m]
        match = match[0] if match else FALLBACK
    return match.strip()


def exact_match(prediction: str, reference: str) -> float:
    """lm-eval's ``exact_match`` with the gsm8k YAMLs' options (ignore_case, regexes_to_ignore)."""
    from lm_eval.api.metrics import exact_match_hf_evaluate

    out = exact_match_hf_evaluate([prediction], [reference], regexes_to_ignore=list(IGNORE),
                                  ignore_case=True, ignore_punctuation=False)
    return float(out["exact_match"])


def score(generation: str, reference: str, strict: str) -> dict:
    text = str(generation)
    return {
        "exact_match": exact_match(regex_extract(STRICT[strict], text), reference),
        "exact_match_flexible": exact_match(regex_extract(FLEXIBLE, text, group_select=-1), reference),
    }


def _process(doc: dict, results: list, strict: str, reference: str) -> dict:
    generation = results[0]
    out = score(generation, reference, strict)
    out.update(cost_metrics(generation))  # read .meta from the raw generation
    return out


def process_results_gsm8k(doc: dict, results: list) -> dict:
    """``gsm8k``: target ``{{answer}}`` (the whole solution; the regexes strip up to ``#### ``)."""
    return _process(doc, results, "gsm8k", doc["answer"])


def cot_target(doc: dict) -> str:
    """``gsm8k_cot``'s target: the number after ``####``."""
    return doc["answer"].split("####")[-1].strip()


def process_results_gsm8k_cot(doc: dict, results: list) -> dict:
    return _process(doc, results, "gsm8k_cot", cot_target(doc))


def process_results_gsm8k_cot_chat(doc: dict, results: list) -> dict:
    """Chat CoT variant: ``The final answer is N`` (lm-eval's ``gsm8k_cot_llama`` regex)."""
    return _process(doc, results, "llama", cot_target(doc))


# ----------------------------------------------------------------------------- few-shot

#: ``gsm8k_cot``'s eight fixed exemplars (Wei et al.), as in the built-in YAML.
COT_SAMPLES = [
    ("There are 15 trees in the grove. Grove workers will plant trees in the grove today. After "
     "they are done, there will be 21 trees. How many trees did the grove workers plant today?",
     "There are 15 trees originally. Then there were 21 trees after some more were planted. So "
     "there must have been 21 - 15 = 6. The answer is 6."),
    ("If there are 3 cars in the parking lot and 2 more cars arrive, how many cars are in the "
     "parking lot?",
     "There are originally 3 cars. 2 more cars arrive. 3 + 2 = 5. The answer is 5."),
    ("Leah had 32 chocolates and her sister had 42. If they ate 35, how many pieces do they have "
     "left in total?",
     "Originally, Leah had 32 chocolates. Her sister had 42. So in total they had 32 + 42 = 74. "
     "After eating 35, they had 74 - 35 = 39. The answer is 39."),
    ("Jason had 20 lollipops. He gave Denny some lollipops. Now Jason has 12 lollipops. How many "
     "lollipops did Jason give to Denny?",
     "Jason started with 20 lollipops. Then he had 12 after giving some to Denny. So he gave Denny "
     "20 - 12 = 8. The answer is 8."),
    ("Shawn has five toys. For Christmas, he got two toys each from his mom and dad. How many toys "
     "does he have now?",
     "Shawn started with 5 toys. If he got 2 toys each from his mom and dad, then that is 4 more "
     "toys. 5 + 4 = 9. The answer is 9."),
    ("There were nine computers in the server room. Five more computers were installed each day, "
     "from monday to thursday. How many computers are now in the server room?",
     "There were originally 9 computers. For each of 4 days, 5 more computers were added. So 5 * 4 "
     "= 20 computers were added. 9 + 20 is 29. The answer is 29."),
    ("Michael had 58 golf balls. On tuesday, he lost 23 golf balls. On wednesday, he lost 2 more. "
     "How many golf balls did he have at the end of wednesday?",
     "Michael started with 58 golf balls. After losing 23 on tuesday, he had 58 - 23 = 35. After "
     "losing 2 more, he had 35 - 2 = 33 golf balls. The answer is 33."),
    ("Olivia has $23. She bought five bagels for $3 each. How much money does she have left?",
     "Olivia had 23 dollars. 5 bagels for 3 dollars each will be 5 x 3 = 15 dollars. So she has "
     "23 - 15 dollars left. 23 - 15 is 8. The answer is 8."),
]


def cot_samples() -> list[dict]:
    return [{"question": q, "target": t} for q, t in COT_SAMPLES]


def cot_chat_samples() -> list[dict]:
    """The same exemplars ending in ``The final answer is N`` (the chat variant's answer format)."""
    return [{"question": q, "target": t.replace("The answer is", "The final answer is").rstrip(".")}
            for q, t in COT_SAMPLES]

# ----------------------------------------------------------------------------- published settings

#: OpenCompass gsm8k_gen_1d7fe4's four exemplars (question, the assistant turn), as LLaDA's
#: EVAL.md Instruct rows ran them (ML-GSAI/LLaDA @ b7e6c35,
#: opencompass/opencompass/configs/datasets/gsm8k/gsm8k_gen_1d7fe4.py): not GSM8K train items.
LLADA_OC_SAMPLES = json.loads((Path(__file__).resolve().parent / "llada_oc_samples.json").read_text())


def llada_oc_samples() -> list[dict]:
    return [dict(s) for s in LLADA_OC_SAMPLES]


def _score_llada_oc(doc: dict, results: list, prediction) -> dict:
    """OpenCompass's ``Gsm8kEvaluator`` on ``prediction(output)`` against the number after
    "#### " (``gsm8k_dataset_postprocess``), then the decoding costs."""
    from pvf_lmeval.lmeval import published_answers as pa

    generation = results[0]
    right = pa.oc_gsm8k_equal(prediction(str(generation)), pa.oc_gsm8k_reference(doc["answer"]))
    out = {"exact_match": float(right)}
    out.update(cost_metrics(generation))
    return out


def process_results_llada_oc(doc: dict, results: list) -> dict:
    """``gsm8k_llada_oc``: OpenCompass's ``gsm8k_postprocess`` and ``Gsm8kEvaluator``."""
    from pvf_lmeval.lmeval import published_answers as pa

    return _score_llada_oc(doc, results, pa.oc_gsm8k_prediction)


def process_results_llada_oc_base(doc: dict, results: list) -> dict:
    """``gsm8k_llada_oc_base``: OpenCompass's ``gsm8k_postprocess_`` and ``Gsm8kEvaluator``."""
    from pvf_lmeval.lmeval import published_answers as pa

    return _score_llada_oc(doc, results, pa.oc_gsm8k_base_prediction)


def process_results_pvf_paper(doc: dict, results: list) -> dict:
    """``gsm8k_pvf_paper``: the PVF authors' ``accuracy_gsm8k`` for one item."""
    from pvf_lmeval.lmeval import published_answers as pa

    generation = results[0]
    out = {"exact_match": float(pa.pvf_gsm8k_correct(str(generation), doc["answer"]))}
    out.update(cost_metrics(generation))
    return out


#: the YAMLs' metric_list: the built-in's strict and flexible matches, then the decoding costs
METRICS = metric_list("exact_match", "exact_match_flexible")
#: the published settings' tasks: one accuracy row, then the decoding costs
ONE_METRIC = metric_list("exact_match")
