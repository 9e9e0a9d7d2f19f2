"""pvf-calibrate: A/VIG/n/m/r on hand-built tables, batching width, resumability, filters,
artifact round trip, bad input."""

from __future__ import annotations

import json
import math

import pytest
import torch

from helpers.decoding_tables import BAND_BASE as BASE
from helpers.decoding_tables import BAND_PLAN30 as PLAN30
from helpers.decoding_tables import (MASK, PROMPT, RandomModel, TableModel, band_pair_table, dist_entropy,
                             dist_logits, filled)
from pvf_lmeval.cli.calibrate import main
from pvf_lmeval.planning.calibrate import (CalibConfig, CalibrationError, Tally, apply_filters,
                                           build_artifact, calibrate_prompt, calibrate_prompts,
                                           fingerprint, load_prompts, run_calibration)
from pvf_lmeval.decoding.stats import entropy_from_logits

H = dist_entropy


def test_entropy_is_in_nats_with_the_mask_excluded():
    # two equally likely ids: log 2; the rest (and the mask) at -inf contribute 0
    two = torch.full((1, 1, 64), float("-inf"))
    two[0, 0, [7, 9]] = 0.0
    assert entropy_from_logits(two, MASK).item() == pytest.approx(math.log(2), abs=1e-6)
    # all 64 logits equal: the mask is excluded, so uniform over 63 ids
    assert entropy_from_logits(torch.zeros(1, 1, 64), MASK).item() == pytest.approx(
        math.log(63), abs=1e-5)
    # (13, .3): .3 on one id, .7 spread over the 62 others
    h = -.3 * math.log(.3) - .7 * math.log(.7 / 62)
    assert entropy_from_logits(dist_logits((13, .3)).view(1, 1, -1), MASK).item() == (
        pytest.approx(h, abs=1e-5))
    assert dist_entropy((13, .3)) == pytest.approx(h, abs=1e-12)


CFG = CalibConfig(gen_length=4, block_length=4)

# Prompt 1: the two band candidates of decoding_tables (A = 1 for branch 30, 0 for 31).
table1 = band_pair_table


# Prompt 2: the only confident position under z_base is the candidate itself: vacuous (m += 0).
def table2(g):
    f = filled(g)
    if not f:
        return {0: (10, .95), 1: (30, .2), 2: (5, .6), 3: (5, .6)}
    if f == {0}:
        return {1: (30, .95), 2: (5, .6), 3: (5, .6)}
    return {i: (12, .95) for i in range(4)}


def test_a_vig_n_m_r_on_a_table():
    m1 = TableModel(table1)
    t = calibrate_prompt(m1, PROMPT, CFG)
    # initial call + one batched call [z_base, z_plan_30, z_plan_31]; then z_base = all
    # confident, commit with no call
    assert m1.calls == [(1, (0, 4)), (3, (0, 4))]
    vig30 = ((H(BASE[2]) - H(PLAN30[2])) + (H(BASE[3]) - H(PLAN30[3]))) / 2
    n, m, a, vig = t.stats[30]
    assert (n, m, a) == (1, 1, 1) and vig == pytest.approx(vig30, abs=1e-5)
    assert t.stats[31] == [1, 1, 0, 0]          # failed: A = 0 and VIG = 0
    assert t.counters["events"] == 2 and t.counters["nonvacuous"] == 2 and t.counters["passed"] == 1

    t2 = calibrate_prompt(TableModel(table2), PROMPT, CFG)
    assert t2.stats == {30: [1, 0, 0, 0]}       # vacuous: counted in n only
    total = Tally()
    total.add(t)
    total.add(t2)
    recs = {r["id"]: r for r in _records(total)}
    assert (recs[30]["n"], recs[30]["m"], recs[30]["r"]) == (2, 1, 1.0)
    assert recs[30]["vig"] == pytest.approx(vig30 / 2, abs=1e-5)     # VIG_v = sum VIG / n_v
    assert (recs[31]["n"], recs[31]["m"], recs[31]["r"], recs[31]["vig"]) == (1, 1, 0.0, 0.0)


def test_only_the_band_is_measured():
    # only p in [.15, .25) is measured; the base set is never a candidate
    def table(g):
        if not filled(g):
            return {0: (10, .95), 1: (30, .26), 2: (31, .16), 3: (11, .14)}
        return {i: (12, .95) for i in range(4)}
    t = calibrate_prompt(TableModel(table), PROMPT, CFG)
    assert set(t.stats) == {31}


