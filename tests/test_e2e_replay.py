"""`bench/e2e.py`'s batched replay: how it times, not what it measures (and one argument check of
`bench/decoders.py`, which splits the decoder table over processes).

Pins: every batch size replays the same requests (the largest batch's worth, the recorded
schedules cycled), in consecutive groups of that size, once untimed (a compiled model compiles
that size's shapes there) and once timed; the aggregate tokens/s counts every request as
``gen_length`` tokens over the timed pass only. A warm-up with one request followed by batch 16
timed on 16 others would compile inside the timed pass.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

@pytest.fixture()
def e2e():
    import e2e as module

    return module


def test_every_batch_size_replays_the_same_requests_warm_then_timed(e2e, monkeypatch):
    passes = []     # (cache, the request schedules of one replay_batched call)

    def fake_replay(model, reqs, cache, prompt_len, L, B, device):
        passes.append((cache, [r[0][0] for r in reqs]))     # a schedule's first call's rows = its tag
        return 0.25 * len(reqs) ** 0.5                     # seconds: bigger groups are cheaper per request

    monkeypatch.setattr(e2e, "random_model", lambda shape, device, dtype: object())
    monkeypatch.setattr(e2e, "replay_batched", fake_replay)
    schedules = {("pvf", "dual"): {k: [(10 + k, False, 0), (1, True, 0)] for k in range(3)}}
    args = SimpleNamespace(replay="llada-8b/16", device="cpu", compile=False, batch_sizes=[1, 4],
                           prompt_len=8, gen_length=96, block_length=32)
    rows = e2e.run_replay(args, schedules)

    want = [10, 11, 12, 10]                                 # 3 recorded, cycled to 4
    batch1 = [("dual", [t]) for t in want]
    assert passes == batch1 + batch1 + [("dual", want)] * 2  # untimed pass, then timed, per size
    assert [(r["batch"], r["requests"]) for r in rows] == [(1, 4), (4, 4)]
    assert rows[0]["seconds"] == pytest.approx(4 * 0.25)
    assert rows[1]["seconds"] == pytest.approx(0.25 * 2)
    assert rows[0]["tokens_per_s"] == pytest.approx(4 * 96 / 1.0)
    assert rows[1]["vs_batch_1"] == pytest.approx(2.0)


def test_decoders_skip_threshold_without_only_is_an_error(monkeypatch, capsys):
    import decoders

    with pytest.raises(SystemExit) as exc:
        decoders.main(["--skip-threshold"])
    assert exc.value.code == 2
    assert "--skip-threshold needs --only" in capsys.readouterr().err


def test_decoders_unknown_only_row_is_an_error(monkeypatch, capsys):
    import decoders

    with pytest.raises(SystemExit) as exc:
        decoders.main(["--only", "pvf routes=ar", "pvf rules=bogus"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--only: unknown row 'pvf rules=bogus'" in err
    assert "'pvf rules=paper+impact_includes_committed'" in err


def test_decoders_opt_in_row_runs_only_when_named(monkeypatch):
    """The impact-rule row is not part of the default table; named, it decodes with that rule."""
    import decoders

    seen = []
    monkeypatch.setattr(decoders, "run_config", lambda model, prompts, targets, extract, decoder,
                        extra, *a: seen.append((decoder, extra.get("rules"))) or
                        {"acc": 0.0, "se": 0.0, "nfe": 1.0, "rows": 1.0, "tpf": 1.0, "wall": 1.0,
                         "plan_tokens": 0.0, "ar_tokens": 0.0, "edits": 0.0})
    decoders.main(["--fixtures", "tiny-llada", "--limit", "1", "--only", "pvf"])
    assert seen == [("threshold", None), ("pvf", None)]
    seen.clear()
    decoders.main(["--fixtures", "tiny-llada", "--limit", "1", "--skip-threshold", "--only",
                   "pvf rules=paper+impact_includes_committed"])
    assert seen == [("pvf", "paper+impact_includes_committed")]
