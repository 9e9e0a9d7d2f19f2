"""The offline `arith` task: synthetic GSM8K-style word problems (the tiny fixtures' task).

Data: `data/test.jsonl` (1,000 held-out items) and `data/calibration.jsonl` (unlabeled use only:
planning-vocabulary calibration), written by scripts/tiny_fixtures/arith_data.py.
"""

from __future__ import annotations

from pathlib import Path

from pvf_lmeval.lmeval.arith_tasks import ANSWER, extract_answer, load_splits, process_results  # noqa: F401
from pvf_lmeval.lmeval.task_loading import quiet_custom_dataset_notice
from pvf_lmeval.lmeval.task_metrics import cost_metrics, metric_list

quiet_custom_dataset_notice(Path(__file__).resolve().parent)  # our data loaders take no --metadata

DATA = Path(__file__).resolve().parent / "data"


def load(**kwargs):
    return load_splits(DATA)

#: the YAML's metric_list: exact match, then the decoding costs
METRICS = metric_list("exact_match")
