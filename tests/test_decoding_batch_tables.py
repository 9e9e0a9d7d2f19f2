"""Batched decoding on a table-free random model: fast batch-size invariance for every decoder.

``RandomModel`` drops a row's left padding (as a network does through its attention mask), so a
request's logits alone and inside a left-padded batch are the same numbers. Then every field of
every request's result, the trace records and their float values included, must be identical
for any batch size and composition: whatever differs is the decoding side's doing (a request
reading another's row, a reduction across requests, a shape that only one request hides).
The fixture-model version with KV caches is tests/test_batching.py.
"""

from __future__ import annotations

import pytest
from helpers.decoding_tables import RandomModel
from helpers.result_fields import assert_same_outcomes, trace_floats

from pvf_lmeval.decoding import decode, decode_batch

#: prompts of five lengths (left padding of 0-4 tokens) and distinct request indices
PROMPTS = [[40, 41, 42], [7], [9, 10, 11, 12, 13], [5, 6], [14, 15, 16, 17]]
INDICES = [100 + 7 * i for i in range(len(PROMPTS))]

CASES = {
    "threshold": {},
    "static": dict(steps=8),
    "freedave": dict(draft_steps=2),
    "explore": dict(plan_vocab=range(4, 20), reveal_next=2),
    # a narrow vocabulary: at some steps one request has a planning pick and another has none
    "explore-planning": dict(pick="planning", plan_vocab=range(4, 9), reveal_next=2),
    # switch 3: the forced token decided after the pick, per request
    "explore-reference": dict(plan_vocab=range(4, 20), reveal_next=2, rules="reference"),
    "pvf": dict(plan_vocab=range(4, 20), reveal_next=2),
    "pvf-reference": dict(plan_vocab=range(4, 20), rules="reference"),
    "pvf-no-routes": dict(plan_vocab=range(4, 20), routes="none"),
}


def _decode_all(case: str, temperature: float, sizes) -> list[list]:
    dec = case.split("-")[0]
    kw = dict(gen_length=16, block_length=4, temperature=temperature, seed=5, trace=True,
              **CASES[case])
    model = RandomModel(7, eos_bias=-2.5, jitter=0.5)
    runs = [[decode(model, p, dec, request_index=i, **kw) for p, i in zip(PROMPTS, INDICES)]]
    for bs in sizes:
        got = []
        for a in range(0, len(PROMPTS), bs):
            got += decode_batch(model, PROMPTS[a:a + bs], dec, request_indices=INDICES[a:a + bs],
                                **kw)
        runs.append(got)
    return runs


@pytest.mark.parametrize("temperature", [0.0, 0.8])
@pytest.mark.parametrize("case", list(CASES))
def test_every_field_identical_at_batch_sizes_1_2_5(case, temperature):
    alone, *batched = _decode_all(case, temperature, (2, 5))
    for bs, got in zip((2, 5), batched):
        assert_same_outcomes(got, alone, (case, temperature, bs))
        assert [trace_floats(r) for r in got] == [trace_floats(r) for r in alone], bs


@pytest.mark.parametrize("case", ["pvf", "explore", "freedave"])
def test_the_runs_exercise_what_they_compare(case):
    """The comparison above means something only if the requests differ from each other and
    the decoders' special steps happen: several calls each, different answers, explored
    tokens, branch rows beyond one per call, planning candidates verified and committed."""
    (alone,) = _decode_all(case, 0.0, ())
    assert len({tuple(r.tokens) for r in alone}) == len(PROMPTS)
    assert all(r.nfe > 1 for r in alone)
    if case == "explore":
        assert sum(r.tokens_explore for r in alone) > 0
    else:
        assert sum(r.branch_rows for r in alone) > sum(r.nfe for r in alone)
    if case == "pvf":
        assert sum(r.plan_tried for r in alone) > 0 and sum(r.tokens_plan for r in alone) > 0
