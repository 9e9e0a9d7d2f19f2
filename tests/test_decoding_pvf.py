"""pvf: base set, planning route with impact-set verification, AR fallback, routes, N_s."""

from helpers.decoding_tables import EOS, filled, run

VOCAB = {30, 31, 32, 33}
KW = dict(plan_vocab=VOCAB, gen_length=8)


def pvf(table, **kw):
    args = dict(KW)
    args.update(kw)
    return run("pvf", table, **args)


def first(r):
    return r.steps[0]


# ------------------------------------------------------------ planning route

def test_plan_branch_fails_verification_falls_back_to_base():
    def table(g):
        f = filled(g)
        if f == {0}:           # z_base: position 2 becomes confident (impact set {2})
            return {1: (30, .5), 2: (11, .95)}
        if f == {0, 1}:        # z_plan: disagrees at position 2
            return {2: (12, .95)}
        return {0: (10, .95), 1: (30, .5), 2: (11, .3)}
    r, m = pvf(table)
    s = first(r)
    assert s["candidates"] == [1] and s["verified"] == [False] and s["route"] == "base"
    assert s["committed"] == [[0, "base"]]
    assert m.calls[1][0] == 2 and s["nfe"] == 2 and s["branch_rows"] == 3
    # the next step uses z_base's stats: position 2 commits 11 (not z_plan's 12)
    assert r.steps[1]["committed"][0] == [2, "base"] and r.tokens[2] == 11


def test_two_verified_branches_larger_c_total_wins():
    base = {0: (10, .95), 1: (30, .6), 2: (31, .5), 3: (32, .25)}
    def table(g):
        f = filled(g)
        if f == {0}:
            return {4: (14, .95)}                       # S_imp = {4}
        if f == {0, 1}:
            return {4: (14, .95), 5: (15, .5)}          # verified, C = .95+.5+4*.05
        if f == {0, 2}:
            return {4: (14, .95), 5: (15, .8)}          # verified, C = .95+.8+4*.05
        if f == {0, 3}:
            return {4: (20, .95), 5: (15, .99)}         # not verified (argmax 20 != 14)
        return base if not f else {}
    r, m = pvf(table)
    s = first(r)
    assert s["candidates"] == [1, 2, 3] and s["verified"] == [True, True, False]
    assert s["route"] == "plan"
    assert s["committed"] == [[0, "base"], [2, "plan"]]
    assert m.calls[1][0] == 4 and r.tokens[2] == 31 and r.routes[2] == "plan"
    assert abs(s["c_total"][0] - 1.65) < 1e-4 and abs(s["c_total"][1] - 1.95) < 1e-4


def _tie_table(c_first, c_second):
    # W = {0..3}; S_base = {0, 3}; candidates 2 (p .5) then 1 (p .4), both token 30;
    # S_imp = {1, 2}
    def table(g):
        f = filled(g)
        if f == {0, 3}:
            return {1: (30, .95), 2: (30, .95)}
        if f == {0, 2, 3}:     # branch 1 (candidate 2): C = max prob at 1
            return {1: (30, c_first)}
        if f == {0, 1, 3}:     # branch 2 (candidate 1): C = max prob at 2
            return {2: (30, c_second)}
        return {0: (10, .95), 1: (30, .4), 2: (30, .5), 3: (13, .95)}
    return table


def test_equal_c_total_earlier_branch_wins():
    r, _ = pvf(_tie_table(.7, .7), gen_length=4)
    s = first(r)
    assert s["candidates"] == [2, 1] and s["verified"] == [True, True]
    assert s["c_total"][0] == s["c_total"][1]
    assert [p for p, route in s["committed"] if route == "plan"] == [2]


def test_larger_c_total_later_branch_wins():
    r, _ = pvf(_tie_table(.7, .8), gen_length=4)
    assert [p for p, route in first(r)["committed"] if route == "plan"] == [1]


