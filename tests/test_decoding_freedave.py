"""freedave: drafts on the static trajectory, one batched call, the acceptance chain."""

import itertools

import torch
from helpers.decoding_tables import EOS, filled, run

from pvf_lmeval.decoding.freedave import accept_chain_batched

Y0 = {0: (10, .9), 1: (11, .8), 2: (12, .7), 3: (13, .6)}


def test_full_chain_accepts_all_drafts():
    def table(g):
        f = filled(g)
        if f == {0}:
            return {1: (11, .85), 2: (12, .5), 3: (13, .4)}
        if f == {0, 1}:
            return {2: (12, .9), 3: (13, .4)}
        if f == {0, 1, 2}:
            return {3: (13, .5)}
        return Y0
    r, m = run("freedave", table, gen_length=4, draft_steps=3)
    # step 1: drafts {0}, {0,1}, {0,1,2} in one call; chain 0 -> 1 -> 2 -> 3
    assert m.canvases[1] == [[10, None, None, None], [10, 11, None, None], [10, 11, 12, None]]
    assert r.steps[0]["accepted"] == 3 and r.steps[0]["drafts"] == 3
    # step 2: one mask left -> D = 1, draft 1 completes the canvas -> no call
    assert r.steps[1]["drafts"] == 1 and not r.steps[1]["made_call"]
    assert r.nfe == 2 and r.branch_rows == 4
    assert r.tokens == [10, 11, 12, 13] and r.routes == ["base"] * 4
    assert [s["route"] for s in r.steps] == ["base", "base"]


def test_chain_stops_at_first_incompatible_and_next_step_uses_its_stats():
    def table(g):
        f = filled(g)
        if f == {0}:      # draft 1's most confident is position 2, not 1 -> draft 2 rejected
            return {1: (11, .5), 2: (12, .95), 3: (13, .4)}
        if f == {0, 1}:
            return {2: (12, .9), 3: (13, .4)}
        if f == {0, 2}:
            return {1: (11, .5), 3: (13, .7)}
        return Y0
    r, m = run("freedave", table, gen_length=4, draft_steps=3)
    assert r.steps[0]["accepted"] == 1
    assert r.steps[0]["committed"] == [[0, "base"]]
    # the next step drafts from draft 1's stats (order 2, 1, 3)
    assert m.canvases[2] == [[10, None, 12, None], [10, 11, 12, None], [10, 11, 12, 13]]
    assert r.tokens == [10, 11, 12, 13]


def test_different_token_is_incompatible():
    def table(g):
        f = filled(g)
        if f == {0}:      # same position as draft 2, but another token
            return {1: (20, .9), 2: (12, .5), 3: (13, .4)}
        if f == {0, 1}:
            return {2: (12, .9), 3: (13, .4)}
        return Y0
    r, _ = run("freedave", table, gen_length=4, draft_steps=3)
    assert r.steps[0]["accepted"] == 1
    assert r.tokens[1] == 20  # the next step sees draft 1's stats


def test_threshold_base_rule_jumps_to_largest():
    y0 = {0: (10, .95), 1: (11, .93), 2: (12, .91), 3: (13, .5)}
    def table(g):
        f = filled(g)
        if f == {0}:          # target_1 disagrees with draft 2 at position 1
            return {1: (21, .95), 2: (12, .5), 3: (13, .5)}
        if f == {0, 1, 2}:    # target_3 writes 20 at 3: draft 4 (13 at 3) is rejected
            return {3: (20, .5)}
        if f:
            return {i: y0[i] for i in range(4) if i not in f}
        return y0
    r, m = run("freedave", table, gen_length=4, draft_steps=4, base_rule="threshold")
    # target_0 = y + {0, 1, 2} contains drafts 1..3: best moves 0 -> 3 at once (not via 1)
    assert r.steps[0]["accepted"] == 3 and m.calls[1][0] == 4
    assert r.tokens == [10, 11, 12, 20]


def test_draft_count_capped_by_masks_left():
    r, m = run("freedave", lambda g: {i: (10 + i, .9 - .1 * i) for i in range(4)},
               gen_length=8, block_length=4, draft_steps=8)
    assert r.steps[0]["drafts"] == 4 and m.calls[1][0] == 4


def test_no_call_when_draft1_meets_early_stop():
    def table(g):
        if filled(g) == {0}:
            return {1: (EOS, .9)}
        return {0: (10, .9), 1: (EOS, .5)}
    r, m = run("freedave", table, gen_length=4, draft_steps=2)
    # step 1: drafts {0}, {0,1}; chain accepts {0, 1:EOS} -> early stop
    assert r.tokens == [10, EOS, EOS, EOS] and r.nfe == 2
    r2, m2 = run("freedave", lambda g: {0: (EOS, .9)}, gen_length=4, draft_steps=3)
    assert r2.nfe == 1 and m2.calls == [(1, (0, 4))] and r2.committed == 1


