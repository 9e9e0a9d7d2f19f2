"""``cache=prefix`` with ``decoder=renoise`` on DiffusionGemma's tiny folder (``ContextKV``):
a canvas's first call keeps the encoder's keys and values of the context, every further call
on that canvas computes the canvas only. Exact: the logits of a cached call equal the full
call's (float tolerance; bit for bit under the batch-invariant kernels), and a seeded decode
gives the uncached decode's tokens and calls, alone and in a left-padded batch of four. The
folder's layers are the released pattern (5 sliding-window, 1 global) with a window of 6, and
the contexts are longer than that: a sliding-window layer keeps the last 5 context columns
(what a canvas query sees), the global one every column."""

from __future__ import annotations

import pytest
import torch
from helpers.gemma_folders import make_gemma_folder
from helpers.prerequisites import family_tier

from pvf_lmeval.decoding.api import decode, decode_batch
from pvf_lmeval.decoding.cache import ContextKV
from pvf_lmeval.models import load_model
from pvf_lmeval.models.footprint import footprint

C = 8                       # the tiny folder's canvas
WINDOW = 6                  # its sliding window: a canvas query sees 5 context positions
PROMPTS = [[2, 5, 9, 17, 33], [2, 40, 41], [2] + list(range(60, 70)), [2, 7]]
EARLY = {"stability_threshold": 0, "confidence_threshold": 5.0}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_gemma_folder(tmp_path_factory.mktemp("dgcache") / "dg", seed=1, canvas_length=C,
                             sliding_window=WINDOW)


@pytest.fixture(scope="module")
def native(folder):
    model = load_model(str(folder), device="cpu", dtype="float32")
    assert model.sliding_windows == (WINDOW,) * 5 + (None,)
    return model


class CallSpy:
    """The native model, recording per call whether it was cached and whether it carried
    self-conditioning (which it does exactly on the calls after a canvas's first)."""

    def __init__(self, model):
        self.model, self.calls, self.stores = model, [], []
        for name in ("canvas_length", "vocab_size", "eos_ids", "pad_id", "dtype", "name",
                     "family", "device", "block_size", "batch_invariant", "sliding_windows"):
            setattr(self, name, getattr(model, name))

    def logits(self, tokens, positions, *, cache=None, self_conditioning=None, **kw):
        self.calls.append((cache is not None and cache.spans is not None,
                           self_conditioning is not None))
        if cache is not None and cache.store not in self.stores:
            self.stores.append(cache.store)
        return self.model.logits(tokens, positions, cache=cache,
                                 self_conditioning=self_conditioning, **kw)

    def widths(self) -> list[list[int]]:
        """Per store the decode made, the context columns each layer's keys and values hold."""
        return [[t.shape[2] for kv in store.kv for t in kv] for store in self.stores]

    def stored_bytes(self) -> int:
        """The bytes of the keys and values the decode's stores hold."""
        return sum(t.numel() * t.element_size() for store in self.stores for kv in store.kv
                   for t in kv)

    def cached_exactly_after_a_canvas_start(self) -> bool:
        cached = [c for c, _ in self.calls]
        return any(cached) and all(c == s for c, s in self.calls)


