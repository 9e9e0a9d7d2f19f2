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


def test_decoders_leave_out_a_row_whose_decoder_refuses_the_model(monkeypatch, capsys):
    """The default table on both fixtures runs to its end: wino refuses logit-shifted tiny-dream
    before any call, the row is left out and stderr says why; the other rows run."""
    import decoders

    seen = []
    monkeypatch.setattr(decoders, "run_config", lambda model, prompts, targets, extract, decoder,
                        *a: seen.append(decoder) or _figures(0.0, 1.0, 1.0, len(prompts)))
    decoders.main(["--fixtures", "tiny-dream", "--limit", "1", "--only", "wino", "pvf"])
    assert seen == ["threshold", "pvf"]
    captured = capsys.readouterr()
    assert "tiny-dream wino: not run: decoder=wino: dream shifts its logits" in captured.err
    assert "| tiny-dream | pvf |" in captured.out and "| wino |" not in captured.out


def _figures(acc, nfe, tpf, items, first=None, **more):
    r = {"acc": acc, "se": 0.0, "nfe": nfe, "rows": 2 * nfe, "tpf": tpf, "wall": 1.0, "plan_tokens": 0.0,
         "ar_tokens": 0.0, "edits": 0.0, "items": items, **more}
    if first is not None:
        r["first_item"] = first
    return r


def test_decoders_merge_weights_by_items_and_sums_tokens_over_calls():
    """Items 0..199 (a file from before --start, no first_item) and 200..999: 150 + 400 correct of
    1,000; NFE 40 and 50 per request; tokens 40*1.5 and 50*2 per request."""
    import decoders

    merged = decoders.merge_figures([_figures(0.5, 50.0, 2.0, 800, 200), _figures(0.75, 40.0, 1.5, 200)])
    assert merged["acc"] == pytest.approx(0.55)
    assert merged["nfe"] == pytest.approx(48.0)
    assert merged["rows"] == pytest.approx(96.0)
    assert merged["tpf"] == pytest.approx((200 * 60 + 800 * 100) / (200 * 40 + 800 * 50))
    assert merged["se"] == pytest.approx((0.55 * 0.45 / 1000) ** 0.5)
    assert (merged["items"], merged["first_item"]) == (1000, 0)
    old = {k: v for k, v in _figures(0.75, 40.0, 1.5, 200).items() if k != "edits"}  # before edits
    assert decoders.merge_figures([_figures(0.5, 50.0, 2.0, 800, 200, edits=5.0), old])["edits"] == 4.0


def test_decoders_merge_refuses_a_gap_or_an_overlap():
    import decoders

    with pytest.raises(ValueError, match="items 0..199 and 300..999 are not consecutive"):
        decoders.merge_figures([_figures(0.5, 1.0, 1.0, 200), _figures(0.5, 1.0, 1.0, 700, 300)])
    with pytest.raises(ValueError, match="items 0..199 and 100..199 are not consecutive"):
        decoders.merge_figures([_figures(0.5, 1.0, 1.0, 200), _figures(0.5, 1.0, 1.0, 100, 100)])


def test_decoders_merge_table_ratios_against_threshold_on_the_same_items(tmp_path, capsys):
    """A row merged to the whole set takes the ratio against the whole-set threshold row of
    another file; a row still short of it gets none."""
    import decoders

    a = {"tiny-llada": {"threshold": _figures(0.5, 20.0, 1.0, 10, wall=2.0),
                        "static": _figures(0.5, 40.0, 1.0, 4)}}
    b = {"tiny-llada": {"static": _figures(0.5, 80.0, 1.0, 6, 4, wall=4.0),
                        "freedave": _figures(0.5, 30.0, 1.0, 6, 4)}}
    for name, run in (("a.json", a), ("b.json", b)):
        (tmp_path / name).write_text(__import__("json").dumps(run))
    decoders.main(["--merge", str(tmp_path / "a.json"), str(tmp_path / "b.json"),
                   "--json", str(tmp_path / "m.json")])
    out = capsys.readouterr().out
    # static: NFE (4*40 + 6*80)/10 = 64 -> 3.20x threshold's 20; wall (4*1 + 6*4)/10 = 2.8 -> 1.40x
    assert "| tiny-llada | static | 10 | 0.500 | 0.158 | 64.00 | 128.00 |" in out
    assert "| 2800.0 ms | 3.20x | 1.40x |" in out
    assert "| tiny-llada | freedave | 6 (from item 4) |" in out and out.rstrip().endswith("| — | — |")
    assert __import__("json").loads((tmp_path / "m.json").read_text())["tiny-llada"]["static"]["nfe"] == 64.0


def test_decoders_start_decodes_the_items_from_it(monkeypatch, capsys):
    import decoders

    seen = []
    monkeypatch.setattr(decoders, "run_config", lambda model, prompts, targets, *a: seen.append(targets) or
                        _figures(0.0, 1.0, 1.0, len(prompts)))
    decoders.main(["--fixtures", "tiny-llada", "--limit", "5", "--start", "3", "--skip-threshold",
                   "--only", "static"])
    import benchlib
    assert seen == [[d["target"] for d in benchlib.held_out(5)[3:]]]
    assert "| tiny-llada | static | 2 (from item 3) |" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        decoders.main(["--limit", "5", "--start", "5", "--only", "static"])
    assert "--start: 5 is not an item index; allowed: 0 to 4" in capsys.readouterr().err


def test_decoders_merge_takes_the_named_rows_of_a_file(tmp_path, capsys):
    """FILE:ROW keeps that row of FILE only: a run over the first items that also decoded
    threshold on them merges with a threshold row over all items from another file."""
    import json

    import decoders

    first = {"tiny-dream": {"threshold": _figures(1.0, 3.0, 1.0, 2), "freedave": _figures(1.0, 30.0, 1.0, 2)}}
    rest = {"tiny-dream": {"freedave": _figures(0.5, 40.0, 1.0, 2, 2)}}
    whole = {"tiny-dream": {"threshold": _figures(0.5, 4.0, 1.0, 4)}}
    for name, run in (("first.json", first), ("rest.json", rest), ("whole.json", whole)):
        (tmp_path / name).write_text(json.dumps(run))
    decoders.main(["--merge", f"{tmp_path / 'first.json'}:freedave", str(tmp_path / "rest.json"),
                   str(tmp_path / "whole.json")])
    out = capsys.readouterr().out
    assert "| tiny-dream | freedave | 4 | 0.750 | 0.217 | 35.00 |" in out and "| 8.75x |" in out
    with pytest.raises(SystemExit, match="has no row 'static'"):
        decoders.main(["--merge", f"{tmp_path / 'first.json'}:static"])


def test_decoders_merge_names_a_file_it_cannot_read(tmp_path):
    """A missing or garbled piece ends in one line naming it, not a traceback."""
    import decoders

    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(SystemExit) as missing:
        decoders.main(["--merge", f"{tmp_path / 'absent.json'}:freedave"])
    assert str(missing.value) == (f"--merge: cannot read {tmp_path / 'absent.json'}: "
                                  "No such file or directory")
    with pytest.raises(SystemExit) as garbled:
        decoders.main(["--merge", str(tmp_path / "bad.json")])
    assert str(garbled.value).startswith(f"--merge: {tmp_path / 'bad.json'} is not a --json file "
                                         "of this script: Expecting property name")
