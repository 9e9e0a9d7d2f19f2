"""Decoding a block-diffusion model (block-causal attention, ``model.block_size``): block
alignment to position ids, the block_length default and error, every decoder on hand-written
tables, PVF's early revelation, batching with left padding, and the exactness of the KV cache.

Position ids below are the model's (prompt from 0). The decoders' trace records positions of the
region: with these prompts (3 and 4 tokens, block 4) the region starts at position id 0, so
trace positions are position ids too, except where a test says otherwise.
"""

from __future__ import annotations

import pytest

from helpers.block_tables import BlockModel, filled_from, random_table
from pvf_lmeval.decoding import decode, decode_batch, make_params

B = 4


def after_block(p: int):
    """Table: position q >= p predicts 10 + q with .96 - .005 * (q mod 4) (above the threshold,
    earlier positions of a block more confident) once the block before q's is complete, else
    20 + q with .97 (a decoder that commits a block before the previous one is complete, or that
    cuts blocks elsewhere than the model, writes other tokens)."""
    def table(seq):
        out = {}
        for q in range(p, len(seq)):
            j = q // B
            done = j == 0 or all(seq[i] is not None for i in range((j - 1) * B, j * B))
            out[q] = (10 + q, .96 - .005 * (q % B)) if done else (20 + q, .97)
        return out
    return table


def committed(r) -> list[list[int]]:
    return [[i for i, _ in s["committed"]] for s in r.steps]


# ---------------------------------------------------------------- block_length


def test_block_length_defaults_to_the_model_block_size():
    m = BlockModel(after_block(3), block_size=B)
    r = decode(m, [40, 41, 42], "threshold", gen_length=8)      # the default would be 32
    assert r.tokens == list(range(13, 21)) and r.block_size == B


@pytest.mark.parametrize("bl", [2, 8])
def test_block_length_other_than_the_model_block_is_one_line_error(bl):
    m = BlockModel(after_block(3), block_size=B)
    msg = f"block_length={bl} must equal the model's block size 4"
    with pytest.raises(ValueError, match=msg):
        decode(m, [40, 41, 42], "threshold", gen_length=8, block_length=bl)
    with pytest.raises(ValueError, match=msg):
        decode(m, [40, 41, 42], params=make_params("threshold", gen_length=8, block_length=bl))
    assert m.nfe == 0


# ---------------------------------------------------------------- every decoder, pinned


@pytest.mark.parametrize("reveal_next", [0, 5])     # PVF's option: a baseline never reveals
def test_threshold_first_block_completes_the_prompt_block(reveal_next):
    # prompt 3 tokens: blocks are position ids 0-3 (prompt + 1 generated), 4-7, 8-11; the
    # answer is position ids 3..10, and 11 completes the last block
    m = BlockModel(after_block(3), block_size=B)
    r = decode(m, [40, 41, 42], "threshold", gen_length=8, trace=True, reveal_next=reveal_next)
    assert r.tokens == [13, 14, 15, 16, 17, 18, 19, 20]
    assert r.routes == ["base"] * 8 and r.committed == 8 and r.gen_length == 8
    assert committed(r) == [[3], [4, 5, 6, 7], [8, 9, 10, 11]]
    assert r.nfe == 3 and r.branch_rows == 3
    # each call runs on the sequence up to the end of its block only
    assert m.calls == [(1, (0, 4), 4), (1, (4, 8), 8), (1, (8, 12), 12)]
    assert m.seqs[1] == [[40, 41, 42, 13, None, None, None, None]]
    assert r.cache_exact


def test_static_one_token_per_step():
    m = BlockModel(after_block(3), block_size=B)
    r = decode(m, [40, 41, 42], "static", gen_length=8, trace=True)
    assert r.tokens == list(range(13, 21)) and r.routes == ["base"] * 8
    assert committed(r) == [[q] for q in range(3, 12)]
    assert r.nfe == 9
    assert [c[1] for c in m.calls] == [(0, 4)] + [(4, 8)] * 4 + [(8, 12)] * 4


def test_static_schedule_counts_the_masks_of_the_partial_first_block():
    # prompt 5: the region starts at position id 4 (trace positions = position id - 4); the
    # first block holds 3 masks: 3 steps of 1; whole blocks: 4 masks in 3 steps, 2 + 1 + 1
    m = BlockModel(after_block(5), block_size=B)
    r = decode(m, [40, 41, 42, 43, 44], "static", gen_length=8, steps=6, trace=True)
    assert r.tokens == list(range(15, 23))
    assert committed(r) == [[1], [2], [3], [4, 5], [6], [7], [8, 9], [10], [11]]
    assert r.nfe == 9


def test_freedave_drafts_within_the_model_block():
    m = BlockModel(after_block(3), block_size=B)
    r = decode(m, [40, 41, 42], "freedave", gen_length=8, trace=True)
    assert r.tokens == list(range(13, 21)) and r.routes == ["base"] * 8
    # block 0 has one mask: one draft; whole blocks: 4 drafts, the 4th accepted
    assert committed(r) == [[3], [4, 5, 6, 7], [8, 9, 10, 11]]
    assert [s["drafts"] for s in r.steps] == [1, 4, 4]
    assert r.nfe == 4 and r.branch_rows == 1 + 1 + 4 + 4
    assert [c[:2] for c in m.calls] == [(1, (0, 4)), (1, (4, 8)), (4, (4, 12)), (4, (8, 12))]