def accept_chain(sub: list[list[bool]]) -> int:
    """The SPEC's acceptance chain, one request: ``sub[b][j]`` = draft j ⊆ target b."""
    best, n = 0, len(sub)
    while True:
        nxt = [j for j in range(best + 1, n) if sub[best][j]]
        if not nxt:
            return best
        best = max(nxt)


def chain_batched(subs: list, Ds: list[int]) -> list[int]:
    return accept_chain_batched(torch.tensor(subs), torch.tensor(Ds)).tolist()


def test_accept_chain_cases():
    T, F = True, False
    cases = [  # (sub, best)
        # best only moves forward: from 2 the chain ends although sub[2][1] holds
        ([[F, F, T, F], [F, F, F, F], [F, T, F, F], [F] * 4], 2),
        ([[T, T, F], [F, F, T], [F, F, F]], 2),
        ([[T, T, T], [F, F, F], [F, F, F]], 2),   # largest j first
        ([[T, T, F, T], [F, F, F, F], [F] * 4, [F] * 4], 3),
        ([[T, F], [F, F]], 0),
        ([[F, T, F, F], [F, F, T, F], [F, F, F, T], [F] * 4], 3),   # three moves
    ]
    for sub, best in cases:
        assert accept_chain(sub) == best
        n = len(sub)
        assert chain_batched([sub], [n - 1]) == [best]
    # a batch of requests, each read on its own rows
    subs = [c[0] for c in cases if len(c[0]) == 4]
    assert chain_batched(subs, [3] * len(subs)) == [2, 3, 3]
    # drafts beyond D are absent: with D = 1 the chain above stops at 1, with D = 0 at 0
    chain = cases[-1][0]
    assert chain_batched([chain, chain, chain], [0, 1, 2]) == [0, 1, 2]


def test_accept_chain_batched_equals_the_chain_on_every_small_case():
    # every 3 x 3 relation (upper triangle matters) for D = 2, and random 5 x 5 ones per D
    subs = [[[bool(bits >> (3 * b + j) & 1) for j in range(3)] for b in range(3)]
            for bits in range(1 << 9)]
    assert chain_batched(subs, [2] * len(subs)) == [accept_chain(s) for s in subs]
    g = torch.Generator().manual_seed(0)
    rnd = (torch.rand(300, 5, 5, generator=g) < .5).tolist()
    Ds = [i % 5 for i in range(300)]
    want = [accept_chain([row[:D + 1] for row in s[:D + 1]]) for s, D in zip(rnd, Ds)]
    assert chain_batched(rnd, Ds) == want
    assert len(set(want)) == 5 and any(itertools.starmap(lambda w, D: 0 < w < D, zip(want, Ds)))


def test_static_base_rule_target_holds_one_commit_where_threshold_holds_two():
    # y's stats: only position 0 is confident, so target_0 = y + {0} under either base rule.
    # Under draft 1 ({0}) positions 1 and 2 are both above the threshold, 2 the more confident:
    # the static target_1 adds only 2 (12), which holds neither draft 2 nor draft 3 (both hold
    # 11 at 1); the threshold target_1 adds 1 and 2 and holds draft 3.
    def table(g):
        f = filled(g)
        if f == {0}:
            return {1: (11, .95), 2: (12, .97), 3: (13, .3)}
        if f == {0, 2}:
            return {1: (11, .8), 3: (13, .7)}
        if f:
            return {i: (10 + i, .99) for i in range(4) if i not in f}
        return {0: (10, .99), 1: (11, .5), 2: (12, .4), 3: (13, .3)}
    r, m = run("freedave", table, gen_length=4, draft_steps=3)     # base_rule=static (default)
    assert r.steps[0]["drafts"] == 3 and r.steps[0]["accepted"] == 1
    assert r.steps[0]["committed"] == [[0, "base"]]
    # the next drafts follow draft 1's stats: 2 first, then 1
    assert m.canvases[2] == [[10, None, 12, None], [10, 11, 12, None], [10, 11, 12, 13]]
    r, m = run("freedave", table, gen_length=4, draft_steps=3, base_rule="threshold")
    assert r.steps[0]["accepted"] == 3
    assert r.steps[0]["committed"] == [[0, "base"], [1, "base"], [2, "base"]]
