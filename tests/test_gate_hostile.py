"""The regression gate (``pvf-report --check``) against results files and baselines written by
someone who wants a regression to pass: every field the checked file states about itself
(standard error, sample count, date, a second copy, a missing or NaN metric, impossible costs)
is forged, and the gate must not pass. A property test builds such pairs at random
(derandomized, bounded) and asserts that none with a true accuracy drop beyond the noise
bound passes, and that an honest rerun inside it does. The noise bound is computed here from
its definition in docs/reports.md, not by the gate's code."""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings, strategies as st

from pvf_lmeval.cli import report

PASSED, REGRESSION, USAGE, INVALID = 0, 1, 2, 3
#: the metrics scored 0 or 1 per item whose noise follows from the accuracy and n
BINARY = [("exact_match", "strict-match"), ("exact_match", "none"), ("acc", "none"),
          ("pass@1", "create_test")]
#: other metrics: the noise is the standard error the baseline recorded
OTHER = [("f1", "none"), ("prompt_level_strict_acc", "none")]


def results(acc, *, metric="exact_match", filt="strict-match", se=None, n=200, nfe=10.0,
            rows=30.0, date=None, task="gsm8k", extra=None, params=None, totals=None) -> dict:
    """An lm-eval results dict of one pvf-dlm run on ``task`` (``acc`` a fraction; ``se``,
    ``n``, ``date``: what the file states; ``extra``: more metric keys; ``params``: decoding
    parameters other than the defaults here; ``totals``: ``config.pvf.totals`` of the task)."""
    params = {"threshold": 0.9, "gen_length": 256, "block_length": 32, **(params or {})}
    res = {"alias": task, "nfe,none": nfe, "branch_rows,none": rows, "tpf,none": 3.0,
           "tps,none": 50.0, "gen_length,none": params["gen_length"]}
    if acc is not _ABSENT:
        res[f"{metric},{filt}"] = acc
    if se is not None:
        res[f"{metric}_stderr,{filt}"] = se
    res.update(extra or {})
    r = {"results": {task: res}, "versions": {task: 3}, "n-shot": {task: 0},
         "config": {"model": "pvf-dlm", "model_args": "pretrained=m", "limit": None,
                    "pvf": {"decoder": "threshold", "pretrained": "m", "dtype": "float32",
                            "params": params}}}
    if totals is not None:
        r["config"]["pvf"]["totals"] = {task: totals}
    if n is not None:
        r["n-samples"] = {task: {"original": n, "effective": n}}
    if date is not None:
        r["date"] = date
    return r


_ABSENT = object()


def write(folder: Path, r: dict, stamp: str = "2026-01-01T00-00-00") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"results_{stamp}.json").write_text(json.dumps(r))
    return folder


def save(tmp: Path, r: dict, *options) -> Path:
    base = tmp / "base.json"
    assert report.main([str(write(tmp / "good", r)), "--save-baseline", str(base), *options]) == 0
    return base


def check(now: Path, base: Path, *options) -> int:
    return report.main([str(now), "--check", str(base), *options])


# ----------------------------------------------------------------------------- one forgery each


def test_a_run_without_a_known_accuracy_metric_is_refused_at_save_time(tmp_path, capsys):
    r = results(0.825, metric="prompt_level_strict_acc", filt="none", task="ifeval",
                extra={"inst_level_strict_acc,none": 0.87, "prompt_level_strict_acc_stderr,none": 0.02})
    write(tmp_path / "good", r)
    base = tmp_path / "base.json"
    assert report.main([str(tmp_path / "good"), "--save-baseline", str(base)]) == USAGE
    assert not base.exists()
    err = capsys.readouterr().err.splitlines()[-1]
    assert err.startswith("pvf-report: --save-baseline: m threshold / ifeval [")
    assert err.endswith("has no accuracy metric pvf-report knows (its metrics: "
                        "prompt_level_strict_acc,none, inst_level_strict_acc,none); name one with "
                        "--metric ifeval=METRIC,FILTER")
    # named, it is saved and checked: 82.5% -> 10% fails
    base = save(tmp_path, r, "--metric", "ifeval=prompt_level_strict_acc,none")
    assert json.loads(base.read_text())["entries"][0]["acc"] == 82.5
    now = write(tmp_path / "now", {**r, "results": {"ifeval": {
        **r["results"]["ifeval"], "prompt_level_strict_acc,none": 0.10}}})
    assert check(now, base, "--metric", "ifeval=prompt_level_strict_acc,none") == REGRESSION


