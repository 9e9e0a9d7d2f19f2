"""The one native network behind every supported checkpoint: a bidirectional transformer.

RMSNorm, rotary position embeddings (rotate-half convention, as LLaMA/Qwen2/LLaDA; optionally on
the first ``rotary_dim`` dimensions of a head only), SwiGLU MLP or routed experts (``moe.py``),
optional q/k/v bias, per-head query/key RMSNorm and grouped-query attention. Attention is never
causal: a diffusion LM sees the whole canvas, or, with ``block_size`` set (block diffusion), every
position of its own block and of the blocks before it. Checkpoint formats (``formats/``) map
each family's weight names onto the parameter names used here.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from . import ops
from .mlp import MLP
from .moe import MoEConfig, RoutedExperts
from .parallel import row_parallel


@dataclass(frozen=True)
class TransformerConfig:
    """Shape of the network. ``head_dim = d_model // n_heads``; ``n_kv_heads`` divides ``n_heads``."""

    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    #: width of the dense SwiGLU MLP; 0 when every layer is routed (``moe.all_routed``)
    ffn_hidden: int
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    qkv_bias: bool = False
    max_seq_len: int = 4096
    #: rotate queries and keys in float32 and cast back (LLaDA's ``rope_full_precision``); when
    #: False the float32-computed tables are cast to the working dtype and applied there (Dream,
    #: like Qwen2). Only matters below float32.
    rope_full_precision: bool = False
    #: per-head width when it is not ``d_model // n_heads`` (LLaDA2's ``head_dim``); None = that
    head_size: int | None = None
    #: leading dimensions of a head that rotary rotates (partial rotary); None = the whole head
    rotary_dim: int | None = None
    #: RMSNorm over ``head_dim`` on every query and key head, before rotary
    qk_norm: bool = False
    #: every RMSNorm multiplies by its weight in float32 and rounds to the working dtype once
    #: (flash-attn's fused ``rms_norm_fn``, SDAR's file); False: the normalised value is rounded
    #: to the working dtype and then multiplied by the weight there (Hugging Face's RMSNorm).
    #: Only matters below float32.
    norm_weight_fp32: bool = False
    #: one fused query/key/value projection (``qkv_proj``: queries, then keys, then values)
    fused_qkv: bool = False
    #: bias on the attention output projection
    o_bias: bool = False
    #: routed experts (``moe.MoEConfig``); None = a SwiGLU MLP of ``ffn_hidden`` in every layer
    moe: MoEConfig | None = None
    #: block diffusion: attention sees the own block and earlier ones (blocks of ``block_size``
    #: positions, aligned to position id 0); None = fully bidirectional
    block_size: int | None = None

    @property
    def has_dense_layer(self) -> bool:
        """Whether some layer has the dense MLP of ``ffn_hidden``."""
        return self.moe is None or not self.moe.all_routed

    @property
    def head_dim(self) -> int:
        return self.head_size or self.d_model // self.n_heads

    @property
    def rope_dim(self) -> int:
        return self.rotary_dim or self.head_dim

    def to_dict(self) -> dict:
        return asdict(self)


def block_causal(position_ids: torch.Tensor, block_size: int) -> torch.Tensor:
    """[N, T, T] boolean: query ``q`` may see key ``k`` when ``k``'s block is not after ``q``'s,
    blocks being ``position_ids // block_size`` (position ids [N, T] or [1, T])."""
    block = torch.div(position_ids, block_size, rounding_mode="floor")
    return block[:, None, :] <= block[:, :, None]


