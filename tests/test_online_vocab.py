"""vocab=online: Beta lower-bound eligibility, exploration reservation, updates only between
requests, save/seed, determinism, frozen batch-size invariance, bad input."""

from __future__ import annotations

import math

import pytest
import torch
from scipy.special import betaincinv

from helpers.decoding_tables import PROMPT, V, RandomModel, TableModel, filled
from pvf_lmeval.decoding import decode
from pvf_lmeval.planning.online import OnlineVocab


def rec(i, n, m, a, g):
    return {"id": i, "n": n, "m": m, "a_sum": a, "vig_sum": g}


def delta(tok, nonvac, passed, vig):
    return {"tok": torch.tensor(tok), "nonvac": torch.tensor(nonvac, dtype=torch.float64),
            "passed": torch.tensor(passed, dtype=torch.float64),
            "vig": torch.tensor(vig, dtype=torch.float64)}


def test_eligibility_is_a_beta_lower_bound_and_a_gain_floor():
    ov = OnlineVocab(V, rho_ver=0.9, gamma_vig=0.03, level=0.05)
    ov.seed([rec(7, 30, 30, 30, 3.0),      # LB = 0.05 ** (1/31) = 0.9080 -> eligible
             rec(8, 28, 28, 27, 2.8),      # one failure: LB(Beta(28, 2)) < 0.9
             rec(9, 30, 30, 30, 0.6),      # passes, but mean gain 0.02 < 0.03
             rec(10, 40, 30, 30, 2.0)])    # vacuous events count in n (gain 2/40) not in m
    assert float(ov.lower_bound[7]) == pytest.approx(0.05 ** (1 / 31))
    assert float(ov.lower_bound[8]) == pytest.approx(betaincinv(28, 2, 0.05))
    assert ov.eligible_ids() == [7, 10]
    assert float(ov.lower_bound[10]) == pytest.approx(0.05 ** (1 / 31))
    # a looser bound (median-ish level) admits the one-failure token
    loose = OnlineVocab(V, level=0.5)
    loose.seed([rec(8, 28, 28, 27, 2.8)])
    assert loose.eligible_ids() == [8]


def test_explorable_tokens():
    ov = OnlineVocab(V, explore=1, explore_max=10)
    ov.seed([rec(7, 30, 30, 30, 3.0),     # eligible: never explorable
             rec(8, 3, 3, 0, 0.0),        # failed 3/3: upper bound < rho -> dropped
             rec(9, 10, 2, 2, 0.0),       # reached explore_max events
             rec(11, 2, 2, 2, 0.0)])      # little evidence: explorable
    mask = ov.explorable_mask(torch.arange(V))
    assert not mask[7] and not mask[8] and not mask[9] and mask[11] and mask[12]
    assert not OnlineVocab(V, explore=0).explorable_mask(torch.arange(V)).any()
    assert not OnlineVocab(V, frozen=True).explorable_mask(torch.arange(V)).any()


# In-band candidates at positions 1..5 with tokens 30..34 (p .5 .45 .4 .3 .25); after step 1
# everything is confident and agrees, so every tried branch passes.
EMPTY = {0: (10, .95), 1: (30, .5), 2: (31, .45), 3: (32, .4), 4: (33, .3), 5: (34, .25)}


def table(g):
    return EMPTY if not filled(g) else {i: (12, .95) for i in range(8)}


def run_pvf(online, tab=table, **kw):
    m = TableModel(tab)
    r = decode(m, PROMPT, "pvf", gen_length=8, block_length=8, trace=True, online=online, **kw)
    return r, m


def test_exploration_reserves_a_slot_and_fills_unused_ones():
    ov = OnlineVocab(V, explore=1)
    ov.seed([rec(t, 40, 40, 40, 4.0) for t in (30, 31, 32)])     # eligible
    r, _ = run_pvf(ov)
    assert r.steps[0]["candidates"] == [1, 2, 4]       # 2 eligible + 1 reserved exploration
    # no exploration: three eligible
    ov0 = OnlineVocab(V, explore=0)
    ov0.seed([rec(t, 40, 40, 40, 4.0) for t in (30, 31, 32)])
    assert run_pvf(ov0)[0].steps[0]["candidates"] == [1, 2, 3]
    # nothing eligible: exploration fills the width; token 30 is ruled out (3 failures)
    cold = OnlineVocab(V, explore=1)
    cold.seed([rec(30, 3, 3, 0, 0.0)])
    r, _ = run_pvf(cold)
    assert r.steps[0]["candidates"] == [2, 3, 4] and r.tokens_plan == 1
    assert r.routes[2] == "plan"                       # an exploration candidate won
    assert r.plan_tried == 3 and r.plan_passed == 3


