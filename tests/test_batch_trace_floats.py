"""Batch-size invariance of the float values in trace records (``c_total``: a sum of
probabilities over the impact set), bit for bit. The discrete outcome of a request (tokens, NFE,
rows, routes, tally, trace facts) is pinned in tests/test_batching.py. These floats come from
float32 logits: with ``batch_invariant=true`` (on the CPU, fixed-shape products,
``models/batch_invariant/cpu.py``, and every decoding sum in a fixed order) they are equal at
batch sizes 1, 3 and 8. With torch's own kernels a batched CPU forward reproduces them only to
the last bits (the library picks its matrix-product kernel by the number of rows, attention
tiles start at the padding), and PVF ranks verified branches by them, so a near tie can become a
different choice: that is pinned as a strict xfail."""

from __future__ import annotations

import pytest
from helpers.cache_models import arith_prompts
from helpers.result_fields import trace_floats

from pvf_lmeval.decoding import decode, decode_batch

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("invariant", [True, pytest.param(False, marks=pytest.mark.xfail(
    strict=True, reason=(
        "torch's kernels: c_total of a pvf trace differs in the last float32 bits between "
        "batch sizes on CPU (tiny-llada, arith, request 3 of 8, step 1: 1.1629562377929688 in a "
        "batch of 3 vs 1.162951946258545 alone)")))], ids=("batch_invariant", "torch_kernels"))
def test_pvf_trace_floats_equal_across_batch_sizes(llada, invariant):
    prompts, _ = arith_prompts(llada.tokenizer, 8)
    prompts = [p[:len(p) - (i % 4)] for i, p in enumerate(prompts)]
    kw = dict(gen_length=16, block_length=8, seed=3, preset="arith", reveal_next=3,
              plan_vocab=list(range(0, 600, 3)), trace=True, batch_invariant=invariant)
    idx = [100 + 7 * i for i in range(8)]
    alone = [trace_floats(decode(llada, p, "pvf", request_index=i, **kw))
             for p, i in zip(prompts, idx)]
    assert sum(map(len, alone)) > 0                  # the traces carry floats to compare
    for bs in (3, 8):
        batched = []
        for a in range(0, 8, bs):
            batched += [trace_floats(r) for r in decode_batch(llada, prompts[a:a + bs], "pvf",
                                                              request_indices=idx[a:a + bs], **kw)]
        assert batched == alone, bs