def test_empty_impact_set_never_verified():
    def table(g):
        f = filled(g)
        if f == {0}:
            return {1: (30, .5)}         # nothing >= tau under z_base: S_imp empty
        return {0: (10, .95), 1: (30, .5)}
    r, m = pvf(table, routes="plan")
    s = first(r)
    assert s["verified"] == [False] and s["committed"] == [[0, "base"]]
    assert m.calls[1][0] == 2


def test_impact_set_only_own_candidate_is_not_verified():
    def table(g):
        f = filled(g)
        if f == {0}:
            return {1: (30, .95)}        # S_imp = {1} = the candidate itself
        if f == {0, 1}:
            return {}
        return {0: (10, .95), 1: (30, .5)}
    r, _ = pvf(table)
    assert first(r)["verified"] == [False] and first(r)["route"] == "base"


def test_candidate_band_and_vocab():
    # 1: in vocab, p == plan_hi -> excluded (upper bound exclusive); 2: not in vocab;
    # 3: in vocab, below plan_lo; 4: in vocab, in band -> the only candidate
    y0 = {0: (10, .95), 1: (30, .65), 2: (11, .5), 3: (31, .15), 4: (32, .3)}
    r, _ = pvf(lambda g: {} if filled(g) else y0, plan_hi=0.65)
    assert first(r)["candidates"] == [4]


def test_width_limits_candidates_ties_by_index():
    y0 = {0: (10, .95), 1: (30, .3), 2: (31, .5), 3: (30, .3), 4: (30, .3)}  # equal p: same dist
    r, m = pvf(lambda g: {} if filled(g) else y0, width=3)
    assert first(r)["candidates"] == [2, 1, 3] and m.calls[1][0] == 4
    r, m = pvf(lambda g: {} if filled(g) else y0, width=1)
    assert first(r)["candidates"] == [2] and m.calls[1][0] == 2


def test_plan_self_check():
    def table(g):
        f = filled(g)
        if f == {0}:
            return {2: (11, .95)}
        if f == {0, 1}:   # verified, but the candidate's own position now prefers 31
            return {1: (31, .9), 2: (11, .95)}
        return {0: (10, .95), 1: (30, .5)}
    r, _ = pvf(table)
    assert first(r)["verified"] == [True] and r.tokens[1] == 30 and r.routes[1] == "plan"
    r, _ = pvf(table, plan_self_check=True)
    assert first(r)["verified"] == [False] and first(r)["committed"] == [[0, "base"]]


def test_plan_self_check_passes_at_plan_lo_exactly():
    # under the plan row the candidate's own token 30 keeps p = .2, equal (in float32) to
    # plan_lo: the check is inclusive
    import torch
    from helpers.decoding_tables import MASK, dist_logits
    from pvf_lmeval.decoding.stats import stats_from_logits
    own = {31: .6, 30: .2}
    lo = float(stats_from_logits(dist_logits(own)[None, None], torch.tensor([[30]]), MASK)[3])

    def table(g):
        f = filled(g)
        if f == {0}:
            return {2: (11, .95)}
        if f == {0, 1}:
            return {1: own, 2: (11, .95)}
        return {0: (10, .95), 1: (30, .5)}
    r, _ = pvf(table, plan_self_check=True, plan_lo=lo)
    assert first(r)["verified"] == [True] and r.routes[1] == "plan" and r.tokens[1] == 30


def test_preset_reaches_decode():
    # a candidate at p = .5 that the state {0} confirms: the default band [.2, .65) plans it
    # (a vacuous branch: base commits it next step); the code preset's band [.8, .9) does not,
    # and its AR route (ar_lo .3) fills and verifies it
    def table(g):
        f = filled(g)
        return {0: (10, .95), 1: (30, .5)} if not f else {1: (30, .95)} if f == {0} else {}
    r, _ = pvf(table)
    assert "c_total" in first(r) and r.routes[:2] == ["base", "base"]
    r, _ = pvf(table, preset="humaneval")
    assert "c_total" not in first(r) and r.routes[:2] == ["base", "ar"]


