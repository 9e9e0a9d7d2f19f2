"""KV cache state for ``cache=prefix|dual`` (SPEC "Cache modes"), decoding side.

The decoding side decides, before every model call, whether the call is *full* (the whole
canvas; it (re)builds the cache) or *cached* (only a span of positions is recomputed, every
other key/value comes from the cache), and after every step which row of a full call was
committed. The model fills ``pending`` (per-layer keys/values of every row of a full call, rows
along dim 0) and reads ``kv`` (the committed row's, [1, ...]) and ``span``; see
``pvf_lmeval.models.kv``. :class:`BatchKV` holds every request of a batch in one tensor per
layer, indexed by request, so that deciding, planning and committing a round costs the same few
tensor operations whatever the number of requests (one request's cache outside the loop, for
the call-cost benchmarks and tests, is ``bench/benchlib.py``'s ``KVCache``). Nothing is shared
between requests' caches (each has its own row) or between ranks.

Rules (with bidirectional attention every cached key depends on the whole canvas, so caching
is an approximation that is exact only right after a refresh):

- the first call of a request is full;
- the cached canvas's *working blocks* are its active block, plus the next block when its
  working set had revealed it (``reveal_next``); a row's are its own, the same way;
- a call is full when any of its rows that still holds a mask has a working block outside the
  cached canvas's: it enters a new block, or reveals a block the cached canvas had not, or when
  the committed row of the last full call could not be matched. A block revealed at the last
  refresh is not new when it becomes the active one: the refresh already built its keys from a
  canvas that held it in the working set, and every cached call recomputes it (SPEC "Cache
  modes": cached calls recompute "the revealed next block when N_s widens the working set").
  Without this, every block costs PVF two full calls (one when it is revealed, one when it
  becomes active);
- otherwise the call is cached: ``dual`` recomputes the cached canvas's working blocks,
  ``prefix`` its active block and everything after it. A dual call's logits then cover only the
  recomputed blocks (the only ones a working set can hold).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ..tensors.uploads import upload
from .select import first_true


def cache_exact(cache: str, block_size: int | None, uniform: bool = False) -> bool:
    """Whether decoding with ``cache`` gives exactly the logits of uncached calls: no cache, or
    any cache on a block-diffusion model (``block_size`` set: a finished block never sees a
    later one, so its cached keys are final) or on a uniform-state one (``uniform``: the cache
    holds the causal encoder's keys of the context, :class:`ContextKV`)."""
    return cache == "none" or block_size is not None or uniform


def revealed(zg: Tensor, a: Tensor, blk: Tensor, *, reveal: int, nb: int, mask_id: int) -> Tensor:
    """Whether the working set of state(s) ``zg`` [..., L] (active block ``a`` [...]) holds the
    next block (``blk`` [L]: block of each generation position)."""
    if reveal <= 0:
        return torch.zeros_like(a, dtype=torch.bool)
    act = (zg == mask_id) & (blk == a.unsqueeze(-1))
    return (act.sum(-1) <= reveal) & (a + 1 < nb)


def full_call_flags(ref: Tensor, ok: Tensor, a: Tensor, valid: Tensor, rev: Tensor, *, B: int,
                    nb: int, reveal: int, mask_id: int) -> Tensor:
    """[R, 3] long (need_full, cached active block, cached reveal) for R requests that hold a
    cache: ``ref`` [R, L] the cached canvases' generation regions, ``ok`` [R] whether their
    committed row was matched, ``a`` [R, M] active blocks of the rows of this call, ``valid``
    [R, M] which rows are sent, ``rev`` [R, M] whether each row reveals its next block.

    A call is full when a sent row that still holds a mask has a working block outside the
    cached canvas's working blocks (see the module docstring)."""
    a_ref = first_true(ref == mask_id) // B                                  # [R]
    blk = torch.arange(ref.shape[-1], device=ref.device) // B
    rev_ref = revealed(ref, a_ref, blk, reveal=reveal, nb=nb, mask_id=mask_id)
    hi_row = a + rev.long()                                                  # last working block
    outside = (a < a_ref[:, None]) | (hi_row > (a_ref + rev_ref.long())[:, None])
    need = (valid & (a < nb) & outside).any(-1) | ~ok
    return torch.stack([need.long(), a_ref, rev_ref.long()], dim=-1)


class BatchKV:
    """The caches of the ``n`` requests of a batch (see the module docstring), one row each.

    ``kv``: per layer, keys and values [n, Hkv, T, D] of every request's committed canvas
    (model-owned contents, allocated at the first commit; a request's row is meaningful once it
    has made a full call; the caller drops it, None, when every calling request refreshes, and
    the next commit allocates it again). ``ref`` [n, L]: each request's cached canvas (generation region);
    ``ok`` [n]: its committed row was matched (False before its first full call, which makes
    that call full). ``full_calls``/``cached_calls`` count the requests' calls of each kind.
    """

    def __init__(self, mode: str, *, n: int, prompt_len: int, gen_length: int,
                 block_length: int, mask_id: int, reveal_next: int, device):
        if mode not in ("prefix", "dual", "dual_base"):
            raise ValueError(f"cache={mode!r} must be one of none, prefix, dual, dual_base")
        #: dual_base: a refresh runs the base row alone over the whole canvas and the other
        #: rows as cached calls on its keys (see :meth:`flags`); otherwise the dual cache
        self.base_refresh = mode == "dual_base"
        mode = "dual" if self.base_refresh else mode
        self.mode = mode
        self.n, self.P0, self.L, self.B = n, prompt_len, gen_length, block_length
        self.nb = gen_length // block_length
        self.mask_id = mask_id
        self.reveal = reveal_next
        self.blk = torch.arange(gen_length, device=device) // block_length
        self.kv: list | None = None
        self.ref = torch.full((n, gen_length), mask_id, dtype=torch.long, device=device)
        self.ok = torch.zeros(n, dtype=torch.bool, device=device)
        self.held = [False] * n             # host: the request has committed a full call
        self.full_calls = 0
        self.cached_calls = 0
        self._pending: list[tuple] = []     # this round's full calls: (keys/values, rows, ...)

    def flags(self, req: Tensor, rows: Tensor, a: Tensor, valid: Tensor) -> Tensor:
        """[R, 3] long (need_full, cached active block, cached reveal) for the requests ``req``
        [R] sending rows ``rows`` [R, M, L] (active blocks ``a`` [R, M], ``valid`` [R, M]).

        With ``dual_base``, three more columns: whether a full call may refresh from the base row
        (row 0) alone (more than one row, and every other row that holds a mask works inside
        the base row's working blocks, as the cached call on its keys requires), and the base
        row's active block and reveal (the cached call's span)."""
        rev = revealed(rows, a, self.blk, reveal=self.reveal, nb=self.nb, mask_id=self.mask_id)
        fl = full_call_flags(self.ref.index_select(0, req), self.ok.index_select(0, req), a,
                             valid, rev, B=self.B, nb=self.nb, reveal=self.reveal,
                             mask_id=self.mask_id)
        if not self.base_refresh:
            return fl
        a0, rev0 = a[:, :1], rev[:, :1].long()
        outside = (a < a0) | (a + rev.long() > a0 + rev0)
        fits = ~(valid & (a < self.nb) & outside).any(-1) & (valid.sum(-1) > 1) & (a0[:, 0] < self.nb)
        return torch.cat([fl, torch.stack([fits.long(), a0[:, 0], rev0[:, 0]], -1)], -1)

    def span(self, a_ref: int, rev: int) -> tuple[int, int]:
        """Generation positions [s0, s1) a cached call recomputes, from the read-back flags."""
        s0 = a_ref * self.B
        s1 = self.L if self.mode == "prefix" else min(self.L, (a_ref + 1 + rev) * self.B)
        return s0, s1

    def call(self, req: list[int], rows: list[int], spans: list[tuple[int, int]] | None,
             *, gen: Tensor, row_r: Tensor, refresh: bool = False) -> "KVCall":
        """The ``cache`` argument of one physical model call over requests ``req`` (``rows[s]``
        rows each, contiguous, in order): cached over generation ``spans`` or full (None).
        A full call's rows (generation regions ``gen`` [N, L], live index ``row_r`` [N] of the
        request of each row) are kept until :meth:`commit` picks each request's committed one;
        a ``refresh`` (``dual_base``: one base row per request) is kept at once, so that the
        request's other rows can be a cached call on it in the same round."""
        if spans is None:
            self.full_calls += len(req)
        else:
            self.cached_calls += len(req)
        return KVCall(self, req, rows, spans, gen, row_r, refresh)

    def _keep(self, kv_out: list, call: "KVCall", pick: Tensor, ok: Tensor, ref: Tensor) -> None:
        """Requests ``call.req`` keep rows ``pick`` [S] of a full call's keys/values ``kv_out``;
        ``ok`` [S] and ``ref`` [S, L] become theirs."""
        req = upload(call.req, ref.device)
        if self.kv is None:
            self.kv = [(k.new_empty((self.n, *k.shape[1:])), v.new_empty((self.n, *v.shape[1:])))
                       for k, v in kv_out]
        # requests a..b-1 (the usual case: every live request's first call, or a batch
        # whose requests refresh together): the rows go straight into the store's slice
        a, b = call.req[0], call.req[-1] + 1
        run = b - a == len(call.req)
        # layer by layer, dropping each layer's pending rows once the committed ones are
        # copied: the peak is the pending rows plus one layer
        for layer in range(len(kv_out)):
            k, v = kv_out[layer]
            kv_out[layer] = None
            for kept, new in zip(self.kv[layer], (k, v)):
                if run:
                    torch.index_select(new, 0, pick, out=kept[a:b])
                else:
                    kept.index_copy_(0, req, new.index_select(0, pick))
            del k, v
        self.ok.index_copy_(0, req, ok)
        self.ref.index_copy_(0, req, ref)
        for i in call.req:
            self.held[i] = True

    def commit(self, y: Tensor) -> None:
        """After a round committed states ``y`` [R, L] (live order): every request whose call
        was full keeps its committed row's keys/values (the first row equal to its committed
        state; ``ok`` False, and the next call full, when none is)."""
        for kv_out, call in self._pending:
            dev = y.device
            N = call.gen.shape[0]
            # output_size: the length is known here, so the device is never asked for it
            seg = torch.repeat_interleave(torch.arange(len(call.req), device=dev),
                                          upload(call.rows, dev),
                                          output_size=N)                              # [N]
            match = (call.gen == y.index_select(0, call.row_r)).all(-1)               # [N]
            j = torch.arange(N, device=dev)
            first = torch.full((len(call.req),), N, device=dev).scatter_reduce(
                0, seg, torch.where(match, j, torch.full_like(j, N)), "amin")
            last = torch.zeros_like(first).scatter_reduce(0, seg, j, "amax")
            pick = torch.where(first < N, first, last)
            self._keep(kv_out, call, pick, first < N,
                       y.index_select(0, call.row_r.index_select(0, pick)))
        self._pending = []


class KVCall:
    """One physical model call's view of a :class:`BatchKV`: what ``model.logits`` gets as
    ``cache`` (the protocol of ``pvf_lmeval.models.kv``). ``rows``: rows per request segment;
    ``spans``: canvas positions [s0, s1) each segment recomputes, None for a full call."""

    def __init__(self, store: BatchKV, req: list[int], rows: list[int],
                 spans: list[tuple[int, int]] | None, gen: Tensor, row_r: Tensor,
                 refresh: bool = False):
        self.store, self.req, self.rows, self.refresh = store, req, rows, refresh
        self.spans = None if spans is None else [(store.P0 + s0, store.P0 + s1)
                                                 for s0, s1 in spans]
        self.gen, self.row_r = gen, row_r

    @property
    def span(self) -> tuple[int, int] | None:
        """The recomputed span of a one-request call (None: full)."""
        return None if self.spans is None else self.spans[0]

    @property
    def ref(self) -> Tensor | None:
        """The cached canvas of a one-request call (None before its first full call)."""
        if not self.store.held[self.req[0]]:
            return None
        return self.store.ref[self.req[0]]

    def layer_kv(self) -> list[tuple[Tensor, Tensor]]:
        """Per layer, the segments' cached keys and values [S, Hkv, T, D] (a view when the
        call is every request of the batch in order)."""
        if self.req == list(range(self.store.n)):
            return self.store.kv
        idx = upload(self.req, self.store.ref.device)
        return [(k.index_select(0, idx), v.index_select(0, idx)) for k, v in self.store.kv]

    def keep(self, kv_out: list) -> None:
        """A full call's per-layer keys/values of every row [N, ...], until the commit (a
        refresh: its rows, one per request, at once)."""
        if self.refresh:
            pick = torch.arange(len(self.req), device=self.gen.device)
            self.store._keep(kv_out, self, pick, torch.ones_like(pick, dtype=torch.bool),
                             self.gen)
        else:
            self.store._pending.append((kv_out, self))


class ContextKV:
    """``cache=prefix`` on a uniform-state model (DiffusionGemma): per request, the encoder's
    keys and values of its context (the prompt and the committed canvases), computed by the
    first call on each canvas (a full call over context + canvas) and read by every further call
    on that canvas, which computes the canvas only. Exact: the encoder reads the context
    causally, so its keys never depend on the canvas, and the context does not change while a
    canvas is denoised (a canvas is committed only when it ends).

    Each layer keeps the context columns a canvas query can see (``models/canvas.py``): a
    global layer (``windows[layer]`` None) every one, ``width``; a sliding-window layer of
    window ``w`` those at position ids ``s - w + 1 .. s - 1`` (``s``: the canvas's first
    position id; every canvas row sees the keys within the window of ``s``, and the context
    ends at ``s - 1``): the last ``w - 1`` columns, ``min(width, w - 1)``, as transformers'
    ``DynamicSlidingWindowLayer`` keeps them. The columns are right-aligned, so a sliding
    layer's are the last of the global layers' and share their position ids.

    ``kv``: per layer, keys after rotary and values [n, Hkv, kept[layer], D] of every request's
    context, right-aligned (``width``: the longest context, the prompt and every canvas but the
    last); ``key_pos`` [n, width] their position ids, ``key_keep`` [n, width] which are real,
    ``start`` [n] the canvas's first position id; ``ctx`` (host) each request's context
    columns. ``full_calls``/``cached_calls`` count the requests' calls of each kind."""

    def __init__(self, *, n: int, width: int, canvas: int, windows: tuple[int | None, ...],
                 device):
        self.n, self.width, self.canvas = n, width, canvas
        #: per layer, the context columns it keeps
        self.kept = [width if w is None else min(width, w - 1) for w in windows]
        self.kv: list | None = None
        self.key_pos = torch.zeros(n, width, dtype=torch.long, device=device)
        self.key_keep = torch.zeros(n, width, dtype=torch.bool, device=device)
        self.start = torch.zeros(n, dtype=torch.long, device=device)
        self.ctx = [0] * n
        self.full_calls = 0
        self.cached_calls = 0

    def call(self, req: list[int], *, full: bool, attention: Tensor | None,
             columns: int) -> "ContextCall":
        """The ``cache`` argument of one physical call over requests ``req`` (one row each) of
        ``columns`` columns (context + canvas, right-aligned, ``attention`` [N, columns] or
        None: every column real): ``full`` keeps its context's keys, otherwise it reads them."""
        if full:
            self.full_calls += len(req)
        else:
            self.cached_calls += len(req)
        return ContextCall(self, req, full, attention, columns)

    def commit(self, y: Tensor) -> None:
        """Nothing to do after a round: a full call keeps its context at once (the context is
        the same whatever the round commits)."""


class ContextCall:
    """One physical call's view of a :class:`ContextKV` (the protocol of
    ``pvf_lmeval.models.kv``): ``rows`` one per request; ``spans`` None for a full call,
    the canvas columns otherwise; :meth:`layer_kv` and :meth:`context` for a cached call,
    :meth:`keep` for a full one."""

    def __init__(self, store: ContextKV, req: list[int], full: bool,
                 attention: Tensor | None, columns: int):
        self.store, self.req = store, req
        self.rows = [1] * len(req)
        self.spans = None if full else [(columns - store.canvas, columns)] * len(req)
        self.attention, self.columns = attention, columns
        self._idx = upload(req, store.start.device)
        # the cached columns a cached call reads: the longest context among its requests
        self._w = max(store.ctx[i] for i in req)

    def _rows(self, x: Tensor) -> Tensor:
        return x if self.req == list(range(self.store.n)) else x.index_select(0, self._idx)

    def layer_kv(self) -> list[tuple[Tensor, Tensor]]:
        """Per layer, the requests' cached keys and values [N, Hkv, w_l, D]: the last
        ``w_l = min(w, kept[layer])`` columns (w: the longest context of the call's requests;
        the columns before a shorter one are not real)."""
        return [(self._rows(k)[:, :, k.shape[2] - min(self._w, k.shape[2]):],
                 self._rows(v)[:, :, v.shape[2] - min(self._w, v.shape[2]):])
                for k, v in self.store.kv]

    def context(self) -> tuple[Tensor, Tensor, Tensor]:
        """(the canvas's first position id [N], the cached columns' position ids [N, w], which
        are real [N, w]) of the call's requests; a layer's keys are the last of these columns."""
        w0 = self.store.width - self._w
        return (self._rows(self.store.start), self._rows(self.store.key_pos)[:, w0:],
                self._rows(self.store.key_keep)[:, w0:])

    def keep(self, kv_out: list) -> None:
        """A full call's per-layer keys and values [N, Hkv, columns, D]: each layer's last
        ``kept[layer]`` context columns (the context: all but the last ``canvas``) become the
        requests' cache."""
        s = self.store
        ctx = self.columns - s.canvas
        dev = s.start.device
        real = (torch.ones(len(self.req), self.columns, dtype=torch.bool, device=dev)
                if self.attention is None else self.attention.to(dev).bool())
        pos = (real.long().cumsum(-1) - 1).clamp(min=0)        # the network's position ids
        lead = s.width - ctx
        if s.kv is None:
            s.kv = [(k.new_zeros((s.n, k.shape[1], kept, k.shape[3])),
                     v.new_zeros((s.n, v.shape[1], kept, v.shape[3])))
                    for (k, v), kept in zip(kv_out, s.kept)]
        for layer, kept in enumerate(s.kept):
            k, v = kv_out[layer]
            kv_out[layer] = None
            first = max(ctx - kept, 0)
            for dst, new in zip(s.kv[layer], (k, v)):
                dst.index_copy_(0, self._idx,
                                F.pad(new[:, :, first:ctx], (0, 0, kept - (ctx - first), 0)))
        s.key_pos.index_copy_(0, self._idx, F.pad(pos[:, :ctx], (lead, 0)))
        s.key_keep.index_copy_(0, self._idx, F.pad(real[:, :ctx].long(), (lead, 0)).bool())
        s.start.index_copy_(0, self._idx, real[:, :ctx].sum(-1))
        for i in self.req:
            s.ctx[i] = ctx
