"""``pvf-report`` on two small real runs (tiny-llada, arith, --limit 4; static and threshold).

The runs go through lm-eval's evaluator and its ``EvaluationTracker`` exactly as the CLI's
``--output_path ... --log_samples`` does (in this process, with a task index without the
built-ins, to keep the test fast); the report must read that layout as written.
"""

from __future__ import annotations

import copy
import csv
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from pvf_lmeval import report

REPO = Path(__file__).resolve().parent.parent
FIXTURE = REPO / "pvf_lmeval" / "fixtures" / "tiny-llada"
MODEL = "tiny-llada"
LIMIT = 4
GEN = "gen_length=64,block_length=32"


def _evaluate(model_args: str, out: Path, task_manager) -> None:
    """What `lm_eval --model pvf-dlm --model_args ... --tasks arith --limit 4 --output_path out
    --log_samples` does (lm_eval/_cli/run.py), minus building the index of built-in tasks."""
    from lm_eval import simple_evaluate
    from lm_eval.loggers import EvaluationTracker

    tracker = EvaluationTracker(output_path=str(out))
    results = simple_evaluate(model="pvf-dlm", model_args=model_args, tasks=["arith"], limit=LIMIT,
                              device="cpu", log_samples=True, evaluation_tracker=tracker,
                              task_manager=task_manager)
    samples = results.pop("samples")
    tracker.save_results_aggregated(results=results, samples=samples)
    for task_name in results["configs"]:
        tracker.save_results_samples(task_name=task_name, samples=samples[task_name])


@pytest.fixture(scope="module")
def runs(tmp_path_factory, monkeypatch_module):
    if not (FIXTURE / "model.safetensors").exists():
        pytest.skip("tiny-llada fixture weights not built yet")
    from lm_eval.tasks import TaskManager

    monkeypatch_module.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch_module.setenv("HF_DATASETS_OFFLINE", "1")
    import torch

    root = tmp_path_factory.mktemp("report_runs")
    tm = TaskManager(include_path=str(REPO / "tasks"), include_defaults=False)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a model this small only loses from threads on a shared machine
    try:
        for decoder in ("static", "threshold"):
            _evaluate(f"pretrained={MODEL},decoder={decoder},{GEN}", root / decoder, tm)
    finally:
        torch.set_num_threads(threads)
    return root


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


def _results(root: Path, decoder: str) -> tuple[Path, dict]:
    (path,) = (root / decoder).rglob("results_*.json")
    return path, json.loads(path.read_text())


def test_layout_is_what_the_report_reads(runs):
    for decoder in ("static", "threshold"):
        path, res = _results(runs, decoder)
        assert path.parent.parent == runs / decoder  # OUT/<model_name_sanitized>/results_<ts>.json
        assert list(path.parent.glob("samples_arith_*.jsonl"))
        assert res["config"]["pvf"]["decoder"] == decoder


