"""What the offline arithmetic tasks (``arith``, ``arith_var``) share: their local splits, the
``#### N`` answer, and scoring (exact match on that number plus the decoding cost metrics)."""

from __future__ import annotations

import re
from pathlib import Path

from .task_metrics import cost_metrics

ANSWER = re.compile(r"####\s*(-?[0-9][0-9,]*)")


def load_splits(data_dir: Path):
    """The task's ``test`` and ``calibration`` splits from ``data_dir`` (JSON lines)."""
    import datasets

    files = {"test": str(data_dir / "test.jsonl"),
             "calibration": str(data_dir / "calibration.jsonl")}
    return datasets.load_dataset("json", data_files=files)


def extract_answer(text: str) -> str | None:
    """The number after the first ``####`` (thousands separators dropped), or None."""
    m = ANSWER.search(text)
    return m.group(1).replace(",", "") if m else None


def process_results(doc: dict, results: list) -> dict:
    generation = results[0]
    out = {"exact_match": float(extract_answer(generation) == doc["target"])}
    out.update(cost_metrics(generation))
    return out
