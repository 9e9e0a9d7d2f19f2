"""The shared loop: early stop, statistics, call accounting, randomness, equivalences."""

import math

import pytest
import torch
from helpers.decoding_tables import EOS, MASK, PROMPT, RandomModel, TableModel, filled, run

from pvf_lmeval.decoding import STAT_KEYS, DecodeResult, decode, make_params
from pvf_lmeval.decoding.blocks import block_size_of
from pvf_lmeval.decoding.batch import gumbel_like, mix_seed
from pvf_lmeval.decoding.select import rank_desc
from pvf_lmeval.decoding.stats import stats_from_logits
from pvf_lmeval.decoding.step import Branches

DECODERS = ("static", "threshold", "eb", "freedave", "pvf", "explore")

# ------------------------------------------------------------ early stop


def test_early_stop_fill_overwrites_and_skips_call():
    table = lambda g: {0: (10, .95), 1: (EOS, .95), 3: (13, .95)}
    r, m = run("threshold", table, gen_length=8, block_length=4)
    assert m.calls == [(1, (0, 8))]                       # the step makes no call
    assert r.tokens == [10, EOS] + [EOS] * 6
    assert r.routes == ["base", "base"] + [None] * 6      # position 3 overwritten
    assert (r.committed, r.gen_tokens, r.tokens_base, r.early_stop) == (2, 1, 2, True)


def test_early_stop_waits_for_earlier_masks():
    def table(g):
        f = filled(g)
        if f == {2}:
            return {0: (10, .95), 1: (11, .5)}
        if f == {0, 2}:
            return {1: (11, .5)}
        return {2: (EOS, .95)}
    r, m = run("threshold", table, gen_length=4)
    # EOS at 2 first; stop only once 0 and 1 are filled (after the third commit, no call)
    assert [s["committed"] for s in r.steps] == [[[2, "base"]], [[0, "base"]], [[1, "forced"]]]
    assert r.nfe == 3 and r.tokens == [10, 11, EOS, EOS] and r.routes[3] is None
    assert r.steps[-1]["early_stop_at"] == 2


def test_early_stop_off_fills_everything():
    table = lambda g: {0: (10, .95), 1: (EOS, .95), 3: (13, .95)}
    r, m = run("threshold", table, gen_length=8, block_length=4, early_stop=False)
    assert r.committed == 8 and None not in r.routes and r.early_stop is False
    assert r.tokens[3] == 13 and r.gen_tokens == 1


def test_fill_uses_token_at_e_with_several_eos_ids():
    table = lambda g: {0: (3, .95), 1: (11, .95)}
    r, _ = run("threshold", table, gen_length=4, model_kw={"eos_ids": (EOS, 3)})
    assert r.tokens == [3, 3, 3, 3] and r.gen_tokens == 0 and r.committed == 1


# ------------------------------------------------------------ statistics schema


def test_stats_keys_and_values():
    r, _ = run("threshold", lambda g: {i: (10 + i, .95) for i in range(8)}, gen_length=8,
               block_length=4)
    st = r.stats()
    assert tuple(st) == STAT_KEYS
    assert set(st) == {"nfe", "branch_rows", "gen_length", "gen_tokens", "committed", "tpf",
                       "wall_s", "tps", "tokens_base", "tokens_plan", "tokens_ar",
                       "tokens_forced", "tokens_explore", "tokens_edit", "edits", "remasks"}
    assert st["edits"] == st["remasks"] == st["tokens_edit"] == 0
    assert st["nfe"] == 2 and st["gen_tokens"] == 8 and st["tpf"] == 4.0
    assert st["wall_s"] > 0 and math.isclose(st["tps"], 8 / st["wall_s"])
    assert st["tokens_base"] + st["tokens_forced"] == st["committed"] == 8
    assert isinstance(r, DecodeResult) and len(r.routes) == len(r.tokens) == 8


def test_trace_off_by_default_and_prompt_as_tensor():
    m = TableModel(lambda g: {})
    r = decode(m, torch.tensor(PROMPT), "static", gen_length=4, block_length=4)
    assert r.steps is None and r.nfe == 4
    assert all(len(row) == 4 for c in m.canvases for row in c)


def test_model_device_attribute_used():
    m = TableModel(lambda g: {})
    m.device = "cpu"
    r = decode(m, PROMPT, "threshold", gen_length=4, block_length=4)
    assert r.nfe == 4


# ------------------------------------------------------------ probabilities


