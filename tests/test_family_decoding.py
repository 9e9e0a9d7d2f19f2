"""The decoders on the new families' networks (SDAR, SDAR-MoE, Fast-dLLM v2, RND1), loaded from
their hub-shaped folders: on the block-causal ones (SDAR's blocks of 4, Fast-dLLM v2's, shifted,
here of 8) the KV cache is exact, so ``cache=prefix`` and ``cache=dual`` give the tokens of
``cache=none``; on every one, a request decoded in a left-padded batch of 4 gives what it gives
alone. The weights are scaled up after loading so that the distributions are peaked (threshold
commits several tokens at once, PVF plans and falls back).

Every decoder runs on SDAR, PVF on each family, and subblock, hierarchy and credit also on
Fast-dLLM v2 (block-causal, shifted) and RND1 (bidirectional, shifted); the rest of the family x
decoder matrix is the ``PVF_FAMILY_TESTS=1`` tier (each call computes a 152k-id LM head)."""

from __future__ import annotations

import pytest
from helpers.prerequisites import family_tier
from helpers.qwen_folders import (load_peaked, make_fast_dllm_folder, make_rnd1_folder,
                                  make_sdar_folder)

from pvf_lmeval.decoding import decode, decode_batch

pytestmark = pytest.mark.usefixtures("one_thread")

#: (folder builder, gen_length, block_length or None for the model's own)
FAMILIES = {
    "sdar": (make_sdar_folder, 8, None),
    "sdar_moe": (lambda f, seed: make_sdar_folder(f, seed, moe=True), 8, None),
    # blocks of 8 (config.json's bd_size; the released 32 would cost 4x the logits per call)
    "fast_dllm": (lambda f, seed: make_fast_dllm_folder(f, seed, bd_size=8), 8, None),
    "rnd1": (make_rnd1_folder, 16, 8),
}
#: Qwen2 byte-level ids (the bytes of " the", "Question", ...), prompts of different lengths
PROMPTS = [[220, 1782, 3555, 25], [14582, 25, 220, 16, 488, 220, 17, 30, 715, 16141, 25],
           [40, 1079], [9707, 1879, 11, 220, 18, 9, 220, 19, 284]]
DECODERS = {
    "static": {},
    "threshold": {"threshold": 0.3},
    "freedave": {"threshold": 0.3, "draft_steps": 2},
    "pvf": {"threshold": 0.3, "plan_lo": 0.05, "plan_hi": 0.3, "reveal_next": 2,
            "plan_vocab": list(range(0, 3000, 7))},
    "explore": {"threshold": 0.3, "reveal_next": 2, "plan_vocab": list(range(0, 3000, 7))},
    "eb": {"gamma": 0.5},
    "subblock": {"threshold": 0.3, "sub_block": 2},
    "hierarchy": {"threshold": 0.3},
    "credit": {"threshold": 0.3},
}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """The families' models, loaded when a test first asks (weights scaled up)."""
    loaded = {}

    def get(name):
        if name not in loaded:
            make = FAMILIES[name][0]
            m = load_peaked(make(tmp_path_factory.mktemp(name) / "f", seed=3))
            loaded[name] = m
        return loaded[name]
    return get


#: every decoder on SDAR, PVF on each family, the commit-only decoders of Fast-dLLM v2 and RND1
#: on those two; the family tier runs the other pairs
COVER = {("sdar", d) for d in DECODERS} | {(f, "pvf") for f in FAMILIES} | \
    {(f, d) for f in ("fast_dllm", "rnd1") for d in ("subblock", "hierarchy", "credit")}


def _same(a, b, context):
    assert (a.tokens, a.routes, a.nfe, a.branch_rows) == \
        (b.tokens, b.routes, b.nfe, b.branch_rows), context


@pytest.mark.parametrize("name,dec", [
    pytest.param(f, d, marks=() if (f, d) in COVER else family_tier, id=f"{f}-{d}")
    for f in FAMILIES for d in DECODERS])
def test_cache_and_batching_change_nothing(models, name, dec):
    m = models(name)
    _, gen_length, block_length = FAMILIES[name]
    kw = {"gen_length": gen_length, **DECODERS[dec]}
    if block_length is not None:
        kw["block_length"] = block_length
    if dec == "static":
        kw["steps"] = gen_length // 2
    none = decode_batch(m, PROMPTS, dec, **kw)
    for i, p in enumerate(PROMPTS):                     # batch 1 = batch 4 (left padding)
        _same(none[i], decode(m, p, dec, request_index=i, **kw), (name, dec, "batch", i))
    if m.block_size is not None:                        # block-causal: the cache is exact
        for cache in ("prefix", "dual"):
            for i, (a, b) in enumerate(zip(none, decode_batch(m, PROMPTS, dec, cache=cache, **kw))):
                _same(a, b, (name, dec, cache, i))
    assert len({tuple(r.tokens) for r in none}) > 1     # the requests really differ
