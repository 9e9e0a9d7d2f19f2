"""``StatTotals``: per-task sums of the decoding statistics, their summary and the merge of ranks,
against values computed by hand."""

from __future__ import annotations

import json

from pvf_lmeval.lmeval.stats import COUNT_KEYS, MEAN_KEYS, StatTotals


def _record(**kw) -> dict:
    row = dict.fromkeys(MEAN_KEYS, 0)
    row.update(kw)
    return row


A1 = _record(nfe=10, branch_rows=14, gen_length=64, gen_tokens=20, committed=22, wall_s=0.25,
             tokens_base=12, tokens_plan=5, tokens_ar=2, tokens_forced=1, tokens_explore=0)
A2 = _record(nfe=6, branch_rows=6, gen_length=64, gen_tokens=10, committed=10, wall_s=0.5,
             tokens_base=4, tokens_plan=3, tokens_ar=0, tokens_forced=2, tokens_explore=1)
B1 = _record(gen_length=32)     # a request that made no call and took no time

# the means of A1 and A2, tpf = 30 tokens / 16 calls, tps = 30 tokens / 0.75 s
WANT_A = {"requests": 2, "nfe": 8.0, "branch_rows": 10.0, "gen_length": 64.0, "gen_tokens": 15.0,
          "committed": 16.0, "wall_s": 0.375, "tokens_base": 8.0, "tokens_plan": 4.0,
          "tokens_ar": 1.0, "tokens_forced": 1.5, "tokens_explore": 0.5, "tokens_edit": 0.0,
          "edits": 0.0, "remasks": 0.0,
          "tpf": 1.875, "tps": 40.0, "nfe_total": 16, "truncated_prompts": 3, "from_cache": 1}
WANT_B = {"requests": 1, **dict.fromkeys(MEAN_KEYS, 0.0), "gen_length": 32.0,
          "tpf": 0.0, "tps": 0.0, "nfe_total": 0, "truncated_prompts": 0, "from_cache": 0}


def _fill(totals: StatTotals, records) -> StatTotals:
    for task, rec in records:
        if rec == "truncated":
            totals.count(task, "truncated_prompts")
        elif isinstance(rec, int):
            totals.count(task, "truncated_prompts", rec)
        elif rec is A2:                 # read from --use_cache: counted, and its costs too
            totals.add(task, rec, from_cache=True)
        else:
            totals.add(task, rec)
    return totals


RECORDS = [("b", B1), ("a", A1), ("a", "truncated"), ("ab", 4), ("a", A2), ("a", 2)]


def test_summary_is_the_hand_computed_means_and_rates():
    got = _fill(StatTotals(), RECORDS).summary()
    # tasks in name order; "ab" has counted prompts but no request, so no row (and "b" still one)
    assert list(got) == ["a", "b"]
    assert got["a"] == WANT_A and got["b"] == WANT_B
    for row in got.values():
        assert type(row["requests"]) is int and type(row["nfe_total"]) is int
        assert all(type(row[k]) is int for k in COUNT_KEYS)


def test_ranks_merge_to_the_whole_and_state_round_trips():
    ranks = [_fill(StatTotals(), RECORDS[0::2]), _fill(StatTotals(), RECORDS[1::2]), StatTotals()]
    # a state crosses processes pickled (all_gather_object); JSON is stricter still
    states = [json.loads(json.dumps(r.state())) for r in ranks]
    assert states[2] == {}
    assert states[0] == {"b": {"requests": 1.0, **dict.fromkeys(MEAN_KEYS, 0.0), "gen_length": 32.0},
                         "a": {"truncated_prompts": 1.0, "requests": 1.0, "from_cache": 1.0,
                               **{k: float(v) for k, v in A2.items()}}}
    assert states[1]["ab"] == {"truncated_prompts": 4.0}
    merged = StatTotals.merged(states).summary()
    assert merged == {"a": WANT_A, "b": WANT_B}
    assert StatTotals.merged([_fill(StatTotals(), RECORDS).state()]).summary() == {"a": WANT_A,
                                                                                   "b": WANT_B}
    twice = StatTotals.merged([states[1], states[1]]).state()
    assert twice["ab"] == {"truncated_prompts": 8.0} and twice["a"]["truncated_prompts"] == 4.0
    assert StatTotals.merged([{}, {}]).summary() == {}