def test_updates_only_between_requests():
    ov = OnlineVocab(V, explore=1, level=0.05)
    before = ov.events.clone()
    r, _ = run_pvf(ov)
    assert ov.pending == 3 and torch.equal(ov.events, before)          # recorded, not applied
    assert r.steps[0]["candidates"] == [1, 2, 3]
    r2, _ = run_pvf(ov)                                                  # same vocabulary
    assert r2.steps[0]["candidates"] == [1, 2, 3] and ov.pending == 6
    ov.update()
    assert ov.pending == 0
    assert [int(ov.events[t]) for t in (30, 31, 32, 33)] == [2, 2, 2, 0]
    assert [int(ov.passes[t]) for t in (30, 31, 32)] == [2, 2, 2]


def test_recorded_gain_is_the_entropy_reduction_of_verified_branches():
    ov = OnlineVocab(V, explore=3)
    run_pvf(ov)
    d = ov.take_pending()
    assert d["tok"].tolist() == [30, 31, 32]
    assert d["nonvac"].tolist() == [1, 1, 1] and d["passed"].tolist() == [1, 1, 1]
    # z_base and every branch have the same confident rows: no entropy reduction
    assert d["vig"].abs().max() < 1e-5

    def tab(g):
        f = filled(g)
        if not f:
            return {0: (10, .95), 1: (30, .5)}
        if f == {0}:
            return {2: (12, .95), 3: (13, .3)}
        if f == {0, 1}:
            return {2: (12, .95), 3: (13, .9)}
        return {i: (12, .95) for i in range(8)}
    ov = OnlineVocab(V, explore=1)
    run_pvf(ov, tab)
    d = ov.take_pending()

    # position 3: (13, .3) -> (13, .9), entropies in nats from -sum p log p
    dh = [0.0, (-.3 * math.log(.3) - .7 * math.log(.7 / 62))
          - (-.9 * math.log(.9) - .1 * math.log(.1 / 62))] + [0.0] * 4
    assert d["tok"].tolist() == [30] and d["passed"].tolist() == [1]
    assert d["vig"].item() == pytest.approx(sum(dh) / 6, abs=1e-5)    # R = W \ {0, 1}


def test_save_and_seed_round_trip(tmp_path):
    from pvf_lmeval.models.loader import checkpoint_folder, load_tokenizer
    from pvf_lmeval.planning.vocab import (artifact_statistics, load_artifact, online_artifact,
                                  resolve_artifact, save_artifact)

    tok = load_tokenizer(checkpoint_folder("tiny-llada"))
    ov = OnlineVocab(len(tok), level=0.05)
    ov.apply([delta([30] * 30 + [31] * 3, [1] * 33, [1] * 30 + [0] * 3, [0.1] * 30 + [0.0] * 3)])
    art = online_artifact(ov, tok, model_family="llada", task_family="math-word",
                          model_name="tiny-llada", requests=5)
    path = save_artifact(art, tmp_path / "o.json")
    loaded = load_artifact(path)
    assert loaded["kind"] == "online" and [t["id"] for t in loaded["tokens"]] == [30]
    assert [t["id"] for t in loaded["observed"]] == [31]
    assert resolve_artifact(loaded, tok, "llada") == (30,)
    seeded = OnlineVocab(len(tok), level=0.05)
    seeded.seed(artifact_statistics(loaded, tok, "llada"))
    for name in ("events", "attempts", "passes"):
        assert torch.equal(getattr(seeded, name), getattr(ov, name))
    assert torch.allclose(seeded.gain_sum, ov.gain_sum)
    assert seeded.eligible_ids() == [30]


def test_seeding_needs_statistics(tmp_path):
    from pvf_lmeval.models.loader import checkpoint_folder, load_tokenizer
    from pvf_lmeval.files.paths import vocab_artifacts_dir
    from pvf_lmeval.planning.vocab import artifact_statistics, load_artifact

    tok = load_tokenizer(checkpoint_folder("tiny-llada"))
    hand = load_artifact(vocab_artifacts_dir() / "tiny-llada.math-word.hand-written.json")
    with pytest.raises(ValueError, match="hand-written.json: kind 'hand-written' has no per-token"):
        artifact_statistics(hand, tok, "llada")


def _requests(model, online, order, batch, **kw):
    """Decode prompts in ``order``, updating the vocabulary after every ``batch`` requests."""
    outs = []
    for n, i in enumerate(order):
        if online is not None and n and n % batch == 0:
            online.update()
        outs.append(decode(model, [3 + i, 4, 5], "pvf", gen_length=8, block_length=4,
                           request_index=i, online=online, **kw).tokens)
    return outs


def test_deterministic_for_fixed_order_and_batch_size():
    model = RandomModel(5, jitter=0.3, eos_bias=-50.0)
    kw = dict(plan_lo=0.1, plan_hi=0.9, threshold=0.9)
    ova, ovb = OnlineVocab(24, explore=2), OnlineVocab(24, explore=2)
    a = _requests(model, ova, range(8), 1, **kw)
    b = _requests(model, ovb, range(8), 1, **kw)
    assert a == b and ova.updates > 0 and ova.events.sum() > 0
    assert torch.equal(ova.events, ovb.events) and torch.equal(ova.gain_sum, ovb.gain_sum)


