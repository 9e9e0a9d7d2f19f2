"""Where a run computed is part of its identity (device kind, batch_invariant, the batch size
where it can change results), and a speed ratio between runs of different batch sizes says so."""

from __future__ import annotations

from pathlib import Path

from pvf_lmeval.cli.report import gate
from pvf_lmeval.cli.report.compare import build_table
from pvf_lmeval.lmeval.identity import run_identity
from pvf_lmeval.cli.report.render import _fmt
from pvf_lmeval.cli.report.runs import Entry


def _result(device: str, dtype: str, batch_size: int, invariant=None) -> dict:
    pvf = {"pretrained": "tiny-llada", "decoder": "threshold", "dtype": dtype, "device": device,
           "params": {"threshold": 0.9, "gen_length": 64}, "batch_size": batch_size}
    if invariant is not None:
        pvf["batch_invariant"] = invariant
    return {"config": {"model": "pvf-dlm", "batch_size": batch_size, "pvf": pvf}}


def test_device_kind_and_batch_size_where_it_can_change_results():
    cuda = run_identity(_result("cuda:0", "bfloat16", 16))
    assert cuda["device"] == "cuda" and cuda["batch_size"] == 16
    assert "batch_invariant" not in cuda
    cuda32 = run_identity(_result("cuda:1", "float32", 16))
    assert cuda32["device"] == "cuda" and cuda32["batch_size"] == 16
    cpu = run_identity(_result("cpu", "float32", 8))
    assert cpu["device"] == "cpu" and cpu["batch_size"] == 8
    assert run_identity(_result("cpu", "bfloat16", 8))["batch_size"] == 8
    inv = run_identity(_result("cuda:0", "bfloat16", 16, invariant=True))
    assert inv["batch_invariant"] is True and "batch_size" not in inv
    # the option off is the same run as a result written before it existed
    assert run_identity(_result("cuda:0", "bfloat16", 16, invariant=False)) == cuda


def _entry(decoder: str, tps: float, batch_size: int) -> Entry:
    ident = {"model_type": "pvf-dlm", "model": "m", "decoder": decoder, "dtype": "float32",
             "device": "cpu", "task": "arith", "gen_length": 64}
    if decoder == "threshold":
        ident["threshold"] = 0.9
    # the same accuracy in every run: only the speed differs
    return Entry(Path(f"/{decoder}{batch_size}.json"), 0.0, ident, acc=90.0, acc_se=3.0,
                 acc_metric="exact_match,none", n=100, nfe=10.0, tps=tps,
                 batch_size=batch_size, metrics=("exact_match,none",))


def test_speed_ratio_names_different_batch_sizes():
    table = build_table([_entry("static", 10.0, 8), _entry("threshold", 40.0, 1)])
    row = next(r for r in table.rows if r.decoder == "static")
    cell = row.cells[table.columns[0].key]
    assert cell["tps_speedup_threshold"] == 0.25
    assert cell["tps_batches_threshold"] == (8, 1)
    assert _fmt("tps_speedup_threshold", cell) == "0.25x (batch 8 vs 1)"
    same = build_table([_entry("static", 10.0, 4), _entry("threshold", 40.0, 4)])
    cell = next(r for r in same.rows if r.decoder == "static").cells[same.columns[0].key]
    assert "tps_batches_threshold" not in cell
    assert _fmt("tps_speedup_threshold", cell) == "0.25x"


def test_gate_speed_drop_names_the_batch_sizes():
    base = gate.baseline_dict(build_table([_entry("static", 10.0, 1),
                                           _entry("threshold", 20.0, 1)]))
    assert [e["batch_size"] for e in base["entries"]] == [1, 1]
    now = build_table([_entry("static", 10.0, 8), _entry("threshold", 40.0, 8)])
    bad, missing, _ = gate.check(now, base, check_speed=True)
    assert not missing
    assert bad == [["m static / arith [device=cpu dtype=float32 gen_length=64 model_type=pvf-dlm]",
                    "tps/threshold", "0.50x", "0.25x",
                    "-50.0% (batch 1 -> 8)", "-10%"]]
