"""``rules=paper|reference``: each switch of ``decoding.rules`` pinned on hand-built tables.

Every test runs the same table under the paper's rules and with one switch turned on (the other
switches off), so a test fails if its switch stops doing exactly its one thing; the last tests
run ``rules=reference`` as a whole through ``decode``.
"""

import pytest
import torch

from helpers.decoding_tables import failed_fill_table, filled, run

from pvf_lmeval.decoding import step as step_mod
from pvf_lmeval.decoding.select import threshold_select
from pvf_lmeval.decoding.rules import PAPER, REFERENCE, Rules, rules_for

VOCAB = {30, 31, 32, 33}


@pytest.fixture
def switch(monkeypatch):
    """``switch(name)``: steps built afterwards follow the paper's rules plus that one switch."""
    def on(name: str):
        monkeypatch.setattr(step_mod, "rules_for", lambda _: Rules("one", **{name: True}))
    return on


def pvf(table, **kw):
    args = dict(plan_vocab=VOCAB, gen_length=8)
    args.update(kw)
    return run("pvf", table, **args)


def committed(step):
    return step["committed"]


# ------------------------------------------------------------ 1. factor rule quirk

FACTOR_TABLE = {0: (10, .9), 1: (11, .8), 2: (12, .76), 3: (13, .1)}   # f=1: .5, .67, .75, .8


def test_factor_first_failure_at_last_rank_commits_all(switch):
    table = lambda g: {} if filled(g) else FACTOR_TABLE
    r, _ = run("threshold", table, gen_length=4, factor=1.0)
    assert [p for p, _ in committed(r.steps[0])] == [0, 1, 2]
    switch("factor_last_rank_commits_all")
    r, _ = run("threshold", table, gen_length=4, factor=1.0)
    assert committed(r.steps[0]) == [[0, "base"], [1, "base"], [2, "base"], [3, "base"]]


def test_factor_quirk_only_at_the_last_rank():
    conf = torch.tensor([[.9, .8, .7, .1, .1]])                       # fails first at rank 2 of 5
    members = torch.ones_like(conf, dtype=torch.bool)
    for quirk in (False, True):
        sel, _ = threshold_select(conf, members, .9, 1.0, last_rank_commits_all=quirk)
        assert sel.tolist() == [[True, True, False, False, False]]
    two = torch.tensor([[.4, .3]])                                    # nothing clears, 2 members
    sel, forced = threshold_select(two, torch.ones_like(two, dtype=torch.bool), .9, 1.0)
    assert sel.tolist() == [[True, False]] and forced.tolist() == [[True, False]]
    sel, forced = threshold_select(two, torch.ones_like(two, dtype=torch.bool), .9, 1.0,
                                   last_rank_commits_all=True)
    assert sel.tolist() == [[True, True]] and not forced.any()


def test_factor_quirk_in_freedave_targets(switch):
    # drafts commit one position at a time; target_0 under the threshold base rule (factor 1)
    # commits 0,1,2 (paper) or all four (quirk); under draft 3 position 3 predicts another
    # token, so draft 4 is accepted only through target_0, i.e. only with the quirk
    table = lambda g: {3: (14, .1)} if filled(g) == {0, 1, 2} else FACTOR_TABLE
    r, _ = run("freedave", table, gen_length=4, base_rule="threshold", factor=1.0)
    paper_accepted = r.steps[0]["accepted"]
    switch("factor_last_rank_commits_all")
    r, _ = run("freedave", table, gen_length=4, base_rule="threshold", factor=1.0)
    assert (paper_accepted, r.steps[0]["accepted"]) == (3, 4)


# ------------------------------------------------------------ 3. forced token after the routes

def _forced_table(g):
    f = filled(g)
    if not f:
        return {0: (10, .6), 1: (30, .5)}      # nothing >= tau: top is 0; 1 is a candidate
    if f == {0}:
        return {2: (12, .95)}                  # impact set {2}
    if f == {0, 1}:
        return {2: (12, .95)}
    return {}


