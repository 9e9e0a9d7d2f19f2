"""KV-cached model calls (SPEC "Cache modes"): the model side of ``cache=prefix|dual``.

The decoding side owns the caches (``pvf_lmeval.decoding.cache``) and says, before each call,
what the call is. ``cache`` as passed to ``DiffusionLM.logits`` is

- a *call view* (the decode loop's ``KVCall``): ``rows`` (rows per request segment; segments
  contiguous, in order), ``spans`` (canvas positions [s0, s1) each segment recomputes, or None
  for a full call), ``layer_kv()`` (per layer, the segments' cached keys and values
  [S, Hkv, T, D]) and ``keep(kv_out)`` (a full call hands over every row's per-layer keys and
  values [N, Hkv, T, D]). One request's caches outside the loop (the call-cost benchmarks and
  tests) offer the same view: ``bench/benchlib.py``'s ``call_view``.
- on a uniform-state model (DiffusionGemma), a context call view (``decoding.cache``'s
  ``ContextCall``): ``rows``, ``spans`` (None: a full call, whose context keys ``keep``
  keeps), ``layer_kv()`` (per layer, the keys and values of the last of the cached columns: a
  sliding-window layer's may be fewer) and ``context()`` (the canvas's first position id, the
  cached columns' position ids and which are real) for a call that computes the canvas only
  (``BidirectionalTransformer.canvas_cached``).

A *full* call runs the whole canvas and hands its keys (after rotary, so cached keys carry their
positions) and values over. A *cached* call recomputes only each segment's span (one position
earlier for shifted checkpoints, Dream: its logits at ``s0`` come from the output at
``s0 - 1``), attending to the cached keys of every other position and to the row's own fresh
keys. Branch rows of one request share its cache: their queries are folded into one sequence
per request, which attends to the request's cache once (never copied per row), with a
block-diagonal mask over the fresh keys. A block-diffusion network (``net.block_size`` set) also
hides, from every query, the keys (cached or fresh) of blocks after the query's own, blocks being
counted on position ids as in a full call.
"""

from __future__ import annotations

import torch

from ..tensors.uploads import upload


def cache_segments(cache, n_rows: int):
    """The call view ``cache`` (see the module docstring) checked against the call's ``n_rows``
    rows, or None (no cache)."""
    if cache is None:
        return None
    if sum(cache.rows) != n_rows:
        raise ValueError(f"cache segments cover {sum(cache.rows)} rows, the call has {n_rows}")
    return cache


def is_cached_call(view) -> bool:
    """True if the call recomputes spans only (``view`` from :func:`cache_segments`)."""
    return view is not None and view.spans is not None


def keep_pending(view, kv_out: list) -> None:
    """After a full call: the caches keep the keys/values of its rows (per layer)."""
    view.keep(kv_out)


def cached_rows(net, tokens: torch.Tensor, positions: torch.Tensor, attention_mask, view,
                shift: int) -> torch.Tensor:
    """Final hidden states [N, P, d] feeding canvas ``positions`` ([P] or [N, P]) of ``tokens``
    [N, T], recomputing only each segment's span (see the module docstring)."""
    N, T = tokens.shape
    dev = tokens.device
    ns = view.rows
    R = len(ns)
    s0s = [max(0, int(s0) - shift) for s0, _ in view.spans]
    lens = [int(s1) - s0 for (_, s1), s0 in zip(view.spans, s0s)]
    if min(lens) < 1 or max(int(s1) for _, s1 in view.spans) > T:
        raise ValueError(f"cache spans {view.spans} do not fit a canvas of {T}")
    S, nmax = max(lens), max(ns)
    Q = nmax * S
    n_t = upload(ns, dev)
    starts = torch.cumsum(n_t, 0) - n_t
    ii = torch.arange(nmax, device=dev)
    row_idx = starts[:, None] + torch.minimum(ii[None], n_t[:, None] - 1)      # [R, nmax]
    s0 = upload(s0s, dev)
    ln = upload(lens, dev)
    j = torch.arange(S, device=dev)
    qpos = (s0[:, None] + j).clamp(max=T - 1)                               # [R, S]
    qtok = tokens[row_idx[:, :, None], qpos[:, None, :]]                    # [R, nmax, S]
    t = torch.arange(T, device=dev)
    keep_c = (t < s0[:, None]) | (t >= (s0 + ln)[:, None])                  # [R, T]
    if attention_mask is None:
        pad = torch.zeros(R, dtype=torch.long, device=dev)
    else:
        real = attention_mask[row_idx[:, 0]].to(torch.bool)                 # [R, T]
        pad = (~real).sum(-1)
        keep_c &= real
    pos_ids = (qpos - pad[:, None]).clamp(min=0)[:, None, :].expand(R, nmax, S).reshape(R, Q)
    valid_k = (j[None, :] < ln[:, None])                                    # [R, S]
    if attention_mask is not None:
        # a span may start on padding: a shifted checkpoint's span begins one position early,
        # on the block before a region whose prompt head is all padding
        valid_k &= real[torch.arange(R, device=dev)[:, None], qpos]
    keep_f = ((ii[:, None] == ii[None, :])[None, :, None, :, None]
              & valid_k[:, None, None, None, :]).expand(R, nmax, S, nmax, S).reshape(R, Q, Q)
    keep_c = keep_c[:, None, :].expand(R, Q, T)
    block_size = getattr(net, "block_size", None)
    if block_size is not None:      # block diffusion: no key of a later block (cached or fresh)
        blk_q = torch.div(pos_ids, block_size, rounding_mode="floor")               # [R, Q]
        blk_c = torch.div((t[None, :] - pad[:, None]).clamp(min=0), block_size, rounding_mode="floor")
        keep_c = keep_c & (blk_c[:, None, :] <= blk_q[:, :, None])
        keep_f = keep_f & (blk_q[:, None, :] <= blk_q[:, :, None])
    keep = torch.cat([keep_c, keep_f], dim=-1)                              # [R, Q, T + Q]
    dtype = net.embed.weight.dtype
    bias = torch.zeros(R, 1, Q, T + Q, dtype=dtype, device=dev)
    bias.masked_fill_(~keep[:, None], torch.finfo(dtype).min)
    h = net.hidden_cached(qtok.reshape(R, Q), pos_ids, view.layer_kv(), bias).view(R, nmax, S, -1)
    src = (positions.to(dev) - shift).clamp(min=0)
    if src.dim() == 1:
        src = src.expand(N, -1)
    # output_size: the length is known here, so the device is never asked for it
    row_req = torch.repeat_interleave(torch.arange(R, device=dev), n_t, output_size=N)
    row_i = torch.arange(N, device=dev) - starts[row_req]
    jj = (src - s0[row_req][:, None]).clamp(0, S - 1)                       # [N, P]
    return h[row_req[:, None], row_i[:, None], jj]
