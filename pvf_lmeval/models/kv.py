"""KV-cached model calls (SPEC "Cache modes"): the model side of ``cache=prefix|dual``.

The decoding side owns the caches (``pvf_lmeval.decoding.cache``) and says, before each call,
what the call is. ``cache`` as passed to ``DiffusionLM.logits`` is either

- a *call view* (the decode loop's ``KVCall``): ``rows`` (rows per request segment; segments
  contiguous, in order), ``spans`` (canvas positions [s0, s1) each segment recomputes, or None
  for a full call), ``layer_kv()`` (per layer, the segments' cached keys and values
  [S, Hkv, T, D]) and ``keep(kv_out)`` (a full call hands over every row's per-layer keys and
  values [N, Hkv, T, D]); or
- one request's ``KVCache`` (all rows belong to it), or a list of ``(KVCache_or_None, n_rows)``
  segments, which :func:`cache_segments` wraps into the same view.

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

from ..uploads import upload


class _Segments:
    """The call view of ``[(KVCache_or_None, n_rows), ...]`` (one-request caches)."""

    def __init__(self, segs: list):
        self.segs = segs
        self.rows = [int(n) for _, n in segs]
        spans = [c is not None and c.span is not None for c, _ in segs]
        if any(spans) and not all(spans):
            raise ValueError("a model call mixes cached and full rows; split it into two calls")
        self.spans = [c.span for c, _ in segs] if all(spans) else None

    @property
    def span(self):
        return None if self.spans is None else self.spans[0]

    def layer_kv(self) -> list:
        if len(self.segs) == 1:
            return self.segs[0][0].kv
        return [(torch.cat([c.kv[layer][0] for c, _ in self.segs]),
                 torch.cat([c.kv[layer][1] for c, _ in self.segs]))
                for layer in range(len(self.segs[0][0].kv))]

    def keep(self, kv_out: list) -> None:
        a = 0
        for c, n in self.segs:
            if c is not None:
                c.pending = [(k[a:a + n], v[a:a + n]) for k, v in kv_out]
            a += n


def cache_segments(cache, n_rows: int):
    """The call view of the ``cache`` argument (see the module docstring), or None (no cache)."""
    if cache is None:
        return None
    if hasattr(cache, "layer_kv"):
        view = cache
    else:
        segs = list(cache) if isinstance(cache, (list, tuple)) else [(cache, n_rows)]
        if all(c is None for c, _ in segs):
            total = sum(int(n) for _, n in segs)
            if total != n_rows:
                raise ValueError(f"cache segments cover {total} rows, the call has {n_rows}")
            return None
        view = _Segments(segs)
    if sum(view.rows) != n_rows:
        raise ValueError(f"cache segments cover {sum(view.rows)} rows, the call has {n_rows}")
    return view


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


class CacheDriftProbe:
    """A model wrapper that measures the cache's approximation error (SPEC "Cache modes").

    Every cached call is also run without the cache on the same rows; per call it records the
    max and mean absolute logit difference (over the decodable ids) and the fraction of
    requested positions whose argmax agrees. The cached logits are what the decoder gets.
    Attributes other than ``logits`` come from the wrapped model.
    """

    def __init__(self, model):
        self.model = model
        self.records: list[dict] = []
        self.full_calls = 0

    def __getattr__(self, name):
        return getattr(self.model, name)

    def logits(self, tokens, positions, *, attention_mask=None, cache=None):
        out = self.model.logits(tokens, positions, attention_mask=attention_mask, cache=cache)
        if not is_cached_call(cache_segments(cache, tokens.shape[0])):
            self.full_calls += 1
            return out
        ref = self.model.logits(tokens, positions, attention_mask=attention_mask)
        ok = torch.isfinite(ref) & torch.isfinite(out)
        diff = torch.where(ok, (out - ref).abs(), torch.zeros_like(out))
        self.records.append({
            "max_abs": float(diff.max()), "mean_abs": float(diff.sum() / ok.sum().clamp(min=1)),
            "agree": float((out.argmax(-1) == ref.argmax(-1)).float().mean()),
            "positions": int(out.shape[0] * out.shape[1])})
        return out

    def summary(self) -> dict:
        """Drift over every cached call so far: max/mean absolute difference, argmax agreement
        (position-weighted), and the numbers of cached and full calls."""
        r = self.records
        n = sum(x["positions"] for x in r)
        return {"cached_calls": len(r), "full_calls": self.full_calls,
                "max_abs": max((x["max_abs"] for x in r), default=0.0),
                "mean_abs": sum(x["mean_abs"] * x["positions"] for x in r) / n if n else 0.0,
                "argmax_agree": sum(x["agree"] * x["positions"] for x in r) / n if n else 1.0}