def test_pvf_without_revelation_is_threshold_here():
    m = BlockModel(after_block(3), block_size=B)
    r = decode(m, [40, 41, 42], "pvf", gen_length=8, plan_vocab=[13, 14], trace=True)
    assert r.tokens == list(range(13, 21)) and r.routes == ["base"] * 8
    assert r.nfe == 3 and m.calls == [(1, (0, 4), 4), (1, (4, 8), 8), (1, (8, 12), 12)]


def step_table(seq):
    """Position q predicts 10 + q: .95 when q - 1 is filled, .5 when q - 2 is (in the band),
    else .05."""
    out = {}
    for q in range(3, len(seq)):
        if seq[q - 1] is not None:
            out[q] = (10 + q, .95)
        elif seq[q - 2] is not None:
            out[q] = (10 + q, .5)
        else:
            out[q] = (10 + q, .05)
    return out


def test_explore_extra_token_and_the_dropped_tail():
    m = BlockModel(step_table, block_size=B)
    r = decode(m, [40, 41, 42], "explore", gen_length=8, trace=True)
    assert r.tokens == list(range(13, 21))
    # one in-band position per step: the extra pick; position id 11 (explore) is decoded to
    # complete the last block but is not part of the answer
    assert committed(r) == [[3], [4, 5], [6, 7], [8, 9], [10, 11]]
    assert r.routes == ["base", "base", "explore", "base", "explore", "base", "explore", "base"]
    assert r.tokens_explore == 3 and r.tokens_base == 5 and r.committed == 8
    assert r.nfe == 5
    assert [c[1] for c in m.calls] == [(0, 4), (4, 8), (4, 8), (8, 12), (8, 12)]


def test_early_stop_ignores_end_of_text_in_the_prompt_block():
    # the prompt's last token is end-of-text and sits in the first decoding block
    m = BlockModel(after_block(3), block_size=B)
    r = decode(m, [40, 41, 2], "threshold", gen_length=8)
    assert r.tokens == list(range(13, 21)) and r.gen_tokens == 8 and r.nfe == 3


# ---------------------------------------------------------------- PVF: early revelation


def reveal_table(seq):
    """Prompt 4 (block 0); block 1 = position ids 4-7, block 2 = 8-11. Position 7 becomes
    confident once 6 is filled; block 2 is confident once block 1 is complete, else position 8
    is a planning candidate (token 30, .5)."""
    f = filled_from(seq, 4)
    b1 = f & {4, 5, 6, 7}
    out = {}
    if not b1:
        out.update({4: (10, .95), 5: (11, .95), 6: (12, .5), 7: (13, .05)})
    elif b1 == {4, 5}:
        out.update({6: (12, .95), 7: (13, .05)})
    elif b1 == {4, 5, 6}:
        out.update({7: (13, .95)})
    if len(seq) > 8:
        if b1 == {4, 5, 6, 7}:
            out.update({q: (10 + q, .95) for q in range(8, 12)})
        else:
            out.update({8: (30, .5), 9: (29, .05), 10: (30, .05), 11: (31, .05)})
    return out


def test_pvf_plans_into_the_next_block_verified_on_what_it_can_influence():
    m = BlockModel(reveal_table, block_size=B)
    r = decode(m, [40, 41, 42, 43], "pvf", gen_length=8, reveal_next=2, routes="plan",
               plan_vocab=[30], trace=True)
    # step 1: the base set {6} leaves 7 confident under z_base (the impact set {7}); candidate 8
    # lies in the next block, which cannot influence 7: nothing to verify, it is not committed.
    # step 2: block 1 completes in z_base, its impact set is 9..11 (block 2): verified, planned.
    assert [s.get("candidates") for s in r.steps] == [None, [8], [8], None]
    assert [s.get("verified") for s in r.steps] == [None, [False], [True], None]
    assert committed(r) == [[4, 5], [6], [7, 8], [9, 10, 11]]
    assert r.tokens == [10, 11, 12, 13, 30, 19, 20, 21]
    assert r.routes == ["base"] * 4 + ["plan"] + ["base"] * 3
    assert (r.plan_tried, r.plan_passed) == (2, 1)
    assert r.nfe == 4 and r.branch_rows == 1 + 1 + 2 + 2
    # revealing steps read the next block's stats: calls run up to its end
    assert m.calls == [(1, (4, 12), 12), (1, (4, 12), 12), (2, (4, 12), 12), (2, (8, 12), 12)]


def test_pvf_without_revelation_never_plans_across_blocks():
    m = BlockModel(reveal_table, block_size=B)
    r = decode(m, [40, 41, 42, 43], "pvf", gen_length=8, routes="plan", plan_vocab=[30],
               trace=True)
    assert committed(r) == [[4, 5], [6], [7], [8, 9, 10, 11]]
    assert r.tokens == [10, 11, 12, 13, 18, 19, 20, 21] and r.plan_tried == 0
    assert r.nfe == 4 and [c[1] for c in m.calls] == [(4, 8)] * 3 + [(8, 12)]


