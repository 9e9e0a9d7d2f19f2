"""Tensor and expert parallel on 2 real processes (gloo, float32, the CPU) against one process.

Tiny random folders of every family, from the published configs (``helpers.hub_folders``,
``helpers.moe_folders``): LLaDA (dense), LLaDA-MoE with a dense first layer and with every layer
routed (the released shape), LLaDA2 (fused query/key/value, block diffusion) with 2 key/value
heads (attention split) and with 1 (attention replicated); and the bundled tiny-dream (Dream's
format: query/key/value biases, a shifted head) and tiny-llada (trained: decoding commits the
same tokens under tensor parallel). One pool of 2 ranks serves
every check of the module (``helpers.ranks``); the ranks check every model call's inputs against
each other (``DiffusionLM.check_ranks``), so a rank that takes another turn fails the job by name.

- ``parallel_layers=experts``: bit for bit one process's logits and decode results (tokens,
  NFE, every statistic, the trace records' floats), every decoder and cache mode;
- ``parallel_layers=all``: logits within 1e-5 of one process's; with ``batch_invariant`` the
  same results at batch sizes 1, 3 and 8, bit for bit;
- both ranks hold the same results, always;
- each rank reads only its part of the checkpoint (its parameters are those slices of one
  process's) and its peak host memory while loading follows (measured);
- a divergence between the ranks is a named error on both.
"""

from __future__ import annotations

import os

import pytest
import torch
from helpers import parallel_jobs as jobs
from helpers.hub_folders import make_llada_folder
from helpers.moe_folders import make_llada2_folder, make_lladamoe_folder
from helpers.ranks import RankPool
from helpers.result_fields import assert_same_outcomes

from pvf_lmeval.models.loader import FIXTURES_DIR

TINY = str(FIXTURES_DIR / "tiny-llada")
MOE = ("lladamoe", "lladamoe_routed", "llada2", "llada2_mqa")
FAMILIES = ("llada", "dream") + MOE
#: commits a few positions per step on the random models (the trained fixture commits more)
THRESHOLD = 0.02
PROMPTS = [[40, 41, 42], [7], [9, 10, 11, 12, 13], [5, 6], [14, 15, 16, 17], [3], [50, 51],
           [60, 61, 62, 63]]


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("parallel")
    made = {
        "llada": make_llada_folder(root / "llada"),
        "dream": FIXTURES_DIR / "tiny-dream",
        "lladamoe": make_lladamoe_folder(root / "lladamoe"),
        "lladamoe_routed": make_lladamoe_folder(root / "lladamoe_routed",
                                                moe_layer_freq=[1, 1, 1]),
        "llada2": make_llada2_folder(root / "llada2"),
        "llada2_mqa": make_llada2_folder(root / "llada2_mqa", num_key_value_heads=1),
    }
    return {k: str(v) for k, v in made.items()}


@pytest.fixture(scope="module")
def big_experts(tmp_path_factory) -> str:
    """LLaDA2 whose routed experts are 25 MB of its 29 MB (float32)."""
    return str(make_llada2_folder(tmp_path_factory.mktemp("parallel") / "big_experts",
                                  hidden_size=64, moe_intermediate_size=2048))


@pytest.fixture(scope="module")
def pool(big_experts):
    """Two ranks; before any other job, their peak host memory while loading ``big_experts``
    split (``parallel_layers=experts``) and whole (``pool.memory``), after a first load that
    leaves only the weights to allocate."""
    ranks = RankPool(2)
    ranks.run(jobs.peak_while_loading, big_experts, "experts")
    ranks.memory = {"whole": ranks.run(jobs.peak_while_loading, big_experts, None),
                    "split": ranks.run(jobs.peak_while_loading, big_experts, "experts")}
    yield ranks
    ranks.close()


def _same_on_both(per_rank) -> object:
    a, b = per_rank
    if isinstance(a, list) and a and isinstance(a[0], torch.Tensor):
        assert all(torch.equal(x, y) for x, y in zip(a, b)), "the ranks hold different logits"
    else:
        for ra, rb in zip(a, b):
            assert_same_outcomes(rb, ra, "rank 1 against rank 0", floats=True)
    return a