def test_the_baseline_metric_and_filter_are_compared(tmp_path, capsys):
    good = results(0.825, extra={"exact_match,flexible-extract": 0.85})
    base = save(tmp_path, good)
    # the preferred filter is NaN in the checked file: invalid input, never another filter
    lost = results(float("nan"), extra={"exact_match,flexible-extract": 0.85})
    capsys.readouterr()
    assert check(write(tmp_path / "nan", lost), base) == INVALID
    assert capsys.readouterr().err.endswith(
        "gsm8k: exact_match,strict-match = nan is not a finite number (no other field stands in "
        "for it)\n")
    # another metric asked for at check time
    bad = results(0.30, extra={"exact_match,flexible-extract": 0.85})
    assert check(write(tmp_path / "other", bad), base,
                 "--metric", "exact_match,flexible-extract") == REGRESSION
    # the metric gone altogether
    gone = results(_ABSENT)
    assert check(write(tmp_path / "gone", gone), base) == REGRESSION
    assert "exact_match,strict-match  missing" in capsys.readouterr().out
    assert check(write(tmp_path / "same", good), base) == PASSED


def test_the_checked_files_own_standard_error_does_not_widen_the_allowed_drop(tmp_path, capsys):
    base = save(tmp_path, results(0.825, se=0.02))
    capsys.readouterr()
    assert check(write(tmp_path / "now", results(0.30, se=5.0)), base) == REGRESSION
    # n = 200, p = 0.825: one run's se sqrt(.825 * .175 / 199) = 2.69 points; two runs' 3.81,
    # z = 2: 7.62 points
    assert "-52.50 pts  -1 pts and -2 se (7.62 pts)" in capsys.readouterr().out
    assert check(write(tmp_path / "in", results(0.825 - 0.0761)), base) == PASSED
    assert check(write(tmp_path / "out", results(0.825 - 0.0763)), base) == REGRESSION


def test_another_sample_count_fails(tmp_path, capsys):
    base = save(tmp_path, results(0.825))
    capsys.readouterr()
    assert check(write(tmp_path / "now", results(0.825, n=20)), base) == REGRESSION
    assert "n       200       20           the same" in capsys.readouterr().out
    assert check(write(tmp_path / "none", results(0.825, n=None)), base) == REGRESSION


def test_a_result_of_another_identity_found_beside_the_baselines_own_file_is_invalid_input(
        tmp_path, capsys):
    """The baseline's own results file left in the folder beside a regressed run whose setting
    changed: the old file matches the baseline, the new one nothing, and the gate would pass."""
    good = results(0.825)
    base = save(tmp_path, good)
    now = tmp_path / "now"
    old, new = now / "results_2026-01-01T00-00-00.json", now / "results_2026-02-01T00-00-00.json"
    write(now, good, "2026-01-01T00-00-00")
    write(now, results(0.10, params={"gen_length": 128}), "2026-02-01T00-00-00")
    capsys.readouterr()
    assert check(now, base) == INVALID
    err = capsys.readouterr().err
    assert err.startswith(f"pvf-report: --check: {new}: m threshold / gsm8k [")
    assert err.endswith("] is not in the baseline (the nearest baseline result differs in "
                        "gen_length: 256 -> 128): the gate would not check it; pass only the runs "
                        "to check, or name its results file to check the others beside it\n")
    assert err.count("\n") == 1
    # named, the file is the user's choice: a note says it is not checked
    assert report.main([str(old), str(new), "--check", str(base)]) == PASSED
    err = capsys.readouterr().err
    assert "pvf-report: note: not in the baseline: m threshold / gsm8k [" in err
    # alone, the regressed run matches no baseline result: the gate fails
    assert report.main([str(new), "--check", str(base)]) == REGRESSION
    # a result of another task in the folder is one the baseline cannot check either
    other = tmp_path / "other"
    write(other, good, "2026-01-01T00-00-00")
    write(other, results(0.10, task="math500"), "2026-02-01T00-00-00")
    capsys.readouterr()
    assert check(other, base) == INVALID
    err = capsys.readouterr().err
    assert err.startswith(f"pvf-report: --check: {other / 'results_2026-02-01T00-00-00.json'}: "
                          f"m threshold / math500 [")
    assert err.endswith("] is not in the baseline: the gate would not check it; pass only the "
                        "runs to check, or name its results file to check the others beside it\n")