def additive_bias(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """0 where ``allowed``, the dtype's most negative value elsewhere (finite: a query that sees
    no key gives a uniform average, never NaN)."""
    bias = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    return bias.masked_fill_(~allowed, torch.finfo(dtype).min)


class RMSNorm(nn.Module):
    """``ops.rms_norm`` over the last dim; ``weight_fp32`` as
    ``TransformerConfig.norm_weight_fp32``."""

    def __init__(self, dim: int, eps: float, weight_fp32: bool = False):
        super().__init__()
        self.eps = eps
        self.weight_fp32 = weight_fp32
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.rms_norm(x, self.weight, self.eps, self.weight_fp32)


def rotary_tables(position_ids: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype):
    """cos/sin tables [N, T, head_dim] for integer ``position_ids`` [N, T], computed in float32
    and returned in ``dtype``: the dtype the rotation is computed in (see ``apply_rotary``).
    ``head_dim`` is the rotated width (``rotary_dim`` for a partial rotary)."""
    inv_freq = 1.0 / (
        theta ** (torch.arange(0, head_dim, 2, device=position_ids.device, dtype=torch.float32) / head_dim)
    )
    angles = position_ids.to(torch.float32)[..., None] * inv_freq
    emb = torch.cat([angles, angles], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _project(layer: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """``layer(x)`` through :func:`ops.linear`, the network's one matrix-product entry point."""
    return ops.linear(x, layer.weight, layer.bias)


def take_rows(x: torch.Tensor, index: torch.Tensor | None) -> torch.Tensor:
    """Rows ``index`` of ``x`` [N|1, T, d] along dim 1: ``index`` [P] (the same for every row) or
    [N, P] (per row); None keeps all of them."""
    if index is None:
        return x
    if index.dim() == 1:
        return x[:, index]
    x = x.expand(index.shape[0], *x.shape[1:])
    return torch.gather(x, 1, index[..., None].expand(-1, -1, x.shape[-1]))


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` [N, H, T, D] by tables [N, T, R], in the tables' dtype; the result has ``x``'s
    dtype (float32 tables on bfloat16 heads = LLaDA's full-precision rotary). With ``R < D``
    (partial rotary) the first ``R`` dimensions are rotated and the rest pass unchanged."""
    if cos.shape[-1] != x.shape[-1]:
        r = cos.shape[-1]
        return torch.cat([apply_rotary(x[..., :r], cos, sin), x[..., r:]], dim=-1)
    if cos.dtype != x.dtype:
        xf = x.to(cos.dtype)
        return (xf * cos[:, None] + _rotate_half(xf) * sin[:, None]).to(x.dtype)
    return x * cos[:, None] + _rotate_half(x) * sin[:, None]


class Attention(nn.Module):
    """Grouped-query attention; with a ``shard`` that splits attention, this rank's heads only
    (its query heads and the key/value heads they read), the output projection summed over the
    ranks (``comm``)."""

    def __init__(self, cfg: TransformerConfig, shard=None, comm=None):
        super().__init__()
        split = shard is not None and shard.attention
        self.n_heads = shard.width(cfg.n_heads, split) if shard else cfg.n_heads
        self.n_kv_heads = shard.width(cfg.n_kv_heads, split) if shard else cfg.n_kv_heads
        self.head_dim = cfg.head_dim
        self.comm = comm if split else None
        q_out, kv_out = self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim
        self.splits = (q_out, kv_out, kv_out)
        if cfg.fused_qkv:
            self.qkv_proj = nn.Linear(cfg.d_model, q_out + 2 * kv_out, bias=cfg.qkv_bias)
        else:
            self.q_proj = nn.Linear(cfg.d_model, q_out, bias=cfg.qkv_bias)
            self.k_proj = nn.Linear(cfg.d_model, kv_out, bias=cfg.qkv_bias)
            self.v_proj = nn.Linear(cfg.d_model, kv_out, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(q_out, cfg.d_model, bias=cfg.o_bias)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(cfg.head_dim, cfg.norm_eps, cfg.norm_weight_fp32)
            self.k_norm = RMSNorm(cfg.head_dim, cfg.norm_eps, cfg.norm_weight_fp32)
        self.qk_norm = cfg.qk_norm

    def _weights(self, which: int):
        """(weight, bias) of the query (0), key (1) or value (2) projection: rows of the fused
        projection (views, no copy) or the separate one."""
        if hasattr(self, "qkv_proj"):
            a = sum(self.splits[:which])
            b = a + self.splits[which]
            bias = self.qkv_proj.bias
            return self.qkv_proj.weight[a:b], None if bias is None else bias[a:b]
        proj = (self.q_proj, self.k_proj, self.v_proj)[which]
        return proj.weight, proj.bias

    def _heads(self, which, x, n_heads, cos, sin):
        n, t, _ = x.shape
        h = ops.linear(x, *self._weights(which)).view(n, t, n_heads, self.head_dim).transpose(1, 2)
        if self.qk_norm and which < 2:
            h = (self.q_norm, self.k_norm)[which](h)
        return h if cos is None else apply_rotary(h, cos, sin)

    def _kv(self, x, cos, sin):
        return (self._heads(1, x, self.n_kv_heads, cos, sin),
                self._heads(2, x, self.n_kv_heads, None, None))

    def _qkv(self, x, cos, sin):
        return (self._heads(0, x, self.n_heads, cos, sin), *self._kv(x, cos, sin))

    def forward(self, x, cos, sin, attn_bias, out_index=None):
        """(attention output [N, T, d], or [N, P, d] for the query rows ``out_index`` only (every
        position still serves as a key); keys after rotary and values [N, Hkv, T, D]).

        Keys and values are always returned (a KV cache keeps them; otherwise they are dropped):
        a compiled block then has one graph whether or not the caller keeps them."""
        q = self._heads(0, take_rows(x, out_index), self.n_heads,
                        take_rows(cos, out_index), take_rows(sin, out_index))
        k, v = self._kv(x, cos, sin)
        out = ops.attention(q, k, v, attn_bias, self.n_kv_heads != self.n_heads)
        n, p = q.shape[0], q.shape[2]
        return self._out(out.transpose(1, 2).reshape(n, p, -1)), k, v

    def _out(self, x):
        """The output projection of the heads' outputs ``x`` [N, P, heads * D]."""
        if self.comm is None:
            return _project(self.o_proj, x)
        return row_parallel(x, self.o_proj.weight, self.o_proj.bias, self.comm)

    def forward_cached(self, x, cos, sin, ck, cv, attn_bias):
        """Queries ``x`` [R, Q, d] against cached keys/values ``ck``/``cv`` [R, Hkv, T, D] (one
        per request, shared by its branch rows, never copied per row) followed by the queries'
        own fresh keys; ``attn_bias`` [R, 1, Q, T + Q] says which of those each query sees."""
        r, t, _ = x.shape
        q, k, v = self._qkv(x, cos, sin)
        k = torch.cat([ck, k], dim=2)
        v = torch.cat([cv, v], dim=2)
        out = ops.attention(q, k, v, attn_bias, self.n_kv_heads != self.n_heads)
        return self._out(out.transpose(1, 2).reshape(r, t, -1))


class Block(nn.Module):
    def __init__(self, cfg: TransformerConfig, layer: int = 0, shard=None, comm=None):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps, cfg.norm_weight_fp32)
        self.attn = Attention(cfg, shard, comm)
        self.mlp_norm = RMSNorm(cfg.d_model, cfg.norm_eps, cfg.norm_weight_fp32)
        routed = cfg.moe is not None and cfg.moe.routed(layer)
        if routed:
            self.mlp = RoutedExperts(cfg.d_model, cfg.moe, shard, comm)
        elif shard is not None and shard.mlp:
            self.mlp = MLP(cfg.d_model, shard.width(cfg.ffn_hidden, True), comm)
        else:
            self.mlp = MLP(cfg.d_model, cfg.ffn_hidden)

    def forward(self, x, cos, sin, attn_bias):
        """[N, T, d] -> ([N, T, d], this layer's keys and values)."""
        return self._forward(x, cos, sin, attn_bias, None)

    def forward_rows(self, x, cos, sin, attn_bias, out_index):
        """[N, T, d] -> ([N, P, d] at the rows ``out_index`` [N, P], keys, values): the last
        layer. A method of its own, so that a compiled block keeps separate (few) graphs for the
        two kinds of call instead of recompiling between them."""
        return self._forward(x, cos, sin, attn_bias, out_index)

    def _forward(self, x, cos, sin, attn_bias, out_index):
        a, k, v = self.attn(self.attn_norm(x), cos, sin, attn_bias, out_index)
        x = take_rows(x, out_index) + a
        return x + self.mlp(self.mlp_norm(x)), k, v

    def forward_cached(self, x, cos, sin, ck, cv, attn_bias):
        x = x + self.attn.forward_cached(self.attn_norm(x), cos, sin, ck, cv, attn_bias)
        return x + self.mlp(self.mlp_norm(x))


class BidirectionalTransformer(nn.Module):
    """Token ids -> final hidden states (``hidden``) and hidden states -> logits (``head``).

    Splitting the two lets callers run the LM head only on the rows they need.

    ``shard``/``comm`` (``parallel.Shard``/``parallel.Comm``, tensor parallel): the network of
    ``cfg`` as this rank holds it; its calls give every rank the logits of the whole network.
    """

    def __init__(self, cfg: TransformerConfig, shard=None, comm=None):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg, i, shard, comm) for i in range(cfg.n_layers))
        #: block diffusion's block size (None: fully bidirectional); see :meth:`hidden`
        self.block_size = cfg.block_size
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps, cfg.norm_weight_fp32)
        split = shard is not None and shard.head
        self.lm_head = nn.Linear(cfg.d_model, shard.width(cfg.vocab_size, split) if shard
                                 else cfg.vocab_size, bias=False)
        #: the vocabulary spans of the ranks, in order, when the head is split
        self.head_spans = shard.widths(cfg.vocab_size) if split else None
        self.comm = comm

    def init_weights(self, seed: int) -> None:
        """Deterministic small-normal init for training from scratch."""
        gen = torch.Generator().manual_seed(seed)
        std = 0.02
        for name, p in self.named_parameters():
            if name.endswith("norm.weight"):
                nn.init.ones_(p)
            elif name.endswith(".bias"):
                nn.init.zeros_(p)
            else:
                scale = std / math.sqrt(2 * self.cfg.n_layers) if name.endswith(("o_proj.weight", "down_proj.weight")) else std
                with torch.no_grad():
                    p.copy_(torch.randn(p.shape, generator=gen) * scale)

    def _rotary(self, position_ids: torch.Tensor, dtype: torch.dtype):
        """Rotary tables in the dtype the rotation runs in: float32 with ``rope_full_precision``."""
        table_dtype = torch.float32 if self.cfg.rope_full_precision else dtype
        return rotary_tables(position_ids, self.cfg.rope_dim, self.cfg.rope_theta, table_dtype)

    def hidden(self, tokens: torch.Tensor, attention_mask: torch.Tensor | None = None,
               position_ids: torch.Tensor | None = None, kv_out: list | None = None,
               out_index: torch.Tensor | None = None) -> torch.Tensor:
        """Final-norm hidden states [N, T, d_model], or [N, P, d_model] at ``out_index`` ([P] or
        [N, P] canvas indices): the last layer then computes only those query rows (exact: the
        other rows' outputs feed nothing), which spares the positions no caller reads.

        ``attention_mask`` [N, T] (1 = real token, 0 = padding) hides padded keys from every query;
        ``position_ids`` [N, T] default to the count of real tokens before each position, so left
        padding does not shift rotary positions. ``kv_out``: a list that receives, per layer, the
        (keys after rotary, values) [N, Hkv, T, D] of this call (to build a KV cache).

        With ``self.block_size`` set, a query also sees only keys whose block (position id //
        block_size) is not after its own: blocks count real tokens from 0, so left padding does
        not move them.
        """
        n, t = tokens.shape
        x = self.embed(tokens)
        keep = None if attention_mask is None else attention_mask.to(torch.bool)
        if keep is not None and position_ids is None:
            position_ids = (keep.long().cumsum(-1) - 1).clamp(min=0)
        if position_ids is None:     # one table row for all: broadcast, not N copies
            position_ids = torch.arange(t, device=tokens.device)[None]
        attn_bias = last_bias = None
        if self.block_size is not None:
            allowed = block_causal(position_ids, self.block_size)                  # [N|1, T, T]
            if keep is not None:
                allowed = allowed & keep[:, None, :]
            attn_bias = additive_bias(allowed[:, None], x.dtype)
            if out_index is not None:
                rows = out_index if out_index.dim() == 2 else out_index.expand(allowed.shape[0], -1)
                last_bias = additive_bias(take_rows(allowed, rows)[:, None], x.dtype)
        elif keep is not None:
            # Additive bias rather than a boolean mask: a fully padded query row would otherwise
            # produce NaNs in SDPA.
            attn_bias = last_bias = additive_bias(keep[:, None, None, :], x.dtype)
        cos, sin = self._rotary(position_ids, x.dtype)
        if out_index is not None and out_index.dim() == 1:
            out_index = out_index.expand(n, -1).contiguous()   # one index form: one compiled graph
        last = len(self.blocks) - 1
        for i, block in enumerate(self.blocks):
            if i == last and out_index is not None:
                x, k, v = block.forward_rows(x, cos, sin, last_bias, out_index)
            else:
                x, k, v = block(x, cos, sin, attn_bias)
            if kv_out is not None:      # keys after rotary: cached keys carry their positions
                kv_out.append((k, v))
            del k, v
        return self.norm(x)

    def hidden_cached(self, tokens: torch.Tensor, position_ids: torch.Tensor, kv: list,
                      attn_bias: torch.Tensor) -> torch.Tensor:
        """Final-norm hidden states [R, Q, d_model] of query tokens [R, Q] at ``position_ids``
        [R, Q], attending per layer to cached (keys, values) ``kv[layer]`` [R, Hkv, T, D] and to
        the queries' own fresh keys, as ``attn_bias`` [R, 1, Q, T + Q] (additive) allows."""
        x = self.embed(tokens)
        cos, sin = self._rotary(position_ids, x.dtype)
        for block, (ck, cv) in zip(self.blocks, kv):
            x = block.forward_cached(x, cos, sin, ck, cv, attn_bias)
        return self.norm(x)

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.head_spans is None:
            return _project(self.lm_head, hidden)
        return self.comm.gather_spans(_project(self.lm_head, hidden), self.head_spans)

    def forward(self, tokens, attention_mask=None, position_ids=None):
        return self.head(self.hidden(tokens, attention_mask, position_ids))
