"""The offline `arith` task: synthetic GSM8K-style word problems (the tiny fixtures' task).

Data: `data/test.jsonl` (1,000 held-out items) and `data/calibration.jsonl` (unlabeled use only:
planning-vocabulary calibration), written by scripts/tiny_fixtures/arith_data.py.
"""

from __future__ import annotations

import re
from pathlib import Path

from pvf_lmeval.task_loading import quiet_custom_dataset_notice
from pvf_lmeval.task_metrics import cost_metrics, ratio_of_sums  # noqa: F401  (YAML uses it)

quiet_custom_dataset_notice(Path(__file__).resolve().parent)  # our data loaders take no --metadata

DATA = Path(__file__).resolve().parent / "data"
ANSWER = re.compile(r"####\s*(-?[0-9][0-9,]*)")


def load(**kwargs):
    import datasets

    files = {"test": str(DATA / "test.jsonl"), "calibration": str(DATA / "calibration.jsonl")}
    return datasets.load_dataset("json", data_files=files)


def extract_answer(text: str) -> str | None:
    m = ANSWER.search(text)
    return m.group(1).replace(",", "") if m else None


def process_results(doc: dict, results: list) -> dict:
    generation = results[0]
    out = {"exact_match": float(extract_answer(generation) == doc["target"])}
    out.update(cost_metrics(generation))
    return out
