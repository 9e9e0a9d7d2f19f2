"""subblock, hierarchy and credit beyond their reference checks: a request decoded in a batch of
8 with ``batch_invariant=true`` gives every field of its result, trace floats included, as it
does alone (paper and reference rules, full and cached calls); and they decode every kind of
family's tiny folder, bidirectional and block-causal, shifted or not, where on a block-causal
model the KV caches give the tokens of ``cache=none``."""

from __future__ import annotations

import pytest
import torch
from helpers.cache_models import arith_prompts
from helpers.qwen_folders import make_fast_dllm_folder, make_rnd1_folder, make_sdar_folder
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


#: (folder builder, gen_length, block_length or None for the model's own)
FAMILIES = {
    "sdar": (make_sdar_folder, 8, None),                     # block-causal, blocks of 4
    "fast_dllm": (lambda f, seed: make_fast_dllm_folder(f, seed, bd_size=8), 8, None),
    "rnd1": (make_rnd1_folder, 16, 8),                       # bidirectional, shifted
}
#: Qwen2 byte-level ids, prompts of different lengths
PROMPTS = [[220, 1782, 3555, 25], [14582, 25, 220, 16, 488, 220, 17, 30, 715, 16141, 25],
           [40, 1079], [9707, 1879, 11, 220, 18, 9, 220, 19, 284]]


@pytest.fixture(scope="module")
def family(tmp_path_factory):
    loaded = {}

    def get(name):
        if name not in loaded:
            folder = FAMILIES[name][0](tmp_path_factory.mktemp(name) / "f", seed=3)
            m = load_model(str(folder), device="cpu", dtype="float32")
            with torch.no_grad():           # peaked distributions: several commits per call
                for pname, p in m.net.named_parameters():
                    if p.dim() > 1 and "router" not in pname and "gate_proj" not in pname:
                        p.mul_(3.0)
            loaded[name] = m
        return loaded[name]
    return get


def _outcome(r):
    return r.tokens, r.routes, r.nfe, r.branch_rows


@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("decoder", DECODERS)
def test_families(family, name, decoder):
    m = family(name)
    _, gen_length, block_length = FAMILIES[name]
    kw = dict(gen_length=gen_length, threshold=0.3, sub_block=2)
    if block_length is not None:
        kw["block_length"] = block_length
    together = decode_batch(m, PROMPTS, decoder, **kw)
    for i, p in enumerate(PROMPTS):
        assert _outcome(together[i]) == _outcome(decode(m, p, decoder, request_index=i, **kw))
    if m.block_size is not None:            # block-causal: the caches are exact
        for cache in ("prefix", "dual"):
            cached = decode_batch(m, PROMPTS, decoder, cache=cache, **kw)
            assert [_outcome(r) for r in cached] == [_outcome(r) for r in together], cache
    assert len({tuple(r.tokens) for r in together}) > 1
    assert all(r.committed > 0 for r in together)
