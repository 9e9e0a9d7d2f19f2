"""``decoder=wino`` and ``decoder=joint`` through the stock ``lm_eval`` CLI (one real subprocess
each, offline, tiny-llada, 4 held-out ``arith`` items): the samples log and the results table
carry ``edits`` and ``remasks``, and every sample's statistics are those of decoding its prompt
with the same parameters directly."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytest.importorskip("lm_eval")

from pvf_lmeval.decoding import decode_batch  # noqa: E402
from pvf_lmeval.models import load_model  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
RUNS = {
    "wino": "pretrained=tiny-llada,decoder=wino,gen_length=64,block_length=32,early_stop=false",
    "joint": "pretrained=tiny-llada,decoder=joint,preset=llada21-quality,gen_length=64,"
             "block_length=32,rules=reference",
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("lm_cli_revocable")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONWARNINGS": "ignore"}

    def run(name):
        out = root / name
        proc = subprocess.run(
            [str(BIN / "lm_eval"), "--model", "pvf-dlm", "--model_args", RUNS[name],
             "--include_path", str(REPO / "tasks"), "--tasks", "arith", "--limit", "4",
             "--output_path", str(out), "--log_samples"],
            cwd=root, env=env, capture_output=True, text=True, timeout=400)
        assert proc.returncode == 0, f"{name}:\n{proc.stderr[-4000:]}"
        (res,) = glob.glob(str(out / "**" / "results_*.json"), recursive=True)
        (smp,) = glob.glob(str(out / "**" / "samples_arith_*.jsonl"), recursive=True)
        samples = [json.loads(line) for line in Path(smp).read_text().splitlines() if line]
        return name, (json.loads(Path(res).read_text())["results"]["arith"],
                      sorted(samples, key=lambda s: s["doc_id"]))

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(pool.map(run, RUNS))


@pytest.mark.parametrize("name", list(RUNS))
def test_the_cli_reports_what_decoding_gives(runs, name):
    metrics, samples = runs[name]
    model = load_model("tiny-llada")
    prompts = [model.tokenizer.encode(s["arguments"]["gen_args_0"]["arg_0"],
                                      add_special_tokens=False) for s in samples]
    args = dict(kv.split("=") for kv in RUNS[name].split(",")[1:])
    decoder = args.pop("decoder")
    direct = decode_batch(model, prompts, decoder, **args)
    for s, r in zip(samples, direct):
        assert (s["nfe"], s["edits"], s["remasks"], s["committed"]) == \
            (r.nfe, r.edits, r.remasks, r.committed), s["doc_id"]
    for key in ("edits", "remasks", "nfe"):
        assert metrics[f"{key},none"] == pytest.approx(sum(s[key] for s in samples) / 4), key
    assert sum(s["edits"] + s["remasks"] for s in samples) > 0
