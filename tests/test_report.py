"""``pvf-report`` on small real runs (tiny-llada, arith) and the regression gate CI relies on.

The runs go through lm-eval's evaluator and its ``EvaluationTracker`` exactly as the CLI's
``--output_path ... --log_samples`` does (in this process, with a task index without the
built-ins, to keep the test fast); the report must read that layout as written.
"""

from __future__ import annotations

import copy
import csv
import io
import json
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.prerequisites import require_bundled_weights, require_module

from pvf_lmeval.cli import report
from pvf_lmeval.cli.report import gate

REPO = Path(__file__).resolve().parent.parent
FIXTURE = REPO / "pvf_lmeval" / "fixtures" / "tiny-llada"
MODEL = "tiny-llada"
LIMIT = 4
GEN = "gen_length=64,block_length=32"


def _evaluate(model_args: str, out: Path, task_manager, limit: int = LIMIT, **kwargs) -> None:
    """What `lm_eval --model pvf-dlm --model_args ... --tasks arith --limit N --output_path out
    --log_samples` does (lm_eval/_cli/run.py), minus building the index of built-in tasks."""
    from lm_eval import simple_evaluate
    from lm_eval.loggers import EvaluationTracker

    tracker = EvaluationTracker(output_path=str(out))
    results = simple_evaluate(model="pvf-dlm", model_args=model_args, tasks=["arith"], limit=limit,
                              device="cpu", log_samples=True, evaluation_tracker=tracker,
                              task_manager=task_manager, **kwargs)
    samples = results.pop("samples")
    tracker.save_results_aggregated(results=results, samples=samples)
    for task_name in results["configs"]:
        tracker.save_results_samples(task_name=task_name, samples=samples[task_name])


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


@pytest.fixture(scope="module")
def evaluate(monkeypatch_module):
    """``evaluate(model_args, out, **kwargs)`` on one thread, offline."""
    require_bundled_weights("tiny-llada")
    from lm_eval.tasks import TaskManager

    monkeypatch_module.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch_module.setenv("HF_DATASETS_OFFLINE", "1")
    import torch

    tm = TaskManager(include_path=str(REPO / "tasks"), include_defaults=False)

    def run(model_args: str, out: Path, **kwargs) -> Path:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # a model this small only loses from threads on a shared machine
        try:
            _evaluate(model_args, out, tm, **kwargs)
        finally:
            torch.set_num_threads(threads)
        return out

    return run


@pytest.fixture(scope="module")
def runs(tmp_path_factory, evaluate):
    """static and threshold runs, and a second, identical pair (a rerun) in ``rerun/``."""
    root = tmp_path_factory.mktemp("report_runs")
    for decoder in ("static", "threshold"):
        evaluate(f"pretrained={MODEL},decoder={decoder},{GEN}", root / "first" / decoder)
    for decoder in ("static", "threshold"):
        evaluate(f"pretrained={MODEL},decoder={decoder},{GEN}", root / "rerun" / decoder)
    return root


def _results(folder: Path) -> tuple[Path, dict]:
    (path,) = folder.rglob("results_*.json")
    return path, json.loads(path.read_text())


def _row(table, decoder: str, threshold=None):
    (row,) = [r for r in table.rows if r.decoder == decoder
              and (threshold is None or r.threshold == threshold)]
    return row


def test_layout_is_what_the_report_reads(runs):
    for decoder in ("static", "threshold"):
        path, res = _results(runs / "first" / decoder)
        assert path.parent.parent == runs / "first" / decoder  # OUT/<model>/results_<ts>.json
        assert list(path.parent.glob("samples_arith_*.jsonl"))
        assert res["config"]["pvf"]["decoder"] == decoder