def _rows(n, width, seed):
    """[n, width] tokens and a left-padded attention mask (row r: r padding columns)."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(2, 400, (n, width), generator=g)
    mask = (torch.arange(width)[None] >= torch.arange(n)[:, None]).long()
    return torch.where(mask.bool(), tokens, 0), mask


@pytest.mark.parametrize("padded", [False, True], ids=["nopad", "leftpad"])
def test_a_cached_call_gives_the_full_calls_logits(native, padded):
    """Two canvas calls on the same context (the second with self-conditioning, as a
    continuing step sends it): the cached call's logits equal the uncached call's, and the
    full call that filled the cache returns the uncached logits too, within 1e-4 of the row's
    largest |logit| (the float32 tolerance of this network: the calls' attention sums over
    other key layouts). The context (13 columns, padded rows shorter) is longer than the
    sliding window (6), so the sliding layers read 5 of them."""
    n, width = 3, 13 + C
    tokens, mask = _rows(n, width, 0)
    att = mask if padded else None
    positions = torch.arange(width - C, width)
    sc = torch.randn(n, C, native.vocab_size, generator=torch.Generator().manual_seed(1))
    store = ContextKV(n=n, width=width, canvas=C, windows=native.sliding_windows,
                      device="cpu")
    full = native.logits(tokens, positions, attention_mask=att)
    kept = native.logits(tokens, positions, attention_mask=att,
                         cache=store.call([0, 1, 2], full=True, attention=att, columns=width))
    assert torch.equal(kept, full)
    canvas2 = torch.cat([tokens[:, :-C], tokens[:, -C:].flip(-1)], 1)
    want = native.logits(canvas2, positions, attention_mask=att, self_conditioning=sc)
    got = native.logits(canvas2, positions, attention_mask=att, self_conditioning=sc,
                        cache=store.call([0, 1, 2], full=False, attention=att, columns=width))
    scale = want.abs().amax(-1, keepdim=True)
    assert ((got - want).abs() <= 1e-4 * scale).all()
    # one request's row of the store, read alone
    one = native.logits(canvas2[1:2], positions, attention_mask=None if att is None else att[1:2],
                        self_conditioning=sc[1:2],
                        cache=store.call([1], full=False, attention=None, columns=width))
    assert ((one - want[1:2]).abs() <= 1e-4 * scale[1:2]).all()


@pytest.mark.parametrize("kept", ["windowed", "every column"])
@pytest.mark.parametrize("context", [13, 150])
def test_a_cached_call_is_bit_exact_under_the_invariant_kernels(native, context, kept):
    """Contexts longer than the window, one past two tiles of the CPU kernels' 64 keys; the
    cache as the decoder keeps it, or every context column on every layer (the cached call
    then hides the older ones itself)."""
    n, width = 2, context + C
    tokens, mask = _rows(n, width, 2)
    positions = torch.arange(width - C, width)
    windows = native.sliding_windows if kept == "windowed" else (None,) * 6
    store = ContextKV(n=n, width=width, canvas=C, windows=windows, device="cpu")
    with native.batch_invariant():
        native.logits(tokens, positions, attention_mask=mask,
                      cache=store.call([0, 1], full=True, attention=mask, columns=width))
        canvas2 = torch.cat([tokens[:, :-C], tokens[:, -C:].flip(-1)], 1)
        want = native.logits(canvas2, positions, attention_mask=mask)
        got = native.logits(canvas2, positions, attention_mask=mask,
                            cache=store.call([0, 1], full=False, attention=mask, columns=width))
    assert torch.equal(got, want)


@pytest.mark.parametrize("context", [13, 3], ids=["longer", "shorter"])
def test_a_sliding_layer_keeps_the_context_keys_a_canvas_query_sees(native, context):
    """A full call over a context of 13 columns (longer than the window) or of 3 (shorter)
    and the canvas: each sliding-window layer keeps the keys and values of the last
    min(context, WINDOW - 1) context columns, the global layer those of every context column,
    as the network computes them (``hidden``'s keys of the same rows)."""
    n, width = 2, context + C
    tokens, mask = _rows(n, width, 3)
    store = ContextKV(n=n, width=context, canvas=C, windows=native.sliding_windows,
                      device="cpu")
    native.logits(tokens, torch.arange(context, width), attention_mask=mask,
                  cache=store.call([0, 1], full=True, attention=mask, columns=width))
    kv_out = []
    native.net.hidden(tokens, mask, kv_out=kv_out)
    widths = [context if w is None else min(context, WINDOW - 1) for w in native.sliding_windows]
    assert [k.shape[2] for k, _ in store.kv] == widths
    for (k, v), (ks, vs), w in zip(kv_out, store.kv, widths):
        assert torch.equal(ks, k[:, :, context - w:context])
        assert torch.equal(vs, v[:, :, context - w:context])


@pytest.mark.parametrize("seed,steps", [(0, 12)] + [
    pytest.param(s, 48, marks=family_tier) for s in (0, 1, 2)])
def test_a_seeded_reference_decode_is_the_uncached_one(folder, native, seed, steps):
    """Batch 1, rules=reference, three canvases of at most ``steps`` denoising steps (48: the
    released schedule, in the family tier; 12 in the default run, a quarter of its calls):
    the same tokens and calls, of which every canvas's first is full and the rest cached. The
    cache holds what
    ``pvf-dlm memory`` counts: keys and values, float32, of the 5 sliding-window layers (2
    heads of 16) at 5 columns and of the global one (1 head of 32) at the context of the last
    canvas, 5 + 2 * 8 = 21."""
    kw = dict(rules="reference", seed=seed, gen_length=3 * C, batch_invariant=True,
              max_denoising_steps=steps)
    plain = decode(native, PROMPTS[0], "renoise", **kw)
    assert plain.nfe > 3        # cached calls were made
    spy = CallSpy(native)
    cached = decode(spy, PROMPTS[0], "renoise", cache="prefix", **kw)
    assert (cached.tokens, cached.nfe) == (plain.tokens, plain.nfe)
    assert spy.cached_exactly_after_a_canvas_start()
    assert cached.cache_exact
    # the longest context: the prompt (5) and two canvases; the sliding layers keep 5 of it
    assert spy.widths() == [[WINDOW - 1] * 10 + [5 + 2 * C] * 2]
    counted = footprint(folder, dtype=torch.float32, prompt_length=5, gen_length=3 * C)
    assert spy.stored_bytes() == counted.kv_cache == 2 * (5 * 2 * 16 * 5 + 1 * 32 * 21) * 4


@family_tier      # about a minute on 2 cores; the call-level left-padded check stays in the default run
def test_a_left_padded_batch_of_four_is_the_uncached_batch(native):
    """rules=reference, a batch of four left-padded prompts of other lengths whose canvases end
    at different steps, so that a call holds requests on different canvases (full and cached
    calls in one round)."""
    kw = dict(rules="reference", seed=11, gen_length=3 * C, batch_invariant=True, **EARLY)
    plain = decode_batch(native, PROMPTS, "renoise", **kw)
    spy = CallSpy(native)
    cached = decode_batch(spy, PROMPTS, "renoise", cache="prefix", **kw)
    assert spy.cached_exactly_after_a_canvas_start()
    assert spy.widths() == [[WINDOW - 1] * 10 + [11 + 2 * C] * 2]
    nfe = []
    for p, c in zip(plain, cached):
        assert (c.tokens, c.nfe, c.routes) == (p.tokens, p.nfe, p.routes)
        nfe.append(p.nfe)
    assert len(set(nfe)) > 1                        # the canvases end at different steps
