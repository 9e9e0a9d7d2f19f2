"""The one place that calls the model: :class:`Runner` lays out the live requests' branch rows as
physical model calls, makes them, and keeps the call accounting and the KV caches.

``Runner.call`` takes the branch rows of every live request as one tensor ``[R, M, L]`` with a
row count per request, and assembles them into physical model calls with index operations: one
per round, or two when KV caches make some requests' calls full and others' cached (each request
still counts one call), or more when a step caps the rows of a physical call (calibration). The
layout needs one small tensor on the host (:meth:`Runner.plan`: row counts, block ranges, cache
flags of every request), which the loop reads together with the round's stop flags as one
:class:`.host_row.HostRow` per request. Cache decisions and commits are tensor operations over all
requests at once. Per request: its KV cache (``cache=prefix|dual``: its row of the batch's cache
tensors, ``cache.BatchKV``) and its accounting (``nfe[i]``: the model calls that carried rows of
request i; ``rows[i]``: the rows it sent).

A uniform-state model (``Batch.uniform``: DiffusionGemma) reads its canvas as the last
``canvas_length`` columns of a call: each request's row is its prompt, its committed canvases and
the canvas being denoised (one decoding block), right-aligned under left padding so that
requests at different canvases share a call, and the call's ``self_conditioning`` is the carry
the request's last call on the same canvas left (:mod:`.hooks`; none on a canvas's first call).
The model takes it for every row of a call or for none, so requests with and without one make
separate physical calls (each still counts one call). Its ``cache=prefix`` is a
:class:`.cache.ContextKV`: a canvas's first call keeps the encoder's keys of the context, the
further calls on that canvas compute the canvas only.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from ..tensors.shadow import Shadow
from ..tensors.uploads import upload
from .batch import Batch, gumbel_like
from .cache import BatchKV, ContextKV
from .compiled import compiled_stats_from_logits
from .hooks import CallView, Carry
from .host_row import HostRow, host_rows
from .select import first_true
from .stats import Stats, entropy_from_logits, eos_switches, stats_from_logits
from .step import take_rows


class Seat(NamedTuple):
    """One request's share of one physical model call."""

    r: int                      # its index among the live requests
    request: int                # its number in the batch
    rows: int                   # the rows it sends in this call
    lo: int                     # generation positions [lo, hi) the call covers for it
    hi: int
    span: tuple[int, int] | None    # a cached call: the positions it recomputes; None: full
    first: int                  # its first row in this call (dual_base: after the base row)