def test_rows_columns_errors_and_ratios(runs):
    table = report.build([runs / "first"])
    assert [c.name for c in table.columns] == ["arith"]
    (col,) = table.columns
    assert col.identity == {"task": "arith", "task_version": 1, "num_fewshot": 0, "gen_length": 64}
    assert [(r.model, r.decoder, r.threshold) for r in table.rows] == [
        (MODEL, "static", None), (MODEL, "threshold", 0.9)]   # static reads no threshold
    static, thr = table.rows
    # identical settings but the decoder: no settings label, the shared ones in the footer
    assert static.label == thr.label == "-"
    assert "block_length=32" in table.common and "limit=4" in table.common
    m = {d: _results(runs / "first" / d)[1]["results"]["arith"] for d in ("static", "threshold")}
    for row, d in ((static, "static"), (thr, "threshold")):
        e = row.entries[col.key]
        assert e.acc == pytest.approx(100 * m[d]["exact_match,none"])
        assert e.acc_se == pytest.approx(100 * m[d]["exact_match_stderr,none"])
        assert e.nfe == pytest.approx(m[d]["nfe,none"])
        assert e.branch_rows == pytest.approx(m[d]["branch_rows,none"])
        assert e.tpf == pytest.approx(m[d]["tpf,none"])
        assert e.tps == pytest.approx(m[d]["tps,none"])
        assert e.n == LIMIT and e.acc_metric == "exact_match,none"
        # revocable-commit statistics: read as costs, never offered as an accuracy metric
        assert (e.edits, e.remasks) == (m[d]["edits,none"], m[d]["remasks,none"]) == (0.0, 0.0)
        assert not any(x.startswith(("edits,", "remasks,", "tokens_edit,")) for x in e.metrics)
    assert m["static"]["nfe,none"] == 64.0           # static: one token per call
    assert m["threshold"]["nfe,none"] < 64.0
    ct, cs = thr.cells[col.key], static.cells[col.key]
    assert ct["nfe_speedup_static"] == pytest.approx(m["static"]["nfe,none"] / m["threshold"]["nfe,none"])
    assert ct["tps_speedup_static"] == pytest.approx(m["threshold"]["tps,none"] / m["static"]["tps,none"])
    assert ct["acc_delta_static"] == pytest.approx(100 * (m["threshold"]["exact_match,none"]
                                                          - m["static"]["exact_match,none"]))
    assert ct["acc_delta_se"] == pytest.approx(100 * (m["threshold"]["exact_match_stderr,none"] ** 2
                                                      + m["static"]["exact_match_stderr,none"] ** 2) ** 0.5)
    assert "nfe_speedup_threshold" not in ct and "nfe_speedup_static" not in cs
    assert cs["nfe_speedup_threshold"] == pytest.approx(1 / ct["nfe_speedup_static"])

    md = report.render.render(table, "markdown").splitlines()
    assert md[0].startswith("| model | decoder | thr | settings | arith n | arith acc ± se | arith Δs ± se")
    assert md[2].startswith(f"| {MODEL} | static | — | - | {LIMIT} | ")
    acc = 100 * m["threshold"]["exact_match,none"]
    se = 100 * m["threshold"]["exact_match_stderr,none"]
    assert md[3].startswith(f"| {MODEL} | threshold | 0.9 | - | {LIMIT} | {acc:.2f} ± {se:.2f} | ")
    assert f"{ct['nfe_speedup_static']:.2f}x" in md[3]
    table_csv = list(csv.DictReader(io.StringIO(report.render.render(table, "csv"))))
    assert float(table_csv[1]["arith:nfe_speedup_static"]) == pytest.approx(ct["nfe_speedup_static"], rel=1e-5)
    assert float(table_csv[1]["arith:acc_se"]) == pytest.approx(se, rel=1e-5)
    assert table_csv[0]["arith:nfe_speedup_static"] == "" and table_csv[0]["thr"] == ""
    assert float(table_csv[1]["arith:edits"]) == float(table_csv[1]["arith:remasks"]) == 0.0
    text = report.render.render(table, "text")
    assert "arith" in text.splitlines()[0] and "NFE×s" in text.splitlines()[1]


# ----------------------------------------------------------------------------- identity


