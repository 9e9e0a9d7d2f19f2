"""``pvf-data fetch --hub-cache``: the shipped test sets where lm-eval's stock tasks look offline.

lm-eval's ``gsm8k``, ``minerva_math500`` and ``humaneval`` load their data with
``datasets.load_dataset(<hub id>, <config>)``. With ``HF_HUB_OFFLINE=1`` (or
``HF_DATASETS_OFFLINE=1``) the datasets library (5.x) does not read the hub's file cache: it
reuses a dataset it has prepared before, from its own cache ``HF_DATASETS_CACHE`` (by default
``$HF_HOME/datasets``, ``~/.cache/huggingface/datasets``), laid out as::

    <namespace>___<name>/<config>/0.0.0/<hash>/dataset_info.json
    <namespace>___<name>/<config>/0.0.0/<hash>/<name>-<split>.arrow     (one per split)

This module writes exactly that, with the hub's columns and types, from the local copies that
``pvf-data fetch`` checked (their SHA-256 is verified again before anything is written). The
``<hash>`` directory is named after those digests, so re-running it is a no-op and a changed
source gets a new directory. Nothing is written unless ``--hub-cache`` is given.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from . import testsets as _data

VERSION = "0.0.0"


@dataclass(frozen=True)
class HubDataset:
    repo_id: str                    # what the stock task's ``dataset_path`` says
    config: str                     # its ``dataset_name`` (the hub config)
    splits: tuple                   # ((split, local dataset name), ...)
    columns: tuple                  # ((column, datasets dtype), ...): the hub's schema
    tasks: str                      # the lm-eval tasks that read it (for messages and docs)


HUB_DATASETS = (
    HubDataset("openai/gsm8k", "main", (("train", "gsm8k_train"), ("test", "gsm8k_test")),
               (("question", "string"), ("answer", "string")), "gsm8k, gsm8k_cot, ..."),
    HubDataset("HuggingFaceH4/MATH-500", "default", (("test", "math500"),),
               (("problem", "string"), ("solution", "string"), ("answer", "string"),
                ("subject", "string"), ("level", "int64"), ("unique_id", "string")),
               "minerva_math500"),
    HubDataset("openai/openai_humaneval", "openai_humaneval", (("test", "humaneval"),),
               (("task_id", "string"), ("prompt", "string"), ("canonical_solution", "string"),
                ("test", "string"), ("entry_point", "string")), "humaneval"),
)


def datasets_cache() -> Path:
    """The datasets library's cache directory, by its own rule, read now (its ``config`` module
    reads the environment once, at import): ``$HF_DATASETS_CACHE``, else ``$HF_HOME/datasets``,
    else ``$XDG_CACHE_HOME/huggingface/datasets``, else ``~/.cache/huggingface/datasets``."""
    if os.environ.get("HF_DATASETS_CACHE"):
        return Path(os.environ["HF_DATASETS_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache"), "huggingface")
    return Path(home).expanduser() / "datasets"


def cache_dir_of(hub: HubDataset, digest: str, root: Path) -> Path:
    """``root/<namespace>___<name>/<config>/0.0.0/<digest>``, named as the library names it."""
    from datasets.naming import camelcase_to_snakecase

    namespace, name = hub.repo_id.split("/")
    return root / f"{namespace}___{camelcase_to_snakecase(name)}" / hub.config / VERSION / digest


def _rows(path: Path, columns: tuple) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        records = [json.loads(line) for line in f if line.strip()]
    names = [c for c, _ in columns]
    for n, rec in enumerate(records, 1):
        missing = [c for c in names if c not in rec]
        if missing:
            raise _data.DataError(f"pvf_lmeval: {path} line {n} lacks {missing} (the hub's columns)")
    return [{c: rec[c] for c in names} for rec in records]


def write_one(hub: HubDataset, *, directory=None, root: Path | None = None, log=print) -> Path:
    """Write ``hub`` into the datasets cache ``root`` from the verified local copies; its path."""
    import datasets
    from datasets.arrow_writer import ArrowWriter
    from datasets.naming import camelcase_to_snakecase

    root = Path(root) if root is not None else datasets_cache()
    files = {split: _data.dataset_file(local, directory=directory, verify=True)
             for split, local in hub.splits}
    digest = hashlib.sha256("".join(_data.DATASETS[local].sha256 for _, local in hub.splits)
                            .encode()).hexdigest()[:16]
    target = cache_dir_of(hub, digest, root)
    if (target / "dataset_info.json").is_file():
        log(f"ok       {hub.repo_id:26s} {target}")
        return target
    features = datasets.Features({c: datasets.Value(t) for c, t in hub.columns})
    name = camelcase_to_snakecase(hub.repo_id.split("/")[1])
    target.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=".pvf_stage_", dir=target.parent))
    try:
        splits = datasets.SplitDict(dataset_name=name)
        for split, path in files.items():
            table = datasets.Dataset.from_list(_rows(path, hub.columns), features=features).data.table
            writer = ArrowWriter(features=features, path=str(stage / f"{name}-{split}.arrow"))
            writer.write_table(table)
            n_rows, n_bytes = writer.finalize()
            writer.close()
            splits.add(datasets.SplitInfo(name=split, num_bytes=n_bytes, num_examples=n_rows,
                                          dataset_name=name))
        info = datasets.DatasetInfo(
            description=f"{hub.repo_id} ({hub.config}) written by pvf-data fetch --hub-cache from "
                        + ", ".join(f"{_data.DATASETS[local].path} (sha256 "
                                    f"{_data.DATASETS[local].sha256})" for _, local in hub.splits),
            features=features, config_name=hub.config, dataset_name=name, version=VERSION,
            splits=splits)
        info.write_to_directory(str(stage))
        os.replace(stage, target)
    finally:
        if stage.exists():
            shutil.rmtree(stage, ignore_errors=True)
    log(f"cached   {hub.repo_id:26s} {target}")
    return target


def write_hub_cache(*, directory=None, root: Path | None = None, log=print) -> list[Path]:
    """Every dataset of :data:`HUB_DATASETS` (their local copies must be fetched first)."""
    return [write_one(hub, directory=directory, root=root, log=log) for hub in HUB_DATASETS]
