"""One request's cache state (``bench/benchlib.py``'s ``KVCache``, the model-level API of the
call-cost benchmarks): which calls are full, the span a cached call recomputes, which row a full call's
commit keeps, and the call counts, on hand-built canvases (no model: the keys and values a full
call hands over are stand-ins whose values name their row).

Canvas: prompt P0 = 2, generation L = 8 in blocks of B = 4, mask id M = 9.
"""

from __future__ import annotations

import pytest
import torch
from benchlib import KVCache

P0, L, B, M = 2, 8, 4, 9


def cache(mode="dual", reveal_next=0):
    return KVCache(mode, prompt_len=P0, gen_length=L, block_length=B, mask_id=M,
                   reveal_next=reveal_next, device="cpu")


def canvas(*filled: int) -> torch.Tensor:
    """Generation region with positions ``filled`` holding 10 + position, the rest masked."""
    g = torch.full((L,), M)
    for p in filled:
        g[p] = 10 + p
    return g


def flags(c, rows: torch.Tensor) -> list[int]:
    """The read-back flags for ``rows`` [N, L] (active block: first mask // B)."""
    a = torch.tensor([int((r == M).nonzero()[0]) // B if (r == M).any() else L // B
                      for r in rows])
    out = c.flags(rows, a)
    assert all(f.dtype == torch.long and f.dim() == 0 for f in out)
    return [int(f) for f in out]


def full_call(c, rows: torch.Tensor, committed: torch.Tensor, layers: int = 2) -> None:
    """A full call over ``rows`` (its keys/values: row n holds n + 100 * layer) and its commit."""
    assert c.plan(flags(c, rows), rows, 0, L) == (0, L) and c.span is None and c.kv is None
    N = rows.shape[0]
    val = torch.arange(N, dtype=torch.float32).view(N, 1, 1, 1)
    c.pending = [(val + 100 * i, -(val + 100 * i)) for i in range(layers)]
    c.commit(committed)


def kept_row(c) -> list[float]:
    return [float(k[0, 0, 0, 0]) - 100 * i for i, (k, _) in enumerate(c.kv)]


def test_modes_other_than_prefix_and_dual_are_an_error():
    for mode in ("none", "dual_base", "full"):
        with pytest.raises(ValueError) as ei:
            cache(mode)
        assert str(ei.value) == f"cache={mode!r} must be one of prefix, dual"


def test_first_call_is_full_and_the_commit_keeps_the_committed_row():
    c = cache()
    assert c.ref is None and c.kv is None and c.pending is None and c.span is None
    assert (c.full_calls, c.cached_calls) == (0, 0)
    rows = torch.stack([canvas(0), canvas(1), canvas(0, 1)])
    assert flags(c, rows) == [1, 0, 0]
    full_call(c, rows, canvas(1))
    assert (c.full_calls, c.cached_calls) == (1, 0)
    assert c.pending is None and kept_row(c) == [1.0, 1.0]
    assert [float(v[0, 0, 0, 0]) for _, v in c.kv] == [-1.0, -101.0]
    assert c.kv[0][0].shape == (1, 1, 1, 1)                  # one row per request
    assert c.ref.tolist() == canvas(1).tolist()


def test_the_cached_canvas_is_a_copy():
    c = cache()
    y = canvas(0)
    full_call(c, y[None], y)
    y[3] = 13
    assert c.ref.tolist() == canvas(0).tolist()


def test_a_commit_without_a_full_call_changes_nothing():
    c = cache()
    full_call(c, canvas(0)[None], canvas(0))
    kv = c.kv
    c.commit(canvas(0, 1))
    assert c.kv is kv and c.ref.tolist() == canvas(0).tolist()


@pytest.mark.parametrize("mode, span, covered", [("dual", (P0, P0 + 4), 4),
                                                  ("prefix", (P0, P0 + 8), 8)])
def test_cached_call_in_the_cached_block(mode, span, covered):
    c = cache(mode)
    full_call(c, canvas(0)[None], canvas(0))
    rows = torch.stack([canvas(0, 1), canvas(0, 2)])
    assert flags(c, rows) == [0, 0, 0]
    # logits asked for generation positions [1, 8): a dual call covers its recomputed block only
    assert c.plan([0, 0, 0], rows, 1, 8) == (1, covered)
    assert c.span == span and c.kv is not None
    assert c.plan([0, 0, 0], rows, 1, 8) == (1, covered)
    assert (c.full_calls, c.cached_calls) == (1, 2)


