"""The requests decoded together, and the one place that calls the model (``Batch.call``).

A batch is any number of requests (one included: a single ``decode`` is a batch of one) that
share the decoding parameters. Prompts are left-padded to a common width ``P0`` with a pad id
distinct from the mask id, so that every request's generation region is the same columns of the
canvas; the attention mask hides the padding from every query and rotary positions ignore it.
Per request: its randomness (a generator seeded from seed, request index and repeat index), its
KV cache (``cache=prefix|dual``: its row of the batch's cache tensors, ``cache.BatchKV``) and its
call accounting. Nothing is shared between requests but the physical model calls, so batching
changes no output and no per-request NFE.

``Batch.call`` takes the branch rows of every live request as one tensor ``[R, M, L]`` with a
row count per request, and assembles them into physical model calls with index operations: one
per round, or two when KV caches make some requests' calls full and others' cached (each request
still counts one call), or more when a step caps the rows of a physical call (calibration). The
layout needs one small tensor on the host (``Batch.plan``: row counts, position ranges, cache
flags of every request), which the loop reads together with the round's stop flags. Cache
decisions and commits are tensor operations over all requests at once.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..tensors.uploads import upload
from .blocks import block_size_of, reach, region_layout
from .cache import BatchKV
from .compiled import compiled_stats_from_logits, step_options
from .common import (Stats, entropy_from_logits, first_true, fixed_sum, gumbel_like, mix_seed,
                     stats_from_logits)


def pad_id_of(model) -> int:
    """The model's pad id (else its first end-of-text id); never the mask id."""
    pad = getattr(model, "pad_id", None)
    if pad is None:
        pad = model.eos_ids[0]
    if int(pad) == int(model.mask_id):
        raise ValueError(f"pad id {pad} equals the mask id: batching needs a pad id distinct "
                         "from the mask id")
    return int(pad)


