"""``pvf`` with ``rules=reference``: the per-request modes carried from one round to the next.

docs/reference-differences.md, switches 3, 6 and 7: a round that tries no route commits its base
set (or the forced token when the base set is empty, nothing else can commit); a failed planning
round is followed by an AR round from its base row (AR_NEXT), which commits the high-confidence
set H of the failed round's working set inside its active block, rewrites the base-set positions
of H with the base row's tokens and masks H outside that block again; an AR round that verifies
no fill is followed by a fresh call (FRESH), and its top position is forced only when the step
committed nothing and no later round commits for it. Every expected value below is derived by
hand from those rules on the table of the test.
"""

from __future__ import annotations

from helpers.decoding_tables import PROMPT, TableModel, failed_fill_table, filled, run
from test_decoding_threshold import exact_conf

from pvf_lmeval.decoding import decode, decode_batch

VOCAB = {30, 31, 32, 33}
REF = dict(plan_vocab=VOCAB, rules="reference")
_ = None        # a masked position in a canvas


def pvf(table, **kw):
    return run("pvf", table, **{**REF, **kw})


def steps(r, *keys):
    """Per step: the committed positions with their routes, then ``keys`` of the record."""
    return [[s["committed"]] + [s.get(k) for k in keys] for s in r.steps]


def gen(canvas) -> list:
    """A recorded canvas with every masked position as ``_``."""
    return [_ if t is None else t for t in canvas]


# ------------------------------------------------------------ no route: base set or forced

def test_a_round_without_a_route_commits_its_base_set_or_forces():
    # only position 0 is confident; nothing is a candidate or reaches ar_lo (.05 < .1): the
    # steps are threshold's, labels included, and a round never turns into a fresh call
    table = lambda g: {} if filled(g) else {0: (10, .95)}
    r, m = pvf(table, gen_length=4)
    assert steps(r, "route", "made_call") == [
        [[[0, "base"]], "base", True], [[[1, "forced"]], "base", True],
        [[[2, "forced"]], "base", True], [[[3, "forced"]], "base", False]]
    assert r.tokens == [10, 5, 5, 5] and (r.nfe, r.branch_rows) == (4, 4)


# ------------------------------------------------------------ a failed fill: FRESH next

def test_a_failed_fill_after_a_base_commit_forces_nothing():
    # round 0 commits its base set {0} and fails its fill: something was committed, so no
    # forced token; round 1 is a fresh call on {0}; round 2 fills 2 from its stats
    r, m = pvf(failed_fill_table, gen_length=4)
    assert steps(r, "route", "verified") == [
        [[[0, "base"]], "base", [False]], [[], "fresh", None],
        [[[2, "ar"], [3, "base"]], "ar", [True]], [[[1, "forced"]], "base", None]]
    assert [gen(c) for c in m.canvases[2]] == [[10, _, _, _]]
    assert r.tokens == [10, 5, 12, 13] and (r.nfe, r.branch_rows) == (4, 6)


# ------------------------------------------------------------ AR after a failed plan

def _refill_table(g):
    """Blocks of 4, threshold .5 (exact in float32), ar_lo .125 (exact), plan band [.2, .5)."""
    f = filled(g)
    if not f:
        return {0: (10, .95)}
    if f == {0}:                          # base set {1}; 2 is a candidate (token 30, p .3)
        return {1: (11, .95), 2: (30, .3)}
    if f == {0, 1}:                       # z_base: H = {1 (base set), 3 (p = threshold)};
        return {1: (13, .95), 2: (31, .125), 3: (12, .5)}    # 2 reaches ar_lo exactly
    if f == {0, 1, 2}:                    # the plan disagrees at 3
        return {1: (13, .95), 3: (14, .95)}
    if f == {0, 1, 3}:                    # the fill of 31 at 2 is verified
        return {2: (31, .4)}
    if f == {0, 1, 2, 3}:
        return {i: (10 + i, .95) for i in range(4, 8)}
    return {}


