"""KV-cached model calls (SPEC "Cache modes"): the model side of ``cache=prefix|dual``.

The decoding side owns one cache object per request (``pvf_lmeval.decoding.cache.KVCache``) and
says, before each call, what the call is: ``span is None`` → a *full* call over the whole canvas,
whose per-layer keys (after rotary, so cached keys carry their positions) and values are kept
for every row in ``cache.pending``; the decoder later keeps the committed row's in ``cache.kv``.
``span = (s0, s1)`` (canvas positions) → a *cached* call that recomputes only those positions of
each row (one position earlier for shifted checkpoints, Dream: its logits at ``s0`` come from the
output at ``s0 - 1``), attending to the cached keys of every other position and to the row's own
fresh keys. Branch rows of one request share its cache: their queries are folded into one
sequence per request, which attends to the request's cache once (never copied per row), with a
block-diagonal mask over the fresh keys.

``cache`` as passed to ``DiffusionLM.logits`` is one cache object (all rows belong to it) or a
list of ``(cache_or_None, n_rows)`` segments (batched requests, rows contiguous, in order).
"""

from __future__ import annotations

import torch


def cache_segments(cache, n_rows: int) -> list | None:
    """Normalise the ``cache`` argument to ``[(cache_or_None, n_rows), ...]`` (None: no cache)."""
    if cache is None:
        return None
    segs = list(cache) if isinstance(cache, (list, tuple)) else [(cache, n_rows)]
    if sum(int(n) for _, n in segs) != n_rows:
        raise ValueError(f"cache segments cover {sum(n for _, n in segs)} rows, the call has {n_rows}")
    if all(c is None for c, _ in segs):
        return None
    return segs


def is_cached_call(segs: list | None) -> bool:
    """True if the call recomputes spans only (every segment has a cache with a span)."""
    if segs is None:
        return False
    spans = [c is not None and c.span is not None for c, _ in segs]
    if any(spans) and not all(spans):
        raise ValueError("a model call mixes cached and full rows; split it into two calls")
    return all(spans)


def keep_pending(segs: list, kv_out: list) -> None:
    """After a full call: each segment's cache keeps the keys/values of its rows (per layer)."""
    a = 0
    for c, n in segs:
        if c is not None:
            c.pending = [(k[a:a + n], v[a:a + n]) for k, v in kv_out]
        a += n


def cached_rows(net, tokens: torch.Tensor, positions: torch.Tensor, attention_mask, segs: list,
                shift: int) -> torch.Tensor:
    """Final hidden states [N, P, d] feeding canvas ``positions`` ([P] or [N, P]) of ``tokens``
    [N, T], recomputing only each segment's span (see the module docstring)."""
    N, T = tokens.shape
    dev = tokens.device
    R = len(segs)
    ns = [int(n) for _, n in segs]
    starts = [sum(ns[:r]) for r in range(R)]
    s0s = [max(0, int(c.span[0]) - shift) for c, _ in segs]
    lens = [int(c.span[1]) - s0 for (c, _), s0 in zip(segs, s0s)]
    if min(lens) < 1 or max(int(c.span[1]) for c, _ in segs) > T:
        raise ValueError(f"cache spans {[c.span for c, _ in segs]} do not fit a canvas of {T}")
    S, nmax = max(lens), max(ns)
    Q = nmax * S
    row_idx = torch.tensor([[a + min(i, n - 1) for i in range(nmax)] for a, n in zip(starts, ns)],
                           device=dev)                                      # [R, nmax]
    s0 = torch.tensor(s0s, device=dev)
    ln = torch.tensor(lens, device=dev)
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
    ii = torch.arange(nmax, device=dev)
    valid_k = (j[None, :] < ln[:, None])                                    # [R, S]
    keep_f = ((ii[:, None] == ii[None, :])[None, :, None, :, None]
              & valid_k[:, None, None, None, :]).expand(R, nmax, S, nmax, S).reshape(R, Q, Q)
    keep = torch.cat([keep_c[:, None, :].expand(R, Q, T), keep_f], dim=-1)  # [R, Q, T + Q]
    dtype = net.embed.weight.dtype
    bias = torch.zeros(R, 1, Q, T + Q, dtype=dtype, device=dev)
    bias.masked_fill_(~keep[:, None], torch.finfo(dtype).min)
    if R == 1:
        kv = segs[0][0].kv
    else:
        kv = [(torch.cat([c.kv[layer][0] for c, _ in segs]), torch.cat([c.kv[layer][1] for c, _ in segs]))
              for layer in range(len(segs[0][0].kv))]
    h = net.hidden_cached(qtok.reshape(R, Q), pos_ids, kv, bias).view(R, nmax, S, -1)
    src = (positions.to(dev) - shift).clamp(min=0)
    if src.dim() == 1:
        src = src.expand(N, -1)
    row_req = torch.repeat_interleave(torch.arange(R, device=dev), torch.tensor(ns, device=dev))
    row_i = torch.cat([torch.arange(n, device=dev) for n in ns])
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