def test_width_splits_calls_without_changing_statistics():
    m = TableModel(table1)
    t = calibrate_prompt(m, PROMPT, CalibConfig(gen_length=4, block_length=4, width=2))
    assert m.calls == [(1, (0, 4)), (2, (0, 4)), (1, (0, 4))]
    ref = calibrate_prompt(TableModel(table1), PROMPT, CFG)
    assert t.stats == ref.stats


def _records(tally):
    class Tok:
        def convert_ids_to_tokens(self, ids):
            return [f"t{i}" for i in ids]
    from pvf_lmeval.planning.calibrate import token_records
    return token_records(tally, Tok())


def test_filters_and_near_rejections():
    cfg = CalibConfig(min_n=50, min_m=20, rho_ver=0.9, gamma_vig=0.03)
    recs = [
        {"id": 1, "string": "a", "n": 60, "m": 30, "r": 0.95, "vig": 0.05},   # kept
        {"id": 2, "string": "b", "n": 50, "m": 20, "r": 0.9, "vig": 0.03},    # kept (inclusive)
        {"id": 3, "string": "c", "n": 40, "m": 30, "r": 0.95, "vig": 0.05},   # near: n
        {"id": 4, "string": "d", "n": 60, "m": 30, "r": 0.85, "vig": 0.02},   # near: r, vig
        {"id": 5, "string": "e", "n": 60, "m": 30, "r": 0.5, "vig": 0.05},    # far
        {"id": 6, "string": "f", "n": 5, "m": 5, "r": 1.0, "vig": 0.5},       # far (support)
    ]
    kept, near = apply_filters(recs, cfg)
    assert [r["id"] for r in kept] == [1, 2]
    assert [(r["id"], r["failed"]) for r in near] == [(3, ["n"]), (4, ["r", "vig"])]