# ------------------------------------------------------------ AR fallback

def test_ar_chain_broken_at_fill_2_commits_exactly_1():
    def table(g):
        f = filled(g)
        if f == {0}:
            return {1: (11, .6), 2: (12, .4), 3: (13, .3)}    # fill 1 verified
        if f == {0, 1}:
            return {2: (20, .95), 3: (13, .3)}                # fill 2: 20 != 12
        if f == {0, 1, 2}:
            return {3: (13, .9)}                              # fill 3 would pass
        return {0: (10, .95), 1: (11, .5), 2: (12, .4), 3: (13, .3), 4: (14, .2)}
    r, m = pvf(table)
    s = first(r)
    assert s["route"] == "ar" and s["candidates"] == [1, 2, 3]
    assert s["verified"] == [True, False, True]
    assert s["committed"] == [[0, "base"], [1, "ar"]]
    assert m.canvases[1] == [
        [10, None, None, None, None, None, None, None],
        [10, 11, None, None, None, None, None, None],
        [10, 11, 12, None, None, None, None, None],
        [10, 11, 12, 13, None, None, None, None],
    ]
    # the next step sees z_ar_1's stats: position 2 commits 20
    assert r.tokens[2] == 20 and r.routes[2] == "base"


def test_ar_first_fill_fails_commits_base_only():
    def table(g):
        f = filled(g)
        if f == {0}:
            return {1: (21, .6)}
        return {0: (10, .95), 1: (11, .5), 2: (12, .4)}
    r, _ = pvf(table)
    assert first(r)["route"] == "base" and first(r)["committed"] == [[0, "base"]]


def test_ar_threshold_inclusive_and_count():
    from test_decoding_threshold import exact_conf
    y0 = {0: (10, .95), 1: (11, .25), 2: (12, .05)}
    lo = exact_conf((11, .25))
    r, m = pvf(lambda g: y0 if not filled(g) else {}, ar_lo=lo, plan_vocab=None)
    assert first(r)["candidates"] == [1] and m.calls[1][0] == 2   # min(K, eligible) = 1


def test_no_candidates_nothing_above_ar_lo_single_row():
    r, m = pvf(lambda g: {} if filled(g) else {0: (10, .95)})
    assert first(r)["route"] == "base" and "candidates" not in first(r)
    assert m.calls[1][0] == 1


def test_last_ar_branch_without_mask_still_counts():
    def table(g):
        f = filled(g)
        if f == {0}:
            return {1: (11, .6)}
        if f == {0, 1}:
            return {2: (12, .6)}
        if f == {0, 1, 2}:
            return {3: (13, .6)}
        return {0: (10, .95), 1: (11, .5), 2: (12, .5), 3: (13, .5)}
    r, m = pvf(table, gen_length=4)
    assert m.calls[1][0] == 4 and r.nfe == 2 and r.branch_rows == 5
    assert r.routes == ["base", "ar", "ar", "ar"] and r.tokens_ar == 3


# ------------------------------------------------------------ progress, forced

def test_forced_joins_base_and_is_never_a_candidate():
    def table(g):
        if filled(g):
            return {}
        return {1: (31, .5), 3: (30, .6)}
    r, _ = pvf(table)
    s = first(r)
    assert [3, "forced"] in s["committed"] and s["candidates"] == [1]
    assert r.routes[3] == "forced"


# ------------------------------------------------------------ routes switches

def _both_table(g):
    f = filled(g)
    if f == {0}:
        return {1: (30, .5), 2: (11, .5), 5: (15, .95)}
    if f == {0, 1}:
        return {2: (11, .5), 5: (20, .95)}              # plan branch fails
    if not f:
        return {0: (10, .95), 1: (30, .5), 2: (11, .5)}
    return {}