def test_few_shot_runs_are_separate_and_explicit_defaults_are_the_same_run(runs, tmp_path, evaluate,
                                                                          capsys):
    # --num_fewshot 2: the same model args, another task variant (never replacing the 0-shot one)
    evaluate(f"pretrained={MODEL},decoder=threshold,{GEN}", tmp_path / "shots", num_fewshot=2)
    # the defaults spelled out: threshold=0.9 and seed=1234 (lm-eval's --seed for torch, which
    # draws without a seed model arg) are what the first run applied
    evaluate(f"pretrained={MODEL},decoder=threshold,{GEN},threshold=0.9,seed=1234,cache=none",
             tmp_path / "explicit")
    table = report.build([runs / "first" / "threshold", tmp_path / "shots", tmp_path / "explicit"])
    assert sorted(c.name for c in table.columns) == ["arith [num_fewshot=0]", "arith [num_fewshot=2]"]
    assert _results(tmp_path / "shots")[1]["n-shot"]["arith"] == 2
    (row,) = table.rows                                     # one run identity
    assert len(row.entries) == 2
    # the explicit-defaults run and the first run are one identity: the newer kept, said out loud
    (note,) = table.notes
    explicit, _ = _results(tmp_path / "explicit")
    assert note.startswith("2 runs of tiny-llada threshold / arith") and f"kept the newest ({explicit}" in note
    capsys.readouterr()
    assert report.main([str(runs / "first" / "threshold"), str(tmp_path / "explicit")]) == 0
    assert "note: 2 runs of tiny-llada threshold / arith" in capsys.readouterr().err


def test_a_task_decoded_under_another_preset_is_another_row(tmp_path, evaluate, capsys):
    """``--gen_kwargs preset=none`` turns arith's preset off for its requests: the run's
    parameters are the same, the task's decoding is not (``reveal_next`` 0, not 5). Two rows,
    and the gate does not compare one with the other."""
    evaluate(f"pretrained={MODEL},decoder=pvf,{GEN}", tmp_path / "preset")
    evaluate(f"pretrained={MODEL},decoder=pvf,{GEN}", tmp_path / "none", gen_kwargs="preset=none")
    assert _results(tmp_path / "preset")[1]["config"]["pvf"]["task_params"]["arith"][
        "reveal_next"] == 5
    table = report.build([tmp_path / "preset", tmp_path / "none"])
    assert not table.notes
    assert sorted(r.label for r in table.rows) == ["reveal_next=0", "reveal_next=5"]
    base = tmp_path / "baseline.json"
    assert report.main([str(tmp_path / "preset"), "--save-baseline", str(base)]) == 0
    capsys.readouterr()
    # found in a folder, a result the baseline does not hold is invalid input
    assert report.main([str(tmp_path / "none"), "--check", str(base)]) == 3
    err = capsys.readouterr().err
    assert "is not in the baseline" in err and "reveal_next: 5 -> 0" in err
    # named, it is noted; the baseline's result has no counterpart (4 items: --allow-blind)
    none_file, _ = _results(tmp_path / "none")
    assert report.main([str(none_file), "--check", str(base), "--allow-blind"]) == 1
    err = capsys.readouterr().err
    assert "not in the baseline: tiny-llada pvf / arith" in err and "reveal_next=0" in err


def test_freedave_row_shows_no_threshold_it_does_not_read():
    params = {"decoder": "freedave", "gen_length": 64, "block_length": 32, "threshold": 0.9,
              "factor": None, "steps": None, "temperature": 0.0, "early_stop": True, "seed": 0,
              "draft_steps": 4, "base_rule": "static", "plan_lo": 0.2, "plan_hi": 0.65,
              "ar_lo": 0.1, "width": 3, "reveal_next": 0, "routes": "plan+ar", "plan_self_check": False,
              "pick": "random", "band": [0.2, 0.6], "cache": "none", "preset": None}
    from pvf_lmeval.lmeval.identity import decoding_identity

    ident = decoding_identity("freedave", params)
    assert ident == {"base_rule": "static", "block_length": 32, "cache": "none", "draft_steps": 4,
                     "early_stop": True, "gen_length": 64, "seed": 0, "temperature": 0}
    assert decoding_identity("freedave", dict(params, threshold=0.5)) == ident
    with_rule = decoding_identity("freedave", dict(params, base_rule="threshold"))
    assert with_rule["threshold"] == 0.9
    pvf = decoding_identity("pvf", dict(params, decoder="pvf", band="0.2:0.6"))
    assert pvf["plan_hi"] == 0.65 and "band" not in pvf and "draft_steps" not in pvf
    # a planning vocabulary found by vocab=auto is named by its file, not by this checkout's path
    from pvf_lmeval.lmeval.identity import run_identity

    res = {"config": {"model": "pvf-dlm", "model_args": {}, "pvf": {
        "pretrained": "m", "decoder": "pvf", "params": dict(params, decoder="pvf"),
        "vocab": "auto:/home/ci/clone/vocab_artifacts/m.math-word.calibrated.json"}}}
    assert run_identity(res)["vocab"] == "auto:m.math-word.calibrated.json"
    # likelihood tasks are scored with mc_num Monte Carlo draws: part of their identity only
    from pvf_lmeval.lmeval.identity import task_identity

    res["config"]["pvf"]["likelihood"] = {"mc_num": 64, "mc_batch": 32}
    res["configs"] = {"arc_easy": {"output_type": "multiple_choice"},
                      "arith": {"output_type": "generate_until"}}
    assert task_identity(res, "arc_easy", None, {})["mc_num"] == 64
    assert "mc_num" not in task_identity(res, "arith", None, {})