def test_mask_never_wins_and_conf_is_renormalised():
    lg = torch.full((1, 1, 8), -10.0)
    lg[0, 0, 7] = 5.0      # mask id 7 would win
    lg[0, 0, 3] = 1.0
    tok, conf, pmax, pcur = stats_from_logits(lg.clone(), torch.tensor([[7]]), 7)
    ref = torch.softmax(torch.cat([lg[0, 0, :7], torch.tensor([-math.inf])]), -1)
    assert tok.item() == 3 and math.isclose(conf.item(), ref[3].item(), rel_tol=1e-5)
    assert pcur.item() == 0.0


def test_temperature_confidence_is_raw_softmax():
    lg = torch.tensor([[[2.0, 1.9, -5.0, -5.0]]])
    noise = torch.tensor([[0.0, 10.0, 0.0, 0.0]])     # forces token 1
    tok, conf, pmax, _ = stats_from_logits(lg.clone(), torch.tensor([[0]]), 3, 0.5, noise)
    p = torch.softmax(torch.tensor([2.0, 1.9, -5.0, -math.inf]), -1)
    assert tok.item() == 1
    assert math.isclose(conf.item(), p[1].item(), rel_tol=1e-5)
    assert math.isclose(pmax.item(), p[0].item(), rel_tol=1e-5)


def test_request_seeds_are_fixed_values():
    """The per-request seed (blake2b of "seed/request/repeat", little-endian, 63 bits) is part of
    what a sampled run reproduces across processes and releases: its values are pinned."""
    assert mix_seed(0, 0, 0) == 393751907897447445
    assert mix_seed(1234, 7, 2) == 3534159876084539043
    assert mix_seed(-1, 3, 0) == 2664277650919298456


def test_rank_ties_go_to_the_lower_index_at_any_length():
    # 64 positions: long enough for an unstable sort to reorder equal keys
    conf = torch.zeros(2, 64)
    conf[1, ::3] = 0.5
    members = torch.ones(2, 64, dtype=torch.bool)
    members[1, 1] = False
    rank = rank_desc(conf, members)
    assert rank[0].tolist() == list(range(64))
    twos = list(range(0, 64, 3))                      # 22 positions at 0.5 first, then the rest
    rest = [i for i in range(64) if i % 3 and i != 1]
    want = [64] * 64
    for r, i in enumerate(twos + rest):
        want[i] = r
    assert rank[1].tolist() == want


class _Net:
    def __init__(self, block_size):
        self.block_size = block_size


@pytest.mark.parametrize("bs", [True, 0, -4, 2.0, "4"])
def test_a_model_block_size_must_be_a_positive_integer(bs):
    with pytest.raises(ValueError) as err:
        block_size_of(_Net(bs))
    assert str(err.value) == f"model block_size={bs!r} must be a positive integer or None"


def test_gumbel_seeded():
    g1 = torch.Generator().manual_seed(1)
    g2 = torch.Generator().manual_seed(1)
    assert torch.equal(gumbel_like((3, 5), g1, "cpu"), gumbel_like((3, 5), g2, "cpu"))


@pytest.mark.parametrize("dec", DECODERS)
def test_temperature_determinism(dec):
    kw = dict(gen_length=16, block_length=8, temperature=1.0, plan_vocab=range(5, 15))
    out = {}
    for seed, req in [(0, 0), (0, 0), (1, 0), (0, 1), (2, 0), (0, 2)]:
        r = decode(RandomModel(3, eos_bias=-20), PROMPT, dec, seed=seed, request_index=req, **kw)
        out.setdefault((seed, req), []).append(r.tokens)
    assert out[(0, 0)][0] == out[(0, 0)][1]
    # every other seed and every other request index draws other noise: five different outputs
    assert len({str(v[0]) for v in out.values()}) == 5


def test_noise_independent_of_other_requests():
    kw = dict(gen_length=16, block_length=8, temperature=0.7)
    a = decode(RandomModel(4), PROMPT, "threshold", request_index=5, **kw)
    decode(RandomModel(4), [7, 8], "threshold", request_index=6, **kw)
    b = decode(RandomModel(4), PROMPT, "threshold", request_index=5, **kw)
    assert a.tokens == b.tokens and a.nfe == b.nfe


# ------------------------------------------------------------ call accounting