_NAN, _INF = float("nan"), float("inf")


def _set(key, value):
    def change(r):
        r["results"]["gsm8k"][key] = value
    return change


def _totals_only(key, value):
    """No cost metrics (a built-in task): the costs come from config.pvf.totals."""
    def change(r):
        res = r["results"]["gsm8k"]
        for k in ("nfe,none", "branch_rows,none", "tpf,none", "tps,none", "gen_length,none"):
            del res[k]
        r["config"]["pvf"]["totals"]["gsm8k"][key] = value
    return change


@pytest.mark.parametrize("change, key, shown", [
    (_set("nfe,none", _NAN), "nfe,none", "nan"),
    (_set("nfe,none", _INF), "nfe,none", "inf"),
    (_set("nfe,none", "nan"), "nfe,none", "'nan'"),
    (_set("nfe,none", None), "nfe,none", "None"),
    (_set("branch_rows,none", -_INF), "branch_rows,none", "-inf"),
    (_set("tps,none", _NAN), "tps,none", "nan"),
    (_set("gen_length,none", _NAN), "gen_length,none", "nan"),
    (_set("exact_match,strict-match", _NAN), "exact_match,strict-match", "nan"),
    (_set("exact_match,strict-match", "x"), "exact_match,strict-match", "'x'"),
    (_totals_only("nfe", _NAN), "config.pvf.totals.gsm8k.nfe", "nan"),
    (_totals_only("requests", _INF), "config.pvf.totals.gsm8k.requests", "inf"),
])
def test_a_metric_that_is_not_a_finite_number_is_invalid_input_never_replaced(
        tmp_path, capsys, change, key, shown):
    """A NaN NFE once fell back to the file's own config.pvf.totals (and a NaN accuracy to
    another filter): a value the run could not have written is refused, whatever else the file
    offers in its place."""
    totals = {"requests": 200, "nfe": 10.0, "branch_rows": 30.0, "gen_tokens": 600.0,
              "wall_s": 12.0, "gen_length": 256}
    base = save(tmp_path, results(0.825, totals=totals))
    now = results(0.825, totals=totals, extra={"exact_match,flexible-extract": 0.825})
    change(now)
    folder = write(tmp_path / "now", now)
    path = next(folder.glob("results_*.json"))
    capsys.readouterr()
    for argv in ([str(folder), "--check", str(base)], [str(folder)]):
        assert report.main(argv) == INVALID
        assert capsys.readouterr().err == (f"pvf-report: {path}: gsm8k: {key} = {shown} is not "
                                           f"a finite number (no other field stands in for it)\n")


@pytest.mark.parametrize("choice", ["exact_match,flexible-extract",
                                    "gsm8k=exact_match,flexible-extract"])
def test_a_named_metric_that_is_not_a_finite_number_is_invalid_input(tmp_path, capsys, choice):
    """``--metric`` names a filter the file states as NaN: neither the preferred metric nor
    another filter stands in for it."""
    good = results(0.825, extra={"exact_match,flexible-extract": 0.85})
    base = save(tmp_path, good, "--metric", choice)
    lost = results(0.825, extra={"exact_match,flexible-extract": float("nan")})
    folder = write(tmp_path / "now", lost)
    capsys.readouterr()
    for argv in ([str(folder), "--check", str(base)], [str(folder)]):
        assert report.main([*argv, "--metric", choice]) == INVALID
        assert capsys.readouterr().err == (
            f"pvf-report: {next(folder.glob('results_*.json'))}: gsm8k: "
            "exact_match,flexible-extract = nan is not a finite number (no other field stands in "
            "for it)\n")


def test_nan_costs_of_another_model_type_are_no_statistics(tmp_path, capsys):
    """The pvf task YAMLs give NaN costs to a model without statistics (--model hf): empty
    cost cells, not invalid input; a pvf-dlm run has statistics for every request."""
    r = results(0.5, nfe=_NAN, rows=_NAN, extra={"tpf,none": _NAN, "tps,none": _NAN})
    r["config"] = {"model": "hf", "model_args": "pretrained=gpt2", "limit": None}
    write(tmp_path / "hf", r)
    (row,) = report.build([tmp_path / "hf"]).rows
    (e,) = row.entries.values()
    assert (row.decoder, e.acc, e.nfe, e.branch_rows, e.tpf, e.tps) == ("hf", 50.0, None, None,
                                                                        None, None)
    assert report.main([str(tmp_path / "hf")]) == PASSED