class Batch:
    """Geometry, randomness, caches and call accounting of requests decoded together.

    Requests are numbered 0..n-1 in the order given; the loop passes ``ids``, the numbers of the
    requests still decoding, in that order, with every batched tensor ([R, ...], R = len(ids)).
    Canvas tensors here are generation regions [..., L]; ``prompt`` [n, P0] holds the padded
    prompts. On a block-diffusion model (``block_size``) a region is ``gen_length + B`` wide and
    starts at the model block that holds the prompt's end (``blocks``): request i's first
    ``start[i]`` region positions are its prompt's last tokens, and ``prompt`` the rest.
    ``nfe[i]`` counts the model calls that carried rows of request i, ``rows[i]`` the rows it
    sent.
    """

    def __init__(self, model, prompts: list[Tensor], params, *, vocab=None,
                 request_indices: list[int], repeat_indices: list[int], reveal: int = 0,
                 invariant: bool = False):
        self.model = model
        self.p = params
        self.n = len(prompts)
        self.device = prompts[0].device
        self.L, self.B = params.gen_length, params.block_length
        # block-diffusion model (``blocks``): decoding blocks are its attention blocks, and the
        # region starts at the model block holding the prompt's end (``start`` [n])
        self.block_size = block_size_of(model)
        self.start: list[int] = [0] * self.n
        self._start_live: Tensor | None = None
        if self.block_size is not None:        # block_length == block_size: checked by the caller
            filler = pad_id_of(model) if any(int(p.shape[0]) == 0 for p in prompts) else 0
            prompts, self.region0, self.start = region_layout(
                prompts, self.B, self.L, int(model.mask_id), filler)
            self.L += self.B
        self.nb = self.L // self.B
        self.mask_id = int(model.mask_id)
        self.eos = upload(sorted({int(e) for e in model.eos_ids}), self.device)
        self.early_stop = params.early_stop
        self.temperature = params.temperature
        self.reveal = reveal
        self.vocab = vocab
        self.idx = torch.arange(self.L, device=self.device)
        self.blk = self.idx // self.B
        self.P0 = max(int(p.shape[0]) for p in prompts)
        pads = [self.P0 - int(p.shape[0]) for p in prompts]
        self.padded = [k > 0 for k in pads]
        pad_id = pad_id_of(model) if any(pads) else 0
        self.prompt = torch.stack([torch.cat([torch.full((k,), pad_id, dtype=torch.long,
                                                         device=self.device), p])
                                   for k, p in zip(pads, prompts)])                  # [n, P0]
        T = self.P0 + self.L
        self.attention = None                                                      # [n, T]
        if any(pads):
            pad_t = upload(pads, self.device)
            self.attention = (torch.arange(T, device=self.device) >= pad_t[:, None]).long()
        self._seeds = [mix_seed(params.seed, r, k) for r, k in zip(request_indices,
                                                                   repeat_indices)]
        self._gens: list[torch.Generator | None] = [None] * self.n
        # the batch's caches, created here, so nothing leaks between batches
        self.cache: BatchKV | None = None
        if params.cache != "none":
            self.cache = BatchKV(params.cache, n=self.n, prompt_len=self.P0, gen_length=self.L,
                                 block_length=self.B, mask_id=self.mask_id, reveal_next=reveal,
                                 device=self.device)
        #: the live requests' numbers, ``ids`` on the host and ``req`` [R] on the device (see
        #: :meth:`live`): every request at first
        self.live(list(range(self.n)))
        self.nfe = [0] * self.n
        self.rows = [0] * self.n
        #: ``torch.compile`` options of the statistics pass when the model asks for it compiled
        self.compile_step = step_options(model)
        #: batch-invariant decoding: every float sum of the decoding side (the softmax
        #: normaliser, entropies, C_total, VIG) in :func:`.common.fixed_sum`'s order, so that a
        #: request's statistics never depend on the rows decoded beside it
        self.invariant = invariant

    # ------------------------------------------------------------ per-request randomness

    def generator(self, i: int) -> torch.Generator:
        """Request i's generator, seeded from (seed, request index, repeat index)."""
        g = self._gens[i]
        if g is None:
            try:
                g = torch.Generator(device=self.device)
            except RuntimeError:  # backends without device generators
                g = torch.Generator()
            g.manual_seed(self._seeds[i])
            self._gens[i] = g
        return g

    def rand(self) -> Tensor:
        """[R, L] uniform [0, 1) draws of the live requests, row r from the r-th one's
        generator. Each request's generator draws on its own (the same values at any batch
        size), so a compiled round (``compile_round``) makes these draws outside its programs
        (:data:`.compiled.OUTSIDE_PROGRAMS`), and reads the live requests here rather than
        taking them as an argument."""
        out = []
        for i in self.ids:
            g = self.generator(i)
            out.append(torch.rand(self.L, generator=g, device=g.device))
        return torch.stack(out).to(self.device)

    # ------------------------------------------------------------ the region

    def initial(self) -> Tensor:
        """The requests' initial regions [n, L]: all masks, or (block-diffusion model) the
        prompt's last tokens, masks, and filler (see ``blocks``)."""
        if self.block_size is None:
            return torch.full((self.n, self.L), self.mask_id, dtype=torch.long,
                              device=self.device)
        return self.region0.clone()

    def live(self, ids: list[int]) -> None:
        """The loop names the live requests (the leading dim of every state the rules below
        get) whenever they change: ``req`` [R] holds their numbers on the device, and the
        block-diffusion layout their region starts (``start``). A round's tensor code reads
        them here, never from a host list, so it runs the same for any requests."""
        self.ids = list(ids)
        self.req = upload(ids, self.device)
        if self.block_size is not None:
            self._start_live = upload([self.start[i] for i in ids], self.device)

    def answer(self, i: int, values: list) -> list:
        """Request i's ``gen_length`` answer positions of per-region-position ``values``."""
        return values[self.start[i]:self.start[i] + self.p.gen_length]

    def rowsum(self, x: Tensor) -> Tensor:
        """Sum over the last dim: in a fixed order for batch-invariant decoding."""
        return fixed_sum(x) if self.invariant else x.sum(-1)

    # ------------------------------------------------------------ rules on states [..., L]

    def working_set(self, zg: Tensor, reveal: int = 0) -> Tensor:
        """W [..., L]: masked positions of the active block of state(s) ``zg`` [..., L].

        With ``reveal`` N_s > 0 and at most N_s masks left in the active block, the masked
        positions of the next block join (the last block has no next block).
        """
        masked = zg == self.mask_id
        a = first_true(masked).unsqueeze(-1) // self.B   # nb when there is no mask
        act = masked & (self.blk == a)
        if reveal <= 0:
            return act
        more = act.sum(dim=-1, keepdim=True) <= reveal
        return act | (masked & (self.blk == a + 1) & more)

    def block_masks(self, zg: Tensor) -> Tensor | int:
        """Masks the active block of each live state ``zg`` [R, L] held when it became active:
        ``B``, less the prompt's tokens in a block-diffusion region's first block ([R, 1])."""
        if self._start_live is None:
            return self.B
        a = first_true(zg == self.mask_id) // self.B
        return self.B - (self._start_live - a * self.B).clamp(0, self.B).unsqueeze(-1)

    def reach(self, own: Tensor) -> Tensor | None:
        """[R, K, L]: positions each branch's own position (``own`` [R, K, L]) can influence on a
        block-diffusion model (its block and later ones); None on a bidirectional one (all)."""
        return None if self.block_size is None else reach(own, self.B)

    def stop_index(self, zg: Tensor) -> Tensor:
        """[...] long: early-stop position e of state(s) ``zg`` [..., L], or -1 (none / early stop
        off). e = first end-of-text position with every earlier position unmasked."""
        eos = torch.isin(zg, self.eos) & (self.idx < first_true(zg == self.mask_id).unsqueeze(-1))
        if self._start_live is not None:      # the prompt's tokens in the region never stop it
            eos &= self.idx >= self._start_live.view(-1, *([1] * (zg.dim() - 1)))
        e = first_true(eos)
        if not self.early_stop:
            return torch.full_like(e, -1)
        return torch.where(e < self.L, e, torch.full_like(e, -1))

    def finished(self, zg: Tensor) -> Tensor:
        """[...] bool: state(s) ``zg`` [..., L] have no mask left or meet the early-stop rule."""
        return ~(zg == self.mask_id).any(-1) | (self.stop_index(zg) >= 0)

    def in_vocab(self, tok: Tensor) -> Tensor:
        """Bool mask: ``tok`` is in the planning vocabulary (all False without one)."""
        if self.vocab is None:
            return torch.zeros_like(tok, dtype=torch.bool)
        return self.vocab.eligible_mask(tok)

    # ------------------------------------------------------------ the model call

    def plan(self, rows: Tensor, n: Tensor, *, cover: Tensor | None = None) -> Tensor:
        """[R, C] long, on the device: what :meth:`call` must know on the host to lay out the
        physical calls of the first ``n[r]`` rows of ``rows`` [R, M, L] for each live request
        (``req``): per request its row count, the first and last active block of its rows that
        hold a mask (-1: none), and, with a KV cache, its cache flags (:meth:`.BatchKV.flags`).
        ``cover`` as for :meth:`call`. Reading it is the caller's: the loop reads it together
        with the round's stop flags, in the round's one read."""
        M = rows.shape[1]
        B, nb = self.B, self.nb
        a = first_true(rows == self.mask_id) // B                          # [R, M]; nb: no mask
        valid = torch.arange(M, device=rows.device) < n[:, None]
        lo_b = torch.where(valid, a, torch.full_like(a, nb)).min(-1).values
        hi_b = torch.where(valid & (a < nb), a, torch.full_like(a, -1)).max(-1).values
        if cover is not None:               # the step needs stats from this block on too
            lo_b = torch.minimum(lo_b, cover // B)
            hi_b = torch.maximum(hi_b, cover // B)   # also rows left without a mask (switch 6)
        cols = [n, lo_b, hi_b]
        if self.cache is not None:
            cols += list(self.cache.flags(self.req, rows, a, valid).unbind(-1))
        return torch.stack(cols, dim=-1)

    def call(self, ids: list[int], rows: Tensor, n: Tensor, *, plan: list[list[int]] | None = None,
             entropy: bool = False, max_rows: int | None = None,
             cover: Tensor | None = None) -> Stats:
        """Run the first ``n[r]`` rows of ``rows`` [R, M, L] (generation regions) for each request
        ``ids[r]``; returns their stats [R, M, L] (rows not sent: mask / 0).

        Each request's rows request generation positions [lo, hi): from the earliest active block
        of its rows to the end of the block after the latest one (the next step's stats need the
        active + next block of whichever row is committed; on a block-diffusion model, the next
        block only when the step reveals it, and the call then runs on the canvas up to that
        end); rows without a mask do not widen it.
        ``plan``: the rows of :meth:`plan` for these rows, as the caller read them (the loop's
        round read); None: read here (one host read).
        ``max_rows`` caps the rows of one physical call (more calls, each counted).
        ``cover`` [R] (optional): a generation position per request from which on the call
        must cover stats too (``rules=reference`` reads positions its rows already filled, and
        its second call after a failed plan may send rows with no mask left).
        """
        R, M, L = rows.shape
        B = self.B
        kc = self.cache
        if kc is not None and max_rows is not None:
            raise ValueError("max_rows (rows per physical call) cannot be combined with a "
                             "KV cache: a request's rows must share one call")
        host = self.plan(rows, n, cover=cover).tolist() if plan is None else plan
        # stats cover the active block and the next one, which a revealing step's next working
        # set may hold; a block-diffusion model's next block is never read otherwise
        ahead = 1 if self.block_size is not None and self.reveal == 0 and cover is None else 2
        # seats: (r, request, rows, lo, hi, span or None, first row)
        refresh_group, full_group, cached_group = [], [], []
        for r, i in enumerate(ids):
            k, lb, hb = host[r][:3]
            if k == 0:
                continue
            if hb < 0:
                raise RuntimeError("forward called on rows without any mask")
            lo, hi = lb * B, min(L, (hb + ahead) * B)
            if kc is not None and not host[r][3]:
                span = kc.span(host[r][4], host[r][5])
                cached_group.append((r, i, k, lo, min(hi, span[1]), span, 0))
            elif kc is not None and kc.base_refresh and host[r][6]:
                # dual_base: the base row alone refreshes the cache, the others are cached
                span = kc.span(host[r][7], host[r][8])
                refresh_group.append((r, i, 1, lo, hi, None, 0))
                cached_group.append((r, i, k - 1, lo, min(hi, span[1]), span, 1))
            else:
                full_group.append((r, i, k, lo, hi, None, 0))
        if kc is not None and not cached_group and not refresh_group:
            # every calling request refreshes (always so for one request): free the old caches
            # before the full call, so that they do not sit beside its activations and rows
            kc.kv = None
        # flat outputs with one spare slot at the end, where padded query positions write
        tok = torch.full((R * M * L + 1,), self.mask_id, dtype=torch.long, device=self.device)
        nf = 4 if entropy else 3
        val = torch.zeros((nf, R * M * L + 1), dtype=torch.float32, device=self.device)
        flat = rows.reshape(R * M, L)
        for group, refresh in ((refresh_group, True), (full_group, False), (cached_group, False)):
            for chunk in _chunks(group, max_rows):
                self._physical(chunk, flat, M, tok, val, entropy, refresh)
        tok, val = tok[:-1].view(R, M, L), val[:, :-1].view(nf, R, M, L)
        return Stats(tok, val[0], val[1], val[2], val[3] if entropy else None)

    def _physical(self, seats: list[tuple], flat: Tensor, M: int, tok_out: Tensor,
                  val_out: Tensor, entropy: bool, refresh: bool = False) -> None:
        """One model call over ``seats`` [(r, request, rows, lo, hi, span, first row)...]; writes
        each row's stats into ``tok_out`` [R*M*L + 1] / ``val_out`` [k, R*M*L + 1] (flat
        [R*M, L] plus a spare slot) at its layout row."""
        dev = self.device
        layout, owner, lens = [], [], []
        for r, i, k, lo, hi, _, j0 in seats:
            layout += range(r * M + j0, r * M + j0 + k)
            owner += [i] * k
            lens.append(hi - lo)
        N = len(layout)
        index = upload([layout, owner], dev)
        gen = flat.index_select(0, index[0])
        tokens = torch.cat([self.prompt.index_select(0, index[1]), gen], dim=1)    # [N, T]
        P = max(lens)
        at = index[0][:, None] * self.L                                         # [N, 1]
        if len(seats) == 1:
            _, i, k, lo, hi, *_ = seats[0]
            positions = torch.arange(self.P0 + lo, self.P0 + hi, device=dev)
            gpos = positions.expand(N, P) - self.P0
            at = at + gpos
        else:
            lo_len = upload([[lo, hi - lo] for _, _, k, lo, hi, *_ in seats
                             for _ in range(k)], dev)                           # [N, 2]
            j = torch.arange(P, device=dev)[None]
            step = torch.minimum(j, lo_len[:, 1:] - 1)
            gpos = lo_len[:, :1] + step                                          # [N, P]
            positions = gpos + self.P0
            # positions past a row's range repeat its last one: their outputs go to the spare
            at = torch.where(j < lo_len[:, 1:], at + gpos, tok_out.shape[0] - 1)
        attention = None
        if self.attention is not None and any(self.padded[i] for _, i, *_ in seats):
            attention = self.attention.index_select(0, index[1])
        if self.block_size is not None and self.cache is None:
            # block-causal: positions after the last requested block cannot influence any
            # requested one, so the call runs on the canvas up to that block's end
            end = self.P0 + max(hi for _, _, _, _, hi, *_ in seats)
            tokens = tokens[:, :end]
            attention = None if attention is None else attention[:, :end]
        cache = None
        if self.cache is not None:
            spans = None if seats[0][5] is None else [s[5] for s in seats]
            cache = self.cache.call([s[1] for s in seats], [s[2] for s in seats], spans,
                                    gen=gen, row_r=index[0] // M, refresh=refresh)
        logits = self.model.logits(tokens, positions, attention_mask=attention, cache=cache)
        for _, i, k, *_ in seats:
            self.nfe[i] += 1
            self.rows[i] += k
        ent = entropy_from_logits(logits, self.mask_id, fixed=self.invariant) if entropy else None
        noise = None
        if self.temperature > 0:
            noise = self._noise(seats, P, logits.shape[-1]).to(logits.device)
        cur = gen.gather(1, gpos)
        if self.compile_step is None or self.invariant:   # the fixed-order sums run eager
            tok, conf, pmax, pcur = stats_from_logits(logits, cur, self.mask_id,
                                                      self.temperature, noise,
                                                      fixed=self.invariant)
        else:
            tok, conf, pmax, pcur = compiled_stats_from_logits(
                logits, cur, self.mask_id, self.temperature, noise, options=self.compile_step)
        vals = [conf, pmax, pcur] + ([ent] if entropy else [])
        # each row's stats land at (its layout row, its positions) of the flat outputs
        at = at.reshape(-1)
        tok_out.index_put_((at,), tok.to(dev).reshape(-1))
        for f, v in enumerate(vals):
            val_out[f].index_put_((at,), v.to(dev).reshape(-1))

    def _noise(self, seats: list[tuple], P: int, V: int) -> Tensor:
        """Gumbel noise per row [N, P, V] (or [P, V] for one request): each request draws
        [hi - lo, V] from its generator, shared by its rows, repeated along the padding."""
        per = []
        for _, i, k, lo, hi, *_ in seats:
            g = self.generator(i)
            z = gumbel_like((hi - lo, V), g, g.device)
            if hi - lo < P:
                z = torch.cat([z, z[-1:].expand(P - (hi - lo), V)])
            per.append(z)
        if len(per) == 1:
            return per[0]
        counts = [k for _, _, k, *_ in seats]
        # output_size: the length is known here, so the device is never asked for it
        return torch.repeat_interleave(torch.stack(per), upload(counts, per[0].device),
                                       dim=0, output_size=sum(counts))

    def commit_caches(self, ids: list[int], y: Tensor) -> None:
        """After a round committed states ``y`` [R, L] (live order): requests whose call was
        full keep the committed row's keys/values (one set of tensor operations for all)."""
        if self.cache is not None:
            self.cache.commit(y)


def _chunks(group: list[tuple], max_rows: int | None):
    """Seats (r, request, rows, lo, hi, span, first row) cut into physical calls of at most
    ``max_rows`` rows; yields lists of seats."""
    if not group:
        return
    if max_rows is None:
        yield group
        return
    out, room = [], max_rows
    for r, i, k, lo, hi, span, first in group:
        j0 = 0
        while j0 < k:
            take = min(room, k - j0)
            out.append((r, i, take, lo, hi, span, first + j0))
            j0 += take
            room -= take
            if room == 0:
                yield out
                out, room = [], max_rows
    if out:
        yield out
