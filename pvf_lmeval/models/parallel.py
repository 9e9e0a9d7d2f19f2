"""One network split over the ranks of a tensor-parallel group (``tensor_parallel_size=N``).

:class:`Shard` says what rank ``r`` of ``N`` holds of a network of a given
:class:`~.transformer.TransformerConfig`, and :meth:`Shard.part` what it reads of each
checkpoint tensor; :class:`Comm` holds the group's collectives. Both are ``None`` on a single
process, where the network runs its plain path.

What is split (``parallel_layers``):

- ``experts``: only the routed experts, ``E / N`` consecutive experts per rank; everything else
  is replicated. The combine is exact (each (token, slot) row has one owner; see
  ``moe.RoutedExperts``), so the logits are bit for bit those of one process.
- ``all``: the routed experts as above, plus attention by heads when ``N`` divides the
  key/value heads (else attention is replicated: :meth:`Shard.notes`), the dense and shared
  MLPs by their hidden width (gate/up rows, down columns), and the LM head by vocabulary rows
  (spans ``[r * n // N, (r + 1) * n // N)``, so any ``N`` up to the fewest rows of these parts:
  every rank holds some of each). The row-split products (attention's output projection, the
  MLPs' down projections) give partial sums that :meth:`Comm.sum` adds across ranks in
  float32: the logits differ from one process in the last bits.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

#: values of ``parallel_layers``
LAYERS = ("all", "experts")


class ParallelLayoutError(ValueError):
    """A tensor-parallel layout the model cannot take (a one-line message)."""


class RanksDiverged(RuntimeError):
    """The ranks of a tensor-parallel group are no longer making the same calls (a one-line
    message, printed without a traceback by the lm-eval adapter)."""

    pvf_one_line = True


def span(n: int, size: int, rank: int) -> tuple[int, int]:
    """Rank ``rank``'s part ``[lo, hi)`` of ``n`` items split over ``size`` ranks in order."""
    return rank * n // size, (rank + 1) * n // size


@dataclass(frozen=True)
class Part:
    """What a rank reads of one checkpoint tensor: nothing (``skip``), all of it (no
    ``ranges``), or the index ``ranges`` [(a, b), ...] along ``dim``, concatenated in order."""

    skip: bool = False
    dim: int = 0
    ranges: tuple[tuple[int, int], ...] = ()

    def shape(self, shape: tuple[int, ...]) -> tuple[int, ...] | None:
        """The shape read from a tensor of ``shape`` (None: nothing)."""
        if self.skip:
            return None
        if not self.ranges:
            return tuple(shape)
        out = list(shape)
        out[self.dim] = sum(b - a for a, b in self.ranges)
        return tuple(out)

    def read(self, handle, name: str) -> torch.Tensor:
        """The part of tensor ``name`` of an open safetensors file ``handle``: a whole tensor by
        ``get_tensor``, a part by ``get_slice`` (only its bytes are read)."""
        if not self.ranges:
            return handle.get_tensor(name)
        return self.take(handle.get_slice(name))

    def take(self, whole) -> torch.Tensor:
        """The part of ``whole``: a tensor, or anything indexed like one (a safetensors slice)."""
        if not self.ranges:
            return whole[:]
        lead = (slice(None),) * self.dim
        parts = [whole[lead + (slice(a, b),)] for a, b in self.ranges]
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=self.dim)


WHOLE = Part()
SKIP = Part(skip=True)
#: the last name part of a parameter stacked over the routed experts [E, ...]
STACKED = ("gate_proj", "up_proj", "down_proj", "gate_up_proj")


def stacked_experts(native: str) -> bool:
    """Whether native parameter ``native`` holds every routed expert, stacked (``moe.py``:
    ``blocks.{i}.mlp.gate_proj``, Gemma-4's ``blocks.{i}.moe.gate_up_proj``, ...)."""
    parts = native.split(".")
    return parts[-1] in STACKED and parts[-2] in ("mlp", "moe")


def _split_rows(cfg) -> list[tuple[int, str]]:
    """(rows, what they are) of each part ``parallel_layers=all`` splits by rows: a rank with
    none of them would hold an empty slice, so their fewest bound the ranks."""
    rows = [(cfg.vocab_size, f"the LM head's {cfg.vocab_size} vocabulary rows (vocab_size)")]
    if cfg.has_dense_layer:
        rows.append((cfg.ffn_hidden, f"the MLP's {cfg.ffn_hidden} hidden units (ffn_hidden)"))
    if cfg.moe is not None and cfg.moe.shared_hidden:
        rows.append((cfg.moe.shared_hidden, f"the shared experts' {cfg.moe.shared_hidden} hidden "
                                            f"units (shared_hidden)"))
    return rows