def test_a_baseline_too_small_to_fail_says_so_and_is_refused_unless_accepted(tmp_path, capsys):
    # 8 items at 50%: one run's se sqrt(.5 * .5 / 7) = 18.90 points, the difference of two runs'
    # 26.73; z = 2: the gate allows a drop of 53.45 points, more than the 50 there are to lose
    base = save(tmp_path, results(0.5, n=8))
    zero = write(tmp_path / "zero", results(0.0, n=8))
    capsys.readouterr()
    assert check(zero, base) == INVALID
    out = capsys.readouterr().out.split("\n\n")[-1]
    head, line, end = out.split("\n")
    assert head == ("pvf-report: error: the baseline cannot fail on the accuracy of 1 result(s): "
                    "the drop it allows reaches the accuracy, so that a result of 0 passes (more "
                    "items, a smaller --z or --acc-tol, or --allow-blind to accept it):")
    assert line.startswith("  m threshold / gsm8k [")
    assert line.endswith("]: accuracy 50.00, allowed drop 53.45 pts")
    assert end == ""
    # accepted: said on stdout, and the rest of the check runs (the NFE rose)
    assert check(zero, base, "--allow-blind") == PASSED
    assert capsys.readouterr().out.split("\n\n")[-1].startswith(
        "pvf-report: note: the baseline cannot fail on the accuracy of 1 result(s): ")
    risen = write(tmp_path / "risen", results(0.0, n=8, nfe=12.0))
    assert check(risen, base, "--allow-blind") == REGRESSION
    # greedy decoding reruns exactly: without the z rule, 8 items fail on one item lost
    assert check(write(tmp_path / "one", results(0.375, n=8)), base, "--z", "0") == REGRESSION
    assert check(write(tmp_path / "same", results(0.5, n=8)), base, "--z", "0") == PASSED
    # a tolerance as large as the accuracy, or an accuracy of 0, cannot fail either
    assert check(write(tmp_path / "t", results(0.5, n=8)), base, "--z", "0",
                 "--acc-tol", "50") == INVALID
    nothing = save(tmp_path / "b0", results(0.0, n=1000))
    assert check(write(tmp_path / "z", results(0.0, n=1000)), nothing) == INVALID


@pytest.mark.parametrize("nfe, rows, message", [
    (-50.0, 30.0, "nfe = -50.0 is below 1"), (0.0, 30.0, "nfe = 0.0 is below 1"),
    (10.0, 0.0, "branch_rows = 0.0 is below 1"), (10.0, -3.0, "branch_rows = -3.0 is below 1"),
])
def test_impossible_costs_are_invalid_input(tmp_path, capsys, nfe, rows, message):
    base = save(tmp_path, results(0.825))
    now = write(tmp_path / "now", results(0.825, nfe=nfe, rows=rows))
    capsys.readouterr()
    assert check(now, base) == INVALID
    path = next(now.glob("results_*.json"))
    assert capsys.readouterr().err == (f"pvf-report: {path}: gsm8k: {message} (every request makes "
                                       f"at least one model call of at least one row)\n")


@pytest.mark.parametrize("acc", [1.5, -0.1])
def test_a_share_of_items_outside_zero_one_is_invalid_input(tmp_path, capsys, acc):
    now = write(tmp_path / "now", results(acc))
    assert report.main([str(now)]) == INVALID
    assert capsys.readouterr().err.endswith(
        f"gsm8k: exact_match,strict-match = {acc!r} is not a share of items in [0, 1]\n")


def test_two_runs_of_one_identity_are_refused_whatever_their_dates(tmp_path, capsys):
    base = save(tmp_path, results(0.825))
    now = tmp_path / "now"
    write(now, results(0.825, date=4102444800.0), "2025-01-01T00-00-00")     # dated 2100
    write(now, results(0.10, date=1.8e9), "2027-01-01T00-00-00")
    capsys.readouterr()
    assert check(now, base) == USAGE
    err = capsys.readouterr().err.splitlines()[-1]
    assert err.startswith("pvf-report: --check: 2 results of m threshold / gsm8k [")
    assert err.endswith("the gate takes one result per run: pass only the run to compare")
    assert report.main([str(now), "--save-baseline", str(tmp_path / "b2.json")]) == USAGE
    assert report.main([str(now)]) == PASSED            # a leaderboard keeps the newest, noted