class Runner:
    """Lays out and makes the model calls of the requests of ``b`` (see the module docstring).

    ``compile_step``: ``torch.compile`` options of the statistics pass (None: eager). ``hook``:
    the step's call hook (``Step.call_hook``, :mod:`.hooks`), run on every physical call
    between the model and the statistics pass; its carry is kept here (:class:`.hooks.Carry`),
    one per request, as the KV caches are."""

    def __init__(self, model, b: Batch, *, compile_step: dict | None = None, hook=None):
        self.model = model
        self.b = b
        # the batch's caches, created here, so nothing leaks between batches
        self.cache: BatchKV | ContextKV | None = None
        if b.p.cache != "none" and b.uniform:
            self.cache = ContextKV(n=b.n, width=b.P0 + b.L - b.B, canvas=b.B,
                                   windows=model.sliding_windows, device=b.device)
        elif b.p.cache != "none":
            self.cache = BatchKV(b.p.cache, n=b.n, prompt_len=b.P0, gen_length=b.L,
                                 block_length=b.B, mask_id=b.mask_id, reveal_next=b.reveal,
                                 device=b.device)
        self.nfe = [0] * b.n
        self.rows = [0] * b.n
        self.compile_step = compile_step
        self.hook = hook
        self.carry = Carry(b.n, b.L, b.device) if hook is not None else None
        self.extra_dtypes: dict = {}        # the hook's extras by name (their dtypes)
        # rules=reference switches of the statistics pass (``Step.loop_switches``)
        self.stats_mask = None if "argmax_over_mask" in b.switches else b.mask_id
        self.float64 = "softmax64" in b.switches
        #: LLaDA's end-of-text switches: ids never chosen, ids of confidence 0
        self.suppress, self.unconfident = eos_switches(b.p, model.eos_ids)
        #: uniform-state: the canvas (block) of each request's last call (-1: none yet)
        self.canvas = [-1] * b.n

    def plan(self, rows: Tensor, n: Tensor, *, cover: Tensor | None = None,
             open: Tensor | None = None) -> dict:
        """:class:`HostRow`'s layout columns by name ([R] long each, on the device): what
        :meth:`call` must know on the host to lay out the physical calls of the first ``n[r]``
        rows of ``rows`` [R, M, L] for each live request (``b.req``): its row count, the first
        and last active block of its rows that hold an open position (``open`` [R, M, L], None:
        a mask; -1: none), and, with a KV cache, its cache flags (:meth:`.BatchKV.flags`).
        ``cover`` as for :meth:`call`. Reading them is the caller's: the loop reads them with
        the round's stop flags, in the round's one read."""
        b = self.b
        M = rows.shape[1]
        B, nb = b.B, b.nb
        a = first_true(rows == b.mask_id if open is None else open) // B   # [R, M]; nb: none
        valid = torch.arange(M, device=rows.device) < n[:, None]
        lo_b = torch.where(valid, a, torch.full_like(a, nb)).min(-1).values
        hi_b = torch.where(valid & (a < nb), a, torch.full_like(a, -1)).max(-1).values
        if cover is not None:               # the step needs stats from this block on too
            lo_b = torch.minimum(lo_b, cover // B)
            hi_b = torch.maximum(hi_b, cover // B)   # also rows left without a mask (switch 6)
        cols = dict(rows=n, lo_block=lo_b, hi_block=hi_b)
        if isinstance(self.cache, BatchKV):
            names = HostRow._fields[HostRow._fields.index("full"):]
            cols.update(zip(names, self.cache.flags(b.req, rows, a, valid).unbind(-1)))
        return cols

    def call(self, rows: Tensor, n: Tensor, *, layout: list[HostRow] | None = None,
             entropy: bool = False, max_rows: int | None = None,
             cover: Tensor | None = None, open: Tensor | None = None, draws: tuple = (),
             hook_args: dict | None = None, shadow: Tensor | None = None) -> Stats:
        """Run the first ``n[r]`` rows of ``rows`` [R, M, L] (generation regions) for each live
        request ``b.ids[r]``; returns their stats [R, M, L] (rows not sent: mask / 0).

        Each request's rows request generation positions [lo, hi): from the earliest active block
        of its rows to the end of the block after the latest one (the next step's stats need the
        active + next block of whichever row is committed; on a block-diffusion model, the next
        block only when the step reveals it, and the call then runs on the canvas up to that
        end); rows without a mask do not widen it.
        ``layout``: the :class:`HostRow` of each live request for these rows, as the caller read
        them (the loop's round read); None: read here (one host read).
        ``max_rows`` caps the rows of one physical call (more calls, each counted).
        ``cover`` [R] (optional): a generation position per request from which on the call
        must cover stats too (``rules=reference`` reads positions its rows already filled, and
        its second call after a failed plan may send rows with no mask left; a held block).
        ``open`` [R, M, L]: the rows' open positions (``Branches.open``; None: their masks).
        ``draws`` (the round's, each [R, ...]) and ``hook_args`` (``Branches.hook``) reach the
        call hook, per row. ``shadow`` [R] (``Branches.shadow``): each request's calls also
        evaluate a shadow copy of the block starting at that generation position, whose
        probabilities of the rows' tokens there are ``Stats.pback``.
        """
        b = self.b
        R, M, L = rows.shape
        B = b.B
        kc = self.cache if isinstance(self.cache, BatchKV) else None
        if self.cache is not None and max_rows is not None:
            raise ValueError("max_rows (rows per physical call) cannot be combined with a "
                             "KV cache: a request's rows must share one call")
        if layout is None:
            zero = torch.zeros_like(n)
            plan = self.plan(rows, n, cover=cover, open=open)
            layout = HostRow.read(host_rows(zero, zero, zero, zero, plan))
        # stats cover the active block and the next one, which a revealing step's next working
        # set may hold; a block-diffusion model's next block is never read otherwise
        ahead = 1 if (b.block_size is not None and b.reveal == 0 and cover is None) or b.uniform \
            else 2
        refresh_group, full_group, cached_group = [], [], []
        for r, (i, h) in enumerate(zip(b.ids, layout)):
            if h.rows == 0:
                continue
            if h.hi_block < 0:
                raise RuntimeError("forward called on rows without any mask")
            lo, hi = h.lo_block * B, min(L, (h.hi_block + ahead) * B)
            if kc is not None and not h.full:
                span = kc.span(h.cached_block, h.cached_reveal)
                cached_group.append(Seat(r, i, h.rows, lo, min(hi, span[1]), span, 0))
            elif kc is not None and kc.base_refresh and h.base_fits:
                # dual_base: the base row alone refreshes the cache, the others are cached
                span = kc.span(h.base_block, h.base_reveal)
                refresh_group.append(Seat(r, i, 1, lo, hi, None, 0))
                cached_group.append(Seat(r, i, h.rows - 1, lo, min(hi, span[1]), span, 1))
            else:
                full_group.append(Seat(r, i, h.rows, lo, hi, None, 0))
        if b.uniform:       # self_conditioning for every row of a call or for none
            refresh_group = [s for s in full_group if not self._continues(s)]
            full_group = [s for s in full_group if self._continues(s)]
        if kc is not None and not cached_group and not refresh_group:
            # every calling request refreshes (always so for one request): free the old caches
            # before the full call, so that they do not sit beside its activations and rows
            kc.kv = None
        # flat outputs with one spare slot at the end, where padded query positions write
        fill = b.pad_id if b.uniform else b.mask_id
        tok = torch.full((R * M * L + 1,), fill, dtype=torch.long, device=b.device)
        nf = 4 if entropy else 3
        val = torch.zeros((nf, R * M * L + 1), device=b.device,
                          dtype=torch.float64 if self.float64 else torch.float32)
        flat = rows.reshape(R * M, L)
        back = None
        if shadow is not None:
            back = (shadow, torch.zeros(R * M * L + 1, dtype=val.dtype, device=b.device))
        hook = None
        if self.hook is not None:
            # the extras the hook returned before, zeros until a call writes them (a round
            # whose requests make no call still hands the step every field)
            extra = {k: torch.zeros(R * M * L + 1, dtype=dt, device=b.device)
                     for k, dt in self.extra_dtypes.items()}
            hook = _HookCall(open=(flat == fill if open is None else open.reshape(R * M, L)),
                             cover=cover, draws=draws, args=hook_args or {}, extra=extra)
        for group, refresh in ((refresh_group, True), (full_group, False), (cached_group, False)):
            for chunk in _chunks(group, max_rows):
                self._physical(chunk, flat, M, tok, val, entropy, refresh, hook, back)
        tok, val = tok[:-1].view(R, M, L), val[:, :-1].view(nf, R, M, L)
        extra = None
        if hook is not None and hook.extra:
            extra = {k: v[:-1].view(R, M, L) for k, v in hook.extra.items()}
        pback = None if back is None else back[1][:-1].view(R, M, L)
        return Stats(tok, val[0], val[1], val[2], val[3] if entropy else None, pback=pback,
                     extra=extra)

    def _physical(self, seats: list[Seat], flat: Tensor, M: int, tok_out: Tensor,
                  val_out: Tensor, entropy: bool, refresh: bool = False,
                  hook: "_HookCall | None" = None,
                  back: tuple[Tensor, Tensor] | None = None) -> None:
        """One model call over ``seats``; writes each row's stats into ``tok_out``
        [R*M*L + 1] / ``val_out`` [k, R*M*L + 1] (flat [R*M, L] plus a spare slot) at its
        layout row (``hook``: the round's call hook inputs, whose extras land likewise;
        ``back``: the requests' shadow starts [R] and the flat ``pback`` output)."""
        b = self.b
        dev = b.device
        layout, owner, lens = [], [], []
        for s in seats:
            layout += range(s.r * M + s.first, s.r * M + s.first + s.rows)
            owner += [s.request] * s.rows
            lens.append(s.hi - s.lo)
        N = len(layout)
        index = upload([layout, owner], dev)
        gen = flat.index_select(0, index[0])
        tokens = torch.cat([b.prompt.index_select(0, index[1]), gen], dim=1)      # [N, T]
        P = max(lens)
        at = index[0][:, None] * b.L                                            # [N, 1]
        if len(seats) == 1:
            lo, hi = seats[0].lo, seats[0].hi
            positions = torch.arange(b.P0 + lo, b.P0 + hi, device=dev)
            gpos = positions.expand(N, P) - b.P0
            at = at + gpos
            inside = torch.ones((N, P), dtype=torch.bool, device=dev)
        else:
            lo_len = upload([[s.lo, s.hi - s.lo] for s in seats for _ in range(s.rows)],
                            dev)                                                # [N, 2]
            j = torch.arange(P, device=dev)[None]
            step = torch.minimum(j, lo_len[:, 1:] - 1)
            gpos = lo_len[:, :1] + step                                          # [N, P]
            positions = gpos + b.P0
            # positions past a row's range repeat its last one: their outputs go to the spare
            inside = j < lo_len[:, 1:]
            at = torch.where(inside, at + gpos, tok_out.shape[0] - 1)
        attention, extra_in = None, {}
        if b.uniform:
            tokens, attention, positions = self._canvas_layout(seats, index, gen)
            extra_in["self_conditioning"] = self._self_conditioning(seats, index, gpos)
        elif b.attention is not None and any(b.padded[s.request] for s in seats):
            attention = b.attention.index_select(0, index[1])
        if b.block_size is not None and self.cache is None:
            # block-causal: positions after the last requested block cannot influence any
            # requested one, so the call runs on the canvas up to that block's end
            end = b.P0 + max(s.hi for s in seats)
            tokens = tokens[:, :end]
            attention = None if attention is None else attention[:, :end]
        cache = None
        if b.uniform and self.cache is not None:
            # a canvas's first call (refresh) keeps the context's keys, the others read them
            cache = self.cache.call([s.request for s in seats], full=refresh,
                                    attention=attention, columns=tokens.shape[1])
        elif self.cache is not None:
            spans = None if seats[0].span is None else [s.span for s in seats]
            cache = self.cache.call([s.request for s in seats], [s.rows for s in seats], spans,
                                    gen=gen, row_r=index[0] // M, refresh=refresh)
        if back is not None:        # the shadowed block's generation positions, per row [N, B]
            cols = back[0].index_select(0, index[0] // M)[:, None] + torch.arange(b.B, device=dev)
            extra_in["shadow"] = Shadow(b.P0 + cols[:, 0], b.B)
        guided = bool(b.p.cfg_scale)
        if guided:
            logits = guided_logits(self.model, tokens, positions, attention, b.P0, b.mask_id,
                                   b.p.cfg_scale)
        else:
            logits = self.model.logits(tokens, positions, attention_mask=attention, cache=cache,
                                       **extra_in)
        if back is not None:
            logits = self._shadow_rows(logits, P, gen, cols, index[0], back[1])
        for s in seats:
            self.canvas[s.request] = s.lo // b.B
            self.nfe[s.request] += 1
            self.rows[s.request] += s.rows * (2 if guided else 1)
        cur = gen.gather(1, gpos)
        extra = None
        if hook is not None:
            logits, extra = self._hook(hook, index, M, logits, cur, gpos, inside)
        mask_id = self.stats_mask
        ent = entropy_from_logits(logits, mask_id, fixed=b.invariant) if entropy else None
        noise = None
        if b.temperature > 0:
            noise = self._noise(seats, P, logits.shape[-1]).to(logits.device)
        if self.compile_step is None or b.invariant:   # the fixed-order sums run eager
            tok, conf, pmax, pcur = stats_from_logits(logits, cur, mask_id, b.temperature,
                                                      noise, fixed=b.invariant, top_k=b.top_k,
                                                      top_p=b.top_p, float64=self.float64,
                                                      suppress=self.suppress,
                                                      unconfident=self.unconfident)
        else:
            tok, conf, pmax, pcur = compiled_stats_from_logits(
                logits, cur, mask_id, b.temperature, noise, options=self.compile_step,
                top_k=b.top_k, top_p=b.top_p, float64=self.float64, suppress=self.suppress,
                unconfident=self.unconfident)
        vals = [conf, pmax, pcur] + ([ent] if entropy else [])
        # each row's stats land at (its layout row, its positions) of the flat outputs
        at = at.reshape(-1)
        for k, v in (extra or {}).items():
            if k not in hook.extra:
                self.extra_dtypes[k] = v.dtype
                hook.extra[k] = torch.zeros(tok_out.shape[0], dtype=v.dtype, device=dev)
            hook.extra[k].index_put_((at,), v.to(dev).reshape(-1))
        tok_out.index_put_((at,), tok.to(dev).reshape(-1))
        for f, v in enumerate(vals):
            val_out[f].index_put_((at,), v.to(dev).reshape(-1))

    def _continues(self, s: Seat) -> bool:
        """Whether request ``s.request``'s call continues the canvas of its last call."""
        return self.canvas[s.request] == s.lo // self.b.B

    def _canvas_layout(self, seats: list[Seat], index: Tensor, gen: Tensor):
        """(tokens [N, W], attention [N, W] or None, positions [B]) of a uniform-state call:
        each row's prompt and region up to its canvas's end (``hi``), right-aligned at column
        W = P0 + the latest end, so that every row's canvas is the last B columns; the columns
        a shift opens on the left are padding."""
        b = self.b
        dev, B = b.device, b.B
        if any(s.rows != 1 or s.hi - s.lo != B for s in seats):
            raise ValueError("a uniform-state step sends one row per request, on one canvas")
        his = [s.hi for s in seats]
        width = b.P0 + max(his)
        full = torch.cat([b.prompt.index_select(0, index[1]), gen], dim=1)      # [N, P0 + L]
        shift = upload([width - b.P0 - h for h in his], dev)
        src = torch.arange(width, device=dev) - shift[:, None]
        real = src >= 0
        tokens = torch.where(real, full.gather(1, src.clamp(min=0)), b.pad_id)
        attention = None
        if b.attention is not None or len(set(his)) > 1:
            att = (b.attention.index_select(0, index[1]) if b.attention is not None
                   else torch.ones_like(full))
            attention = (att.gather(1, src.clamp(min=0)).bool() & real).long()
        return tokens, attention, torch.arange(width - B, width, device=dev)

    def _self_conditioning(self, seats: list[Seat], index: Tensor, gpos: Tensor):
        """The carry of each row's last call on its canvas [N, B, C] (a group's rows all have
        one or none: :meth:`call`), as the hook returned it (the model rounds it to its own
        dtype); None on a canvas's first call."""
        if not self._continues(seats[0]):
            return None
        carry, _ = self.carry.view(index[1], gpos)
        return carry

    def _shadow_rows(self, logits: Tensor, P: int, gen: Tensor, cols: Tensor, rows: Tensor,
                     out: Tensor) -> Tensor:
        """The canvas logits [N, P, V] of a call with a shadow; the shadow rows' probabilities
        of the tokens the rows hold at the shadowed positions ``cols`` [N, B] (0 where they
        hold the mask) go into ``out`` (flat pback [R*M*L + 1]) at layout rows ``rows`` [N]."""
        b = self.b
        cur = gen.gather(1, cols)
        pcur = stats_from_logits(logits[:, P:], cur, self.stats_mask, fixed=b.invariant,
                                 float64=self.float64)[3]
        pback = torch.where(cur == b.mask_id, torch.zeros_like(pcur), pcur)
        out.index_put_(((rows[:, None] * b.L + cols).reshape(-1),), pback.reshape(-1))
        return logits[:, :P]

    def _noise(self, seats: list[Seat], P: int, V: int) -> Tensor:
        """Gumbel noise per row [N, P, V] (or [P, V] for one request): each request draws
        [hi - lo, V] from its generator, shared by its rows, repeated along the padding."""
        per = []
        for s in seats:
            g = self.b.generator(s.request)
            z = gumbel_like((s.hi - s.lo, V), g, g.device)
            if s.hi - s.lo < P:
                z = torch.cat([z, z[-1:].expand(P - (s.hi - s.lo), V)])
            per.append(z)
        if len(per) == 1:
            return per[0]
        counts = [s.rows for s in seats]
        # output_size: the length is known here, so the device is never asked for it
        return torch.repeat_interleave(torch.stack(per), upload(counts, per[0].device),
                                       dim=0, output_size=sum(counts))

    def _hook(self, hook: "_HookCall", index: Tensor, M: int,
              logits: Tensor, cur: Tensor, gpos: Tensor, inside: Tensor):
        """The step's call hook on one physical call (rows ``index[0]`` = live row r * M + j,
        of requests ``index[1]``): its :class:`.hooks.CallView`, its carry kept until
        :meth:`commit_carry`; returns (the logits for the statistics pass, its extras)."""
        b = self.b
        r = index[0] // M
        rows_open = hook.open.index_select(0, index[0])                       # [N, L]
        first = first_true(rows_open)
        if hook.cover is not None:
            first = torch.where(first < b.L, first, hook.cover.index_select(0, r))
        carry, carried = self.carry.view(index[1], gpos)
        view = CallView(logits=logits, tokens=cur, gpos=gpos, inside=inside,
                        open=rows_open.gather(1, gpos), block=first // b.B, carry=carry,
                        carried=carried, draws=take_rows(tuple(hook.draws), r),
                        args=take_rows(dict(hook.args), r))
        out = self.hook(b, view)
        if out.carry is not None:
            self.carry.keep(r, index[0] % M, index[1], gpos, inside, out.carry)
        return out.logits, out.extra

    def commit_caches(self, y: Tensor) -> None:
        """After a round committed states ``y`` [R, L] (live order): requests whose call was
        full keep the committed row's keys/values (one set of tensor operations for all)."""
        if self.cache is not None:
            self.cache.commit(y)

    def commit_carry(self, pick: Tensor, made: Tensor) -> None:
        """After a round's choice (``pick`` [R], the committed row of each live request,
        ``made`` [R] its call): the call hook's carry of the committed rows is kept."""
        if self.carry is not None:
            self.carry.commit(pick, made)


class _HookCall(NamedTuple):
    """A round's inputs of the call hook, over the flat rows [R * M, ...] of :meth:`Runner.call`
    (``open`` [R * M, L]) or per request (``cover``, ``draws``, ``args``); ``extra`` collects
    the hook's per-position values (flat buffers by name)."""

    open: Tensor
    cover: Tensor | None
    draws: tuple
    args: dict
    extra: dict


def guided_logits(model, tokens: Tensor, positions: Tensor, attention: Tensor | None,
                  prompt_len, mask_id: int, scale: float) -> Tensor:
    """LLaDA's classifier-free guidance (``generate.py``, ``get_log_likelihood.py``): one model
    call on ``tokens`` [N, T] and the same rows with their prompt masked (its first
    ``prompt_len`` positions: an int, or [N] per row), combined as
    ``un + (scale + 1) * (cond - un)`` (float32)."""
    cols = torch.arange(tokens.shape[1], device=tokens.device)
    lens = torch.as_tensor(prompt_len, device=tokens.device).reshape(-1, 1)
    un = tokens.masked_fill(cols < lens, mask_id)
    pos = positions if positions.dim() == 1 else torch.cat([positions, positions])
    att = None if attention is None else torch.cat([attention, attention])
    cond, uncond = model.logits(torch.cat([tokens, un]), pos, attention_mask=att,
                                cache=None).float().chunk(2)
    return uncond + (scale + 1) * (cond - uncond)


def _chunks(group: list[Seat], max_rows: int | None):
    """Seats cut into physical calls of at most ``max_rows`` rows; yields lists of seats."""
    if not group:
        return
    if max_rows is None:
        yield group
        return
    out, room = [], max_rows
    for s in group:
        j0 = 0
        while j0 < s.rows:
            take = min(room, s.rows - j0)
            out.append(s._replace(rows=take, first=s.first + j0))
            j0 += take
            room -= take
            if room == 0:
                yield out
                out, room = [], max_rows
    if out:
        yield out
