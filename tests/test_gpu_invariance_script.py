"""bench/gpu_invariance.py at CPU scale: the prepared GPU command's code path runs and counts the
requests that differ between batch sizes (none on the CPU in float32, with the option off and
on: the CPU's plain-torch implementation), and times model calls with the option off and on."""

from __future__ import annotations

import json

import gpu_invariance
import pytest

pytestmark = pytest.mark.usefixtures("one_thread")


def test_cpu_smoke(tmp_path, monkeypatch, capsys):
    import throughput

    real = throughput.time_call

    def short_call(model, prompt_len, L, B, width, cache, reps, device):
        # the cost part's calls on a canvas of 32 + 2 blocks instead of 512: the same code path
        return real(model, 32, 2 * B, B, width, cache, reps, device)
    monkeypatch.setattr(throughput, "time_call", short_call)
    gpu_invariance.main(["--device", "cpu", "--dtype", "float32", "--items", "3",
                         "--batch-sizes", "1,2", "--gen-length", "16", "--fixtures", "tiny-llada",
                         "--decoders", "pvf", "--caches", "none,dual", "--shape", "tiny-random",
                         "--reps", "1",
                         "--out", str(tmp_path)])
    res = json.loads((tmp_path / "results.json").read_text())
    rows = res["invariance"]
    assert [(r["cache"], r["batch_invariant"]) for r in rows] == [
        ("none", False), ("none", True), ("dual", False), ("dual", True)]
    for r in rows:
        assert "error" not in r and r["b2"] == {"tokens": 0, "nfe": 0, "branch_rows": 0, "any": 0}
    report = (tmp_path / "report.md").read_text()
    assert "| tiny-llada | pvf | dual | off | 0 / 0 / 0 / 0 |" in report
    assert "| tiny-llada | pvf | dual | on | 0 / 0 / 0 / 0 |" in report
    # the cost part: every setting timed with the option off and on
    assert [(r["decoder"], r["requests"], r["rows"], r["cache"]) for r in res["speed"]] == [
        ("pvf", 1, 4, "none"), ("pvf", 1, 4, "dual"), ("pvf", 16, 64, "none"),
        ("pvf", 16, 64, "dual"), ("threshold", 1, 1, "none"), ("threshold", 1, 1, "dual"),
        ("threshold", 16, 16, "none"), ("threshold", 16, 16, "dual")]
    assert all(r["off_ms"] > 0 and r["on_ms"] > 0 for r in res["speed"])


def test_unknown_decoder_is_an_error():
    with pytest.raises(SystemExit, match="--decoders: 'fast' is not one of"):
        gpu_invariance.main(["--decoders", "fast"])
