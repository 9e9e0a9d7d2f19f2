"""Batched decoding (``batch_size > 1``): identical results (every field but wall time, trace
records included) for batch sizes 1, 3 and 8, for every decoder and cache mode, greedy and
sampled; with ``batch_invariant=true`` the trace records' float values too, on both bundled
fixtures; padding really masked."""

from __future__ import annotations

import pytest
from helpers.cache_models import arith_prompts, dream_like, random_prompts
from helpers.result_fields import assert_same_outcomes, outcome, trace_floats

from pvf_lmeval.decoding import decode, decode_batch
from pvf_lmeval.decoding.batch import pad_id_of
from pvf_lmeval.models import load_model
from pvf_lmeval.planning.online import OnlineVocab

DECODERS = ("static", "threshold", "eb", "freedave", "pvf", "explore")
CACHES = ("none", "prefix", "dual")


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def llada_prompts(llada):
    prompts, _ = arith_prompts(llada.tokenizer, 8)
    # different lengths, so that batches are left-padded
    return [p[:len(p) - (i % 4)] for i, p in enumerate(prompts)]


def _kw(dec: str, cache: str, temperature: float, vocab, gen_length: int = 24) -> dict:
    kw = dict(gen_length=gen_length, block_length=8, cache=cache, temperature=temperature, seed=3)
    if dec in ("pvf", "explore"):
        kw.update(preset="arith", reveal_next=3, plan_vocab=vocab)
    if dec == "static":
        kw.update(steps=gen_length // 2)
    return kw


def _check_batch_sizes(model, prompts, dec, kw, online=None, floats=False):
    idx = [100 + 7 * i for i in range(len(prompts))]
    single = [decode(model, p, dec, request_index=i, online=online, trace=True, **kw)
              for p, i in zip(prompts, idx)]
    for bs in (3, 8):
        got = []
        for a in range(0, len(prompts), bs):
            got += decode_batch(model, prompts[a:a + bs], dec, request_indices=idx[a:a + bs],
                                online=online, trace=True, **kw)
        assert_same_outcomes(got, single, (dec, kw, bs), floats=floats)
    return single


@pytest.mark.parametrize("cache", CACHES)
@pytest.mark.parametrize("dec", DECODERS)
def test_batch_sizes_identical_llada(llada, llada_prompts, dec, cache):
    vocab = list(range(0, 600, 3))
    for temperature in (0.0, 0.8):
        out = _check_batch_sizes(llada, llada_prompts, dec,
                                 _kw(dec, cache, temperature, vocab, gen_length=16))
        assert len({str(o.tokens) for o in out}) > 1        # the requests really differ


@pytest.mark.parametrize("cache", CACHES)
def test_batch_sizes_identical_dream_shape(cache):
    """Shifted logits, GQA, a head wider than the tokenizer, random prompts."""
    m = dream_like()
    prompts = random_prompts(8, 47, seed=1)
    for dec, temperature in (("pvf", 0.0), ("freedave", 0.0), ("threshold", 0.8)):
        _check_batch_sizes(m, prompts, dec, _kw(dec, cache, temperature, list(range(4, 40))))


@pytest.mark.parametrize("fixture, cache", (("tiny-llada", "dual"), ("tiny-dream", "dual"),
                                            ("tiny-dream", "none")))
def test_batch_invariant_every_field_and_float_identical(fixture, cache):
    """``batch_invariant=true`` on the CPU: every field of every result, the trace records'
    floats included, bit for bit at batch sizes 1, 3 and 8; cached calls (key sets per query)
    and full calls (tiny-llada's full calls: tests/test_batch_trace_floats.py)."""
    model = load_model(fixture)
    prompts, _ = arith_prompts(model.tokenizer, 8)
    prompts = [p[:len(p) - (i % 4)] for i, p in enumerate(prompts)]
    kw = dict(_kw("pvf", cache, 0.0, list(range(0, 600, 3)), gen_length=16), batch_invariant=True)
    out = _check_batch_sizes(model, prompts, "pvf", kw, floats=True)
    assert sum(len(trace_floats(r)) for r in out) > 0      # the traces carry floats to compare


@pytest.mark.parametrize("cache", CACHES)
def test_batch_sizes_identical_online_frozen(llada, llada_prompts, cache):
    online = OnlineVocab(llada.vocab_size, frozen=True)
    online.seed([{"id": i, "n": 100, "m": 100, "r": 1.0, "vig": 0.5} for i in range(0, 600, 2)])
    assert online.eligible_ids()
    _check_batch_sizes(llada, llada_prompts, "pvf", _kw("pvf", cache, 0.0, None), online=online)


def test_padding_is_masked_and_distinct_from_mask(llada, llada_prompts):
    assert pad_id_of(llada) != llada.mask_id
    short, long_ = [5, 6, 7], llada_prompts[0]
    kw = dict(gen_length=16, block_length=8)
    a = decode_batch(llada, [short, long_], "threshold", request_indices=[0, 1], **kw)[0]
    llada_pad = llada.pad_id
    try:
        llada.pad_id = 11                                     # another pad id: same result
        b = decode_batch(llada, [short, long_], "threshold", request_indices=[0, 1], **kw)[0]
    finally:
        llada.pad_id = llada_pad
    c = decode(llada, short, "threshold", request_index=0, **kw)
    assert outcome(a) == outcome(b) == outcome(c)


def test_batch_stats_and_errors(llada, llada_prompts):
    rs = decode_batch(llada, llada_prompts[:3], "threshold", gen_length=16, block_length=8)
    assert [r.gen_length for r in rs] == [16] * 3
    assert len({r.wall_s for r in rs}) == 1 and rs[0].wall_s > 0   # an equal share each
    assert decode_batch(llada, [], "threshold") == []

    class Boom:
        def __init__(self, m):
            self.m, self.n = m, 0

        def __getattr__(self, k):
            return getattr(self.m, k)

        def logits(self, *a, **k):
            self.n += 1
            if self.n == 3:
                raise RuntimeError("boom")
            return self.m.logits(*a, **k)

    with pytest.raises(RuntimeError, match="boom"):
        decode_batch(Boom(llada), llada_prompts[:3], "threshold", gen_length=16, block_length=8)


def test_lm_batch_size_and_cache_args():
    """``--model_args batch_size=3,cache=dual``: same texts and per-request NFE as batch_size=1;
    requests whose decoding parameters differ go to different batches."""
    from lm_eval.api.instance import Instance

    from pvf_lmeval.lmeval.lm import PVFDiffusionLM

    kw = {"until": ["Question:"], "do_sample": False}
    reqs = [Instance(request_type="generate_until", doc={}, idx=0, doc_id=i, task_name="arith",
                     arguments=(f"Question: Tom has {i + 3} books. He gets {i % 4 + 1} books. "
                                "How many books does Tom have now?\nAnswer:",
                                dict(kw, threshold=0.8) if i == 2 else dict(kw)))
            for i in range(5)]
    out = {}
    for bs in (1, 3):
        lm = PVFDiffusionLM(pretrained="tiny-llada", device="cpu", decoder="pvf", preset="arith",
                            batch_size=bs, cache="dual", gen_length=32, block_length=16)
        assert lm.params.cache == "dual" and lm.get_model_info()["pvf"]["params"]["cache"] == "dual"
        res = lm.generate_until(reqs, disable_tqdm=True)
        out[bs] = [(str(r), r.meta["nfe"], r.meta["branch_rows"]) for r in res]
    assert out[1] == out[3]
    with pytest.raises(ValueError, match="cache='full' must be one of none, prefix, dual"):
        PVFDiffusionLM(pretrained="tiny-llada", device="cpu", cache="full")