@pytest.mark.parametrize("change, message", [
    (lambda b: b.update(entries=[]), "the baseline holds no results (it would pass any run)"),
    (lambda b: b["entries"][0].update(acc=None), "baseline entry 1: acc=None must be a finite "
                                                 "number in [0, 100]"),
    (lambda b: b["entries"][0].update(acc=True), "baseline entry 1: acc=True must be a finite "
                                                 "number in [0, 100]"),
    (lambda b: b["entries"][0].update(acc="82.5"), "baseline entry 1: acc='82.5' must be a finite "
                                                   "number in [0, 100]"),
    (lambda b: b["entries"][0].update(acc=float("nan")), "baseline entry 1: acc=nan must be a "
                                                         "finite number in [0, 100]"),
    (lambda b: b["entries"][0].update(acc=150.0), "baseline entry 1: acc=150.0 must be a finite "
                                                  "number in [0, 100]"),
    (lambda b: b["entries"][0].update(acc_metric=None), "baseline entry 1: acc_metric=None must "
                                                        "be METRIC,FILTER"),
    (lambda b: b["entries"][0].update(n=0), "baseline entry 1: n=0 must be a positive integer "
                                            "or null"),
    (lambda b: b["entries"][0].update(nfe=-50.0), "baseline entry 1: nfe=-50.0 must be a finite "
                                                  "number >= 1 or null"),
    (lambda b: b["entries"][0].update(branch_rows=0), "baseline entry 1: branch_rows=0 must be a "
                                                      "finite number >= 1 or null"),
    (lambda b: b["entries"][0].update(acc_se=-1), "baseline entry 1: acc_se=-1 must be a finite "
                                                  "number >= 0 or null"),
    (lambda b: b["entries"][0].update(tps_ratio={"threshold": "x"}),
     "baseline entry 1: tps_ratio={'threshold': 'x'} must map reference decoders to positive "
     "numbers"),
    (lambda b: b["entries"].append(b["entries"][0]), "baseline entry 2: a second result of the "
                                                     "same identity"),
    (lambda b: b["entries"].append(7), "baseline entry 2: 7 is not an object"),
    (lambda b: b["entries"][0].update(identity={"task": "gsm8k"}),
     "baseline entry 1: identity must be an object naming the model, decoder and task"),
])
def test_a_baseline_that_would_check_nothing_is_invalid_input(tmp_path, capsys, change, message):
    base = save(tmp_path, results(0.825))
    data = json.loads(base.read_text())
    change(data)
    base.write_text(json.dumps(data))
    capsys.readouterr()
    assert check(write(tmp_path / "now", results(0.10)), base) == INVALID
    assert capsys.readouterr().err == (f"pvf-report: --check: {message}; write the baseline again "
                                       "with --save-baseline\n" if "entry" in message else
                                       f"pvf-report: --check: {message}; write it again with "
                                       "--save-baseline\n")


@pytest.mark.parametrize("text, message", [
    ("[" * 100_000 + "]" * 100_000, "not a readable JSON baseline (maximum recursion depth exceeded"),
    ("{", "not a readable JSON baseline (Expecting property name enclosed in double quotes"),
    ('{"pvf_report_baseline": 3, "entries": [1]}', "--check: baseline entry 1: 1 is not an object"),
    ("\xff", "not a readable JSON baseline ("),
])
def test_a_malformed_baseline_is_one_line_and_not_a_regression(tmp_path, capsys, text, message):
    now = write(tmp_path / "now", results(0.5))
    (tmp_path / "b.json").write_bytes(text.encode("latin-1"))
    assert check(now, tmp_path / "b.json") == INVALID
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
def test_results_and_baselines_that_block_or_never_end_are_refused(tmp_path, capsys, kind):
    import os

    def plant(path):
        os.mkfifo(path) if kind == "fifo" else path.symlink_to("/dev/zero")
    what = "a FIFO" if kind == "fifo" else "a character device"
    runs = tmp_path / "runs"
    runs.mkdir()
    plant(runs / "results_x.json")
    assert report.main([str(runs)]) == INVALID
    assert capsys.readouterr().err == (f"pvf-report: {runs / 'results_x.json'}: the lm-eval "
                                       f"results file is {what}, not a regular file\n")
    plant(tmp_path / "base.json")
    assert check(write(tmp_path / "now", results(0.5)), tmp_path / "base.json") == INVALID
    assert capsys.readouterr().err == (f"pvf-report: --check {tmp_path / 'base.json'}: the "
                                       f"baseline is {what}, not a regular file\n")