# ----------------------------------------------------------------------------- the gate


def test_gate_passes_identical_reruns_and_fails_on_a_missing_baseline_row(runs, tmp_path, evaluate,
                                                                          capsys):
    base = tmp_path / "baseline.json"
    assert report.main([str(runs / "first"), "--save-baseline", str(base)]) == 0
    saved = json.loads(base.read_text())
    assert saved["pvf_report_baseline"] == 3 and len(saved["entries"]) == 2
    # a rerun of the same commands: tokens/s differ (not checked by default), the rest must pass;
    # but on 4 items no accuracy can fail (the drop the noise bound allows reaches it): said,
    # and refused unless accepted
    capsys.readouterr()
    assert report.main([str(runs / "rerun"), "--check", str(base)]) == 3
    assert "error: the baseline cannot fail on the accuracy of 2 result(s)" in capsys.readouterr().out
    assert report.main([str(runs / "rerun"), "--check", str(base), "--allow-blind"]) == 0
    assert "check passed" in capsys.readouterr().err
    # the settings changed (threshold 0.9 -> 0.5): nothing matches the threshold row
    evaluate(f"pretrained={MODEL},decoder=threshold,{GEN},threshold=0.5", tmp_path / "t05")
    t05, _ = _results(tmp_path / "t05")
    assert report.main([str(runs / "rerun" / "static"), str(t05), "--check", str(base),
                        "--allow-blind"]) == 1
    out = capsys.readouterr().out
    assert "error: 1 baseline result(s) not in these runs" in out
    assert "tiny-llada threshold / arith" in out and "nearest run differs in threshold: 0.9 -> 0.5" in out
    assert report.main([str(runs / "rerun" / "static"), str(t05), "--check", str(base),
                        "--allow-missing", "--allow-blind"]) == 0
    # found in a folder rather than named, a result the baseline does not hold is invalid input
    capsys.readouterr()
    assert report.main([str(runs / "rerun" / "static"), str(tmp_path / "t05"), "--check", str(base),
                        "--allow-missing", "--allow-blind"]) == 3
    assert capsys.readouterr().err.startswith(f"pvf-report: --check: {t05}: tiny-llada threshold / arith [")
    # an old baseline (rows matched by a settings string) is refused, not half-used
    (tmp_path / "v1.json").write_text(json.dumps({"pvf_report_baseline": 1, "rows": []}))
    assert report.main([str(runs / "first"), "--check", str(tmp_path / "v1.json")]) == 3
    assert "write it again with --save-baseline" in capsys.readouterr().err


