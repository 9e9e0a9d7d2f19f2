"""The regression gate's rules (``pvf-report --check``) on hand-made results: every regression row
(metric, baseline, now, change, allowed) pinned as the user reads it, each rule at its boundary.
The gate on real runs is in ``test_report.py``."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from pvf_lmeval.cli.report import gate
from pvf_lmeval.cli.report.compare import build_table
from pvf_lmeval.cli.report.runs import Entry, ReportError, UsageError

PVF = "m pvf / t [gen_length=64 model_type=pvf-dlm num_fewshot=0 task_version=1 threshold=0.9]"
THRESHOLD = ("m threshold / t [gen_length=64 model_type=pvf-dlm num_fewshot=0 task_version=1 "
             "threshold=0.9]")


def _entry(decoder: str, *, acc=60.0, se=1.0, nfe=10.0, rows=30.0, tps=100.0, threshold=0.9,
           model="m", batch_size=None, metric="exact_match,none", n=100) -> Entry:
    ident = {"model": model, "model_type": "pvf-dlm", "decoder": decoder, "gen_length": 64,
             "task": "t", "task_version": 1, "num_fewshot": 0}
    if decoder != "static":
        ident["threshold"] = threshold
    # named on the command line: the gate notes a result the baseline does not hold
    return Entry(Path(f"{decoder}.json"), 1.0, ident, acc=acc, acc_se=se, acc_metric=metric,
                 n=n, nfe=nfe, branch_rows=rows, tpf=1.0, tps=tps, batch_size=batch_size,
                 named=True)


def _check(entries_then, entries_now, **kw):
    base = gate.baseline_dict(build_table(entries_then))
    base = json.loads(json.dumps(base))                    # as written to the file
    return gate.check(build_table(entries_now), base, **kw)


def _bad(entries_then, entries_now, **kw):
    bad, missing, notes = _check(entries_then, entries_now, **kw)
    assert missing == [] and notes == []
    return bad


THEN = [_entry("threshold"), _entry("pvf", tps=150.0)]


def test_a_baseline_holds_each_result_its_identity_and_speed_ratios():
    base = gate.baseline_dict(build_table([_entry("threshold", batch_size=16),
                                           _entry("pvf", tps=150.0, nfe=8.0, batch_size=16)]))
    common = {"model": "m", "model_type": "pvf-dlm", "gen_length": 64, "task": "t",
              "task_version": 1, "num_fewshot": 0, "threshold": 0.9}
    measured = {"acc": 60.0, "acc_se": 1.0, "n": 100, "acc_metric": "exact_match,none",
                "branch_rows": 30.0, "tpf": 1.0, "batch_size": 16}
    assert base == {"pvf_report_baseline": 3, "entries": [
        {"identity": {**common, "decoder": "threshold"}, **measured, "nfe": 10.0, "tps": 100.0,
         "tps_ratio": {}},
        {"identity": {**common, "decoder": "pvf"}, **measured, "nfe": 8.0, "tps": 150.0,
         "tps_ratio": {"threshold": 1.5}}]}


def test_identical_results_pass():
    assert _check(THEN, copy.deepcopy(THEN)) == ([], [], [])
    assert _check(THEN, copy.deepcopy(THEN), check_speed=True) == ([], [], [])


def test_accuracy_fails_beyond_the_tolerance_and_z_standard_errors_of_the_baselines_noise():
    # exact_match scores each item 0 or 1: one run's se is sqrt(p (1 - p) / (n - 1)) at the
    # baseline's p = 0.5 and n = 51, 7.07 points; of the difference of two such runs, 10 points;
    # z = 2: a drop of 20 points passes, more fails, whatever se the current result states
    half = [THEN[0], _entry("pvf", acc=50.0, n=51, se=0.0)]
    assert _bad(half, [THEN[0], _entry("pvf", acc=30.0, n=51)]) == []
    assert _bad(half, [THEN[0], _entry("pvf", acc=29.9, n=51, se=0.0)]) == [
        [PVF, "acc", "50.00", "29.90", "-20.10 pts", "-1 pts and -2 se (20.00 pts)"]]
    assert _bad(half, [THEN[0], _entry("pvf", acc=29.9, n=51, se=50.0)]) == [
        [PVF, "acc", "50.00", "29.90", "-20.10 pts", "-1 pts and -2 se (20.00 pts)"]]
    assert _bad(half, [THEN[0], _entry("pvf", acc=39.0, n=51)], z=1.0) == [
        [PVF, "acc", "50.00", "39.00", "-11.00 pts", "-1 pts and -1 se (10.00 pts)"]]
    assert _bad(half, [THEN[0], _entry("pvf", acc=39.0, n=51)], acc_tol=12.0, z=1.0) == []
    assert _bad(half, [THEN[0], _entry("pvf", acc=70.0, n=51)]) == []          # a rise
    # another metric: the standard error the baseline recorded (1 point): 2 x sqrt(2) = 2.83
    f1 = [THEN[0], _entry("pvf", metric="f1,none")]
    assert _bad(f1, [THEN[0], _entry("pvf", metric="f1,none", acc=57.0, se=40.0)]) == [
        [PVF, "acc", "60.00", "57.00", "-3.00 pts", "-1 pts and -2 se (2.83 pts)"]]
    assert _bad(f1, [THEN[0], _entry("pvf", metric="f1,none", acc=57.5, se=0.0)]) == []
    # none recorded: the tolerance decides; a drop equal to it passes
    exact = [THEN[0], _entry("pvf", metric="f1,none", se=None)]
    assert _bad(exact, [THEN[0], _entry("pvf", metric="f1,none", acc=59.0)]) == []
    assert _bad(exact, [THEN[0], _entry("pvf", metric="f1,none", acc=58.5)]) == [
        [PVF, "acc", "60.00", "58.50", "-1.50 pts", "-1 pts and -2 se (0.00 pts)"]]
    assert _bad(exact, [THEN[0], _entry("pvf", metric="f1,none", acc=58.5)], acc_tol=1.5) == []
    # another metric or filter, or none, is a failure of its own (no accuracy is compared)
    assert _bad(THEN, [THEN[0], _entry("pvf", acc=None, metric=None)]) == [
        [PVF, "acc_metric", "exact_match,none", "missing", "", "the same"]]
    assert _bad(THEN, [THEN[0], _entry("pvf", metric="exact_match,flexible-extract")]) == [
        [PVF, "acc_metric", "exact_match,none", "exact_match,flexible-extract", "", "the same"]]
    # another number of items (the noise bound assumes the baseline's)
    assert _bad(THEN, [THEN[0], _entry("pvf", n=99)]) == [[PVF, "n", "100", "99", "", "the same"]]
    assert _bad(THEN, [THEN[0], _entry("pvf", n=None)]) == [
        [PVF, "n", "100", "missing", "", "the same"]]


def test_a_result_without_accuracy_is_refused_as_a_baseline():
    with pytest.raises(UsageError) as err:
        gate.baseline_dict(build_table([THEN[0], _entry("pvf", acc=None, metric=None)]))
    assert str(err.value) == (f"--save-baseline: {PVF} has no accuracy metric pvf-report knows "
                              "(its metrics: none); name one with --metric t=METRIC,FILTER")


def test_costs_fail_on_any_rise_beyond_the_relative_tolerance():
    assert _bad(THEN, [THEN[0], _entry("pvf", nfe=10.1)]) == [
        [PVF, "nfe", "10.00", "10.10", "+1.0%", "+0%"]]
    assert _bad(THEN, [THEN[0], _entry("pvf", nfe=10.1)], cost_tol=0.02) == []
    assert _bad(THEN, [THEN[0], _entry("pvf", nfe=10.3)], cost_tol=0.02) == [
        [PVF, "nfe", "10.00", "10.30", "+3.0%", "+2%"]]
    assert _bad(THEN, [THEN[0], _entry("pvf", nfe=15.0)], cost_tol=0.5) == []
    assert _bad(THEN, [THEN[0], _entry("pvf", rows=31.0, nfe=9.0)]) == [
        [PVF, "branch_rows", "30.00", "31.00", "+3.3%", "+0%"]]
    # means summed in another order may differ in the last bits: 1e-9 relative slack
    assert _bad(THEN, [THEN[0], _entry("pvf", nfe=10.0 + 5e-9)]) == []
    assert _bad(THEN, [THEN[0], _entry("pvf", nfe=10.0 + 2e-8)]) == [
        [PVF, "nfe", "10.00", "10.00", "+0.0%", "+0%"]]
    assert _bad(THEN, [THEN[0], _entry("pvf", nfe=None)]) == [
        [PVF, "nfe", "10.00", "missing", "", ""]]
    assert _bad([THEN[0], _entry("pvf", nfe=None)], [THEN[0], _entry("pvf", nfe=99.0)]) == []
    # a baseline without NFE still checks its branch rows
    assert _bad([THEN[0], _entry("pvf", nfe=None)], [THEN[0], _entry("pvf", nfe=99.0, rows=40.0)]) == [
        [PVF, "branch_rows", "30.00", "40.00", "+33.3%", "+0%"]]


def test_every_regression_of_every_result_is_listed_in_baseline_order():
    now = [_entry("threshold", acc=40.0, nfe=12.0, tps=100.0), _entry("pvf", nfe=11.0, tps=90.0)]
    assert _bad(THEN, now, check_speed=True) == [
        [THRESHOLD, "acc", "60.00", "40.00", "-20.00 pts", "-1 pts and -2 se (13.93 pts)"],
        [THRESHOLD, "nfe", "10.00", "12.00", "+20.0%", "+0%"],
        [PVF, "nfe", "10.00", "11.00", "+10.0%", "+0%"],
        [PVF, "tps/threshold", "1.50x", "0.90x", "-40.0%", "-10%"]]


def test_results_of_several_tasks():
    def two_tasks(entries):
        out = []
        for e in entries:
            for task in ("t", "u"):
                if (e.identity["decoder"], task) != ("pvf", "t"):
                    out.append(Entry(e.path, e.date, {**e.identity, "task": task}, acc=e.acc,
                                     acc_se=e.acc_se, acc_metric=e.acc_metric, n=e.n, nfe=e.nfe,
                                     branch_rows=e.branch_rows, tpf=e.tpf, tps=e.tps))
        return out
    base = gate.baseline_dict(build_table(two_tasks(THEN)))
    # pvf has no result on task t: its result on u is still in the baseline
    assert sorted((b["identity"]["decoder"], b["identity"]["task"]) for b in base["entries"]) == [
        ("pvf", "u"), ("threshold", "t"), ("threshold", "u")]
    bad, missing, notes = gate.check(build_table(two_tasks([THEN[0], _entry("pvf", nfe=10.5)])),
                                     json.loads(json.dumps(base)))
    assert [r[1:] for r in bad] == [["nfe", "10.00", "10.50", "+5.0%", "+0%"]]
    assert bad[0][0].startswith("m pvf / u [") and missing == [] and notes == []


def test_speed_is_checked_as_the_ratio_to_the_reference_decoder_of_the_same_runs():
    slower_machine = [_entry("threshold", tps=50.0), _entry("pvf", tps=75.0)]
    assert _bad(THEN, slower_machine, check_speed=True) == []
    pvf_slower = [THEN[0], _entry("pvf", tps=120.0)]
    assert _bad(THEN, pvf_slower) == []
    assert _bad(THEN, pvf_slower, check_speed=True) == [
        [PVF, "tps/threshold", "1.50x", "1.20x", "-20.0%", "-10%"]]
    assert _bad(THEN, pvf_slower, check_speed=True, speed_tol=0.25) == []
    # exactly at the tolerance (1.35 = 1.5 x 0.9) passes
    assert _bad(THEN, [THEN[0], _entry("pvf", tps=135.0)], check_speed=True) == []
    # the batch size changed with it: the row says so
    bs1 = [_entry("threshold", batch_size=1), _entry("pvf", tps=150.0, batch_size=1)]
    assert _bad(bs1, [_entry("threshold", batch_size=16), _entry("pvf", tps=120.0, batch_size=16)],
                check_speed=True) == [
        [PVF, "tps/threshold", "1.50x", "1.20x", "-20.0% (batch 1 -> 16)", "-10%"]]
    assert _bad(bs1, [_entry("threshold", batch_size=1), _entry("pvf", tps=120.0, batch_size=1)],
                check_speed=True) == [
        [PVF, "tps/threshold", "1.50x", "1.20x", "-20.0%", "-10%"]]
    # no threshold run now; none in the baseline; another reference decoder
    bad, missing, _ = _check(THEN, [THEN[1]], check_speed=True)
    assert bad == [[PVF, "tps/threshold", "1.50x", "no threshold run", "", ""]]
    assert missing == [THRESHOLD + "\n    nearest run differs in decoder: threshold -> pvf"]
    bad, _, notes = _check([THEN[1]], THEN, check_speed=True)
    assert bad == [[PVF, "tps/threshold", "no reference", "", "", ""]]
    assert notes == [f"not in the baseline: {THRESHOLD}"]
    static = [_entry("static", tps=50.0), _entry("pvf", tps=150.0)]
    assert _bad(static, [static[0], _entry("pvf", tps=120.0)], check_speed=True,
                speed_ref="static") == [
        [PVF, "tps/static", "3.00x", "2.40x", "-20.0%", "-10%"]]


def test_a_baseline_result_without_a_counterpart_is_named_with_the_nearest_run():
    bad, missing, notes = _check(THEN, [THEN[0]])
    assert bad == [] and notes == []
    assert missing == [PVF + "\n    nearest run differs in decoder: pvf -> threshold"]
    # the nearest of several: the fewest differing keys
    now = [_entry("threshold", threshold=0.7), _entry("pvf", threshold=0.5)]
    bad, missing, notes = _check(THEN, now)
    assert missing == [THRESHOLD + "\n    nearest run differs in threshold: 0.9 -> 0.7",
                       PVF + "\n    nearest run differs in threshold: 0.9 -> 0.5"]
    # several differences, in key order
    now = [_entry("threshold", threshold=0.7), _entry("pvf", threshold=0.5)]
    for e in now:
        e.identity["gen_length"] = 128
    _, missing, _ = _check(THEN, now)
    assert missing == [
        THRESHOLD + "\n    nearest run differs in gen_length: 64 -> 128; threshold: 0.9 -> 0.7",
        PVF + "\n    nearest run differs in gen_length: 64 -> 128; threshold: 0.9 -> 0.5"]
    assert len(notes) == 2 and bad == []
    # no run of that model and task: no nearest line
    _, missing, _ = _check(THEN, [_entry("pvf", model="other")])
    assert missing == [THRESHOLD, PVF]


def test_a_result_the_baseline_does_not_hold_found_in_a_folder_is_invalid_input():
    found = _entry("pvf", threshold=0.5)
    found.named = False
    with pytest.raises(ReportError) as err:
        _check(THEN, [THEN[0], THEN[1], found])
    assert type(err.value) is ReportError and str(err.value) == (
        f"--check: pvf.json: {PVF.replace('0.9', '0.5')} is not in the baseline (the nearest "
        "baseline result differs in threshold: 0.9 -> 0.5): the gate would not check it; pass "
        "only the runs to check, or name its results file to check the others beside it")
    # another model: no nearest result
    found = _entry("pvf", model="other")
    found.named = False
    with pytest.raises(ReportError) as err:
        _check(THEN, [THEN[0], THEN[1], found])
    assert str(err.value).endswith(" is not in the baseline: the gate would not check it; pass "
                                   "only the runs to check, or name its results file to check "
                                   "the others beside it")
    # named, it is noted
    found.named = True
    assert _check(THEN, [THEN[0], THEN[1], found])[2] == [
        f"not in the baseline: {PVF.replace('m pvf', 'other pvf')}"]


def test_a_baseline_result_whose_accuracy_check_cannot_fail_is_listed():
    # n = 51 at 50%: two runs' se 10 points; z = 2: 20 points, short of 50
    half = [_entry("pvf", acc=50.0, n=51)]
    base = json.loads(json.dumps(gate.baseline_dict(build_table(half))))["entries"]
    assert gate.blind(base, acc_tol=1.0, z=2.0) == []
    assert gate.blind(base, acc_tol=1.0, z=6.0) == [f"{PVF}: accuracy 50.00, allowed drop 60.00 pts"]
    assert gate.blind(base, acc_tol=50.0, z=0.0) == [f"{PVF}: accuracy 50.00, allowed drop 50.00 pts"]
    assert gate.blind(base, acc_tol=49.9, z=0.0) == []
    zero = [_entry("pvf", acc=0.0, n=5000)]
    base = json.loads(json.dumps(gate.baseline_dict(build_table(zero))))["entries"]
    assert gate.blind(base, acc_tol=0.0, z=0.0) == [f"{PVF}: accuracy 0.00, allowed drop 0.00 pts"]


@pytest.mark.parametrize("baseline, message", [
    ({"entries": []}, "--check: not a pvf-report baseline (write one with --save-baseline)"),
    ([1, 2], "--check: not a pvf-report baseline (write one with --save-baseline)"),
    ({"pvf_report_baseline": 2, "entries": []},
     "--check: baseline format 2 is not 3 (identities with device kind and batch size); write it "
     "again with --save-baseline"),
    ({"pvf_report_baseline": 3, "entries": {}},
     "--check: baseline format 3 is not 3 (identities with device kind and batch size); write it "
     "again with --save-baseline"),
])
def test_a_file_that_is_not_a_current_baseline_is_refused(baseline, message):
    with pytest.raises(ReportError) as err:
        gate.check(build_table(THEN), baseline)
    assert str(err.value) == message


def test_regression_table_text():
    assert gate.table_text(["a", "bb"], [["xyz", "1"], ["w", "22"]]) == (
        "a    bb\n---  --\nxyz  1\nw    22")
    # a heading wider than its column's values sets the width
    assert gate.table_text(["metric", "x"], [["nfe", "1"]]) == "metric  x\n------  -\nnfe     1"