def test_rows_columns_and_ratios(runs):
    rows, tasks = report.build([runs])
    assert tasks == ["arith"]
    assert [(r.model, r.decoder) for r in rows] == [(MODEL, "static"), (MODEL, "threshold")]
    static, thr = rows
    assert static.label == f"block_length=32 gen_length=64 limit={LIMIT}"
    assert thr.label == f"block_length=32 gen_length=64 limit={LIMIT} threshold=0.9"  # the default
    m = {d: _results(runs, d)[1]["results"]["arith"] for d in ("static", "threshold")}
    for row, d in ((static, "static"), (thr, "threshold")):
        c = row.cells["arith"]
        assert c["acc"] == pytest.approx(100 * m[d]["exact_match,none"])
        assert c["nfe"] == pytest.approx(m[d]["nfe,none"])
        assert c["tpf"] == pytest.approx(m[d]["tpf,none"])
        assert c["tps"] == pytest.approx(m[d]["tps,none"])
        assert c["n"] == LIMIT and c["acc_metric"] == "exact_match,none"
    assert m["static"]["nfe,none"] == 64.0           # static: one token per call
    assert m["threshold"]["nfe,none"] < 64.0
    ct, cs = thr.cells["arith"], static.cells["arith"]
    assert ct["nfe_speedup_static"] == pytest.approx(m["static"]["nfe,none"] / m["threshold"]["nfe,none"])
    assert ct["tps_speedup_static"] == pytest.approx(m["threshold"]["tps,none"] / m["static"]["tps,none"])
    assert ct["acc_delta_static"] == pytest.approx(100 * (m["threshold"]["exact_match,none"]
                                                          - m["static"]["exact_match,none"]))
    assert ct["nfe_speedup_threshold"] is None and cs["nfe_speedup_static"] is None
    assert cs["nfe_speedup_threshold"] == pytest.approx(1 / ct["nfe_speedup_static"])

    md = report.render(rows, tasks, "markdown").splitlines()
    assert md[0].startswith("| model | decoder | settings | arith acc | arith Δs | arith NFE | arith NFE×s")
    assert len(md) == 4 and md[3].startswith(f"| {MODEL} | threshold |")
    assert f"{ct['nfe_speedup_static']:.2f}x" in md[3]
    table = list(csv.DictReader(io.StringIO(report.render(rows, tasks, "csv"))))
    assert float(table[1]["arith:nfe_speedup_static"]) == pytest.approx(ct["nfe_speedup_static"], rel=1e-5)
    assert table[0]["arith:nfe_speedup_static"] == ""
    text = report.render(rows, tasks, "text")
    assert "arith" in text.splitlines()[0] and "NFE×s" in text.splitlines()[1]


def test_check_passes_on_real_baseline_and_fails_on_doctored(runs, tmp_path, capsys):
    base = tmp_path / "baseline.json"
    assert report.main([str(runs), "--save-baseline", str(base)]) == 0
    assert report.main([str(runs), "--check", str(base)]) == 0
    doctored = json.loads(base.read_text())
    row = next(r for r in doctored["rows"] if r["decoder"] == "threshold")
    row["tasks"]["arith"]["acc"] += 5.0                       # we "used to" be 5 points better
    row["tasks"]["arith"]["nfe"] /= 1.2                       # and 20% cheaper
    bad = tmp_path / "doctored.json"
    bad.write_text(json.dumps(doctored))
    capsys.readouterr()
    assert report.main([str(runs), "--check", str(bad)]) == 1
    out = capsys.readouterr().out
    assert "2 regression(s)" in out and "acc" in out and "nfe" in out and "-5.00 pts" in out
    # within tolerance: passes
    assert report.main([str(runs), "--check", str(bad), "--acc-tol", "6", "--cost-tol", "0.25"]) == 0