def test_gate_fails_on_a_real_accuracy_drop_and_nfe_rise(evaluate, tmp_path, capsys):
    """The same command after the checkpoint changed (here: its weights damaged) is a regression."""
    from safetensors.torch import load_file, save_file
    import torch

    model = tmp_path / "model"
    shutil.copytree(FIXTURE, model)
    # arith's own gen length: its answers run to 70 tokens under the fixtures' joint
    # BPE, so 64 would cut some of them off and the intact model would score too low to compare
    args = f"pretrained={model},decoder=threshold,gen_length=96,block_length=32"
    evaluate(args, tmp_path / "good", limit=16, batch_size=16)
    base = tmp_path / "base.json"
    assert report.main([str(tmp_path / "good"), "--save-baseline", str(base)]) == 0
    weights = load_file(model / "model.safetensors")
    gen = torch.Generator().manual_seed(0)
    save_file({k: v + 2.0 * v.std() * torch.randn(v.shape, generator=gen) if v.numel() > 1 else v
               for k, v in weights.items()}, model / "model.safetensors")
    evaluate(args, tmp_path / "damaged", limit=16, batch_size=16)
    (good,) = report.build([tmp_path / "good"]).rows
    (bad,) = report.build([tmp_path / "damaged"]).rows
    g, b = next(iter(good.entries.values())), next(iter(bad.entries.values()))
    assert g.acc - b.acc > 2 * (g.acc_se ** 2 + b.acc_se ** 2) ** 0.5 and b.nfe > g.nfe
    bad, missing, _ = gate.check(report.build([tmp_path / "damaged"]), json.loads(base.read_text()))
    assert [r[1:4] for r in bad] == [["acc", f"{g.acc:.2f}", f"{b.acc:.2f}"],
                                     ["nfe", f"{g.nfe:.2f}", f"{b.nfe:.2f}"],
                                     ["branch_rows", f"{g.branch_rows:.2f}", f"{b.branch_rows:.2f}"]]
    assert missing == []
    capsys.readouterr()
    assert report.main([str(tmp_path / "damaged"), "--check", str(base)]) == 1
    assert "3 regression(s)" in capsys.readouterr().out
    # a tolerance wider than the drop lets it pass (the z rule alone does not fail it), once
    # the user accepts an accuracy check that cannot fail
    assert report.main([str(tmp_path / "damaged"), "--check", str(base), "--acc-tol", "100",
                        "--cost-tol", "100"]) == 3
    assert report.main([str(tmp_path / "damaged"), "--check", str(base), "--acc-tol", "100",
                        "--cost-tol", "100", "--allow-blind"]) == 0


# ----------------------------------------------------------------------------- other sources


def test_runs_without_statistics_give_empty_cost_cells(runs, tmp_path):
    _, res = _results(runs / "first" / "threshold")
    stripped = copy.deepcopy(res)
    arith = stripped["results"]["arith"]
    for key in list(arith):
        if key.split(",")[0].replace("_stderr", "") in ("nfe", "gen_tokens", "wall_s", "tpf", "tps",
                                                        "branch_rows", "committed", "gen_length") \
                or key.startswith("tokens_"):
            del arith[key]
    pvf = stripped["config"].pop("pvf")
    (tmp_path / "stripped").mkdir()
    (tmp_path / "stripped" / "results_2026-01-01T00-00-00.json").write_text(json.dumps(stripped))
    table = report.build([tmp_path / "stripped"])
    (row,) = table.rows
    (e,) = row.entries.values()
    assert e.acc == pytest.approx(100 * res["results"]["arith"]["exact_match,none"])
    assert e.nfe is None and e.tpf is None and e.tps is None and e.cost_source is None
    assert row.decoder == "threshold" and row.model == MODEL  # from model_args without config.pvf
    assert report.main([str(tmp_path / "stripped"), "--format", "csv"]) == 0

    # a built-in task run: no cost metrics, but config.pvf.totals -> same costs as the metrics
    stripped["config"]["pvf"] = pvf
    (tmp_path / "totals").mkdir()
    (tmp_path / "totals" / "results_x.json").write_text(json.dumps(stripped))
    (row,) = report.build([tmp_path / "totals"]).rows
    (e,) = row.entries.values()
    assert e.cost_source == "totals"
    assert e.nfe == pytest.approx(res["results"]["arith"]["nfe,none"])
    assert e.tpf == pytest.approx(res["results"]["arith"]["tpf,none"])
    assert e.identity["gen_length"] == 64

    # another model type (--model hf): decoder column "hf", NaN costs from the pvf task YAMLs
    hf = copy.deepcopy(res)
    hf["config"] = {"model": "hf", "model_args": "pretrained=gpt2,dtype=float32", "limit": 4.0}
    for key in hf["results"]["arith"]:
        if key.startswith(("nfe,", "tpf,", "tps,")):
            hf["results"]["arith"][key] = float("nan")
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "results_y.json").write_text(json.dumps(hf))
    table = report.build([tmp_path / "hf", runs / "first"])
    hf_row = _row(table, "hf")
    assert hf_row.model == "gpt2" and hf_row.identity["dtype"] == "float32"
    assert all(e.nfe is None for e in hf_row.entries.values())
    assert all("nfe_speedup_static" not in c for c in hf_row.cells.values())


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
    table = report.build([tmp_path])
    assert [c.task for c in table.columns] == ["grp"]
    (e,) = table.rows[0].entries.values()
    assert e.acc == 50.0 and e.n == 4
    assert e.acc_se == pytest.approx(100 * (0.25 / 3) ** 0.5)   # 0/1 scores: from the mean and n
    assert e.nfe == pytest.approx((10 + 60) / 4)
    assert e.tpf == pytest.approx((40 + 60) / (10 + 60))    # ratio of sums
    assert e.tps == pytest.approx((40 + 60) / (1.0 + 6.0))
    # a group without an aggregate accuracy is shown as its subtasks
    del res["results"]["grp"]["exact_match,custom-extract"]
    (tmp_path / "results_g.json").write_text(json.dumps(res))
    table = report.build([tmp_path])
    assert [c.task for c in table.columns] == ["grp_a", "grp_b"]
    assert table.rows[0].entries[table.columns[1].key].nfe == 20


