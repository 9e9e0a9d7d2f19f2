"""subblock (Fast-dLLM v2's sub-block decoding): the candidates of a round, the threshold rule in
a sub-block (inclusive, strict under ``rules=reference``), a block's first token by argmax, and
``rules=reference`` against Fast-dLLM v2's own outputs (tests/data/reference_decoders)."""

import pytest
import torch
from helpers.decoding_tables import MASK, dist_logits, filled, run

from pvf_lmeval.decoding.stats import stats_from_logits
from pvf_lmeval.decoding.subblock import subblock_set

T, F = True, False


def _on(x):
    return torch.nonzero(x).flatten().tolist()


@pytest.mark.parametrize("masked,cands,first", [
    ([2, 3, 5, 6, 9], [2, 3], []),            # the first sub-block with a mask (of 4)
    ([5, 6, 9, 12], [5, 6], []),              # the next one, once the first is full
    ([8, 9, 10, 12, 15], [8, 9, 10], [8]),    # a block (of 8) starting masked: its first
    ([9, 10, 12, 15], [9, 10], []),
    ([15], [15], []),
    ([], [], []),
])
def test_subblock_candidates(masked, cands, first):
    m = torch.zeros(16, dtype=torch.bool)
    m[masked] = True
    W, f = subblock_set(m, 8, 4)
    assert (_on(W), _on(f)) == (cands, first)


def test_subblock_candidates_batched():
    m = torch.tensor([[F, T, T, F, T, T, T, T], [F, F, F, F, T, T, F, T]])
    W, f = subblock_set(m, 4, 2)
    assert W.tolist() == [[F, T, F, F, F, F, F, F], [F, F, F, F, T, T, F, F]]
    assert f.tolist() == [[F] * 8, [F, F, F, F, T, F, F, F]]


def steps_of(r):
    return [s["committed"] for s in r.steps]


def exact_conf(d):
    """The decoder's own float32 confidence for distribution spec ``d``."""
    lg = dist_logits(d)[None, None]
    return float(stats_from_logits(lg, torch.zeros(1, 1, dtype=torch.long), MASK)[1])


def test_first_token_alone_then_sub_blocks_left_to_right():
    # gen 8, one block, sub-blocks of 4: the block's first position alone (by argmax, whatever
    # its confidence), then {1, 2, 3} by the threshold rule although 5 and 6 are confident
    def table(g):
        f = filled(g)
        if not f:
            return {0: (10, .3), 1: (11, .95), 5: (15, .99), 6: (16, .99)}
        if f == {0}:
            return {1: (11, .95), 2: (12, .5), 3: (13, .92), 5: (15, .99), 6: (16, .99)}
        if f == {0, 1, 3}:
            return {2: (12, .4), 5: (15, .99), 6: (16, .99)}
        return {i: (10 + i, .99) for i in range(8)}
    r, m = run("subblock", table, gen_length=8, sub_block=4)
    assert steps_of(r) == [[[0, "base"]], [[1, "base"], [3, "base"]], [[2, "forced"]],
                           [[4, "base"], [5, "base"], [6, "base"], [7, "base"]]]
    assert r.tokens == [10, 11, 12, 13, 14, 15, 16, 17] and r.nfe == 4 == m.nfe


@pytest.mark.parametrize("rules,committed", [("paper", [[1, "base"]]),
                                             ("strict_threshold", [[1, "forced"]])])
def test_threshold_inclusive_or_strict(rules, committed):
    tau = exact_conf((11, .9))

    def table(g):
        if not filled(g):
            return {0: (10, .99)}
        return {1: (11, .9), 2: (12, .5), 3: (13, tau - 0.1)}
    r, _ = run("subblock", table, gen_length=4, sub_block=4, threshold=tau, rules=rules)
    assert steps_of(r)[1] == committed


def test_sub_block_must_divide_block_length():
    from pvf_lmeval.decoding import decode
    from helpers.decoding_tables import TableModel
    with pytest.raises(ValueError, match=r"^sub_block=3 must divide block_length=8$"):
        decode(TableModel(lambda g: {}), [1, 2], "subblock", gen_length=8, block_length=8,
               sub_block=3)


# ---------------------------------------------------------------- against Fast-dLLM v2's code

def _fast_dllm_check(model, prompts, cases, answer_length):
    """Decode each case's prompt with ``rules=reference``; (tokens equal up to the reference's
    first end-of-text, NFE equal) per case. ``answer_length(p)``: the gen_length that decodes
    the reference's blocks for a prompt of p tokens."""
    from pvf_lmeval.decoding import decode
    out = []
    for case in cases:
        p = prompts[case["case"]]
        r = decode(model, p, "subblock", gen_length=answer_length(len(p)), threshold=0.9,
                   sub_block=8, rules="reference")
        ref = case["tokens"]
        n = min(len(ref), len(r.tokens))
        eos = [k for k in range(n) if ref[k] in model.eos_ids]
        n = eos[0] + 1 if eos else n
        out.append((r.tokens[:n] == ref[:n], r.nfe == case["nfe"], r.nfe, case["nfe"]))
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_reference_tables(seed):
    from helpers.reference_tables import ReferenceTable, reference_cases, table_prompts
    # blocks of 16 (prompts of 5: two blocks are the reference's gen 32), sub-blocks of 8
    m = ReferenceTable(seed, block_size=16, shift=True)
    got = _fast_dllm_check(m, table_prompts(8), reference_cases(f"fastdllm-v2.table{seed}"),
                           lambda p: 16)
    assert got == [(True, True, n, n) for _, _, _, n in got]


def test_reference_tiny_dream(one_thread, tmp_path):
    from helpers.cache_models import arith_prompts
    from helpers.reference_tables import reference_cases, tiny_dream_as_fast_dllm
    from pvf_lmeval.models import load_model
    m = load_model(str(tiny_dream_as_fast_dllm(tmp_path / "fd")), device="cpu")
    # case 5's prompt is one block (32 tokens): the reference never shows it to the model (its
    # prefill needs a longer prompt, its block calls send only the masks), so it is left out.
    # The others end inside a block: the reference decodes that block and two more (gen 64)
    cases = [c for c in reference_cases("fastdllm-v2.tiny-dream") if c["case"] != 5]
    prompts, _ = arith_prompts(m.tokenizer, 10)
    got = _fast_dllm_check(m, prompts, cases, lambda p: 64)
    assert got == [(True, True, n, n) for _, _, _, n in got]


def test_reference_first_token_of_the_mask_id_leaves_the_block_to_the_sub_block_rule():
    """rules=reference: the block's first position's argmax is the mask id (p .6 under the
    softmax over all four ids), so its first token is not taken; the sub-block rule commits .95
    at 1 from the same stats."""
    from helpers.decoding_tables import LogitRows

    from pvf_lmeval.decoding import decode
    rows = [[0., 0., 0., 1.61], [3.9, 0., 0., 0.], [0.] * 4, [0.] * 4]
    r = decode(LogitRows(rows), [1], "subblock", gen_length=4, block_length=4, sub_block=2,
               rules="reference", trace=True, early_stop=False)
    assert r.steps[0]["committed"] == [[1, "base"]]
    assert r.tokens == [0, 0, 0, 0]