@pytest.mark.parametrize("name", MOE)
def test_expert_parallel_logits_are_one_process_bit_for_bit(pool, folders, one_thread, name):
    got = _same_on_both(pool.run(jobs.logits, folders[name], "experts"))
    want = jobs.logits(folders[name], None)
    for g, w in zip(got, want):
        assert torch.equal(g, w)


#: every decoder and every cache mode at least once (the whole product: the slow tier)
COVER = (("static", "none"), ("threshold", "prefix"), ("freedave", "dual"), ("pvf", "dual_base"),
         ("explore", "prefix"), ("pvf", "none"))
PRODUCT = tuple((d, c) for d in ("static", "threshold", "freedave", "pvf", "explore")
                for c in ("none", "prefix", "dual", "dual_base"))
slow = pytest.mark.skipif(os.environ.get("PVF_PARALLEL_TESTS") != "1",
                          reason="slow parallel tier: set PVF_PARALLEL_TESTS=1 to run it")


def _cases(block: int, gen: int, vocab_ids, pairs=COVER) -> list[tuple[str, dict]]:
    base = dict(gen_length=gen, block_length=block, trace=True, seed=3)
    per_decoder = {"static": dict(steps=4), "threshold": dict(threshold=THRESHOLD),
                   "freedave": dict(draft_steps=2, threshold=THRESHOLD),
                   "pvf": dict(plan_vocab=vocab_ids, reveal_next=2, threshold=THRESHOLD,
                               plan_lo=THRESHOLD * 0.7, plan_hi=THRESHOLD, width=2),
                   "explore": dict(plan_vocab=vocab_ids, reveal_next=2, threshold=THRESHOLD)}
    return [(d, dict(base, cache=c, **per_decoder[d])) for d, c in pairs]


def _expert_parallel_decodes(pool, folders, name, block, gen, pairs):
    cases = _cases(block, gen, list(range(4, 60)), pairs)
    got = _same_on_both(pool.run(jobs.decodes, folders[name], "experts", cases, PROMPTS[:3]))
    want = jobs.decodes(folders[name], None, cases, PROMPTS[:3])
    for (decoder, kw), g, w in zip(cases, got, want):
        assert_same_outcomes(g, w, (decoder, kw["cache"]), floats=True)


@pytest.mark.parametrize("name,block,gen", [("llada2", 32, 32), ("lladamoe_routed", 8, 16)])
def test_expert_parallel_decodes_are_one_process_bit_for_bit(pool, folders, one_thread, name,
                                                             block, gen):
    """Every decoder and every cache mode, three requests in one batch: tokens, NFE, routes,
    every statistic and the trace records' floats, bit for bit."""
    _expert_parallel_decodes(pool, folders, name, block, gen, COVER)


@slow
@pytest.mark.parametrize("name,block,gen", [("llada2", 32, 32), ("lladamoe", 8, 16)])
def test_expert_parallel_decodes_every_decoder_with_every_cache_mode(pool, folders, one_thread,
                                                                     name, block, gen):
    _expert_parallel_decodes(pool, folders, name, block, gen, PRODUCT)


@pytest.mark.parametrize("name", FAMILIES)
def test_tensor_parallel_logits_within_1e_5(pool, folders, one_thread, name):
    """Every logit within 1e-5 of one process's, relative to the largest logit of its row (a
    trained model's logits run to about 20: float32 sums in another order differ by ~1e-6 of
    that)."""
    got = _same_on_both(pool.run(jobs.logits, folders[name], "all"))
    want = jobs.logits(folders[name], None)
    for g, w in zip(got, want):
        finite = torch.isfinite(w)
        assert torch.equal(finite, torch.isfinite(g))
        row = w.masked_fill(~finite, 0).abs().amax(-1, keepdim=True)
        err = ((g - w).masked_fill(~finite, 0).abs() / row).max()
        assert err <= 1e-5, float(err)


@pytest.mark.parametrize("name,layers", [("llada", "all"), ("llada2", "all"),
                                         ("llada2", "experts")])
