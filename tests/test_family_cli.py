"""The new families through the stock ``lm_eval`` CLI (the ``PVF_FAMILY_TESTS=1`` tier): on each
family's hub-shaped folder, every decoder with ``cache=none``, ``prefix`` and ``dual`` (one task
per pair, the bundled ``arith`` task with the pair in its ``generation_kwargs``), at
``--batch_size 1`` and ``4``. On the block-causal families (SDAR, SDAR-MoE, Fast-dLLM v2) the
cache is exact: every pair gives the ``cache=none`` answers; on every family batch 1 gives what
batch 4 gives. Each run is a real ``lm_eval`` process (about a minute each on 2 cores: lm-eval
indexes its own task library first); ``tests/test_family_decoding.py`` checks the same through
the decoding API in the default tier."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from helpers.prerequisites import family_tier
from helpers.qwen_folders import make_fast_dllm_folder, make_rnd1_folder, make_sdar_folder

pytestmark = family_tier

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
DECODERS = ("static", "threshold", "freedave", "pvf", "explore")
CACHES = ("none", "prefix", "dual")
#: folder builder, max_gen_toks, extra model args
FAMILIES = {
    "sdar": (lambda f: make_sdar_folder(f, 4), 8, ""),
    "sdar_moe": (lambda f: make_sdar_folder(f, 4, moe=True), 8, ""),
    "fast_dllm": (lambda f: make_fast_dllm_folder(f, 4, bd_size=8), 16, ""),
    "rnd1": (lambda f: make_rnd1_folder(f, 4), 16, ",block_length=8"),
}
LIMIT = 3


def _task_yaml(folder: Path, dec: str, cache: str, max_gen_toks: int) -> str:
    name = f"fam_{dec}_{cache}"
    (folder / f"{name}.yaml").write_text(
        f"include: {REPO / 'tasks' / 'arith' / 'arith.yaml'}\n"
        f"task: {name}\n"
        "generation_kwargs:\n"
        "  until:\n    - \"Question:\"\n"
        "  do_sample: false\n  temperature: 0.0\n"
        f"  max_gen_toks: {max_gen_toks}\n  decoder: {dec}\n  cache: {cache}\n")
    return name


def answers(root: Path, family: str) -> dict:
    """{batch size: {(decoder, cache): [answer per document]}} from two lm_eval runs."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           "TOKENIZERS_PARALLELISM": "false", "PYTHONWARNINGS": "ignore"}
    make, gen, extra = FAMILIES[family]
    folder = make(root / family)
    tasks = root / "tasks"
    tasks.mkdir()
    names = [_task_yaml(tasks, d, c, gen) for d in DECODERS for c in CACHES]

    def run(bs):
        out = root / f"out_{bs}"
        cmd = [str(BIN / "lm_eval"), "--model", "pvf-dlm",
               "--model_args", f"pretrained={folder},vocab=none{extra}",
               "--include_path", str(tasks), "--tasks", ",".join(names),
               "--limit", str(LIMIT), "--batch_size", str(bs), "--output_path", str(out),
               "--log_samples"]
        proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=1700)
        assert proc.returncode == 0, f"{family}, batch {bs}:\n{proc.stderr[-4000:]}"
        got = {}
        for path in glob.glob(str(out / "**" / "samples_fam_*.jsonl"), recursive=True):
            dec, cache = Path(path).name.split("_")[2:4]
            rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line]
            got[(dec, cache)] = [r["resps"][0][0] for r in sorted(rows, key=lambda r: r["doc_id"])]
        return bs, got

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(pool.map(run, (1, 4)))


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("family", list(FAMILIES))
def test_cli_cache_modes_and_batch_sizes_agree(tmp_path, family):
    got = answers(tmp_path, family)
    one, four = got[1], got[4]
    assert set(one) == {(d, c) for d in DECODERS for c in CACHES}
    assert one == four                                    # batch 1 = batch 4, every pair
    if family != "rnd1":                                  # block-causal: the cache is exact
        for d in DECODERS:
            for c in ("prefix", "dual"):
                assert four[(d, c)] == four[(d, "none")], (family, d, c)
    assert all(len(v) == LIMIT for v in four.values())