def test_ar_after_a_failed_plan_commits_h_in_the_block_and_rewrites_the_base_set():
    # the ties are exact: these probabilities come out of float32 softmax as .125 and .5
    assert (exact_conf((31, .125)), exact_conf((12, .5))) == (.125, .5)
    kw = dict(gen_length=8, block_length=4, threshold=.5, plan_hi=.5, ar_lo=.125)
    r, m = pvf(_refill_table, **kw)
    assert steps(r, "route", "candidates", "verified") == [
        [[[0, "base"]], "base", None, None],
        [[[1, "base"]], "base", [2], [False]],
        # AR_NEXT from z_base's stats: W' = {1, 2, 3}, S' = {1}; H = {1, 3} (3 at p = tau);
        # the failed round's block starts at position 1 (block 0): 3 is committed (base) and
        # the base set's 1 is rewritten with z_base's 13; 2 (p = ar_lo) is the one fill
        [[[2, "ar"], [3, "base"]], "ar", [2], [True]],
        [[[4, "base"], [5, "base"], [6, "base"], [7, "base"]], "base", None, None]]
    assert [gen(c) for c in m.canvases[3]] == [[10, 11, _, 12, _, _, _, _],
                                               [10, 11, 31, 12, _, _, _, _]]
    assert r.tokens == [10, 13, 31, 12, 14, 15, 16, 17]
    assert r.routes == ["base", "base", "ar", "base", "base", "base", "base", "base"]
    assert (r.nfe, r.branch_rows) == (4, 6)
    # the rewrite of 1 (11 -> 13) is an edit of a decided token; pvf is not revocable, so the
    # position keeps its route
    assert (r.edits, r.remasks, r.tokens_edit) == (1, 0, 0)


def _outside_table(g):
    """Blocks of 4, reveal_next=2: the failed round's working set spans blocks 0 and 1."""
    f = filled(g)
    if not f:
        return {0: (10, .95), 1: (11, .95)}
    if f == {0, 1}:                       # W = {2..7}; base set {3}; candidate 2
        return {2: (30, .3), 3: (13, .95)}
    if f == {0, 1, 3}:                    # z_base: H = {5}, in block 1
        return {2: (30, .3), 5: (15, .95)}
    if f == {0, 1, 2, 3}:                 # the plan disagrees at 5
        return {5: (16, .95)}
    if f == {0, 1, 3, 5}:                 # AR row 0 (H written): the fill at 2 fails;
        return {2: (31, .5)}              # later the plan's z_base (empty impact set)
    if f == {0, 1, 2, 3, 5}:              # the plan branch, verified later
        return {2: (30, .95), 4: (14, .95), 6: (16, .95), 7: (17, .95)}
    return {}


def test_h_outside_the_block_conditions_the_rows_and_is_masked_again():
    r, m = pvf(_outside_table, gen_length=8, block_length=4, reveal_next=2)
    assert steps(r, "route", "candidates", "verified") == [
        [[[0, "base"], [1, "base"]], "base", None, None],
        [[[3, "base"]], "base", [2], [False]],
        # AR_NEXT: H = {5} lies outside the failed round's block 0: it is written in the rows,
        # never committed; the fill fails; the round committed nothing but is AR_NEXT (its
        # failed round committed 3), so nothing is forced and the next round is fresh
        [[], "base", [2], [False]],
        [[], "fresh", None, None],
        [[[2, "plan"], [5, "base"]], "plan", [2], [True]],
        [[[4, "base"], [6, "base"], [7, "base"]], "base", None, None]]
    assert [gen(c) for c in m.canvases[3]] == [[10, 11, _, 13, _, 15, _, _],
                                               [10, 11, 30, 13, _, 15, _, _]]
    assert [gen(c) for c in m.canvases[4]] == [[10, 11, _, 13, _, _, _, _]]      # 5 masked
    assert r.tokens == [10, 11, 30, 13, 14, 15, 16, 17]
    assert (r.nfe, r.branch_rows) == (6, 9)


def test_planning_only_fills_nothing_after_a_failed_plan():
    # routes=plan: the AR_NEXT round has no fill, so it commits nothing (not even H = {3})
    # and calls on the committed state. The reference counts an AR call it does not make in
    # that round and in the next (in-band 2, token 11, is no planning token): NFE is two above
    # the calls the model saw
    def table(g):
        f = filled(g)
        if not f:
            return {0: (10, .95), 1: (30, .5), 2: (11, .5)}
        if f == {0}:
            return {2: (11, .5), 3: (13, .95)}
        if f == {0, 1}:
            return {3: (14, .95)}
        return {}
    m = TableModel(table)
    r = decode(m, PROMPT, "pvf", gen_length=4, block_length=4, routes="plan", trace=True, **REF)
    assert steps(r, "route") == [[[[0, "base"]], "base"], [[], "base"], [[[3, "base"]], "base"],
                                 [[[1, "forced"]], "base"], [[[2, "forced"]], "base"]]
    assert [gen(c) for c in m.canvases[2]] == [[10, _, _, _]]
    assert r.tokens == [10, 5, 5, 13] and (m.nfe, r.nfe) == (5, 7)


# ------------------------------------------------------------ sampled: H by top probability

HOT = dict(temperature=100.0, gen_length=4)     # the sampled token is almost never the top one