@dataclass(frozen=True)
class Shard:
    """Rank ``rank`` of ``size``'s part of the network of ``cfg`` (see the module docstring).

    ``attention``/``mlp``/``head``: whether those are split; ``experts``: the rank's routed
    experts ``(lo, hi)`` (None: a dense model)."""

    cfg: object
    size: int
    rank: int
    layers: str
    attention: bool
    mlp: bool
    head: bool
    experts: tuple[int, int] | None

    @classmethod
    def plan(cls, cfg, size: int, rank: int, layers: str = "all") -> "Shard":
        """The layout of ``cfg`` on rank ``rank`` of ``size`` (``layers``: one of
        :data:`LAYERS`, as the model args' check leaves it); a one-line
        :class:`ParallelLayoutError` when the model cannot take it."""
        moe = cfg.moe
        if moe is None and layers == "experts":
            raise ParallelLayoutError("parallel_layers=experts: the model is dense (no routed "
                                      "experts to split); use parallel_layers=all")
        if moe is not None and moe.n_experts % size:
            raise ParallelLayoutError(f"tensor_parallel_size={size} must divide the model's "
                                      f"{moe.n_experts} routed experts (each rank holds an "
                                      f"equal share)")
        split = layers == "all"
        if split and size > 1:
            most, part = min(_split_rows(cfg))
            if size > most:
                raise ParallelLayoutError(
                    f"tensor_parallel_size={size} is more ranks than the model can split: "
                    f"parallel_layers=all gives each rank rows of {part}, so at most {most}")
        # attention of one shape in every layer, whose key/value heads split over the ranks
        heads = split and cfg.n_kv_heads % size == 0 and cfg.global_attention is None
        return cls(cfg=cfg, size=size, rank=rank, layers=layers,
                   attention=heads, mlp=split, head=split,
                   experts=None if moe is None else span(moe.n_experts, size, rank))

    def span(self, n: int) -> tuple[int, int]:
        return span(n, self.size, self.rank)

    def width(self, n: int, split: bool) -> int:
        """This rank's part of ``n`` (all of it when not ``split``)."""
        lo, hi = self.span(n) if split else (0, n)
        return hi - lo

    def widths(self, n: int) -> list[int]:
        """Every rank's part of ``n``, in rank order."""
        return [span(n, self.size, r)[1] - span(n, self.size, r)[0] for r in range(self.size)]

    def notes(self) -> list[str]:
        """What a user should know about this layout (log lines)."""
        cfg = self.cfg
        if self.layers == "all" and not self.attention and self.size > 1:
            if cfg.global_attention is not None:
                return [f"attention is replicated on each of the {self.size} ranks: its global "
                        f"and sliding-window layers differ in shape"]
            return [f"attention is replicated on each of the {self.size} ranks: its "
                    f"{cfg.n_kv_heads} key/value heads do not split over {self.size}"]
        return []

    def part(self, native: str, expert: int | None) -> Part:
        """What this rank reads of the checkpoint tensor filling native parameter ``native``
        (``expert``: its index when one tensor holds one expert of a stacked parameter)."""
        if expert is not None:
            lo, hi = self.experts
            return WHOLE if lo <= expert < hi else SKIP
        if self.size == 1:
            return WHOLE
        cfg = self.cfg
        name = native.split(".")
        leaf = ".".join(name[-2:])
        d = cfg.head_dim
        if ".attn." in native and self.attention:
            h, kv = self.span(cfg.n_heads), self.span(cfg.n_kv_heads)
            q_rows, kv_rows = (h[0] * d, h[1] * d), (kv[0] * d, kv[1] * d)
            if leaf in ("q_proj.weight", "q_proj.bias"):
                return Part(dim=0, ranges=(q_rows,))
            if leaf in ("k_proj.weight", "k_proj.bias", "v_proj.weight", "v_proj.bias"):
                return Part(dim=0, ranges=(kv_rows,))
            if leaf in ("qkv_proj.weight", "qkv_proj.bias"):
                q, k = cfg.n_heads * d, cfg.n_kv_heads * d
                return Part(dim=0, ranges=(q_rows, (q + kv_rows[0], q + kv_rows[1]),
                                           (q + k + kv_rows[0], q + k + kv_rows[1])))
            if leaf == "o_proj.weight":
                return Part(dim=1, ranges=(q_rows,))
            return WHOLE
        if stacked_experts(native):                                   # all experts in one tensor
            return Part(dim=0, ranges=(self.experts,))
        if ".mlp." in native and native.startswith("blocks."):   # a layer's dense or shared MLP
            if not self.mlp or leaf not in ("gate_proj.weight", "up_proj.weight",
                                            "down_proj.weight"):
                return WHOLE
            hidden = cfg.moe.shared_hidden if ".shared." in native else cfg.ffn_hidden
            rows = self.span(hidden)
            return Part(dim=1 if leaf == "down_proj.weight" else 0, ranges=(rows,))
        if native == "lm_head.weight" and self.head:
            return Part(dim=0, ranges=(self.span(cfg.vocab_size),))
        return WHOLE


