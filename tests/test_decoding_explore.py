"""explore: threshold set + exactly one seeded in-band extra per step, single-row calls."""

from helpers.decoding_tables import filled, run

BAND8 = {i: (10 + i, .3) for i in range(8)}


def extras(r):
    return [[p for p, route in s["committed"] if route == "explore"] for s in r.steps]


def test_threshold_set_plus_one_extra_per_step():
    table = lambda g: {0: (10, .95), 1: (11, .3), 2: (12, .4), 3: (13, .7)} if not filled(g) \
        else {}
    r, m = run("explore", table, gen_length=4, band="0.2:0.6")
    s = r.steps[0]
    base = [p for p, route in s["committed"] if route == "base"]
    assert base == [0] and len(extras(r)[0]) == 1 and extras(r)[0][0] in (1, 2)
    assert all(n == 1 for n, _ in m.calls) and r.branch_rows == r.nfe
    assert r.tokens_explore == sum(len(e) for e in extras(r))


def test_out_of_band_never_explored_band_inclusive():
    from test_decoding_threshold import exact_conf
    hi = exact_conf((12, .4))
    table = lambda g: {0: (10, .95), 1: (11, .7), 2: (12, .4), 3: (13, .1)} if not filled(g) \
        else {}
    for seed in range(5):
        r, _ = run("explore", table, gen_length=4, band=f"0.2:{hi!r}", seed=seed)
        assert extras(r)[0] == [2]


def test_no_eligible_means_no_extra():
    r, _ = run("explore", lambda g: {}, gen_length=4, band="0.2:0.6")   # every p = .05
    assert r.tokens_explore == 0 and r.tokens_forced == 4


def test_seeded_determinism_and_seed_dependence():
    runs = {}
    for seed in range(6):
        r1, _ = run("explore", lambda g: BAND8, seed=seed)
        r2, _ = run("explore", lambda g: BAND8, seed=seed)
        assert extras(r1) == extras(r2) and r1.tokens == r2.tokens
        runs[seed] = str(extras(r1))
    assert len(set(runs.values())) > 1
    a, _ = run("explore", lambda g: BAND8, seed=0, request_index=0)
    b, _ = run("explore", lambda g: BAND8, seed=0, request_index=1)
    c, _ = run("explore", lambda g: BAND8, seed=0, request_index=0, repeat_index=1)
    assert len({str(extras(a)), str(extras(b)), str(extras(c))}) > 1


def test_pick_planning_prefers_vocab_then_falls_back():
    # positions 3 and 6 predict planning tokens; the rest are plain in-band tokens
    table = lambda g: {i: ((30 if i in (3, 6) else 10 + i), .3) for i in range(8)
                       if i not in filled(g)}
    for seed in range(6):
        r, _ = run("explore", table, pick="planning", plan_vocab={30}, seed=seed)
        ex = extras(r)
        assert ex[0][0] in (3, 6) and ex[1][0] in (3, 6)
        # once both are gone, the pick falls back to random in-band positions
        assert all(len(e) == 1 for e in ex if e) and r.tokens_explore >= 3


def test_extra_only_from_active_block():
    table = lambda g: {0: (10, .3), 4: (14, .3), 5: (15, .3)} if not filled(g) else {}
    for seed in range(4):
        r, _ = run("explore", table, block_length=4, reveal_next=4, band="0.2:0.6", seed=seed)
        assert all(p < 4 for p in extras(r)[0])


def test_trace_route_of_every_step_is_explore():
    table = lambda g: {0: (10, .95), 1: (11, .3), 2: (12, .4)} if not filled(g) else {}
    r, _ = run("explore", table, gen_length=4, band="0.2:0.6")
    assert len(r.steps) >= 1 and [s["route"] for s in r.steps] == ["explore"] * len(r.steps)


def test_reveal_next_widens_the_threshold_set_to_the_next_block():
    # block 0 = positions 0..3; after step 0 three masks are left (<= reveal_next), so block 1
    # joins the working set and its confident position 5 is committed in step 1
    table = lambda g: {0: (10, .95), 5: (15, .95)} if not filled(g) else (
        {5: (15, .95)} if filled(g) == {0} else {i: (12, .95) for i in range(8)})
    r, _ = run("explore", table, gen_length=8, block_length=4, reveal_next=3, band="0.2:0.6")
    assert r.steps[0]["committed"] == [[0, "base"]]
    assert r.steps[1]["committed"] == [[5, "base"]]


def test_reference_rules_force_only_when_nothing_is_explored():
    table = lambda g: {0: (10, .3)} if not filled(g) else {i: (12, .95) for i in range(4)}
    paper, _ = run("explore", table, gen_length=4, band="0.2:0.6")
    assert paper.steps[0]["committed"] == [[0, "forced"]]
    ref, _ = run("explore", table, gen_length=4, band="0.2:0.6", rules="reference")
    assert ref.steps[0]["committed"] == [[0, "explore"]]


def test_band_lower_edge_inclusive():
    # p = .5 exactly (float32) at the band's lower edge is in band: the one extra; 0 is forced
    table = lambda g: {} if filled(g) else {0: (10, .7), 1: (11, .5)}
    for seed in range(3):
        r, _ = run("explore", table, gen_length=4, band="0.5:0.6", seed=seed)
        assert r.steps[0]["committed"] == [[0, "forced"], [1, "explore"]]
        assert r.tokens[:2] == [10, 11]


def test_reference_rules_force_exactly_the_top_position_when_nothing_commits():
    # nothing clears tau and nothing is in band: the single most confident position of W
    # (1 and 2 tie at .7: the lower index) is forced, and nothing else
    table = lambda g: {} if filled(g) else {1: (11, .7), 2: (12, .7)}
    r, m = run("explore", table, gen_length=4, band="0.2:0.3", rules="reference")
    assert [s["committed"] for s in r.steps] == [
        [[1, "forced"]], [[0, "forced"]], [[2, "forced"]], [[3, "forced"]]]
    assert r.tokens == [5, 11, 5, 5] and m.nfe == 4


def test_reference_rules_commit_the_base_set_and_the_extra_without_forcing():
    table = lambda g: {} if filled(g) else {0: (10, .95), 1: (11, .4)}
    r, m = run("explore", table, gen_length=4, band="0.2:0.6", rules="reference")
    assert r.steps[0]["committed"] == [[0, "base"], [1, "explore"]]
    assert [gen[:2] for gen in m.canvases[1]] == [[10, 11]] and r.tokens[:2] == [10, 11]
