"""``decoder=wino``, ``decoder=joint`` and ``decoder=pvf-edit`` through the stock ``lm_eval``
CLI (one real subprocess each, offline, tiny-llada, 4 held-out ``arith`` items): the samples log
and the results table carry ``edits`` and ``remasks``, every sample's statistics are those of
decoding its prompt with the same parameters directly (pvf-edit: under the task's preset and the
bundled planning vocabulary, as the adapter resolves them), and pvf-report puts each run in its
leaderboard and Pareto plot. pvf-edit's run (about 40 s of CPU: lm-eval starts in each) is the
``PVF_FAMILY_TESTS=1`` tier."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from helpers.prerequisites import family_tier, require_module

pytest.importorskip("lm_eval")

from pvf_lmeval.cli import report  # noqa: E402
from pvf_lmeval.decoding import PLANNING_DECODERS, decode_batch  # noqa: E402
from pvf_lmeval.models import load_model  # noqa: E402
from pvf_lmeval.planning.vocab import resolve_vocab_for  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
RUNS = {
    "wino": "pretrained=tiny-llada,decoder=wino,gen_length=64,block_length=32,early_stop=false",
    "joint": "pretrained=tiny-llada,decoder=joint,preset=llada21-quality,gen_length=64,"
             "block_length=32,rules=reference",
    "pvf-edit": "pretrained=tiny-llada,decoder=pvf-edit,gen_length=64,block_length=32,"
                "edit_threshold=0.5",
}
#: the runs of the family tier (helpers.prerequisites.family_tier)
TIER = {"pvf-edit"}
NAMES = [n for n in RUNS if n not in TIER or os.environ.get("PVF_FAMILY_TESTS") == "1"]


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
                      sorted(samples, key=lambda s: s["doc_id"]), out)

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(pool.map(run, NAMES))


@pytest.mark.parametrize("name", [pytest.param(n, marks=family_tier if n in TIER else ())
                                  for n in RUNS])
def test_the_cli_reports_what_decoding_gives(runs, name):
    metrics, samples, _ = runs[name]
    model = load_model("tiny-llada")
    prompts = [model.tokenizer.encode(s["arguments"]["gen_args_0"]["arg_0"],
                                      add_special_tokens=False) for s in samples]
    args = dict(kv.split("=") for kv in RUNS[name].split(",")[1:])
    decoder = args.pop("decoder")
    if decoder in PLANNING_DECODERS:        # the task's preset and vocab=auto's artifact
        args.update(preset="arith", plan_vocab=resolve_vocab_for(
            model, "auto", task_family="math-word")[0])
    direct = decode_batch(model, prompts, decoder, **args)
    for s, r in zip(samples, direct):
        assert (s["nfe"], s["edits"], s["remasks"], s["committed"]) == \
            (r.nfe, r.edits, r.remasks, r.committed), s["doc_id"]
    for key in ("edits", "remasks", "nfe"):
        assert metrics[f"{key},none"] == pytest.approx(sum(s[key] for s in samples) / 4), key
    assert sum(s["edits"] + s["remasks"] for s in samples) > 0


def test_the_report_ranks_every_run(runs, tmp_path):
    table = report.build([runs[name][2] for name in NAMES])
    (col,) = table.columns
    assert [r.decoder for r in table.rows] == NAMES                 # the registry's order
    for row in table.rows:
        metrics = runs[row.decoder][0]
        e = row.entries[col.key]
        assert (e.nfe, e.edits, e.remasks) == (metrics["nfe,none"], metrics["edits,none"],
                                               metrics["remasks,none"])
    md = report.render.render(table, "markdown").splitlines()
    assert [line.split(" | ")[1] for line in md[2:2 + len(NAMES)]] == NAMES
    require_module("matplotlib", "plot", "pip install -e .[plot]")
    from pvf_lmeval.cli.report import plot

    info = plot.plot(table, "accuracy-nfe", str(tmp_path / "p.png"))
    assert info.errorbars == len(NAMES) and info.path.stat().st_size > 10_000