class Comm:
    """The collectives of one tensor-parallel group (``group``: a torch.distributed process
    group of ``size`` ranks), in torch's functional collectives (traceable by ``torch.compile``),
    waited at once. A gloo group given CUDA tensors (two ranks sharing one GPU) is fed through
    host memory.

    Inside :meth:`local_only` every collective returns a tensor of its result's shape computed
    from this rank's input alone (no communication): a probe of memory use that cannot leave
    another rank waiting."""

    def __init__(self, group, size: int, rank: int):
        import torch.distributed as dist

        self.group, self.size, self.rank = group, size, rank
        self.gloo = dist.get_backend(group) == "gloo"
        self.local = False
        #: bytes this rank handed to collectives (payloads, counted once per call)
        self.sent = 0

    @contextlib.contextmanager
    def local_only(self):
        """Collectives without communication inside the block (see the class docstring)."""
        previous, self.local = self.local, True
        try:
            yield self
        finally:
            self.local = previous

    def _run(self, op, x: torch.Tensor) -> torch.Tensor:
        import torch.distributed._functional_collectives as fc

        self.sent += x.numel() * x.element_size()
        if self.gloo and x.is_cuda:
            return fc.wait_tensor(op(x.cpu())).to(x.device)
        return fc.wait_tensor(op(x))

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum over the ranks, in ``x``'s dtype, in the backend's order (exact when every
        element is nonzero on at most one rank)."""
        import torch.distributed._functional_collectives as fc

        if self.local:
            return x.clone()
        return self._run(lambda t: fc.all_reduce(t, "sum", self.group), x.contiguous())

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        """[size, *x.shape]: every rank's ``x``, in rank order."""
        import torch.distributed._functional_collectives as fc

        if self.local:
            return x[None].expand(self.size, *x.shape).clone()
        out = self._run(lambda t: fc.all_gather_single(t, 0, self.group), x.contiguous())
        return out.view(self.size, *x.shape)

    def ordered_sum(self, x: torch.Tensor) -> torch.Tensor:
        """Sum over the ranks as rank 0 + rank 1 + ... in that order, elementwise: every element
        depends on its own values only (never on the message size), the same on every rank."""
        parts = self.gather(x)
        total = parts[0]
        for p in parts[1:]:
            total = total + p
        return total

    def gather_spans(self, x: torch.Tensor, lengths: list[int]) -> torch.Tensor:
        """The ranks' last-dim spans of ``x`` [..., lengths[rank]] joined in rank order
        ([..., sum(lengths)]); spans shorter than the longest travel padded."""
        width = max(lengths)
        if x.shape[-1] < width:
            x = torch.nn.functional.pad(x, (0, width - x.shape[-1]))
        parts = self.gather(x)
        return torch.cat([parts[r, ..., :n] for r, n in enumerate(lengths)], dim=-1)


def row_parallel(x: torch.Tensor, weight: torch.Tensor, bias, comm) -> torch.Tensor:
    """A row-split product: ``x`` [..., K_r] @ ``weight`` [N, K_r].T on each rank, the partials
    summed over the ranks in float32 (``ops.rank_sum``), then ``bias`` (once), in ``x``'s
    dtype."""
    from . import ops

    out = ops.rank_sum(ops.linear(x, weight), comm)
    if bias is not None:
        out = out + bias.float()
    return out.to(x.dtype)


def same_on_every_rank(comm: "Comm", fingerprint: torch.Tensor, what: str) -> None:
    """Compare ``fingerprint`` (a small int64 tensor on this rank's device) across the ranks of
    ``comm``'s group (one gather, one host read); ranks that differ raise :class:`RanksDiverged`
    on every rank, naming ``what`` and the first rank that differs from rank 0."""
    every = comm.gather(fingerprint.reshape(-1)).tolist()
    odd = [r for r, fp in enumerate(every) if fp != every[0]]
    if odd:
        raise RanksDiverged(f"pvf-dlm: tensor-parallel ranks diverged: {what} of rank {odd[0]} "
                            f"differ from rank 0's (fingerprints {every[odd[0]]} and {every[0]})")


def call_fingerprint(*tensors) -> torch.Tensor:
    """[2 * len(tensors)] int64 on the tensors' device: per tensor (None allowed) its element
    count and a position-weighted sum of its values (as int64): equal calls give equal
    fingerprints; calls that differ almost surely do not."""
    out = []
    for t in tensors:
        if t is None:
            out += [torch.tensor(-1, device=tensors[0].device)] * 2
            continue
        flat = t.reshape(-1).long()
        weights = torch.arange(1, flat.numel() + 1, device=flat.device) % 1000003
        out += [torch.tensor(flat.numel(), device=flat.device), (flat * weights).sum()]
    return torch.stack(out)