@pytest.mark.parametrize("dec", DECODERS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_call_accounting(dec, seed):
    m = RandomModel(seed, eos_bias=-3)
    kw = dict(gen_length=24, block_length=8, plan_vocab=range(5, 15), trace=True)
    if dec in ("pvf", "explore"):
        kw["reveal_next"] = 2
    r = decode(m, PROMPT, dec, **kw)
    assert r.nfe == m.nfe and r.branch_rows == sum(m.calls)
    assert [s["step"] for s in r.steps] == list(range(len(r.steps)))   # one record per round
    prev = 1
    for s in r.steps:                 # each step makes at most one call
        assert s["nfe"] - prev == (1 if s["made_call"] else 0)
        prev = s["nfe"]
    assert r.nfe == 1 + sum(s["made_call"] for s in r.steps)
    if dec in ("static", "threshold", "eb", "explore"):  # single-row: the final commit needs no call
        assert not r.steps[-1]["made_call"]
    assert r.committed == sum(r.routes.count(x) for x in
                              ("base", "plan", "ar", "forced", "explore"))
    assert r.committed == sum(len(s["committed"]) for s in r.steps) - \
        sum(1 for s in r.steps for p, _ in s["committed"] if r.routes[p] is None)
    assert MASK not in r.tokens and 23 not in r.tokens


# ------------------------------------------------------------ equivalences


CONFIGS = [dict(early_stop=True), dict(early_stop=False), dict(temperature=0.8),
           dict(threshold=0.7, plan_lo=0.1, plan_hi=0.5)]


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("cfg", range(len(CONFIGS)))
def test_pvf_routes_none_equals_threshold(seed, cfg):
    kw = dict(gen_length=24, block_length=8, **CONFIGS[cfg])
    a = decode(RandomModel(seed, eos_bias=-2), PROMPT, "threshold",
               **{k: v for k, v in kw.items() if not k.startswith("plan")})
    b = decode(RandomModel(seed, eos_bias=-2), PROMPT, "pvf", routes="none", reveal_next=0,
               plan_vocab=range(24), **kw)
    assert (a.tokens, a.nfe, a.branch_rows, a.routes) == (b.tokens, b.nfe, b.branch_rows, b.routes)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("cfg", range(3))
def test_freedave_one_draft_equals_static(seed, cfg):
    kw = dict(gen_length=24, block_length=8, **CONFIGS[cfg])
    a = decode(RandomModel(seed, eos_bias=-2), PROMPT, "static", **kw)
    b = decode(RandomModel(seed, eos_bias=-2), PROMPT, "freedave", draft_steps=1, **kw)
    assert (a.tokens, a.nfe, a.branch_rows, a.routes) == (b.tokens, b.nfe, b.branch_rows, b.routes)


def test_pvf_with_routes_differs_from_threshold_somewhere():
    diff = 0
    for seed in range(4):
        kw = dict(gen_length=24, block_length=8)
        a = decode(RandomModel(seed, eos_bias=-3), PROMPT, "threshold", **kw)
        b = decode(RandomModel(seed, eos_bias=-3), PROMPT, "pvf", plan_vocab=range(24), **kw)
        diff += (a.nfe, a.tokens) != (b.nfe, b.tokens)
    assert diff > 0


def test_params_object_and_overrides():
    p = make_params("pvf", gen_length=16, block_length=8, plan_vocab=range(5, 15))
    a = decode(RandomModel(1), PROMPT, params=p)
    b = decode(RandomModel(1), PROMPT, "pvf", gen_length=16, block_length=8,
               plan_vocab=range(5, 15))
    assert a.tokens == b.tokens and a.decoder == "pvf"
    c = decode(RandomModel(1), PROMPT, "threshold", params=p)
    assert c.decoder == "threshold"
    with pytest.raises(ValueError, match="gen_length=12"):
        decode(RandomModel(1), PROMPT, params=p, gen_length=12)


def test_branches_of_the_requests_left_keep_every_field():
    """When requests finish, the loop keeps the others' branches: every per-request field
    (rows, n, labels, cover, unmade and the memo's tensors, tuples included) keeps their rows, in
    the order asked; plain values stay."""
    br = Branches(torch.arange(24).reshape(4, 2, 3), torch.tensor([2, 0, 1, 2]),
                  torch.arange(12, dtype=torch.int8).reshape(4, 3), entropy=True,
                  memo=dict(W=torch.tensor([10, 11, 12, 13]), pair=(torch.arange(4) * 2, 7), k=5),
                  cover=torch.tensor([0, 3, 6, 9]), unmade=torch.tensor([1, 0, 2, 0]))
    kept = br.select(torch.tensor([3, 1]))
    assert kept.rows.tolist() == [[[18, 19, 20], [21, 22, 23]], [[6, 7, 8], [9, 10, 11]]]
    assert kept.n.tolist() == [2, 0] and kept.labels.tolist() == [[9, 10, 11], [3, 4, 5]]
    assert kept.cover.tolist() == [9, 3] and kept.unmade.tolist() == [0, 0]
    assert kept.memo["W"].tolist() == [13, 11] and kept.memo["k"] == 5
    assert kept.memo["pair"][0].tolist() == [6, 2] and kept.memo["pair"][1] == 7
    assert kept.entropy is True
    none = Branches(br.rows, br.n, br.labels).select(torch.tensor([0]))
    assert none.cover is None and none.unmade is None and none.memo == {}
