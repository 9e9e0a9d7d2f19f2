"""``cfg_scale``, LLaDA's classifier-free guidance (``generate.py``, ``get_log_likelihood.py``):
``un + (cfg_scale + 1) (cond - un)``, un the logits of the canvas with its prompt masked, in
generation and in the likelihood; and ``mc_stratum``, LLaDA's stratified mask counts. Exact
expectations from hand-made models whose guided logits are known in closed form."""

from __future__ import annotations

import math

import pytest
import torch

from pvf_lmeval.decoding import decode_batch, make_params
from pvf_lmeval.decoding.likelihood import Estimator, loglikelihood, stratified_draws

V, MASK = 16, 15


class GuidedModel:
    """Every position predicts from whether the row's first token is masked (the prompt masked:
    unconditional). cond: token 1 at 2.0, token 2 at 1.9; un: token 1 at 2.0, token 2 at 0.
    Unguided greedy writes 1s; at cfg_scale 1 the logits of token 2 are 0 + 2 * 1.9 = 3.8
    against token 1's 2.0, so guided greedy writes 2s."""

    mask_id = MASK
    eos_ids = (0,)

    def __init__(self):
        self.rows: list[torch.Tensor] = []

    def logits(self, tokens, positions, *, attention_mask=None, cache=None):
        self.rows.append(tokens.clone())
        n, p = tokens.shape[0], positions.shape[-1]
        out = torch.zeros(n, p, V)
        out[..., 1] = 2.0
        cond = tokens[:, 0] != MASK
        out[cond, :, 2] = 1.9
        out[..., MASK] = -1e9
        return out


def test_generation_follows_the_guided_logits_and_counts_twice_the_rows():
    prompt = [5, 6, 7]
    plain = decode_batch(GuidedModel(), [prompt], "static", gen_length=4, block_length=4,
                         steps=4, early_stop=False)[0]
    m = GuidedModel()
    guided = decode_batch(m, [prompt], "static", gen_length=4, block_length=4, steps=4,
                          early_stop=False, cfg_scale=1.0)[0]
    assert plain.tokens == [1, 1, 1, 1] and guided.tokens == [2, 2, 2, 2]
    # each call: the canvas, then the same canvas with its 3 prompt tokens masked
    assert all(len(r) == 2 and r[1, :3].tolist() == [MASK] * 3 and torch.equal(r[0, 3:], r[1, 3:])
               and r[0, :3].tolist() == prompt for r in m.rows)
    assert (guided.nfe, guided.stats()["branch_rows"]) == (4, 8)
    assert (plain.nfe, plain.stats()["branch_rows"]) == (4, 4)


def test_guidance_with_a_kv_cache_is_one_line():
    with pytest.raises(ValueError, match=r"^cfg_scale=0.5 needs cache=none \(the canvas with "
                       r"its prompt masked has no KV cache of its own\); drop cache=dual or "
                       r"cfg_scale$"):
        make_params("threshold", cfg_scale=0.5, cache="dual")
    with pytest.raises(ValueError, match=r"^cfg_scale=-1.0 must be >= 0$"):
        make_params("threshold", cfg_scale=-1)


def test_likelihood_reads_the_guided_softmax():
    """Every draw of a constant target is exact: T log softmax(guided)[token]."""
    cond = torch.zeros(V)
    cond[1], cond[2] = 2.0, 1.9
    un = torch.zeros(V)
    un[1] = 2.0
    for scale in (0.0, 0.5, 2.0):
        logits = un + (scale + 1) * (cond - un)
        logits[MASK] = float("-inf")
        want = 3 * float(torch.log_softmax(logits, -1)[2])
        got = loglikelihood(GuidedModel(), [5, 6], [2, 2, 2],
                            estimator=Estimator(mc_num=4, cfg_scale=scale))
        assert got.logprob == pytest.approx(want, abs=1e-5)
        assert got.rows == got.canvases * (2 if scale else 1)


def test_mc_stratum_stratifies_each_group_as_llada():
    """LLaDA's forward_process per group of b draws: over T = b tokens each group's counts are
    1..T once each; every draw masks exactly its count."""
    masked, counts = stratified_draws(8, 32, 8, torch.Generator().manual_seed(3))
    assert torch.equal(masked.sum(-1), counts)
    for g in range(4):
        assert sorted(counts[8 * g:8 * g + 8].tolist()) == list(range(1, 9))
    with pytest.raises(ValueError, match=r"^mc_stratum=3 must divide mc_num=8 \(draws are "
                                         r"stratified in groups of mc_stratum\)$"):
        Estimator(mc_num=8, mc_stratum=3)
    assert math.isfinite(loglikelihood(GuidedModel(), [5], [1, 2],
                                       estimator=Estimator(mc_num=8, mc_stratum=4)).logprob)