def test_frozen_statistics_are_batch_size_invariant():
    model = RandomModel(5, jitter=0.3, eos_bias=-50.0)
    kw = dict(plan_lo=0.1, plan_hi=0.9)
    seeds = [rec(t, 40, 40, 40, 4.0) for t in range(0, 20, 2)]

    def frozen():
        ov = OnlineVocab(24, frozen=True)
        ov.seed(seeds)
        return ov
    one = _requests(model, frozen(), range(8), 1, **kw)
    four = _requests(model, frozen(), range(8), 4, **kw)
    ids = tuple(range(0, 20, 2))
    fixed = [decode(model, [3 + i, 4, 5], "pvf", gen_length=8, block_length=4, request_index=i,
                    plan_vocab=ids, **kw).tokens for i in range(8)]
    assert one == four == fixed
    ov = frozen()
    _requests(model, ov, range(8), 1, **kw)
    assert ov.pending == 0 and ov.updates == 0


def test_bad_online_arguments():
    from pvf_lmeval.lmeval.settings import VocabSettings

    with pytest.raises(ValueError, match="online_level=2.0 must be in"):
        VocabSettings.parse("online", {"online_level": "2"})
    with pytest.raises(ValueError, match="rho_ver applies only to vocab=online"):
        VocabSettings.parse("auto", {"rho_ver": "0.8"})
    with pytest.raises(ValueError, match="online_explore='x' must be an integer"):
        VocabSettings.parse("online", {"online_explore": "x"})
    cfg = VocabSettings.parse("online", {"online_frozen": "true", "rho_ver": "0.8"}).cfg
    assert cfg["frozen"] is True and cfg["rho_ver"] == 0.8


def test_adapter_updates_between_batches_and_saves(tmp_path, monkeypatch):
    from lm_eval.api.instance import Instance

    import pvf_lmeval.lmeval.lm as lm_mod
    from helpers.prerequisites import require_bundled_weights
    from pvf_lmeval.planning.vocab import load_artifact

    require_bundled_weights("tiny-llada")
    save = tmp_path / "online.json"
    lm = lm_mod.PVFDiffusionLM(pretrained="tiny-llada", device="cpu", decoder="pvf", preset="arith",
                               vocab="online", online_save=str(save), batch_size=2,
                               gen_length=32, block_length=32)
    assert lm.online is not None and lm.vocab_source == "online"
    decoded, updates = [], []
    real_decode, real_update = lm_mod.decode_batch, lm.vocab.update

    def spy(model, prompts, **k):
        decoded.extend([k["online"]] * len(prompts))
        return real_decode(model, prompts, **k)
    monkeypatch.setattr(lm_mod, "decode_batch", spy)
    monkeypatch.setattr(lm.vocab, "update",
                        lambda gather: updates.append(len(decoded)) or real_update(gather))
    kw = {"until": ["Question:"], "do_sample": False}
    reqs = [Instance(request_type="generate_until", doc={}, idx=0, doc_id=i, task_name="arith",
                     arguments=(f"Question: Tom has {i + 3} books. He gets 2 books from Noah. How "
                                "many books does Tom have now?\nAnswer:", dict(kw)))
            for i in range(3)]
    lm.generate_until(reqs)
    assert updates == [2, 3] and all(o is lm.online for o in decoded)
    art = load_artifact(save)
    assert art["kind"] == "online" and art["online"]["requests"] == 3


def test_exploration_in_a_batch_is_each_requests_own():
    """Within a batch the vocabulary does not change: every request decodes (all fields, trace
    included) as it does alone with a vocabulary in the same state, exploration slots counted
    per request."""
    from pvf_lmeval.decoding import decode_batch
    from helpers.result_fields import assert_same_outcomes
    model = RandomModel(5, jitter=0.3, eos_bias=-50.0)
    kw = dict(gen_length=8, block_length=4, plan_lo=0.05, plan_hi=0.9, threshold=0.9,
              trace=True)
    prompts = [[3 + i, 4, 5] for i in range(5)]
    alone = [decode(model, p, "pvf", request_index=i, online=OnlineVocab(24, explore=2), **kw)
             for i, p in enumerate(prompts)]
    together = decode_batch(model, prompts, "pvf", request_indices=list(range(5)),
                            online=OnlineVocab(24, explore=2), **kw)
    assert_same_outcomes(together, alone, "batch of 5", floats=True)
    assert sum(r.plan_tried for r in alone) > 0


def test_gain_sum_goes_through_the_batch_row_sum(monkeypatch):
    """The verification's entropy-reduction sum uses ``Batch.rowsum`` (the fixed order under
    ``batch_invariant``), like ``C_total``: both show up there, [R, K, L] and [R, K + 1, L]."""
    from pvf_lmeval.decoding.batch import Batch
    shapes = []
    real = Batch.rowsum
    monkeypatch.setattr(Batch, "rowsum", lambda self, x: (shapes.append(tuple(x.shape)),
                                                          real(self, x))[1])
    run_pvf(OnlineVocab(V, explore=3))
    assert (1, 3, 8) in shapes and (1, 4, 8) in shapes
