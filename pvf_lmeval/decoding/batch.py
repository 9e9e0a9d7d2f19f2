"""The requests decoded together: their state, the rules every decoder step applies to it, and
their randomness (:class:`Batch`). The model call is the runner's (:mod:`.runner`).

A batch is any number of requests (one included: a single ``decode`` is a batch of one) that
share the decoding parameters. Prompts are left-padded to a common width ``P0`` with a pad id
distinct from the mask id, so that every request's generation region is the same columns of the
canvas; the attention mask hides the padding from every query and rotary positions ignore it.
Per request: its randomness (a generator seeded from seed, request index and repeat index).
Nothing is shared between requests but the physical model calls, so batching changes no output
and no per-request NFE.
"""

from __future__ import annotations

import hashlib

import torch
from torch import Tensor

from ..tensors.fixed_order import fixed_sum
from ..tensors.uploads import upload
from .blocks import block_size_of, reach, region_layout
from .draws import Draw, draw_one, draw_plan
from .select import first_true


def mix_seed(seed: int, request_index: int, repeat_index: int) -> int:
    """Deterministic 63-bit seed from (seed, request index, repeat index), process-independent."""
    h = hashlib.blake2b(f"{seed}/{request_index}/{repeat_index}".encode(), digest_size=8)
    return int.from_bytes(h.digest(), "little") & ((1 << 63) - 1)


def gumbel_like(shape: tuple[int, ...], generator: torch.Generator, device) -> Tensor:
    """Standard Gumbel noise of ``shape`` (float32) drawn from ``generator``."""
    u = torch.rand(shape, generator=generator, device=device, dtype=torch.float32)
    return -torch.log(-torch.log(u.clamp_(min=torch.finfo(torch.float32).tiny)))


def is_uniform_state(model) -> bool:
    """Whether ``model`` is a uniform-state diffusion model (a ``canvas_length``, no mask)."""
    return getattr(model, "canvas_length", None) is not None


def pad_id_of(model) -> int:
    """The model's pad id (else its first end-of-text id); never the mask id."""
    pad = getattr(model, "pad_id", None)
    if pad is None:
        pad = model.eos_ids[0]
    if not is_uniform_state(model) and int(pad) == int(model.mask_id):
        raise ValueError(f"pad id {pad} equals the mask id: batching needs a pad id distinct "
                         "from the mask id")
    return int(pad)