def test_routes_plan_ar_failing_plan_makes_no_ar_attempt():
    r, m = pvf(_both_table)
    assert first(r)["route"] == "base" and m.calls[1][0] == 2
    assert first(r)["committed"] == [[0, "base"]]


def test_routes_ar_ignores_candidates():
    r, m = pvf(_both_table, routes="ar")
    s = first(r)
    assert s["candidates"] == [1, 2] and m.calls[1][0] == 3   # AR branches, not planning


def test_routes_plan_without_candidates_is_single_row():
    r, m = pvf(lambda g: {} if filled(g) else {0: (10, .95), 1: (11, .5)}, routes="plan")
    assert m.calls[1][0] == 1 and all(n == 1 for n, _ in m.calls)


def test_routes_none_single_row_calls():
    r, m = pvf(_both_table, routes="none")
    assert all(n == 1 for n, _ in m.calls) and r.tokens_plan == r.tokens_ar == 0


# ------------------------------------------------------------ working set, N_s

def _reveal_table(g):
    f = filled(g)
    if f == {0, 1}:
        return {2: (12, .3), 3: (13, .3), 5: (15, .95), 6: (16, .92)}
    if not f:
        return {0: (10, .95), 1: (11, .95), 2: (12, .3), 3: (13, .3), 5: (15, .95)}
    return {}


def test_reveal_next_widens_working_set():
    r, m = pvf(_reveal_table, block_length=4, reveal_next=2, routes="none")
    assert r.steps[0]["committed"] == [[0, "base"], [1, "base"]]      # 4 masks > N_s
    assert r.steps[1]["committed"] == [[5, "base"], [6, "base"]]      # 2 masks <= N_s
    r, _ = pvf(_reveal_table, block_length=4, reveal_next=0, routes="none")
    assert r.steps[1]["committed"] == [[2, "forced"]]


def test_reveal_next_large_reveals_from_start_and_last_block_has_no_next():
    r, m = pvf(_reveal_table, block_length=4, reveal_next=4, routes="none")
    assert r.steps[0]["committed"] == [[0, "base"], [1, "base"], [5, "base"]]
    r, _ = pvf(_reveal_table, gen_length=4, block_length=4, reveal_next=4, routes="none")
    assert r.tokens_base + r.tokens_forced == 4


def test_reveal_next_range_covers_next_blocks_of_branches():
    # AR fills that complete block 0 make the call cover block 1 and block 2
    def table(g):
        f = filled(g)
        if f == {0, 1, 2}:
            return {3: (13, .6)}
        if not f:
            return {0: (10, .95), 1: (11, .95), 2: (12, .95), 3: (13, .5)}
        return {}
    r, m = pvf(table, gen_length=12, block_length=4, reveal_next=1)
    assert m.calls[0] == (1, (0, 8))
    assert m.calls[1] == (2, (0, 12))     # z_ar_1 has its active block at 1: blocks 1-2 too
    assert r.steps[0]["committed"] == [[0, "base"], [1, "base"], [2, "base"], [3, "ar"]]


# ------------------------------------------------------------ early stop

def test_no_call_when_z_base_meets_early_stop():
    def table(g):
        return {} if filled(g) else {0: (10, .95), 1: (EOS, .95), 2: (30, .5)}
    r, m = pvf(table)
    assert m.calls == [(1, (0, 8))] and r.nfe == 1
    assert r.tokens == [10] + [EOS] * 7 and r.routes == ["base", "base"] + [None] * 6
    assert r.committed == 2 and r.gen_tokens == 1


def test_fixed_vocab_ids_are_sorted_and_unique():
    import torch

    from pvf_lmeval.decoding.plan_vocab import FixedVocab

    v = FixedVocab([7, 3, 7, 5])
    assert v.eligible_ids() == [3, 5, 7]
    assert v.eligible_mask(torch.tensor([[3, 4, 7]])).tolist() == [[True, False, True]]
    assert FixedVocab([]).eligible_mask(torch.tensor([1, 2])).tolist() == [False, False]
