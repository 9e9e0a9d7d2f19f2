"""``top_k`` / ``top_p`` sampling (transformers' filters, HFLM's ``gen_kwargs``) in every decoder:
the filter equals transformers' own warpers, a sample never leaves it, it changes nothing at
temperature 0 (and ``top_k=1`` samples the greedy decode), and filtered sampling stays seeded
per request and identical at every batch size."""

from __future__ import annotations

import pytest
import torch
from helpers.decoding_tables import RandomModel
from helpers.result_fields import assert_same_outcomes

from pvf_lmeval.decoding import decode, decode_batch, make_params
from pvf_lmeval.decoding.stats import sampling_scores, stats_from_logits

PROMPTS = [[40, 41, 42], [7], [9, 10, 11, 12, 13], [5, 6], [14, 15, 16, 17]]
INDICES = [100 + 7 * i for i in range(len(PROMPTS))]
DECODERS = {"threshold": {}, "static": dict(steps=8), "freedave": dict(draft_steps=2),
            "explore": dict(plan_vocab=range(4, 20), reveal_next=2),
            "pvf": dict(plan_vocab=range(4, 20), reveal_next=2)}
FILTERS = [dict(top_k=1), dict(top_k=5), dict(top_p=0.5), dict(top_p=0.9),
           dict(top_k=7, top_p=0.6), dict(top_p=1e-9)]


def _transformers_scores(lg: torch.Tensor, temperature: float, top_k=None, top_p=None):
    """transformers' own warpers, in ``generate``'s order: temperature, top-k, top-p."""
    from transformers.generation.logits_process import (TemperatureLogitsWarper,
                                                        TopKLogitsWarper, TopPLogitsWarper)

    flat = lg.reshape(-1, lg.shape[-1])
    out = TemperatureLogitsWarper(temperature)(None, flat.clone())
    if top_k is not None:
        out = TopKLogitsWarper(top_k)(None, out)
    if top_p is not None:
        out = TopPLogitsWarper(top_p)(None, out)
    return out.reshape(lg.shape)


@pytest.mark.parametrize("filters", FILTERS, ids=str)
@pytest.mark.parametrize("temperature", [0.5, 1.0, 1.7])
def test_the_filter_is_transformers_and_a_sample_never_leaves_it(filters, temperature):
    g = torch.Generator().manual_seed(3)
    lg = torch.randn(3, 4, 40, generator=g) * 3
    lg[..., 39] = float("-inf")                          # the mask's logit, as decoding sets it
    want = _transformers_scores(lg, temperature, **filters)
    got = sampling_scores(lg, temperature, **filters)
    assert torch.equal(torch.isinf(got), torch.isinf(want))
    assert torch.equal(got[~torch.isinf(got)], (lg / temperature)[~torch.isinf(got)])
    assert torch.equal(sampling_scores(lg, temperature, **filters, fixed=True).isinf(),
                       want.isinf())
    for seed in range(20):
        noise = -torch.log(-torch.log(torch.rand(3, 4, 40, generator=g)))
        tok, *_ = stats_from_logits(lg.clone(), torch.zeros(3, 4, dtype=torch.long), 39,
                                    temperature, noise, **filters)
        assert torch.equal(tok, (want + noise).argmax(-1))
        assert not torch.isinf(want.gather(-1, tok.unsqueeze(-1))).any()


def _runs(decoder: str, sizes=(1,), **kw) -> list[list]:
    kw = {"gen_length": 16, "block_length": 4, "seed": 5, **DECODERS[decoder], **kw}
    model = RandomModel(7, eos_bias=-2.5, jitter=0.5)
    runs = []
    for bs in sizes:
        got = []
        for a in range(0, len(PROMPTS), bs):
            got += decode_batch(model, PROMPTS[a:a + bs], decoder,
                                request_indices=INDICES[a:a + bs], **kw)
        runs.append(got)
    return runs


@pytest.mark.parametrize("decoder", list(DECODERS))
def test_filters_change_nothing_greedy_and_top_k_1_samples_the_greedy_decode(decoder):
    """At temperature 0 the argmax is in every filter; at temperature 0.8 with ``top_k=1`` (or
    a nucleus of one token) the only token left is the argmax: the greedy decode, every
    field of every request."""
    (greedy,) = _runs(decoder, temperature=0.0)
    for kw in (dict(temperature=0.0, top_k=3, top_p=0.5), dict(temperature=0.8, top_k=1),
               dict(temperature=0.8, top_p=1e-9)):
        (got,) = _runs(decoder, **kw)
        assert_same_outcomes(got, greedy, (decoder, kw))
    (sampled,) = _runs(decoder, temperature=0.8)
    assert [r.tokens for r in sampled] != [r.tokens for r in greedy]


@pytest.mark.parametrize("decoder", list(DECODERS))
def test_filtered_sampling_is_seeded_and_batch_invariant(decoder):
    """Each request draws its Gumbel noise from its own generator (seed, request index), the
    filter is per row: batch sizes 1, 2 and 5 give the same results; the seed changes them;
    the filter changes them against plain sampling."""
    kw = dict(temperature=1.0, top_k=4, top_p=0.8)
    alone, *batched = _runs(decoder, sizes=(1, 2, 5), **kw)
    for bs, got in zip((2, 5), batched):
        assert_same_outcomes(got, alone, (decoder, bs))
    (other_seed,) = _runs(decoder, **{**kw, "seed": 6})
    (plain,) = _runs(decoder, temperature=1.0)
    assert [r.tokens for r in other_seed] != [r.tokens for r in alone]
    assert [r.tokens for r in plain] != [r.tokens for r in alone]


def test_top_k_and_top_p_values():
    """transformers' switches: ``top_k=0`` and ``top_p=1`` mean no filter."""
    p = make_params("threshold", top_k=0, top_p=1.0)
    assert p.top_k is None and p.top_p is None
    assert make_params("threshold", top_k="40", top_p="0.95").top_k == 40
    for kw, msg in ((dict(top_k=-1), "top_k=-1 must be a positive integer"),
                    (dict(top_p=0.0), r"top_p=0.0 must be in \(0, 1\]"),
                    (dict(top_p=1.5), r"top_p=1.5 must be in \(0, 1\]"),
                    (dict(top_k=2.5), "top_k=2.5 must be an integer")):
        with pytest.raises(ValueError, match=msg):
            make_params("threshold", **kw)
    out = decode(RandomModel(7), [1, 2], "threshold", gen_length=8, block_length=4,
                 temperature=0.9, top_p=0.9, top_k=3)
    assert len(out.tokens) == 8
