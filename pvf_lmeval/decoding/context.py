"""Per-request decoding context: the canvas geometry, the model call, call accounting, stop rules.

The context owns every model call (``forward``), so NFE and branch rows are counted in one place,
and the (future) KV cache object is threaded through here: ``self.cache`` is passed to every
``model.logits`` call.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .common import (Stats, StepResult, entropy_from_logits, first_true, gumbel_like, mix_seed,
                     stats_from_logits)
from .cache import KVCache
from .params import DecodeParams


class Ctx:
    """Geometry, model access and counters for decoding one request.

    Canvas tensors are [T] or [N, T] long (prompt + L generation positions); ``gen(z)`` views the
    generation region. ``nfe`` counts model calls, ``rows`` sums their batch rows.
    """

    def __init__(self, model, prompt: Tensor, params: DecodeParams, *, request_index: int = 0,
                 repeat_index: int = 0, trace: bool = False, online=None, batch=None):
        self.model = model
        self.p = params
        self.device = prompt.device
        self.P0 = int(prompt.shape[0])
        self.L = params.gen_length
        self.B = params.block_length
        self.nb = self.L // self.B
        self.mask_id = int(model.mask_id)
        self.eos = torch.tensor(sorted({int(e) for e in model.eos_ids}), dtype=torch.long,
                                device=self.device)
        self.early_stop = params.early_stop
        self.temperature = params.temperature
        self.trace = trace
        self.idx = torch.arange(self.L, device=self.device)
        self.blk = self.idx // self.B
        vocab = params.plan_vocab or ()
        self.vocab = torch.tensor(vocab, dtype=torch.long, device=self.device)
        # Online planning vocabulary (``decoding.online.OnlineVocab``) or None: when set, it
        # replaces ``plan_vocab`` (eligible ids + exploration) and records planning outcomes.
        self.online = online
        self.plan_tried = 0      # planning candidates verified (non-vacuous impact set or not)
        self.plan_passed = 0     # ... of which passed the impact-set check (A_j = 1)
        self._seed = mix_seed(params.seed, request_index, repeat_index)
        self._gen: torch.Generator | None = None
        # KV cache of this request (``cache=prefix|dual``, see ``cache.py``), passed to every
        # call; created here, per request, so nothing leaks between requests.
        self.cache = None
        if params.cache != "none":
            reveal = params.reveal_next if params.decoder in ("pvf", "explore") else 0
            self.cache = KVCache(params.cache, prompt_len=self.P0, gen_length=self.L,
                                 block_length=self.B, mask_id=self.mask_id, reveal_next=reveal,
                                 device=self.device)
        # Batched decoding (``batch.py``): the handle that pools this request's calls with the
        # other requests' (its prompt is left-padded there); None = a call of its own.
        self.batch = batch
        self.nfe = 0
        self.rows = 0

    # ------------------------------------------------------------ helpers

    @property
    def generator(self) -> torch.Generator:
        """The request's generator, seeded from (seed, request index, repeat index)."""
        if self._gen is None:
            try:
                g = torch.Generator(device=self.device)
            except RuntimeError:  # backends without device generators
                g = torch.Generator()
            g.manual_seed(self._seed)
            self._gen = g
        return self._gen

    def rand(self, n: int) -> Tensor:
        """n uniform [0, 1) draws on the device from the request's generator."""
        g = self.generator
        return torch.rand(n, generator=g, device=g.device).to(self.device)

    def gen(self, z: Tensor) -> Tensor:
        """Generation region of canvas(es) ``z`` ([..., L] view)."""
        return z[..., self.P0:]

    def with_gen(self, y: Tensor, zg: Tensor) -> Tensor:
        """Canvas equal to ``y`` ([T]) with generation region ``zg`` ([L])."""
        z = y.clone()
        z[self.P0:] = zg
        return z

    def in_vocab(self, tok: Tensor) -> Tensor:
        """Bool mask: ``tok`` is in the planning vocabulary (all False for an empty vocabulary).

        With an online vocabulary: its currently eligible ids."""
        if self.online is not None:
            return self.online.eligible_mask(tok)
        if self.vocab.numel() == 0:
            return torch.zeros_like(tok, dtype=torch.bool)
        return torch.isin(tok, self.vocab)

    def working_set(self, zg: Tensor, reveal_next: int = 0) -> Tensor:
        """W [..., L]: masked positions of the active block of state(s) ``zg`` [..., L].

        With ``reveal_next`` N_s > 0 and at most N_s masks left in the active block, the masked
        positions of the next block join (the last block has no next block).
        """
        masked = zg == self.mask_id
        a = first_true(masked).unsqueeze(-1) // self.B   # nb when there is no mask
        act = masked & (self.blk == a)
        if reveal_next <= 0:
            return act
        reveal = act.sum(dim=-1, keepdim=True) <= reveal_next
        return act | (masked & (self.blk == a + 1) & reveal)

    def stop_index(self, zg: Tensor) -> Tensor:
        """0-d tensor: early-stop position e of state ``zg`` [L], or -1 (none / early stop off).

        e = first end-of-text position with every earlier position unmasked.
        """
        eos = torch.isin(zg, self.eos) & (self.idx < first_true(zg == self.mask_id))
        e = first_true(eos)
        if not self.early_stop:
            return torch.full_like(e, -1)
        return torch.where(e < self.L, e, torch.full_like(e, -1))

    def finished(self, zg: Tensor) -> bool:
        """True if state ``zg`` [L] has no mask left or meets the early-stop condition (1 read)."""
        done = ~(zg == self.mask_id).any() | (self.stop_index(zg) >= 0)
        return bool(done.item())

    # ------------------------------------------------------------ the model call

    def forward(self, rows: Tensor, entropy: bool = False) -> Stats:
        """One model call on branch rows [N, T]; counts 1 NFE and N rows.

        ``entropy``: also compute the per-position entropy (``Stats.ent``); off by default.

        Requests only generation positions [lo, hi): from the earliest active block of the rows
        to the end of the block after the latest one (the next step's stats need active + next
        block of whichever row is committed). Rows without a mask do not widen the range.
        """
        rg = self.gen(rows)
        a = first_true(rg == self.mask_id) // self.B      # nb for rows without a mask
        lo_b = a.min()
        hi_b = torch.where(a < self.nb, a, torch.full_like(a, -1)).max()
        flags = self.cache.flags(rg, a) if self.cache is not None else []
        lo_b, hi_b, *flags = torch.stack([lo_b, hi_b, *flags]).tolist()
        if hi_b < 0:
            raise RuntimeError("forward called on rows without any mask")
        lo, hi = lo_b * self.B, min(self.L, (hi_b + 2) * self.B)
        if self.cache is not None:
            lo, hi = self.cache.plan(flags, rg, lo, hi)
        positions = torch.arange(self.P0 + lo, self.P0 + hi, device=self.device)
        if self.batch is not None:
            logits = self.batch.call(self, rows, positions)
        else:
            logits = self.model.logits(rows, positions, attention_mask=None, cache=self.cache)
        ent = entropy_from_logits(logits, self.mask_id) if entropy else None
        self.nfe += 1
        self.rows += int(rows.shape[0])
        noise = None
        if self.temperature > 0:
            g = self.generator
            noise = gumbel_like((hi - lo, logits.shape[-1]), g, g.device).to(logits.device)
        tok, conf, pmax, pcur = stats_from_logits(
            logits, rg[:, lo:hi], self.mask_id, self.temperature, noise)
        N = rows.shape[0]
        full_tok = torch.full((N, self.L), self.mask_id, dtype=torch.long, device=self.device)
        full_tok[:, lo:hi] = tok.to(self.device)
        full = torch.zeros((3, N, self.L), dtype=torch.float32, device=self.device)
        full[:, :, lo:hi] = torch.stack([conf, pmax, pcur]).to(self.device)
        full_ent = None
        if ent is not None:
            full_ent = torch.zeros((N, self.L), dtype=torch.float32, device=self.device)
            full_ent[:, lo:hi] = ent.to(self.device)
        return Stats(full_tok, full[0], full[1], full[2], lo, hi, full_ent)

    def committed(self, y: Tensor) -> None:
        """The loop calls this after every step with the committed canvas ``y`` [T] (the KV
        cache keeps that row's keys/values when the step's call was full)."""
        if self.cache is not None:
            self.cache.commit(self.gen(y))

    def commit_single(self, y: Tensor, zg: Tensor, labels: Tensor, info: dict | None = None
                      ) -> StepResult:
        """Commit state ``zg`` [L] with a single-row call (none if it is finished)."""
        z = self.with_gen(y, zg)
        if self.finished(zg):
            return StepResult(z, labels, None, info or {})
        return StepResult(z, labels, self.forward(z.unsqueeze(0)).row(0), info or {})
