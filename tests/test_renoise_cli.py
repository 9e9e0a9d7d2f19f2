"""DiffusionGemma through the stock ``lm_eval`` CLI (the ``PVF_FAMILY_TESTS=1`` tier):
``--model pvf-dlm --model_args pretrained=<tiny DiffusionGemma folder>`` with its one decoder,
``renoise`` (the only one a uniform-state model allows; every other is refused in one line
before the model loads its first batch), at ``--batch_size 1`` and ``4``.

Two tasks: the released sampler (48 denoising calls per canvas on random weights, which never
meet the stop rule) and one-step canvases (``stability_threshold=0``, a confidence the first
step always meets). Batch 1 gives batch 4's answers on the one-step task: its output is each
canvas's first argmax. Over 48 steps the random network's entropies lie within the few 1e-6
by which its CPU logits move with the batch, so the accepted sets (and the answers) may differ
there; ``tests/test_renoise.py`` pins the decoder's own batching exactly."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from helpers.gemma_folders import make_gemma_folder
from helpers.prerequisites import family_tier

pytestmark = family_tier

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
LIMIT = 3
C = 8
TASKS = {"released": "", "onestep": "  stability_threshold: 0\n  confidence_threshold: 100\n"}


def _task(folder: Path, name: str, extra: str, decoder: str = "renoise") -> str:
    (folder / f"dg_{name}.yaml").write_text(
        f"include: {REPO / 'tasks' / 'arith' / 'arith.yaml'}\n"
        f"task: dg_{name}\n"
        "generation_kwargs:\n"
        "  until:\n    - \"Question:\"\n"
        "  do_sample: false\n  temperature: 0.0\n"
        f"  max_gen_toks: {2 * C}\n  decoder: {decoder}\n{extra}")
    return f"dg_{name}"


def _env() -> dict:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
            "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONWARNINGS": "ignore"}


@pytest.mark.timeout(1200)
def test_renoise_through_lm_eval_at_batch_1_and_4(tmp_path):
    folder = make_gemma_folder(tmp_path / "dg", seed=1, canvas_length=C)
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    names = [_task(tasks, n, extra) for n, extra in TASKS.items()]

    def run(bs):
        out = tmp_path / f"out_{bs}"
        cmd = [str(BIN / "lm_eval"), "--model", "pvf-dlm",
               "--model_args", f"pretrained={folder},vocab=none,decoder=renoise",
               "--include_path", str(tasks), "--tasks", ",".join(names), "--limit", str(LIMIT),
               "--batch_size", str(bs), "--output_path", str(out), "--log_samples"]
        proc = subprocess.run(cmd, cwd=tmp_path, env=_env(), capture_output=True, text=True,
                              timeout=1100)
        assert proc.returncode == 0, f"batch {bs}:\n{proc.stderr[-4000:]}"
        got = {}
        for path in glob.glob(str(out / "**" / "samples_dg_*.jsonl"), recursive=True):
            task = Path(path).name.split("_")[2]
            rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line]
            got[task] = [r["resps"][0][0] for r in sorted(rows, key=lambda r: r["doc_id"])]
        results = next(iter(glob.glob(str(out / "**" / "results_*.json"), recursive=True)))
        return bs, got, json.loads(Path(results).read_text())["results"]

    with ThreadPoolExecutor(max_workers=2) as pool:
        runs = {bs: (got, res) for bs, got, res in pool.map(run, (1, 4))}
    one, four = runs[1][0], runs[4][0]
    assert set(one) == set(four) == {"released", "onestep"}
    assert all(len(v) == LIMIT for v in one.values())
    assert one["onestep"] == four["onestep"]
    for bs in (1, 4):
        res = runs[bs][1]
        assert res["dg_onestep"]["nfe,none"] == 2            # two canvases, one step each
        assert res["dg_released"]["nfe,none"] == 2 * 48      # two canvases, every step


def test_a_masked_decoder_on_diffusion_gemma_is_one_line(tmp_path):
    folder = make_gemma_folder(tmp_path / "dg", seed=1, canvas_length=C)
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    name = _task(tasks, "threshold", "", decoder="threshold")
    cmd = [str(BIN / "lm_eval"), "--model", "pvf-dlm",
           "--model_args", f"pretrained={folder},vocab=none", "--include_path", str(tasks),
           "--tasks", name, "--limit", "1"]
    proc = subprocess.run(cmd, cwd=tmp_path, env=_env(), capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode != 0
    assert ("decoder=threshold fills masked positions; diffusion_gemma is a uniform-state "
            "diffusion model") in proc.stderr
