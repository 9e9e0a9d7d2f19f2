"""threshold (Fast-dLLM): p >= tau in the active block, forced top-1, factor rule."""

import pytest
import torch
from helpers.decoding_tables import MASK, dist_logits, filled, run

from pvf_lmeval.decoding.stats import stats_from_logits


def steps_of(r):
    return [s["committed"] for s in r.steps]


def test_threshold_then_forced():
    def table(g):
        f = filled(g)
        if f == {0, 1}:
            return {2: (12, .91), 3: (13, .4)}
        if f == {0, 1, 2}:
            return {3: (13, .6)}
        return {0: (10, .95), 1: (11, .92), 2: (12, .5), 3: (13, .3)}
    r, m = run("threshold", table, gen_length=4)
    assert steps_of(r) == [[[0, "base"], [1, "base"]], [[2, "base"]], [[3, "forced"]]]
    assert r.tokens == [10, 11, 12, 13]
    assert r.nfe == 3 and m.calls == [(1, (0, 4))] * 3  # last step completes: no call
    assert (r.tokens_base, r.tokens_forced, r.committed) == (3, 1, 4)


def test_forced_tie_lowest_index():
    r, _ = run("threshold", lambda g: {i: (10 + i, .5) for i in range(4)}, gen_length=4)
    assert steps_of(r)[0] == [[0, "forced"]]
    assert r.routes == ["forced"] * 4 and r.nfe == 4


def exact_conf(d):
    """The decoder's own float32 confidence for distribution spec ``d``."""
    lg = dist_logits(d)[None, None]
    return float(stats_from_logits(lg, torch.zeros(1, 1, dtype=torch.long), MASK)[1])


# reveal_next is PVF's (a preset sets it for every decoder): a baseline's block still waits
@pytest.mark.parametrize("reveal_next", [0, 5])
def test_threshold_inclusive_and_active_block_only(reveal_next):
    table = lambda g: {0: (10, .95), 1: (11, .2), 4: (14, .99), 5: (15, .99)}
    tau = exact_conf((10, .95))
    r, _ = run("threshold", table, gen_length=8, block_length=4, threshold=tau,
               reveal_next=reveal_next)
    assert steps_of(r)[0] == [[0, "base"]]          # p == tau commits; block 1 waits
    assert steps_of(r)[1:4] == [[[1, "forced"]], [[2, "forced"]], [[3, "forced"]]]
    assert steps_of(r)[4] == [[4, "base"], [5, "base"]]


def test_factor_rule():
    # f = 1: the n-th most confident needs p >= 1 - 1/(n+1): .5, .667, .75, .8
    def table(g):
        if not filled(g):
            return {0: (10, .7), 1: (11, .55), 2: (12, .9), 3: (13, .6)}
        return {1: (11, .4), 3: (13, .45)}
    r, _ = run("threshold", table, gen_length=4, factor=1.0)
    # .9 >= .5, .7 >= .667, .6 < .75 (stop): commit 2 and 0, although .7 < tau
    assert steps_of(r)[0] == [[0, "base"], [2, "base"]]
    # then .45 < .5: nothing qualifies -> forced top-1
    assert steps_of(r)[1] == [[3, "forced"]]


def test_factor_large_commits_all():
    r, _ = run("threshold", lambda g: {i: (10 + i, .3) for i in range(4)}, gen_length=4,
               factor=4.0)  # 1 - 4/(n+1) <= .2 for n <= 4
    assert len(r.steps) == 1 and r.nfe == 1 and r.routes == ["base"] * 4