def test_forced_token_before_planning_under_the_paper():
    r, m = pvf(_forced_table)
    assert committed(r.steps[0]) == [[0, "forced"], [1, "plan"]]
    assert [filled(c) for c in m.canvases[1]] == [{0}, {0, 1}]


def test_forced_token_only_when_nothing_else_commits(switch):
    switch("force_after_routes")
    r, m = pvf(_forced_table)
    # the base row is the state itself: its impact set is empty, so planning fails (paper
    # verification); nothing was committed, so the top position is forced after the call and
    # the next round is a fresh call on that state
    assert [filled(c) for c in m.canvases[1]] == [set(), {1}]
    assert committed(r.steps[0]) == [[0, "forced"]]
    assert r.steps[1]["route"] == "fresh" and committed(r.steps[1]) == []
    assert [filled(c) for c in m.canvases[2]] == [{0}]


def test_explore_forces_only_without_an_extra_pick(switch):
    table = lambda g: {} if filled(g) else {0: (10, .6), 1: (11, .5)}
    kw = dict(gen_length=4, band=(0.4, 0.55), pick="random")
    r, _ = run("explore", table, **kw)
    assert committed(r.steps[0]) == [[0, "forced"], [1, "explore"]]
    switch("force_after_routes")
    r, _ = run("explore", table, **kw)
    assert committed(r.steps[0]) == [[1, "explore"]]


# ------------------------------------------------------------ 4. impact set composition

def _impact_table(base_row, branch_row):
    def table(g):
        f = filled(g)
        if not f:
            return {0: (10, .95), 1: (30, .5)}
        if f == {0}:
            return base_row
        if f == {0, 1}:
            return branch_row
        return {}
    return table


def test_impact_set_includes_base_committed_positions(switch):
    # the base-committed position 0 is confident under z_base; the branch changes its argmax
    table = _impact_table({0: (10, .99), 2: (12, .95)}, {0: (11, .99), 2: (12, .95)})
    r, _ = pvf(table)
    assert r.steps[0]["verified"] == [True] and r.steps[0]["route"] == "plan"
    switch("impact_includes_committed")
    r, _ = pvf(table)
    assert r.steps[0]["verified"] == [False] and r.steps[0]["route"] == "base"


def test_impact_set_includes_the_candidate_position(switch):
    # the candidate's own position is >= tau under z_base; its branch predicts another token there
    table = _impact_table({1: (30, .95)}, {1: (31, .99)})
    r, _ = pvf(table, plan_hi=0.9)
    assert r.steps[0]["verified"] == [False]            # paper: S_imp minus own = empty
    switch("impact_includes_committed")
    r, _ = pvf(table, plan_hi=0.9)
    assert r.steps[0]["verified"] == [False]            # own position compared: 31 != 30
    agree = _impact_table({1: (30, .95)}, {1: (30, .99)})
    r, _ = pvf(agree, plan_hi=0.9)
    assert r.steps[0]["verified"] == [True]


def test_empty_impact_set_passes(switch):
    table = _impact_table({}, {})
    r, _ = pvf(table)
    assert r.steps[0]["verified"] == [False] and r.steps[0]["route"] == "base"
    switch("impact_includes_committed")
    r, _ = pvf(table)
    assert r.steps[0]["verified"] == [True] and committed(r.steps[0]) == [[0, "base"], [1, "plan"]]


# ------------------------------------------------------------ 5. C_total composition

def _c_total_table(g):
    f = filled(g)
    if not f:
        return {0: (10, .95), 1: (30, .6), 2: (31, .5)}
    if f == {0}:
        return {3: (13, .95)}
    if f == {0, 1}:
        return {3: (13, .95), 1: (30, .3), 4: (14, .8)}
    if f == {0, 2}:
        return {3: (13, .95), 2: (31, .99), 4: (14, .5)}
    return {}