def test_runs_without_statistics_give_empty_cost_cells(runs, tmp_path):
    _, res = _results(runs, "threshold")
    stripped = copy.deepcopy(res)
    arith = stripped["results"]["arith"]
    for key in list(arith):
        if key.split(",")[0].replace("_stderr", "") in report.COST_KEYS + (
                "tpf", "tps", "branch_rows", "committed", "gen_length") or key.startswith("tokens_"):
            del arith[key]
    pvf = stripped["config"].pop("pvf")
    (tmp_path / "stripped").mkdir()
    (tmp_path / "stripped" / "results_2026-01-01T00-00-00.json").write_text(json.dumps(stripped))
    rows, _ = report.build([tmp_path / "stripped"])
    (row,) = rows
    c = row.cells["arith"]
    assert c["acc"] == pytest.approx(100 * res["results"]["arith"]["exact_match,none"])
    assert all(c[k] is None for k in ("nfe", "tpf", "tps", "nfe_speedup_static", "tps_speedup_static"))
    assert row.decoder == "threshold" and row.model == MODEL  # from model_args without config.pvf
    assert report.main([str(tmp_path / "stripped"), "--format", "csv"]) == 0

    # a built-in task run: no cost metrics, but config.pvf.totals -> same costs as the metrics
    stripped["config"]["pvf"] = pvf
    (tmp_path / "totals").mkdir()
    (tmp_path / "totals" / "results_x.json").write_text(json.dumps(stripped))
    (row,) = report.build([tmp_path / "totals"])[0]
    assert row.cells["arith"]["nfe"] == pytest.approx(res["results"]["arith"]["nfe,none"])
    assert row.cells["arith"]["tpf"] == pytest.approx(res["results"]["arith"]["tpf,none"])

    # another model type (--model hf): decoder column "hf", NaN costs from the pvf task YAMLs
    hf = copy.deepcopy(res)
    hf["config"] = {"model": "hf", "model_args": "pretrained=gpt2,dtype=float32", "limit": 4.0}
    for key in hf["results"]["arith"]:
        if key.startswith(("nfe,", "tpf,", "tps,")):
            hf["results"]["arith"][key] = float("nan")
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "results_y.json").write_text(json.dumps(hf))
    rows, _ = report.build([tmp_path / "hf", runs])
    hf_row = next(r for r in rows if r.decoder == "hf")
    assert hf_row.model == "gpt2" and hf_row.label == "dtype=float32 limit=4"
    assert hf_row.cells["arith"]["nfe"] is None and hf_row.cells["arith"]["nfe_speedup_static"] is None


def test_group_costs_from_totals(tmp_path):
    """A built-in group (mmlu_pro-like): accuracy from the group row, costs summed over subtasks."""
    res = {
        "results": {"grp": {"exact_match,custom-extract": 0.5},
                    "grp_a": {"exact_match,custom-extract": 1.0},
                    "grp_b": {"exact_match,custom-extract": 0.25}},
        "group_subtasks": {"grp": ["grp_a", "grp_b"]},
        "n-samples": {"grp_a": {"effective": 1}, "grp_b": {"effective": 3}},
        "config": {"model": "pvf-dlm", "model_args": {"pretrained": "m", "decoder": "pvf"},
                   "pvf": {"pretrained": "m", "decoder": "pvf", "params": {"threshold": 0.9},
                           "totals": {"grp_a": {"requests": 1, "nfe": 10, "gen_tokens": 40, "wall_s": 1.0},
                                      "grp_b": {"requests": 3, "nfe": 20, "gen_tokens": 20, "wall_s": 2.0}}}},
        "date": 1.0,
    }
    (tmp_path / "results_g.json").write_text(json.dumps(res))
    rows, tasks = report.build([tmp_path])
    assert tasks == ["grp"]
    c = rows[0].cells["grp"]
    assert c["acc"] == 50.0 and c["n"] == 4
    assert c["nfe"] == pytest.approx((10 + 60) / 4)
    assert c["tpf"] == pytest.approx((40 + 60) / (10 + 60))    # ratio of sums
    assert c["tps"] == pytest.approx((40 + 60) / (1.0 + 6.0))
    # a group without an aggregate accuracy is shown as its subtasks
    del res["results"]["grp"]["exact_match,custom-extract"]
    (tmp_path / "results_g.json").write_text(json.dumps(res))
    rows, tasks = report.build([tmp_path])
    assert tasks == ["grp_a", "grp_b"] and rows[0].cells["grp_b"]["nfe"] == 20


def test_plot_and_console_script(runs, tmp_path):
    pytest.importorskip("matplotlib")
    png = tmp_path / "pareto.png"
    proc = subprocess.run([str(Path(sys.executable).parent / "pvf-report"), str(runs), "--format", "markdown",
                           "--plot", "accuracy-nfe", str(png)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("| model |") and png.stat().st_size > 1000
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bad_input_is_a_clean_error(tmp_path, capsys):
    assert report.main([str(tmp_path)]) == 2
    assert "no results_*.json" in capsys.readouterr().err
    (tmp_path / "results_bad.json").write_text("{not json")
    assert report.main([str(tmp_path / "results_bad.json")]) == 2