def test_h_is_committed_by_top_probability_even_when_the_sample_is_not_confident():
    # round 0: position 0 has top probability .95, but its sampled token is another one (seed
    # chosen so), so the base set is empty; the candidate at 1 fails its self-check (top .05
    # at its own position): AR_NEXT_EMPTY. Round 1: H = {0} by top probability .95 >= tau,
    # committed with the base row's sampled token; the fill at 1 fails (32 is certain under
    # {0}); H was committed, so nothing is forced (the base set under the sampled confidences
    # would be empty: a forced token at 1, p .5, would follow from it)
    def table(g):
        f = filled(g)
        if not f:
            return {0: (10, .95), 1: {30: .5, 31: .5}}
        if f == {0}:
            return {1: (32, 1.0)}
        return {}
    r = pvf(table, seed=0, **HOT)[0]
    assert r.steps[0]["committed"] == [] and r.tokens[0] != 10        # the seed's samples
    assert steps(r, "route", "candidates", "verified")[1] == [[[0, "base"]], "base", [1], [False]]


def test_a_failed_fill_with_nothing_committed_forces_the_top_position():
    # round 0: no position clears tau; the candidate at 0 (p .25) fails its self-check:
    # AR_NEXT_EMPTY, nothing committed. Round 1: H is empty; fills 0 (p .25), 1 (p .5) from
    # z_base's stats; the fill at 0 fails (a fresh sample of the four tokens, seed chosen so):
    # nothing committed in the two rounds, so the most confident position, 1, is forced
    def table(g):
        if filled(g):
            return {}
        return {0: {30: .25, 31: .25, 32: .25, 33: .25}, 1: {10: .5, 11: .5}}
    r = pvf(table, seed=2, **HOT)[0]
    assert r.steps[0]["committed"] == []
    assert r.steps[1]["candidates"] == [0, 1] and r.steps[1]["verified"][0] is False  # the seed
    assert r.steps[1]["committed"] == [[1, "forced"]] and r.tokens[1] in (10, 11)
    assert r.steps[2]["route"] == "fresh"


# ------------------------------------------------------------ batched: each request's own mode

A, B = [40, 41, 42], [40, 41, 43]       # two prompts, each with its own table


def _alone_and_batched(tables, **kw):
    """The first request decoded alone, then both requests in one batch (request indices 0
    and 1, so the first one's seeded draws are the same in both)."""
    kw = {**REF, "trace": True, "block_length": kw["gen_length"], **kw}
    alone = decode(TableModel(None, tables=tables), A, "pvf", request_index=0, **kw)
    both = decode_batch(TableModel(None, tables=tables), [A, B], "pvf", request_indices=[0, 1],
                        **kw)
    return alone, both


def test_a_failed_plan_with_an_empty_base_set_owes_its_forced_token_in_a_batch():
    # A: the candidate 0 (p .3) fails its self-check with an empty base set (AR_NEXT_EMPTY);
    # its next round has nothing to fill (ar_lo .7), so the owed forced token comes then.
    # B commits its whole canvas in round 0: its base set must not make A's round AR_NEXT
    tables = {tuple(A): lambda g: {} if filled(g) else {0: (30, .3)},
              tuple(B): lambda g: {0: (10, .95), 1: (11, .95)}}
    alone, (a, b) = _alone_and_batched(tables, gen_length=2, ar_lo=.7)
    for r in (alone, a):
        assert steps(r, "route", "candidates") == [
            [[], "base", [0]], [[[0, "forced"]], "base", None], [[[1, "forced"]], "base", None]]
        assert r.tokens == [30, 5] and r.nfe == 4          # 3 calls and the unmade AR call
    assert steps(b, "made_call") == [[[[0, "base"], [1, "base"]], False]] and b.tokens == [10, 11]


def test_a_base_commit_of_another_request_is_not_this_request_s_commit():
    # A is the sampled table of the test above (seed 2): round 1 commits nothing and forces 1.
    # B commits a base token in that round (p 1: the sample is certain)
    def table_b(g):
        f = filled(g)
        return {0: (10, 1.0)} if not f else {1: (11, 1.0)} if f == {0} else {}
    tables = {tuple(A): lambda g: {} if filled(g) else {
        0: {30: .25, 31: .25, 32: .25, 33: .25}, 1: {10: .5, 11: .5}}, tuple(B): table_b}
    alone, (a, b) = _alone_and_batched(tables, seed=2, **HOT)
    assert b.steps[1]["committed"] == [[1, "base"]]
    for r in (alone, a):
        assert r.steps[1]["verified"][0] is False                       # the seed's samples
        assert r.steps[1]["committed"] == [[1, "forced"]]
