"""subblock, hierarchy and credit beyond their reference checks: a request decoded in a batch of
8 with ``batch_invariant=true`` gives every field of its result, trace floats included, as it
does alone (paper and reference rules, full and cached calls). Every family's tiny folder:
tests/test_family_decoding.py."""

from __future__ import annotations

import pytest
from helpers.cache_models import arith_prompts
from helpers.result_fields import assert_same_outcomes, trace_floats

from pvf_lmeval.decoding import decode, decode_batch
from pvf_lmeval.models import load_model

pytestmark = pytest.mark.usefixtures("one_thread")

DECODERS = ("subblock", "hierarchy", "credit")


@pytest.mark.parametrize("fixture", ["tiny-llada", "tiny-dream"])
@pytest.mark.parametrize("decoder", DECODERS)
def test_batch_of_eight_equals_alone_batch_invariant(fixture, decoder):
    model = load_model(fixture)
    prompts, _ = arith_prompts(model.tokenizer, 8)
    prompts = [p[:len(p) - (i % 4)] for i, p in enumerate(prompts)]      # left padding
    idx = [100 + 7 * i for i in range(8)]
    for rules, cache in (("paper", "none"), ("reference", "none"), ("paper", "dual")):
        kw = dict(gen_length=32, block_length=16, rules=rules, cache=cache, trace=True,
                  batch_invariant=True, threshold=0.7)
        alone = [decode(model, p, decoder, request_index=i, **kw) for p, i in zip(prompts, idx)]
        together = decode_batch(model, prompts, decoder, request_indices=idx, **kw)
        assert_same_outcomes(together, alone, (fixture, decoder, rules, cache), floats=True)
        assert sum(len(trace_floats(r)) for r in alone) == 0      # no float hides in the trace
        assert len({tuple(r.tokens) for r in alone}) > 1          # the requests really differ