def test_shadow_calls_split_over_the_ranks_are_one_process(pool, folders, one_thread, name,
                                                          layers):
    """Calls with a shadow block (``Shadow``): expert parallel bit for bit one process's logits,
    tensor parallel within 1e-5 of them (as above)."""
    got = _same_on_both(pool.run(jobs.logits, folders[name], layers, True))
    want = jobs.logits(folders[name], None, True)
    assert [w.shape[:2] for w in want] == [(3, 20 + 8), (3, 6 + 8), (3, 40 + 8)]
    for g, w in zip(got, want):
        if layers == "experts":
            assert torch.equal(g, w)
            continue
        finite = torch.isfinite(w)
        assert torch.equal(finite, torch.isfinite(g))
        row = w.masked_fill(~finite, 0).abs().amax(-1, keepdim=True)
        assert ((g - w).masked_fill(~finite, 0).abs() / row).max() <= 1e-5


def test_tensor_parallel_decodes_the_trained_fixture_as_one_process(pool, one_thread):
    """tiny-llada (trained, confident) under tensor parallel 2: every decoder and cache mode
    commits the tokens of one process (its logits differ in the last bits only)."""
    cases = _cases(8, 32, list(range(4, 200)), PRODUCT)
    got = _same_on_both(pool.run(jobs.decodes, TINY, "all", cases, PROMPTS[:3]))
    want = jobs.decodes(TINY, None, cases, PROMPTS[:3])
    for (decoder, kw), g, w in zip(cases, got, want):
        assert_same_outcomes(g, w, (decoder, kw["cache"]))


@pytest.mark.parametrize("name,decoder,cache", [("tiny", "pvf", "dual"),
                                                ("llada2", "threshold", "prefix")])
def test_batch_invariant_tensor_parallel_is_the_same_at_batch_sizes_1_3_8(pool, folders, name,
                                                                          decoder, cache):
    """batch_invariant=true under tensor parallel 2 (its cross-rank sums in rank order): every
    request's result, trace floats included, is the same in batches of 1, 3 and 8."""
    folder, block = (TINY, 8) if name == "tiny" else (folders[name], 32)
    (case,) = _cases(block, 32, list(range(4, 60)), [(decoder, cache)])
    case[1]["batch_invariant"] = True
    one, three, eight = _same_on_both(pool.run(jobs.decodes, folder, "all", [case], PROMPTS,
                                               (1, 3, 8)))
    assert_same_outcomes(three, one, "batch 3", floats=True)
    assert_same_outcomes(eight, one, "batch 8", floats=True)