def test_a_deeply_nested_results_file_is_one_line(tmp_path, capsys):
    (tmp_path / "results_x.json").write_text("[" * 100_000 + "]" * 100_000)
    assert report.main([str(tmp_path)]) == INVALID
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "maximum recursion depth exceeded" in err


@pytest.mark.parametrize("option", ["--acc-tol", "--z", "--cost-tol", "--speed-tol"])
@pytest.mark.parametrize("value", ["nan", "inf", "-1"])
def test_gate_options_must_be_finite_and_non_negative(tmp_path, capsys, option, value):
    base = save(tmp_path, results(0.825))
    assert check(write(tmp_path / "now", results(0.10)), base, f"{option}={value}") == USAGE
    assert capsys.readouterr().err.endswith(f"{option}={float(value)} must be a finite number >= 0\n")


def test_a_missing_baseline_file_is_a_usage_error(tmp_path, capsys):
    now = write(tmp_path / "now", results(0.5))
    assert check(now, tmp_path / "none.json") == USAGE
    assert capsys.readouterr().err == f"pvf-report: --check {tmp_path / 'none.json'}: No such file or directory\n"


# ----------------------------------------------------------------------------- the property


def noise_bound(p0: float, n: int, binary: bool, se0: float, acc_tol: float, z: float) -> float:
    """The largest drop (points) that passes: ``acc_tol`` or ``z`` standard errors of the
    difference of two runs of the baseline's size, whichever is larger (docs/reports.md)."""
    one_run = 100 * math.sqrt(p0 * (1 - p0) / max(n - 1, 1)) if binary else 100 * se0
    return max(acc_tol, z * math.sqrt(2) * one_run)


#: what a checked file may state for its own standard error and date, harmless to the gate
JUNK = st.sampled_from([None, 0.0, 5.0, 1e9, float("nan"), float("inf"), -1.0, "x"])
DATES = st.sampled_from([None, 4102444800.0, 0.0, -1.0, float("nan"), "2100"])


@st.composite
def baselines(draw):
    """(results of the baseline run, options naming its metric, its noise in points)."""
    binary = draw(st.booleans())
    metric, filt = draw(st.sampled_from(BINARY if binary else OTHER))
    n = draw(st.integers(1, 5000))
    p0 = draw(st.integers(0, n)) / n if binary else draw(st.floats(0.0, 1.0))
    se0 = draw(st.floats(0.0, 0.2))
    nfe = draw(st.floats(1.0, 500.0))
    rows = nfe * draw(st.floats(1.0, 4.0))
    r = results(p0, metric=metric, filt=filt, se=se0, n=n, nfe=nfe, rows=rows)
    named = metric == "prompt_level_strict_acc" or draw(st.booleans())
    options = ("--metric", f"{metric},{filt}") if named else ()
    return r, options, (p0, n, binary, se0, metric, filt, nfe, rows)


def _decoy(metric: str, filt: str) -> tuple[str, str]:
    """Another accuracy key of the same task a forged file can fill with a good value."""
    return (metric, "flexible-extract") if filt != "flexible-extract" else (metric, "none")


def _run(r_good, save_options, r_now, now_extra, check_options) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        base = tmp / "base.json"
        assert report.main([str(write(tmp / "good", r_good)), "--save-baseline", str(base),
                            *save_options]) == PASSED
        write(tmp / "now", r_now)
        for i, extra in enumerate(now_extra):
            write(tmp / "now", extra, f"2100-01-0{i + 1}T00-00-00")
        return report.main([str(tmp / "now"), "--check", str(base), *check_options])


GATE = settings(derandomize=True, deadline=None, database=None, print_blob=False,
                max_examples=60, suppress_health_check=list(HealthCheck))


#: what a forged checked file does besides its true drop (one per example, so each is tried)
FORGERIES = ("none", "stderr", "n", "date", "stale good copy", "metric lost", "decoy metric",
             "no --metric", "costs", "changed setting")
#: settings a regressed run may have changed, its results left beside the baseline's own file
CHANGES = st.sampled_from([{"gen_length": 128}, {"gen_length": 512}, {"threshold": 0.5},
                           {"block_length": 16}])


