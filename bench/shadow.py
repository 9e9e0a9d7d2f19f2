"""The real decode loop at a real model's cost: a fixture decides, a model of a real shape pays.

``ShadowModel`` is what the loop sees as its model. Each ``logits`` call runs

1. the bundled fixture on the call (its logits decide: the schedule of calls, rows, positions
   and caches is the one the loop really produces), and
2. a randomly initialised model of a real shape (the *shadow*) on the same rows, positions,
   attention mask and cache mode, with its own KV cache in the same state: a twin
   ``BatchKV`` of the batch's cache that receives the same calls and the same commits, so every
   full call, refresh, cached span and commit of the loop happens on the shadow's keys and
   values too.

The logits returned are the shadow's tensor, [N, P, V_shadow] float32, with the fixture's logits
written into its first V_fixture ids and -inf beyond: the loop's statistics pass (maximum,
normaliser, Gumbel noise, entropies) runs over the shadow's vocabulary, so its cost is the real
model's, while its outcome is the fixture's (the extra ids add exact zeros to the normaliser;
only the order of the float32 summation can differ from the fixture's own run).

Clocks (``CLOCK``, device synchronised around each part): ``fixture_s`` (the fixture's calls,
an artefact of the method, subtracted from the wall), ``inside_s`` (the shadow's calls and the
copy of the fixture's logits into their tensor: what a real model's call costs).
"""

from __future__ import annotations

import time

from benchlib import BatchKV, KVCall

from benchlib import sync

CLOCK = time.perf_counter


class ShadowModel:
    """The loop's model: ``fixture`` decides, ``shadow`` (same device, vocabulary at least the
    fixture's) is called with every call's inputs. Attributes other than ``logits`` (mask and
    end-of-text ids, pad id, tokenizer, device) are the fixture's."""

    def __init__(self, fixture, shadow):
        if shadow.vocab_size < fixture.vocab_size:
            raise ValueError(f"shadow vocabulary ({shadow.vocab_size}) must hold the fixture's "
                             f"({fixture.vocab_size})")
        self.fixture, self.shadow = fixture, shadow
        self.V = fixture.vocab_size
        self.fixture_s = 0.0
        self.inside_s = 0.0
        self.calls = 0
        self._store: BatchKV | None = None     # the batch's cache the twin follows
        self._twin: BatchKV | None = None

    def __getattr__(self, name):
        return getattr(self.fixture, name)

    def logits(self, tokens, positions, *, attention_mask=None, cache=None):
        dev = self.fixture.device
        twin_call = self._twin_call(cache)
        sync(dev)
        t0 = CLOCK()
        decide = self.fixture.logits(tokens, positions, attention_mask=attention_mask,
                                     cache=cache)
        sync(dev)
        t1 = CLOCK()
        out = self.shadow.logits(tokens, positions, attention_mask=attention_mask,
                                 cache=twin_call)
        out[..., :self.V] = decide
        out[..., self.V:] = float("-inf")
        sync(dev)
        self.fixture_s += t1 - t0
        self.inside_s += CLOCK() - t1
        self.calls += 1
        return out

    # ------------------------------------------------------------ the shadow's cache

    def _twin_call(self, cache):
        """The shadow's view of this call's ``cache``: the same call on the twin store."""
        if cache is None:
            return None
        if not isinstance(cache, KVCall):
            raise TypeError(f"ShadowModel follows the decode loop's caches (KVCall), not "
                            f"{type(cache).__name__}")
        store = cache.store
        if store is not self._store:
            self._follow(store)
        if store.kv is None:            # the loop dropped the caches before an all-full round
            self._twin.kv = None
        spans = None if cache.spans is None else [(s0 - store.P0, s1 - store.P0)
                                                  for s0, s1 in cache.spans]
        return self._twin.call(cache.req, cache.rows, spans, gen=cache.gen, row_r=cache.row_r,
                               refresh=cache.refresh)

    def _follow(self, store: BatchKV) -> None:
        """A new batch: a twin of its cache, which commits whenever the batch's cache does."""
        self._twin = None               # the last batch's keys/values go first
        twin = BatchKV("dual_base" if store.base_refresh else store.mode, n=store.n,
                       prompt_len=store.P0, gen_length=store.L, block_length=store.B,
                       mask_id=store.mask_id, reveal_next=store.reveal,
                       device=store.ref.device)
        commit = store.commit

        def both(y):
            commit(y)
            twin.commit(y)
        store.commit = both
        self._store, self._twin = store, twin