# ----------------------------------------------------------------------------- plot and CLI


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_plot_has_error_bars_and_labels_that_do_not_overlap(runs, tmp_path):
    require_module("matplotlib", "plot", "pip install -e .[plot]")
    from pvf_lmeval.cli.report import plot

    # thresholds 0.9 and 0.89 lie on top of each other: their labels must not
    first = _results(runs / "first" / "threshold")[1]
    near = copy.deepcopy(first)
    near["config"]["pvf"]["params"]["threshold"] = 0.89
    near["results"]["arith"]["nfe,none"] *= 1.01
    (tmp_path / "near").mkdir()
    (tmp_path / "near" / "results_near.json").write_text(json.dumps(near))
    table = report.build([runs / "first", tmp_path / "near"])
    info = plot.plot(table, "accuracy-nfe", str(tmp_path / "p.png"), log_x=True)
    assert _png_size(info.path) == info.size == (780, 572)
    assert info.path.stat().st_size > 20_000
    assert info.errorbars == 3                        # every run: static, threshold 0.9 and 0.89
    assert sorted(t for t, _ in info.labels) == ["0.89", "0.9"]   # static reads no threshold
    (_, a), (_, b) = info.labels
    assert not plot._overlap(a, b)
    assert plot.decoder_color("pvf") == "#d62728" and plot.decoder_color("threshold") == "#1f77b4"


def test_console_script(runs, tmp_path):
    require_module("matplotlib", "plot", "pip install -e .[plot]")
    png = tmp_path / "pareto.png"
    exe = str(Path(sys.executable).parent / "pvf-report")
    proc = subprocess.run([exe, str(runs / "first"), "--format", "markdown",
                           "--plot", "accuracy-nfe", str(png)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("| model |") and png.stat().st_size > 1000
    # a bad plot kind is an error before anything is printed
    proc = subprocess.run([exe, str(runs / "first"), "--plot", "bogus", str(png)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip() == ("pvf-report: --plot 'bogus': KIND must be one of accuracy-nfe, "
                                   "accuracy-tps, accuracy-tpf")
    proc = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=120)
    assert "acc (%) ± standard error" in proc.stdout and "%%" not in proc.stdout


def test_bad_input_is_a_clean_error(tmp_path, capsys):
    assert report.main([str(tmp_path)]) == 2
    assert "no results_*.json" in capsys.readouterr().err
    (tmp_path / "results_bad.json").write_text("{not json")
    assert report.main([str(tmp_path / "results_bad.json")]) == 3
    assert report.main([str(tmp_path), "--z", "-1"]) == 2
    assert capsys.readouterr().err.strip().endswith("--z=-1.0 must be a finite number >= 0")
