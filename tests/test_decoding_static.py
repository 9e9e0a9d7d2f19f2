"""static: one most-confident position per step, the LLaDA schedule with steps < L."""

import torch
from helpers.decoding_tables import filled, run

from pvf_lmeval.decoding.select import llada_count_tensor

CONST4 = {0: (10, 0.5), 1: (11, 0.9), 2: (12, 0.7), 3: (13, 0.3)}


def committed_order(r):
    return [[p for p, _ in s["committed"]] for s in r.steps]


def test_one_per_step_most_confident_first():
    r, m = run("static", lambda g: CONST4, gen_length=4)
    assert committed_order(r) == [[1], [2], [0], [3]]
    assert r.tokens == [10, 11, 12, 13]
    assert r.routes == ["base"] * 4 and r.tokens_base == 4 and r.committed == 4
    # NFE = L: the initial call + one per step, none after the last commit
    assert r.nfe == 4 and m.calls == [(1, (0, 4))] * 4
    assert [s["made_call"] for s in r.steps] == [True, True, True, False]
    assert [s["route"] for s in r.steps] == ["base"] * 4


def test_ties_lowest_index():
    r, _ = run("static", lambda g: {i: (10 + i, 0.5) for i in range(4)}, gen_length=4)
    assert committed_order(r) == [[0], [1], [2], [3]]


def test_blocks_in_order_and_requested_range():
    # position 5 (block 1) is the most confident, but block 0 comes first
    table = lambda g: {0: (10, .3), 1: (11, .4), 2: (12, .2), 3: (13, .1), 5: (15, .99)}
    r, m = run("static", table, gen_length=8, block_length=4)
    assert [o[0] for o in committed_order(r)] == [1, 0, 2, 3, 5, 4, 6, 7]
    # stats cover the active block and the next one: (0, 8) while in block 0, then (4, 8)
    assert [rng for _, rng in m.calls] == [(0, 8)] * 4 + [(4, 8)] * 4
    assert r.nfe == 8 and r.branch_rows == 8


def test_next_step_sees_committed_state():
    def table(g):
        f = filled(g)
        if 1 in f:  # after committing position 1, position 3 becomes confident with token 30
            return {0: (10, .5), 2: (12, .4), 3: (30, .8)}
        return {0: (10, .5), 1: (11, .9), 2: (12, .7), 3: (13, .3)}
    r, _ = run("static", table, gen_length=4)
    assert committed_order(r) == [[1], [3], [0], [2]]
    assert r.tokens == [10, 11, 12, 30]


def test_llada_schedule_steps_lt_L():
    conf = {i: (10 + i, 0.9 - 0.1 * (i % 4)) for i in range(8)}
    # 6 steps over 2 blocks of 4: 3 per block, 4 = 2 + 1 + 1
    r, m = run("static", lambda g: conf, gen_length=8, block_length=4, steps=6)
    assert committed_order(r) == [[0, 1], [2], [3], [4, 5], [6], [7]]
    assert r.nfe == 6 and r.routes == ["base"] * 8
    # 2 steps: the whole block at once
    r, _ = run("static", lambda g: conf, gen_length=8, block_length=4, steps=2)
    assert committed_order(r) == [[0, 1, 2, 3], [4, 5, 6, 7]] and r.nfe == 2
    # steps = L is the default one-per-step
    r, _ = run("static", lambda g: conf, gen_length=8, block_length=4, steps=8)
    assert len(r.steps) == 8 and r.nfe == 8


def llada_schedule(m: int, s: int) -> list[int]:
    """LLaDA's per-step counts for a block of m masks in s steps (its get_num_transfer_tokens:
    m // s each, the first m % s one more), steps that would commit nothing left out."""
    return [c for c in (m // s + (1 if j < m % s else 0) for j in range(s)) if c > 0]


def test_llada_schedule_uneven():
    assert llada_schedule(8, 3) == [3, 3, 2] and llada_schedule(3, 5) == [1, 1, 1]
    # the tensor rule, asked with the tokens done so far, walks exactly that schedule
    for m in range(1, 13):
        for s in range(1, 13):
            want = llada_schedule(m, s)
            done = torch.tensor([sum(want[:j]) for j in range(len(want))])
            assert llada_count_tensor(m, s, done).tolist() == want, (m, s)
            # a tensor of block sizes broadcasts against done
            got = llada_count_tensor(torch.tensor([m]), s, done)
            assert got.tolist() == want, (m, s)


def test_static_labels_base_even_when_low():
    r, _ = run("static", lambda g: {}, gen_length=4)  # every position at p = 0.05
    assert r.routes == ["base"] * 4 and r.tokens_forced == 0