def test_each_rank_holds_its_part(pool, folders):
    """The parameters each rank loaded are those slices of one process's: its experts, its
    query/key/value heads out of the fused projection, its columns of the output and down
    projections, its rows of the LM head."""
    names = ("blocks.1.attn.qkv_proj.weight", "blocks.1.attn.o_proj.weight",
             "blocks.0.mlp.gate_proj.weight", "blocks.0.mlp.down_proj.weight",
             "blocks.1.mlp.gate_proj", "blocks.1.mlp.shared.up_proj.weight",
             "blocks.1.mlp.shared.down_proj.weight", "blocks.1.mlp.router.weight",
             "lm_head.weight")
    per_rank = pool.run(jobs.parameters, folders["llada2"], "all", names)
    whole = jobs.parameters(folders["llada2"], None, names)
    hd, f, fs = 16, 48, 16          # the folder's head, dense and shared widths
    vocab = whole["lm_head.weight"].shape[0]
    for r, got in enumerate(per_rank):
        def mine(n):
            return slice(r * n // 2, (r + 1) * n // 2)
        q = whole["blocks.1.attn.qkv_proj.weight"]      # 4 query heads, then 2 key, 2 value
        heads = torch.cat([q[:64][mine(64)], q[64:96][mine(32)], q[96:][mine(32)]])
        assert torch.equal(got["blocks.1.attn.qkv_proj.weight"], heads)
        assert torch.equal(got["blocks.1.attn.o_proj.weight"],
                           whole["blocks.1.attn.o_proj.weight"][:, mine(4 * hd)])
        assert torch.equal(got["blocks.0.mlp.gate_proj.weight"],
                           whole["blocks.0.mlp.gate_proj.weight"][mine(f)])
        assert torch.equal(got["blocks.0.mlp.down_proj.weight"],
                           whole["blocks.0.mlp.down_proj.weight"][:, mine(f)])
        assert torch.equal(got["blocks.1.mlp.gate_proj"], whole["blocks.1.mlp.gate_proj"][mine(8)])
        assert torch.equal(got["blocks.1.mlp.shared.up_proj.weight"],
                           whole["blocks.1.mlp.shared.up_proj.weight"][mine(fs)])
        assert torch.equal(got["blocks.1.mlp.shared.down_proj.weight"],
                           whole["blocks.1.mlp.shared.down_proj.weight"][:, mine(fs)])
        assert torch.equal(got["blocks.1.mlp.router.weight"], whole["blocks.1.mlp.router.weight"])
        assert torch.equal(got["lm_head.weight"], whole["lm_head.weight"][mine(vocab)])


def test_batch_size_auto_probes_each_rank_alone_and_takes_every_rank_s_answer(pool, folders):
    """A probe runs its collectives locally (rank 0 probes while rank 1 does nothing, and
    finishes); a batch fits only when it fits on every rank."""
    assert pool.run(jobs.probe_alone, folders["llada2"], "all", timeout=120) == \
        [(True, False), (True, False)]


def test_a_row_split_product_with_a_bias_is_the_whole_product(pool, one_thread):
    """Attention's output projection and the MLPs' down projections under tensor parallel: each
    rank's span of the inner dimension, the partials summed in float32, the bias added once
    (no folder here has an output-projection bias)."""
    got = _same_on_both([[t] for t in pool.run(jobs.row_split_product, 5, 67, 9)])[0]
    gen = torch.Generator().manual_seed(7)
    x, w, b = (torch.randn(5, 67, generator=gen), torch.randn(9, 67, generator=gen),
               torch.randn(9, generator=gen))
    assert (got - torch.nn.functional.linear(x, w, b)).abs().max() <= 1e-5


@pytest.mark.parametrize("name,layers,what", [("llada2", "all", "tokens"),
                                               ("llada2", "experts", "shadow")])
def test_a_divergence_between_the_ranks_is_named(pool, folders, name, layers, what):
    """Other tokens, or the same tokens with another shadow, on rank 1."""
    got = pool.run(jobs.diverge, folders[name], layers, what)
    for message in got:
        assert message.startswith("RanksDiverged: pvf-dlm: tensor-parallel ranks diverged: the "
                                  "inputs of model call "), message
        assert " of rank 1 differ from rank 0's (fingerprints " in message


def test_the_requests_and_committed_tokens_are_compared_across_the_ranks(pool):
    """The adapter's check of each generate_until's requests and each batch's tokens: equal
    values pass, a rank with other values stops every rank with the name of what differs."""
    assert pool.run(jobs.compare_values, [[1, 2], [1, 2]]) == ["same", "same"]
    for message in pool.run(jobs.compare_values, [[1, 2], [1, 3]]):
        assert message.startswith("RanksDiverged: pvf-dlm: tensor-parallel ranks diverged: the "
                                  "committed tokens of rank 1 differ from rank 0's"), message


def test_peak_host_memory_while_loading_follows_the_rank_s_share(pool):
    """Each rank reads only its experts (skipped tensors are never read): its peak resident
    memory while loading is about half of one process's, the routed experts being most of the
    weights. Measured in the ranks' own processes (VmHWM), not assumed."""
    for whole, split in zip(pool.memory["whole"], pool.memory["split"]):
        experts = whole["held"] - split["held"]          # the other rank's half of the experts
        assert experts * 2 > 0.8 * whole["held"]         # experts: most of the weights
        assert whole["peak"] >= whole["held"]            # the measurement sees the load
        assert split["peak"] < 0.65 * whole["peak"], (split, whole)