def test_c_total_over_positions_still_masked(switch):
    r, _ = pvf(_c_total_table)
    s = r.steps[0]
    assert s["candidates"] == [1, 2] and s["verified"] == [True, True]
    assert s["c_total"] == pytest.approx([1.95, 1.65], abs=1e-4)
    assert [p for p, route in committed(s) if route == "plan"] == [1]
    switch("c_total_over_step_masks")
    r, _ = pvf(_c_total_table)
    s = r.steps[0]
    # every position of W_t masked before the base commit: 0 and the own position count too
    assert s["c_total"] == pytest.approx([2.30, 2.69], abs=1e-4)
    assert [p for p, route in committed(s) if route == "plan"] == [2]


# ------------------------------------------------------------ 6. AR after a failed plan

def _failed_plan_table(g):
    f = filled(g)
    if not f:
        return {0: (10, .95), 1: (30, .5), 2: (11, .5)}
    if f == {0}:                         # z_base: impact set {3}; 4 becomes a candidate
        return {2: (11, .5), 3: (13, .95), 4: (32, .4)}
    if f == {0, 1}:
        return {3: (14, .95)}            # disagrees: the plan fails
    if f == {0, 3}:
        return {2: (11, .6), 4: (32, .4)}
    if f == {0, 2, 3}:
        return {4: (32, .4)}
    return {}


def test_failed_plan_then_a_normal_step(switch):
    r, m = pvf(_failed_plan_table)
    assert r.steps[0]["route"] == "base" and committed(r.steps[0]) == [[0, "base"]]
    assert r.steps[1]["candidates"] == [4] and m.calls[2][0] == 2     # planning again


def test_failed_plan_continues_with_ar_from_the_base_row(switch):
    switch("ar_after_failed_plan")
    r, m = pvf(_failed_plan_table)
    assert committed(r.steps[0]) == [[0, "base"]]
    s = r.steps[1]
    assert s["route"] == "ar" and s["candidates"] == [2, 4]           # no planning, AR fills
    assert [filled(c) for c in m.canvases[2]] == [{0, 3}, {0, 2, 3}, {0, 2, 3, 4}]
    assert committed(s) == [[2, "ar"], [3, "base"], [4, "ar"]]


def _refill_table(g):
    f = filled(g)
    if not f:                            # base set {0, 1}; candidate 2, whose impact set is empty
        return {0: (10, .95), 1: (11, .95), 2: (30, .5)}
    if f == {0, 1}:                      # z_base: 2 is now confident, 0 is not
        return {0: (15, .5), 1: (11, .99), 2: (31, .95)}
    if f == {0, 1, 2}:                   # the plan branch, and the AR rows: 15 at 0 verifies
        return {0: (15, .9), 1: (11, .99), 2: (31, .99)}
    return {}


def test_failed_plan_refills_a_base_position_when_no_mask_is_left(switch):
    r, m = pvf(_refill_table, gen_length=3, block_length=3)
    assert r.steps[0]["route"] == "base" and r.tokens[:3] == [10, 11, 31]
    switch("ar_after_failed_plan")
    r, m = pvf(_refill_table, gen_length=3, block_length=3)
    assert committed(r.steps[0]) == [[0, "base"], [1, "base"]]
    # H under z_base ({1, 2}) completes the canvas, yet the reference still makes its second
    # call: position 0 (a base-set position, p .5 under z_base) is an AR fill, and it verifies
    s = r.steps[1]
    assert s["made_call"] and s["route"] == "ar" and s["candidates"] == [0]
    assert [filled(c) for c in m.canvases[-1]] == [{0, 1, 2}, {0, 1, 2}]
    assert r.tokens[:3] == [15, 11, 31] and r.nfe == 3


# ------------------------------------------------------------ 7. fresh call after a failed fill

def test_failed_fill_reuses_the_call(switch):
    r, m = pvf(failed_fill_table)
    assert r.steps[0]["route"] == "base" and r.steps[0]["verified"] == [False]
    assert r.steps[1]["route"] == "ar" and committed(r.steps[1]) == [[2, "ar"], [3, "base"]]
    paper = (r.nfe, r.tokens)
    switch("fresh_call_after_failed_fill")
    r, m = pvf(failed_fill_table)
    assert r.steps[1]["route"] == "fresh" and committed(r.steps[1]) == []
    assert [filled(c) for c in m.canvases[2]] == [{0}]
    assert committed(r.steps[2]) == [[2, "ar"], [3, "base"]]
    assert (r.nfe, r.tokens) == (paper[0] + 1, paper[1])