@GATE
@given(baselines(), st.sampled_from(FORGERIES), st.data())
def test_no_forged_file_with_a_drop_beyond_the_noise_bound_passes(capsys, base, forgery, data):
    r_good, save_options, (p0, n, binary, se0, metric, filt, nfe, rows) = base
    acc_tol = data.draw(st.sampled_from([0.0, 0.5, 1.0, 3.0]))
    z = data.draw(st.sampled_from([0.0, 1.0, 2.0, 3.0]))
    bound = noise_bound(p0, n, binary, se0, acc_tol, z)
    # the true accuracy now: often just beyond the bound, where a gate too lenient passes it
    excess = data.draw(st.one_of(st.sampled_from([0.01, 0.05, 0.2]), st.floats(0.01, 100.0)))
    assume(100 * p0 - bound - excess >= 0)
    p1 = (100 * p0 - bound - excess) / 100
    decoy = _decoy(metric, filt)
    now = dict(metric=metric, filt=filt, se=se0, n=n, nfe=nfe, rows=rows, extra={})
    value, stale, check_options = p1, [], save_options
    invalid = False                              # the forgery is invalid input, exit 3
    if forgery == "stderr":
        now["se"] = data.draw(st.sampled_from([5.0, 1e9, float("inf"), float("nan"), -1.0, "x"]))
    elif forgery == "n":
        now["n"] = data.draw(st.sampled_from([None, 1, 2, n + 1, 10 ** 9]))
    elif forgery == "date":
        now["date"] = data.draw(st.sampled_from([4102444800.0, 0.0, -1.0, float("nan"), "2100"]))
    elif forgery == "stale good copy":           # the baseline's own file, dated 2100
        stale = [dict(r_good, date=4102444800.0)]
    elif forgery == "metric lost":               # NaN or gone, a good value under another key
        value = data.draw(st.sampled_from([float("nan"), None, "nan", _ABSENT]))
        now["extra"] = {",".join(decoy): p0}
        invalid = value is not _ABSENT           # a value no run writes; gone, it is missing
    elif forgery == "decoy metric":              # the check asks for another key
        now["extra"] = {",".join(decoy): p0}
        check_options = ("--metric", ",".join(decoy))
    elif forgery == "no --metric":
        now["extra"] = {",".join(decoy): p0}
        check_options = ()
    elif forgery == "costs":
        now["nfe"] = data.draw(st.sampled_from([-50.0, 0.0, 0.5, float("nan")]))
        now["rows"] = data.draw(st.sampled_from([0.0, -1.0, rows]))
        invalid = True
    elif forgery == "changed setting":           # the baseline's own file left beside it
        now["params"] = data.draw(CHANGES)
        stale = [r_good]
        invalid = True
    rc = _run(r_good, save_options, results(value, **now), stale,
              [*check_options, "--acc-tol", str(acc_tol), "--z", str(z)])
    capsys.readouterr()
    assert rc != PASSED
    assert (rc == INVALID) == invalid


#: a non-finite cost a forged file states, and the file's other fields that would stand in
NOT_FINITE = st.sampled_from([float("nan"), float("inf"), float("-inf"), "nan", "inf", None])
COST_FORGERIES = ("none", "nfe", "branch_rows", "totals", "totals beside samples")


@GATE
@given(baselines(), st.sampled_from(COST_FORGERIES), NOT_FINITE, st.data())
def test_no_forged_file_hides_a_cost_rise_behind_a_value_that_is_not_a_number(
        capsys, base, forgery, bad, data):
    """The accuracy unchanged, the NFE or branch rows risen beyond ``--cost-tol``; a forged
    file states the rise as NaN (or another non-number) and keeps the baseline's costs in
    ``config.pvf.totals`` or a samples log, the fields the report reads when a task has no cost
    metrics. Never a pass: a plain rise is a regression, a non-number invalid input."""
    r_good, save_options, (p0, n, binary, se0, metric, filt, nfe, rows) = base
    cost_tol = data.draw(st.sampled_from([0.0, 0.1, 0.5]))
    rise = 1 + cost_tol + data.draw(st.sampled_from([0.01, 0.1, 1.0]))
    old = {"requests": n, "nfe": nfe, "branch_rows": rows, "gen_tokens": 3.0 * nfe * n,
           "wall_s": 1.0 * n, "gen_length": 256}
    now = results(p0, metric=metric, filt=filt, se=se0, n=n, nfe=nfe * rise, rows=rows * rise,
                  totals=old)
    res = now["results"]["gsm8k"]
    if forgery in ("nfe", "branch_rows"):
        res[f"{forgery},none"] = bad
    elif forgery.startswith("totals"):           # a built-in task: no cost metrics
        for k in ("nfe", "branch_rows", "tpf", "tps", "gen_length"):
            del res[f"{k},none"]
        now["config"]["pvf"]["totals"]["gsm8k"] = {**old, "nfe": bad}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        base_path = tmp / "base.json"
        assert report.main([str(write(tmp / "good", r_good)), "--save-baseline", str(base_path),
                            *save_options]) == PASSED
        folder = write(tmp / "now", now)
        if forgery == "totals beside samples":   # the samples log states the old costs
            (folder / "samples_gsm8k_2026-01-01T00-00-00.jsonl").write_text(
                json.dumps({"nfe": nfe, "branch_rows": rows, "gen_length": 256}) + "\n")
        rc = report.main([str(folder), "--check", str(base_path), *save_options,
                          "--cost-tol", str(cost_tol), "--allow-blind"])
    capsys.readouterr()
    assert rc == (REGRESSION if forgery == "none" else INVALID)