# ---------------------------------------------------------------- batching, cache


# every remainder modulo the block; the last prompt ends with end-of-text in its last block
PROMPTS = [[49], [40, 41, 42], [43, 44, 45, 46, 47], [48] * 8, [50, 51, 52, 53], [43, 44, 2]]
DECODERS = [("threshold", {}), ("static", {}), ("freedave", {}),
            ("pvf", {"reveal_next": 2, "plan_vocab": list(range(10, 50, 3))}),
            ("pvf", {"rules": "reference", "plan_vocab": list(range(10, 50, 3))}),
            ("explore", {"reveal_next": 1}), ("threshold", {"temperature": 0.7}),
            ("static", {"steps": 4}), ("eb", {}), ("eb", {"rules": "reference"})]


def _same(a, b):
    assert (a.tokens, a.routes, a.nfe, a.branch_rows) == (b.tokens, b.routes, b.nfe, b.branch_rows)


@pytest.mark.parametrize("dec,kw", DECODERS)
def test_left_padded_requests_decode_exactly_as_alone(dec, kw):
    m = BlockModel(random_table(7), block_size=B)
    batch = decode_batch(m, PROMPTS, dec, gen_length=8, **kw)
    for i, p in enumerate(PROMPTS):
        _same(batch[i], decode(m, p, dec, gen_length=8, request_index=i, **kw))
    assert len({r.nfe for r in batch}) > 1              # the requests did differ


def test_empty_prompt_decodes_whole_blocks():
    m = BlockModel(after_block(0), block_size=B)
    r = decode(m, [], "threshold", gen_length=8)
    assert r.tokens == list(range(10, 18)) and r.nfe == 2
    assert [c[1] for c in m.calls] == [(0, 4), (4, 8)]


@pytest.mark.parametrize("cache", ["prefix", "dual", "dual_base"])
@pytest.mark.parametrize("dec,kw", DECODERS[:5])
def test_cache_is_exact_on_a_block_causal_model(cache, dec, kw):
    outs = {}
    for c in ("none", cache):
        m = BlockModel(random_table(3), block_size=B)
        outs[c] = decode_batch(m, PROMPTS, dec, gen_length=8, cache=c, **kw)
    for a, b in zip(outs["none"], outs[cache]):
        if cache == "dual_base":        # its refreshing steps make two calls: NFE differs
            assert (a.tokens, a.routes) == (b.tokens, b.routes)
        else:
            _same(a, b)
        assert b.cache_exact
    assert any(t == 9 for r in outs[cache] for t in r.tokens) is False


def test_cache_model_shows_drift_when_attention_is_bidirectional():
    # the same table and cache seen by every position: the cached keys go stale
    outs = {}
    for c in ("none", "prefix"):
        m = BlockModel(random_table(3), block_size=B, causal=False)
        outs[c] = decode_batch(m, [[40, 41, 42, 43]], "threshold", gen_length=8,
                               block_length=B, cache=c)
    assert outs["none"][0].tokens != outs["prefix"][0].tokens
    assert not outs["prefix"][0].cache_exact and outs["none"][0].cache_exact


# ---------------------------------------------------------------- the native LLaDA 2 network


@pytest.fixture(scope="module")
def llada2(tmp_path_factory):
    """A tiny random LLaDA 2 network with blocks of 4, weights scaled up so that its
    distributions are peaked (threshold commits several tokens, PVF plans)."""
    import torch
    from helpers.moe_folders import make_llada2_folder

    from pvf_lmeval.models import load_model

    m = load_model(str(make_llada2_folder(tmp_path_factory.mktemp("llada2") / "f", seed=2)),
                   device="cpu", dtype="float32")
    m.block_size = B
    with torch.no_grad():
        for name, p in m.net.named_parameters():
            if p.dim() > 1 and "gate" not in name and "router" not in name:
                p.mul_(3.0)
    return m


NET_PROMPTS = [[123, 45, 67], [89, 12, 34, 56, 78, 90], [11, 22, 33, 44, 55, 66, 77, 88], [99]]
NET_DECODERS = [("threshold", {"threshold": 0.3}),
                ("pvf", {"threshold": 0.3, "plan_lo": 0.05, "plan_hi": 0.3, "reveal_next": 2,
                         "plan_vocab": list(range(691))})]


@pytest.mark.parametrize("dec,kw", NET_DECODERS)
def test_native_block_network_cache_and_batching_change_nothing(llada2, dec, kw):
    none = decode_batch(llada2, NET_PROMPTS, dec, gen_length=8, **kw)
    for cache in ("prefix", "dual"):
        for a, b in zip(none, decode_batch(llada2, NET_PROMPTS, dec, gen_length=8, cache=cache,
                                           **kw)):
            _same(a, b)
    for i, p in enumerate(NET_PROMPTS):
        _same(none[i], decode(llada2, p, dec, gen_length=8, request_index=i, **kw))
    if dec == "pvf":
        assert sum(r.tokens_plan for r in none) > 0