class Batch:
    """Geometry, randomness and live set of requests decoded together, and the rules on their
    states that the decoder steps share.

    Requests are numbered 0..n-1 in the order given; the loop passes ``ids``, the numbers of the
    requests still decoding, in that order, with every batched tensor ([R, ...], R = len(ids)).
    Canvas tensors here are generation regions [..., L]; ``prompt`` [n, P0] holds the padded
    prompts. On a block-diffusion model (``block_size``) a region is ``gen_length + B`` wide and
    starts at the model block that holds the prompt's end (``blocks``): request i's first
    ``start[i]`` region positions are its prompt's last tokens, and ``prompt`` the rest.

    A uniform-state model (``uniform``: DiffusionGemma) has no mask token (``mask_id`` None):
    its region is ``gen_length / canvas_length`` canvases (blocks of ``canvas_length``); a
    canvas starts as uniform random tokens (:meth:`noise`) and the step says which positions
    are open (``Step.open``). Filler (the pad id) stands in the canvases not started yet,
    which no call reads.
    """

    def __init__(self, model, prompts: list[Tensor], params, *, vocab=None,
                 request_indices: list[int], repeat_indices: list[int], reveal: int = 0,
                 invariant: bool = False, switches=frozenset()):
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
        self.uniform = is_uniform_state(model)
        self.mask_id = None if self.uniform else int(model.mask_id)
        self.vocab_size = int(model.vocab_size) if self.uniform else None
        self.eos = upload(sorted({int(e) for e in model.eos_ids}), self.device)
        self.early_stop = params.early_stop
        self.temperature = params.temperature
        self.top_k, self.top_p = params.top_k, params.top_p
        self.reveal = reveal
        self.vocab = vocab
        self.idx = torch.arange(self.L, device=self.device)
        self.blk = self.idx // self.B
        self.P0 = max(int(p.shape[0]) for p in prompts)
        pads = [self.P0 - int(p.shape[0]) for p in prompts]
        self.padded = [k > 0 for k in pads]
        pad_id = pad_id_of(model) if any(pads) or self.uniform else 0
        self.pad_id = pad_id
        self.prompt = torch.stack([torch.cat([torch.full((k,), pad_id, dtype=torch.long,
                                                         device=self.device), p])
                                   for k, p in zip(pads, prompts)])                  # [n, P0]
        T = self.P0 + self.L
        self.attention = None                                                      # [n, T]
        if any(pads):
            pad_t = upload(pads, self.device)
            self.attention = (torch.arange(T, device=self.device) >= pad_t[:, None]).long()
        #: the loop switches on for the decoder (``Step.switches``)
        self.switches = frozenset(switches)
        self._seeds = [params.seed if "torch_seed" in self.switches else mix_seed(params.seed, r, k)
                       for r, k in zip(request_indices, repeat_indices)]
        self._gens: list[torch.Generator | None] = [None] * self.n
        #: the live requests' numbers, ``ids`` on the host and ``req`` [R] on the device (see
        #: :meth:`live`): every request at first
        self.live(list(range(self.n)))
        #: batch-invariant decoding: every float sum of the decoding side (the softmax
        #: normaliser, entropies, C_total, VIG) in :func:`pvf_lmeval.tensors.fixed_order.fixed_sum`'s order, so that a
        #: request's statistics never depend on the rows decoded beside it
        self.invariant = invariant

    # ------------------------------------------------------------ per-request randomness

    def generator(self, i: int) -> torch.Generator:
        """Request i's generator, seeded from (seed, request index, repeat index); with the
        ``torch_seed`` switch on, from ``seed`` itself (``rules=reference``)."""
        g = self._gens[i]
        if g is None:
            try:
                g = torch.Generator(device=self.device)
            except RuntimeError:  # backends without device generators
                g = torch.Generator()
            g.manual_seed(self._seeds[i])
            self._gens[i] = g
        return g

    def draw(self, plan: tuple) -> tuple[Tensor, ...]:
        """The draws of ``plan`` (``Step.draw_plan``) for the live requests, one tensor
        [R, ...] per draw, row r from the r-th one's generator: each request's generator draws
        on its own (the same values at any batch size). The loop makes them before the step."""
        return draw_plan(plan, self.ids, self.generator, self.device)

    def noise(self, requests: list[int]) -> Tensor:
        """[len(requests), B] uniform random token ids in [0, vocab_size) (a uniform-state
        canvas's noise), row r from request ``requests[r]``'s generator."""
        d = Draw("randint", (self.B,), self.vocab_size)
        return torch.stack([draw_one(d, self.generator(i)) for i in requests]).to(self.device)

    # ------------------------------------------------------------ the region

    def initial(self) -> Tensor:
        """The requests' initial regions [n, L]: all masks, or (block-diffusion model) the
        prompt's last tokens, masks, and filler (see ``blocks``), or (uniform-state model) the
        first canvas's noise (:meth:`noise`, one draw per request) and filler."""
        if self.uniform:
            y = torch.full((self.n, self.L), self.pad_id, dtype=torch.long, device=self.device)
            y[:, :self.B] = self.noise(list(range(self.n)))
            return y
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

    def working_set(self, zg: Tensor, reveal: int = 0, open: Tensor | None = None,
                    active: Tensor | None = None) -> Tensor:
        """W [..., L]: open positions (``open``; None: the masks) of the active block of
        state(s) ``zg`` [..., L]: the block of the first open position, or ``active`` [...]
        (a block a step holds, which may have none left).

        With ``reveal`` N_s > 0 and at most N_s open positions left in the active block, the
        open positions of the next block join (the last block has no next block).
        """
        masked = zg == self.mask_id if open is None else open
        if active is None:
            active = first_true(masked) // self.B        # nb when there is no mask
        a = active.unsqueeze(-1)
        act = masked & (self.blk == a)
        if reveal <= 0:
            return act
        more = act.sum(dim=-1, keepdim=True) <= reveal
        return act | (masked & (self.blk == a + 1) & more)

    def block_masks(self, zg: Tensor, open: Tensor | None = None) -> Tensor | int:
        """Masks the active block of each live state ``zg`` [R, L] held when it became active:
        ``B``, less the prompt's tokens in a block-diffusion region's first block ([R, 1])
        (``open``: the states' open positions, None: their masks)."""
        if self._start_live is None:
            return self.B
        a = first_true(zg == self.mask_id if open is None else open) // self.B
        return self.B - (self._start_live - a * self.B).clamp(0, self.B).unsqueeze(-1)

    def reach(self, own: Tensor) -> Tensor | None:
        """[R, K, L]: positions each branch's own position (``own`` [R, K, L]) can influence on a
        block-diffusion model (its block and later ones); None on a bidirectional one (all)."""
        return None if self.block_size is None else reach(own, self.B)

    def stop_index(self, zg: Tensor, open: Tensor | None = None,
                   settled: Tensor | None = None) -> Tensor:
        """[...] long: early-stop position e of state(s) ``zg`` [..., L], or -1 (none / early stop
        off). e = first end-of-text position among the settled positions: those before
        ``settled`` [...] (``Step.settled``; None: the first open position, ``open`` or the
        masks). With the ``stop_after_block`` switch, the end-of-text must lie in a settled
        block (the request stops after that block: :meth:`fill_from`)."""
        if settled is None:
            settled = first_true(zg == self.mask_id if open is None else open)
        upto = settled.unsqueeze(-1)
        if "stop_after_block" in self.switches:
            upto = (upto // self.B) * self.B
        eos = torch.isin(zg, self.eos) & (self.idx < upto)
        if self._start_live is not None:      # the prompt's tokens in the region never stop it
            eos &= self.idx >= self._start_live.view(-1, *([1] * (zg.dim() - 1)))
        e = first_true(eos)
        if not self.early_stop:
            return torch.full_like(e, -1)
        return torch.where(e < self.L, e, torch.full_like(e, -1))

    def fill_from(self, e: Tensor) -> Tensor:
        """[R] long: the early stop at ``e`` [R] fills the positions after this one: e itself,
        or, with the ``stop_after_block`` switch, the last position of e's block (the tokens
        after end-of-text inside it stay as decoded)."""
        if "stop_after_block" in self.switches:
            return torch.where(e >= 0, (e // self.B + 1) * self.B - 1, e)
        return e

    def finished(self, zg: Tensor, open: Tensor | None = None, hold: Tensor | None = None,
                 settled: Tensor | None = None) -> Tensor:
        """[...] bool: state(s) ``zg`` [..., L] have no open position left (``open``; None: no
        mask) and hold no block (``hold`` [...]), or meet the early-stop rule (``settled`` as
        for :meth:`stop_index`)."""
        if open is None:
            open = zg == self.mask_id
        done = ~open.any(-1)
        if hold is not None:
            done &= ~hold
        return done | (self.stop_index(zg, open, settled) >= 0)

    def in_vocab(self, tok: Tensor) -> Tensor:
        """Bool mask: ``tok`` is in the planning vocabulary (all False without one)."""
        if self.vocab is None:
            return torch.zeros_like(tok, dtype=torch.bool)
        return self.vocab.eligible_mask(tok)