def blind(p0: float, bound: float) -> bool:
    """Whether a baseline's accuracy check cannot fail: the drop it allows reaches its
    accuracy, so that a result of 0 passes (docs/reports.md)."""
    return 100 * p0 <= bound


def _clear_of_the_edge(p0: float, bound: float, acc_tol: float) -> bool:
    """Not within rounding of the edge, where the gate's own arithmetic may fall either side."""
    return acc_tol >= 100 * p0 or abs(100 * p0 - bound) > 1e-9


@GATE
@given(baselines(), st.booleans(), st.data())
def test_an_honest_rerun_inside_the_noise_bound_passes_whatever_its_file_says(
        capsys, base, allow_blind, data):
    r_good, save_options, (p0, n, binary, se0, metric, filt, nfe, rows) = base
    acc_tol = data.draw(st.sampled_from([0.0, 0.5, 1.0, 3.0]))
    z = data.draw(st.sampled_from([0.0, 1.0, 2.0, 3.0]))
    bound = noise_bound(p0, n, binary, se0, acc_tol, z)
    assume(_clear_of_the_edge(p0, bound, acc_tol))
    low = max(0.0, 100 * p0 - 0.99 * bound)
    p1 = data.draw(st.floats(low, 100.0 if binary else max(low, 100 * p0) + 10)) / 100
    nfe1 = data.draw(st.floats(1.0, nfe))
    r_now = results(p1, metric=metric, filt=filt, se=data.draw(JUNK), n=n, nfe=nfe1,
                    rows=data.draw(st.floats(nfe1, max(nfe1, rows))), date=data.draw(DATES))
    rc = _run(r_good, save_options, r_now, [],
              [*save_options, "--acc-tol", str(acc_tol), "--z", str(z),
               *(["--allow-blind"] if allow_blind else [])])
    capsys.readouterr()
    # a baseline that cannot fail is refused unless accepted
    assert rc == (INVALID if blind(p0, bound) and not allow_blind else PASSED)


@GATE
@given(baselines(), st.booleans(), st.data())
def test_a_result_of_0_fails_unless_the_baseline_cannot_fail_which_is_said(
        capsys, base, allow_blind, data):
    """The worst result a run can have: the gate fails it, or, where the drop the baseline
    allows reaches its accuracy (too few items, an accuracy near 0, a tolerance that large),
    the baseline is refused, or accepted with ``--allow-blind``, on stdout either way."""
    r_good, save_options, (p0, n, binary, se0, metric, filt, nfe, rows) = base
    acc_tol = data.draw(st.sampled_from([0.0, 1.0, 3.0, 10.0, 50.0]))
    z = data.draw(st.sampled_from([0.0, 1.0, 2.0, 3.0, 5.0]))
    bound = noise_bound(p0, n, binary, se0, acc_tol, z)
    assume(_clear_of_the_edge(p0, bound, acc_tol))
    rc = _run(r_good, save_options, results(0.0, metric=metric, filt=filt, n=n, nfe=nfe, rows=rows),
              [], [*save_options, "--acc-tol", str(acc_tol), "--z", str(z),
                   *(["--allow-blind"] if allow_blind else [])])
    out = capsys.readouterr().out
    if blind(p0, bound):
        assert rc == (PASSED if allow_blind else INVALID)
        assert f"the baseline cannot fail on the accuracy of 1 result(s)" in out
    else:
        assert rc == REGRESSION and "cannot fail" not in out