def _prompts(k=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [[int(x) for x in torch.randint(3, 20, (4,), generator=g)] for _ in range(k)]


def test_resume_gives_the_uninterrupted_result(tmp_path):
    model = RandomModel(3, jitter=0.3, sharp=9.0, eos_bias=-50.0)
    cfg = CalibConfig(gen_length=8, block_length=4, band=(0.1, 0.5), width=3)
    prompts = _prompts(6)
    ref, done, _ = run_calibration(model, prompts, cfg, progress=False)
    assert done and ref.counters["events"] > 5 and ref.counters["passed"] > 0
    state = tmp_path / "x.json.partial"
    part, done, _ = run_calibration(model, prompts, cfg, state_path=state, fp="f", save_every=100,
                                    stop_after=2, progress=False)
    assert not done and json.loads(state.read_text())["done"] == 2
    part, done, _ = run_calibration(model, prompts, cfg, state_path=state, fp="f",
                                    stop_after=2, progress=False)
    assert not done and json.loads(state.read_text())["done"] == 4
    final, done, _ = run_calibration(model, prompts, cfg, state_path=state, fp="f", progress=False)
    assert done and final.stats == ref.stats and final.counters == ref.counters
    with pytest.raises(CalibrationError, match="x.json.partial: written for another model"):
        run_calibration(model, prompts, cfg, state_path=state, fp="other", progress=False)


def test_a_batch_of_prompts_measures_each_as_alone():
    model = RandomModel(3, jitter=0.3, sharp=9.0, eos_bias=-50.0)
    prompts = _prompts(5)
    wide = CalibConfig(gen_length=8, block_length=4, band=(0.1, 0.5), width=200)
    alone = [calibrate_prompt(model, p, wide) for p in prompts]
    assert sum(t.counters["events"] for t in alone) > 5 and {t.counters["calls"] for t in alone} != {0}
    together = calibrate_prompts(model, prompts, wide)
    assert [t.stats for t in together] == [t.stats for t in alone]
    assert [t.counters for t in together] == [t.counters for t in alone]   # steps, calls, rows too
    # A narrow --width cuts the batch's rows into more physical calls: the measurement is the
    # same, only the calls each prompt took part in change.
    narrow = CalibConfig(gen_length=8, block_length=4, band=(0.1, 0.5), width=3)
    cut = calibrate_prompts(model, prompts, narrow)
    assert [t.stats for t in cut] == [t.stats for t in alone]
    for a, b in zip(cut, alone):
        assert {k: v for k, v in a.counters.items() if k != "calls"} == \
            {k: v for k, v in b.counters.items() if k != "calls"}


def test_batched_runs_resume_exactly_and_only_with_their_batch_size(tmp_path):
    model = RandomModel(3, jitter=0.3, sharp=9.0, eos_bias=-50.0)
    cfg = CalibConfig(gen_length=8, block_length=4, band=(0.1, 0.5), width=3)
    prompts = _prompts(7)
    ref, done, _ = run_calibration(model, prompts, cfg, progress=False)
    batched, done, _ = run_calibration(model, prompts, cfg, progress=False, batch_size=3)
    assert done and batched.stats == ref.stats and batched.counters["events"] == ref.counters["events"]
    state = tmp_path / "x.json.partial"
    # stop_after=2 with batches of 3 stops after one whole batch; saves fall on batch ends
    part, done, _ = run_calibration(model, prompts, cfg, state_path=state, fp="f", save_every=2,
                                    stop_after=2, progress=False, batch_size=3)
    assert not done and json.loads(state.read_text())["done"] == 3
    final, done, _ = run_calibration(model, prompts, cfg, state_path=state, fp="f",
                                     progress=False, batch_size=3)
    assert done and final.stats == batched.stats and final.counters == batched.counters
    desc = ({"name": "m"}, {"path": "d"}, 7, cfg, False)
    assert fingerprint(*desc) == fingerprint(*desc, 1) != fingerprint(*desc, 3)


def test_fingerprint_ignores_filters_but_not_measurement():
    a = fingerprint({"m": 1}, {"d": 1}, 3, CalibConfig(), False)
    assert a == fingerprint({"m": 1}, {"d": 1}, 3, CalibConfig(min_n=1, gamma_vig=0.5), False)
    assert a != fingerprint({"m": 1}, {"d": 1}, 3, CalibConfig(band=(0.1, 0.2)), False)


def test_artifact_round_trip(tmp_path):
    from pvf_lmeval.models.loader import checkpoint_folder, load_tokenizer
    from pvf_lmeval.planning.vocab import artifact_statistics, load_artifact, resolve_artifact

    tok = load_tokenizer(checkpoint_folder("tiny-llada"))
    tally = Tally({30: [60, 30, 29, 3.0], 31: [60, 30, 10, 0.5], 40: [45, 30, 29, 3.0]})
    tally.counters.update(prompts=3, events=165)
    cfg = CalibConfig()
    art = build_artifact(tally, cfg, tokenizer=tok, model_family="llada", task_family="math-word",
                         model_name="tiny-llada", model_config_hash="sha256:x",
                         data_desc={"source": "file"}, n_prompts=3, chat=False, runtime_s=1.0)
    path = tmp_path / "a.json"
    path.write_text(json.dumps(art))
    loaded = load_artifact(path)
    assert loaded["kind"] == "calibrated" and loaded["thresholds"]["min_n"] == 50
    assert [t["id"] for t in loaded["tokens"]] == [30]
    assert loaded["tokens"][0]["string"] == tok.convert_ids_to_tokens(30)
    assert [(t["id"], t["failed"]) for t in loaded["rejected_near"]] == [(40, ["n"])]
    assert resolve_artifact(loaded, tok, "llada") == (30,)
    stats = {r["id"]: r for r in artifact_statistics(loaded, tok, "llada")}
    assert stats[30]["a_sum"] == 29 and stats[40]["n"] == 45


@pytest.mark.parametrize("content, message", [
    ('{"x": 1}\n', "records have no prompts"),
    ('{"question": "q"}\n{"other": 2}\n', "record 2 has no 'question' field"),
    ("not json\n", "line 1 is not JSON"),
    ("", "no records"),
])
def test_data_without_prompts(tmp_path, content, message):
    path = tmp_path / "cal.jsonl"
    path.write_text(content)
    with pytest.raises(CalibrationError, match=message) as err:
        load_prompts(str(path))
    assert str(path) in str(err.value)


def test_task_prompts_use_the_calibration_split():
    prompts, desc = load_prompts("arith")
    assert len(prompts) == 400 and desc["path"] == "tasks/arith/data/calibration.jsonl"
    assert prompts[0].startswith("Question: ") and prompts[0].endswith("\nAnswer:")


@pytest.mark.parametrize("argv, message", [
    (["--family", "poetry", "--data", "arith"], "--family 'poetry' is not one of"),
    (["--family", "math", "--data", "/nope/x.jsonl"], "calibration data /nope/x.jsonl: no such file"),
    (["--family", "math", "--data", "arith", "--gen-length", "30", "--block-length", "8"],
     "must be a multiple"),
    (["--family", "math", "--data", "arith", "--batch-size", "0"], "--batch-size=0 is out of range"),
])
def test_cli_errors_are_one_line(capsys, argv, message):
    assert main(["--model", "tiny-llada", "--no-progress"] + argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err and err.startswith("pvf-calibrate: ")


def test_the_artifact_records_the_weights_it_was_measured_on(tmp_path):
    from pvf_lmeval.models import load_model

    out = tmp_path / "v.json"
    assert main(["--model", "tiny-llada", "--data", "arith", "--family", "math-word", "--limit", "2",
                 "--gen-length", "32", "--block-length", "32", "--batch-size", "2", "--no-progress",
                 "--out", str(out)]) == 0
    art = json.loads(out.read_text())
    assert art["model_weights"] == load_model("tiny-llada", device="cpu").weights_fingerprint
    assert art["model_weights"].startswith("sha256:") and art["calibration"]["prompts"] == 2


def test_band_edges_lo_inclusive_hi_exclusive():
    # confidences equal (in float32) to the band's edges: lo is measured, hi is not
    from test_decoding_threshold import exact_conf
    lo, hi = exact_conf((30, .15)), exact_conf((31, .25))

    def table(g):
        if not filled(g):
            return {0: (10, .95), 1: (30, .15), 2: (31, .25), 3: (11, .05)}
        return {i: (12, .95) for i in range(4)}
    t = calibrate_prompt(TableModel(table), PROMPT, CalibConfig(gen_length=4, block_length=4,
                                                                band=(lo, hi)))
    assert set(t.stats) == {30}


def test_every_candidate_of_a_revealed_next_block_is_measured():
    # reveal_next = 4: W_t is both blocks of 4 (8 positions); 6 in-band candidates, more than
    # one block holds, each measured in the one call [z_base + 6 branches]
    y0 = {0: (10, .95), 1: (11, .95), **{p: (30 + p, .2) for p in range(2, 8)}}

    def table(g):
        return y0 if not filled(g) else {i: (12, .95) for i in range(8)}
    m = TableModel(table)
    t = calibrate_prompt(m, PROMPT, CalibConfig(gen_length=8, block_length=4, reveal_next=4))
    assert m.calls[1][0] == 7
    assert sorted(t.stats) == [32, 33, 34, 35, 36, 37]
    assert all(s[0] == 1 for s in t.stats.values())


def test_vig_on_a_block_diffusion_model_averages_over_what_the_candidate_can_influence():
    """Block-causal model (block 4; prompt = position ids 0-3, the answer 4-11), reveal_next 4:
    W_t is blocks 1 and 2. The in-band candidate (token 30) sits at 8, in block 2: it can
    influence block 2 only, so its VIG averages over the masked positions 9-11, not 5-7."""
    from helpers.block_tables import BlockModel, filled_from
    base = {5: (11, .5), 6: (12, .5), 7: (13, .5), 8: (30, .5), 9: (19, .95), 10: (20, .5),
            11: (21, .5)}
    plan = {9: (19, .97), 10: (20, .7), 11: (21, .5)}

    def table(seq):
        f = filled_from(seq, 4)          # what q sees: its own block and earlier ones
        if not f:
            t = {4: (10, .95), 5: (11, .5), 6: (12, .5), 7: (13, .5), 8: (30, .2),
                 9: (19, .5), 10: (20, .5), 11: (21, .5)}
        elif f == {4}:
            t = base
        elif f == {4, 8}:
            t = {**base, **plan}
        else:
            t = {q: (10 + q, .95) for q in range(4, 12)}
        return {q: d for q, d in t.items() if q < len(seq)}
    m = BlockModel(table, block_size=4)
    t = calibrate_prompt(m, [40, 41, 42, 43], CalibConfig(gen_length=8, block_length=4,
                                                           reveal_next=4))
    vig = ((H((19, .95)) - H((19, .97))) + (H((20, .5)) - H((20, .7)))) / 3
    n, m_, a, v = t.stats[30]
    assert (n, m_, a) == (1, 1, 1) and v == pytest.approx(vig, abs=1e-5)
    assert set(t.stats) == {30}
