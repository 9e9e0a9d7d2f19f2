"""The offline `arith_var` task: `arith`'s word problems with varied 120-250-token solutions.

Data: `data/test.jsonl` (1,000 held-out items) and `data/calibration.jsonl` (400 items, unlabeled
use only: planning-vocabulary calibration), written by scripts/tiny_fixtures/arith_var_data.py;
the training stream comes from the same generator with other seeds and never shares a question.
"""

from __future__ import annotations

import re
from pathlib import Path

from pvf_lmeval.task_metrics import cost_metrics, ratio_of_sums  # noqa: F401  (YAML uses it)

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
