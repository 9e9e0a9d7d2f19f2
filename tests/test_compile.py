"""``compile=blocks`` stays compiled through batched decoding: rounds vary the rows per call,
the requested positions, left padding and full vs cached calls, and none of that may push dynamo
past its recompile limit (after which calls silently run eager)."""

from __future__ import annotations

import pytest
import torch
from cache_models import arith_prompts

from pvf_lmeval.decoding import decode_batch
from pvf_lmeval.models import load_model

pytestmark = pytest.mark.usefixtures("one_thread")


def test_batched_runs_stay_within_a_few_graphs_per_block_function():
    """backend=eager: dynamo's capture and guards without inductor's code generation (cheap on a
    CPU). ``fail_on_recompile_limit_hit`` turns a fall-back to eager into an error, and the limit
    is set to 4 graphs per function (dynamo's default is 8)."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    model = load_model("tiny-llada").compile(scope="blocks", backend="eager")
    prompts, _ = arith_prompts(model.tokenizer, 8)
    prompts = [p[:len(p) - (i % 3)] for i, p in enumerate(prompts)]     # left padding
    vocab = range(0, 600, 2)
    with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True, recompile_limit=4):
        for dec, cache, sizes in (("pvf", "dual", (1, 3)), ("pvf", "none", (5,)),
                                  ("freedave", "prefix", (8,))):
            for bs in sizes:
                extra = {"preset": "arith", "plan_vocab": vocab} if dec == "pvf" else {}
                rs = decode_batch(model, prompts[:bs], dec, gen_length=32, block_length=16,
                                  cache=cache, **extra)
                assert len(rs) == bs
    # three block functions (all rows, the last layer's requested rows, cached): at most one
    # graph per (one row or several) x (attention mask or none)
    assert 0 < counters["stats"]["unique_graphs"] <= 10
    torch._dynamo.reset()