# ------------------------------------------------------------ 8. self-check probability

def _self_check_table(own_dist):
    return _impact_table({2: (12, .95)}, {2: (12, .95), 1: own_dist})


def test_self_check_tests_the_top_probability(switch):
    placed_unlikely = _self_check_table((31, .6))    # p(30) tiny, top probability .6
    r, _ = pvf(placed_unlikely)
    assert r.steps[0]["verified"] == [True]          # no self-check by default
    r, _ = pvf(placed_unlikely, plan_self_check=True)
    assert r.steps[0]["verified"] == [False]         # paper's check: the placed token's p
    switch("self_check_max_prob")
    r, _ = pvf(placed_unlikely)
    assert r.steps[0]["verified"] == [True]          # top probability .6 >= plan_lo
    r, _ = pvf(_self_check_table((30, .1)))
    assert r.steps[0]["verified"] == [False]         # top probability .1 < plan_lo, always on


# ------------------------------------------------------------ rules=reference as a whole

def test_rule_sets():
    assert rules_for("paper") == PAPER and not any(
        v for k, v in vars(PAPER).items() if k != "name")
    assert all(v for k, v in vars(REFERENCE).items() if k != "name")
    with pytest.raises(ValueError, match=r"rules='bogus' must be one of paper, reference"):
        rules_for("bogus")


def test_rules_argument_of_decode():
    from pvf_lmeval.decoding import decode
    from helpers.decoding_tables import PROMPT, TableModel

    with pytest.raises(ValueError, match="rules"):
        decode(TableModel(lambda g: {}), PROMPT, "pvf", gen_length=8, rules="authors")
    r, _ = pvf(failed_fill_table, rules="reference")
    assert r.steps[1]["route"] == "fresh"
    r, _ = pvf(_forced_table, rules="reference")
    # reference: no forced base; the empty impact set passes, but the top-probability
    # self-check fails (.05 at the branch's own position); nothing is committed and the next
    # round fills from the base row by AR: 0 is verified, 1 is not
    assert committed(r.steps[0]) == [] and r.steps[0]["route"] == "base"
    assert r.steps[1]["route"] == "ar" and r.steps[1]["candidates"] == [0, 1]
    assert committed(r.steps[1]) == [[0, "ar"]]


@pytest.mark.parametrize("cache", ["none", "dual"])
def test_reference_batch_sizes_identical(llada, one_thread, cache):
    """The modes carried between rounds are per request: batches of 1, 3 and 8 agree."""
    from helpers.cache_models import arith_prompts
    from helpers.result_fields import assert_same_outcomes
    from pvf_lmeval.decoding import decode, decode_batch

    prompts, _ = arith_prompts(llada.tokenizer, 8)
    prompts = [p[:len(p) - (i % 4)] for i, p in enumerate(prompts)]
    idx = [100 + 7 * i for i in range(len(prompts))]
    for temperature in (0.0, 0.8):
        kw = dict(gen_length=24, block_length=8, cache=cache, temperature=temperature, seed=3,
                  preset="arith", reveal_next=3, plan_vocab=list(range(0, 600, 3)),
                  rules="reference", early_stop=False)
        single = [decode(llada, p, "pvf", request_index=i, trace=True, **kw)
                  for p, i in zip(prompts, idx)]
        for bs in (3, 8):
            got = []
            for a in range(0, len(prompts), bs):
                got += decode_batch(llada, prompts[a:a + bs], "pvf", trace=True,
                                    request_indices=idx[a:a + bs], **kw)
            assert_same_outcomes(got, single, (cache, temperature, bs))