@pytest.mark.parametrize("mode, span", [("dual", (P0 + 4, P0 + 8)), ("prefix", (P0 + 4, P0 + 8))])
def test_a_row_entering_a_new_block_makes_the_call_full(mode, span):
    c = cache(mode)
    full_call(c, canvas(0, 1, 2)[None], canvas(0, 1, 2))
    done = canvas(0, 1, 2, 3)
    assert flags(c, done[None]) == [1, 0, 0]                  # block 1 is not cached
    full_call(c, done[None], done)
    assert flags(c, canvas(0, 1, 2, 3, 5)[None]) == [0, 1, 0]
    assert c.plan([0, 1, 0], done[None], 4, 8) == (4, 8) and c.span == span
    assert (c.full_calls, c.cached_calls) == (2, 1)


def test_an_unmatched_commit_forces_the_next_call_full():
    c = cache()
    rows = torch.stack([canvas(0), canvas(1)])
    full_call(c, rows, canvas(2))                       # no row of the call is the commit
    assert kept_row(c) == [1.0, 1.0]                    # (the last row is kept, unused)
    assert flags(c, canvas(2, 3)[None]) == [1, 0, 0]
    full_call(c, rows, canvas(0))
    assert kept_row(c) == [0.0, 0.0] and flags(c, canvas(0, 3)[None]) == [0, 0, 0]


def test_reveal_next_widens_the_cached_blocks():
    c = cache("dual", reveal_next=2)
    # 2 masks left in block 0 (<= reveal_next): the working set holds block 1 too
    y = canvas(0, 1)
    full_call(c, y[None], y)
    assert flags(c, canvas(0, 1, 2)[None]) == [0, 0, 1]
    assert c.plan([0, 0, 1], y[None], 0, 8) == (0, 8) and c.span == (P0, P0 + 8)
    # cached with 3 masks in block 0: a row with 2 left reveals block 1, outside the cache
    c = cache("dual", reveal_next=2)
    y = canvas(0)
    full_call(c, y[None], y)
    assert flags(c, torch.stack([canvas(0), canvas(0)])) == [0, 0, 0]
    assert flags(c, torch.stack([canvas(0), canvas(0, 2)])) == [1, 0, 0]
    # the last block has no next block to reveal
    c = cache("dual", reveal_next=2)
    y = canvas(0, 1, 2, 3, 4, 5)
    full_call(c, y[None], y)
    assert flags(c, canvas(0, 1, 2, 3, 4, 5, 6)[None]) == [0, 1, 0]


def test_batch_store_keeps_each_requests_committed_row():
    """``BatchKV``, the decode loop's layout: one full call over two of three requests (rows
    0-1 request 0's, row 2 request 2's), its commit, then calls of one request each."""
    from pvf_lmeval.decoding.cache import BatchKV
    store = BatchKV("dual", n=3, prompt_len=P0, gen_length=L, block_length=B, mask_id=M,
                    reveal_next=0, device="cpu")
    gen = torch.stack([canvas(0), canvas(1), canvas(2)])
    call = store.call([0, 2], [2, 1], None, gen=gen, row_r=torch.tensor([0, 0, 1]))
    assert (store.full_calls, store.cached_calls) == (2, 0) and call.spans is None
    val = torch.arange(3, dtype=torch.float32).view(3, 1, 1, 1)
    call.keep([(val, -val)])
    # request 0 committed a state none of its rows had (its last row is kept, unused);
    # request 2 committed its row
    store.commit(torch.stack([canvas(5), canvas(2)]))
    k, v = store.kv[0]
    assert (k[0].item(), v[0].item(), k[2].item(), v[2].item()) == (1.0, -1.0, 2.0, -2.0)
    assert store.ok.tolist() == [False, False, True] and store.held == [True, False, True]
    assert store.ref[0].tolist() == canvas(5).tolist()
    assert store.ref[2].tolist() == canvas(2).tolist()
    # the next flags: request 0 full (its commit was unmatched), request 2 cached in block 0
    rows = torch.stack([canvas(5, 6), canvas(2, 3)])[:, None]          # [R, 1, L]
    fl = store.flags(torch.tensor([0, 2]), rows, torch.tensor([[0], [0]]),
                     torch.ones(2, 1, dtype=torch.bool))
    assert fl.tolist() == [[1, 0, 0], [0, 0, 0]]
    cached = store.call([2], [1], [store.span(0, 0)], gen=rows[1], row_r=torch.tensor([1]))
    assert cached.spans == [(P0, P0 + 4)] and cached.span == (P0, P0 + 4)
    assert [t.item() for t in cached.layer_kv()[0]] == [2.0, -2.0]
    assert cached.ref.tolist() == canvas(2).tolist()
    store.call([0], [1], None, gen=rows[0], row_r=torch.tensor([0]))
    store.call([2], [1], [store.span(0, 0)], gen=rows[1], row_r=torch.tensor([1]))
    assert (store.full_calls, store.cached_calls) == (3, 2)