def test_single_switches_by_name():
    r = rules_for("paper+fresh_call_after_failed_fill+self_check_max_prob")
    assert r.fresh_call_after_failed_fill and r.self_check_max_prob and not r.force_after_routes
    assert rules_for("impact_includes_committed").impact_includes_committed
    with pytest.raises(ValueError, match="switches joined by '\\+' from: factor_last_rank"):
        rules_for("paper+fresh_call")
    fresh, _ = pvf(failed_fill_table, rules="fresh_call_after_failed_fill")
    assert fresh.steps[1]["route"] == "fresh"


# ------------------------------------------------------------ 2. capitalised planning tokens

def test_capitalised_ids_of_a_real_tokenizer(llada):
    from pvf_lmeval.planning.vocab import capitalised_ids

    tok = llada.tokenizer
    caps = capitalised_ids(tok)
    texts = {i: tok.decode([i]).strip() for i in caps}
    assert caps and all(t[0].isupper() for t in texts.values())
    lower = [i for i in range(len(tok)) if tok.decode([i]).strip()[:1].islower()]
    assert lower and not caps & set(lower)
    assert not caps & set(tok.all_special_ids)


class _Texts:
    """A tokenizer stub: ids 0..7 decode to fixed texts; ``special`` (if given) becomes
    ``all_special_ids``."""

    TEXTS = [" a", "Bos", " Emma", "the", "Pad", "The", "  ", " Zed"]

    def __init__(self, special=None):
        if special is not None:
            self.all_special_ids = special

    def __len__(self) -> int:
        return len(self.TEXTS)

    def decode(self, ids) -> str:
        return self.TEXTS[ids[0]]


def test_capitalised_ids_leave_out_special_tokens():
    from pvf_lmeval.decoding.plan_vocab import capitalised_ids

    # capitalised texts: 1 "Bos", 2 " Emma", 4 "Pad", 5 "The", 7 " Zed"; 1 and 4 are special
    assert capitalised_ids(_Texts([1, 4])) == frozenset({2, 5, 7})
    assert capitalised_ids(_Texts([])) == frozenset({1, 2, 4, 5, 7})
    assert capitalised_ids(_Texts()) == frozenset({1, 2, 4, 5, 7})     # no all_special_ids


def test_adapter_adds_capitalised_tokens_under_reference_rules(one_thread):
    from pvf_lmeval.lmeval.lm import PVFDiffusionLM
    from pvf_lmeval.planning.vocab import capitalised_ids

    paper = PVFDiffusionLM(pretrained="tiny-llada", device="cpu", decoder="pvf", preset="arith",
                           vocab="none")
    assert paper.params.plan_vocab is None
    ref = PVFDiffusionLM(pretrained="tiny-llada", device="cpu", decoder="pvf", preset="arith",
                         vocab="none", rules="reference")
    assert set(ref.params.plan_vocab) == capitalised_ids(ref.tokenizer)
    with pytest.raises(ValueError, match="rules=reference adds capitalised tokens"):
        PVFDiffusionLM(pretrained="tiny-llada", device="cpu", decoder="pvf", preset="arith",
                       vocab="online", rules="reference")


# ------------------------------------------------------------ 9. calls counted but not made

def test_unmade_call_counted_after_a_failed_plan_with_nothing_to_fill():
    def table(g):
        f = filled(g)
        if not f:
            return {0: (10, .95), 1: (30, .5)}
        if f == {0}:
            return {3: (13, .95)}        # impact set {3}; nothing else reaches ar_lo
        if f == {0, 1}:
            return {3: (14, .95)}        # the plan fails
        return {}
    from helpers.decoding_tables import PROMPT, TableModel
    from pvf_lmeval.decoding import decode

    base, m0 = pvf(table, rules="ar_after_failed_plan")
    assert base.steps[1]["route"] == "base" and m0.canvases[2] == [[10] + [None] * 7]
    m1 = TableModel(table)
    counted = decode(m1, PROMPT, "pvf", plan_vocab=VOCAB, gen_length=8, block_length=8,
                     trace=True,
                     rules="ar_after_failed_plan+count_unmade_calls")
    assert (counted.tokens, m1.nfe) == (base.tokens, m0.nfe)       # the same calls made
    assert counted.nfe == base.nfe + 1                             # ... one more counted
