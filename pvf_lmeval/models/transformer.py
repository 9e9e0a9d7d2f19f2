"""The one native network behind every supported checkpoint: a bidirectional transformer.

RMSNorm, rotary position embeddings (rotate-half convention, as LLaMA/Qwen2/LLaDA; optionally on
the first ``rotary_dim`` dimensions of a head only, or proportional: only the first
``rope_pairs`` frequencies of the whole head), a gated MLP or routed experts (``moe.py``),
optional q/k/v bias, per-head query/key RMSNorm and grouped-query attention. Attention is never
causal over the canvas: a diffusion LM sees the whole canvas, or, with ``block_size`` set (block
diffusion), every position of its own block and of the blocks before it.

DiffusionGemma's Gemma-4 layers are options of the same network: sandwich norms with the dense
MLP and the routed experts side by side and a per-layer scalar (``sandwich``), value norms,
an attention scale of 1, interleaved sliding-window and global layers whose attention has its
own shape (``global_layers``, ``global_attention``), a scaled embedding, softcapped logits, and
the encoder/canvas split (``canvas_length``, ``canvas.py``) with the self-conditioning input.
Checkpoint formats (``formats/``) map each family's weight names onto the parameter names used
here.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from . import ops
from .canvas import cached_canvas_keys, split_attention
from .mlp import ACTIVATIONS, MLP
from .moe import MoEConfig, RoutedExperts
from .parallel import row_parallel
from .shadow import ShadowMask, shadow_columns, shadow_positions, shadow_visible


@dataclass(frozen=True)
class LayerAttention:
    """The attention of one kind of layer: heads of ``head_dim``, ``n_kv_heads`` key/value heads,
    rotary at ``rope_theta`` over the first ``rotary_dim`` dimensions (None: all) or, with
    ``rope_pairs``, proportional (only the first ``rope_pairs`` of the ``head_dim / 2``
    frequencies ``theta ** (-2j / head_dim)`` turn, the others are 0); ``values_from_keys``: no
    value projection, the values are the raw key projection (before the key norm and rotary)."""

    head_dim: int
    n_kv_heads: int
    rope_theta: float
    rotary_dim: int | None = None
    rope_pairs: int | None = None
    values_from_keys: bool = False


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
    #: the dense MLP's gate activation (``mlp.ACTIVATIONS``)
    activation: str = "silu"
    #: proportional rotary of this config's own layers (``LayerAttention.rope_pairs``)
    rope_pairs: int | None = None
    #: the token embedding times sqrt(d_model), that factor rounded to the working dtype first
    embed_scale: bool = False
    #: attention scores q.k times this; None = 1 / sqrt(head_dim)
    attn_scale: float | None = None
    #: an RMSNorm without weight on every value head
    v_norm: bool = False
    #: Gemma-4's layer: each sublayer's output normed before its residual add, the dense MLP
    #: and the routed experts (``moe``, every layer) side by side with norms of their own, the
    #: layer's output times a learned scalar (``Block``)
    sandwich: bool = False
    #: the logits as ``cap * tanh(logits / cap)`` in float32
    logit_softcap: float | None = None
    #: per layer, True for a global layer (attention of ``global_attention``'s shape, no window)
    #: and False for a layer of this config's own shape limited to ``sliding_window`` positions;
    #: None = every layer of this config's shape
    global_layers: tuple[bool, ...] | None = None
    global_attention: LayerAttention | None = None
    sliding_window: int | None = None
    #: the encoder/canvas split (``canvas.py``): the last ``canvas_length`` columns of a call are
    #: the canvas, read bidirectionally; the columns before them the context, read causally
    canvas_length: int | None = None
    #: the canvas input takes the previous step's logits (``SelfConditioning``)
    self_conditioning: bool = False

    def __post_init__(self):
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation={self.activation!r} must be one of {', '.join(ACTIVATIONS)}")
        if (self.global_layers is None) != (self.global_attention is None):
            raise ValueError("global_layers and global_attention go together")
        if self.sliding_window is not None and self.canvas_length is None:
            raise ValueError("sliding_window is defined for the encoder/canvas split only "
                             "(canvas_length)")
        if self.canvas_length is not None and self.block_size is not None:
            raise ValueError("canvas_length and block_size exclude each other")
        if self.self_conditioning and self.canvas_length is None:
            raise ValueError("self_conditioning needs canvas_length")

    @property
    def has_dense_layer(self) -> bool:
        """Whether some layer has the dense MLP of ``ffn_hidden``."""
        return self.sandwich or self.moe is None or not self.moe.all_routed

    def is_global(self, layer: int) -> bool:
        """Whether ``layer`` is a global layer (``global_layers``)."""
        return self.global_layers is not None and bool(self.global_layers[layer])

    def attention_of(self, layer: int) -> LayerAttention:
        """The attention shape of ``layer``."""
        if self.is_global(layer):
            return self.global_attention
        return LayerAttention(self.head_dim, self.n_kv_heads, self.rope_theta, self.rotary_dim,
                              self.rope_pairs)

    def window_of(self, layer: int) -> int | None:
        """The sliding window of ``layer`` (None: none)."""
        return None if self.is_global(layer) else self.sliding_window

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
    ``TransformerConfig.norm_weight_fp32``; ``scale=False``: no weight (times 1)."""

    def __init__(self, dim: int, eps: float, weight_fp32: bool = False, scale: bool = True):
        super().__init__()
        self.eps = eps
        self.weight_fp32 = weight_fp32
        self.weight = nn.Parameter(torch.ones(dim)) if scale else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.weight is None:
            unit = torch.ones(x.shape[-1], dtype=x.dtype, device=x.device)
            return ops.rms_norm(x, unit, self.eps, True)
        return ops.rms_norm(x, self.weight, self.eps, self.weight_fp32)


def rotary_tables(position_ids: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype,
                  pairs: int | None = None):
    """cos/sin tables [N, T, head_dim] for integer ``position_ids`` [N, T], computed in float32
    and returned in ``dtype``: the dtype the rotation is computed in (see ``apply_rotary``).
    ``head_dim`` is the rotated width (``rotary_dim`` for a partial rotary); ``pairs``: only the
    first ``pairs`` frequencies turn, the rest are 0 (proportional rotary: cos 1, sin 0)."""
    inv_freq = 1.0 / (
        theta ** (torch.arange(0, head_dim, 2, device=position_ids.device, dtype=torch.float32) / head_dim)
    )
    if pairs is not None:
        inv_freq = torch.cat([inv_freq[:pairs], inv_freq.new_zeros(head_dim // 2 - pairs)])
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
    """Grouped-query attention of layer ``layer``'s shape (``TransformerConfig.attention_of``);
    with a ``shard`` that splits attention, this rank's heads only (its query heads and the
    key/value heads they read), the output projection summed over the ranks (``comm``)."""

    def __init__(self, cfg: TransformerConfig, shard=None, comm=None, layer: int = 0):
        super().__init__()
        shape = cfg.attention_of(layer)
        split = shard is not None and shard.attention
        self.n_heads = shard.width(cfg.n_heads, split) if shard else cfg.n_heads
        self.n_kv_heads = shard.width(shape.n_kv_heads, split) if shard else shape.n_kv_heads
        self.head_dim = shape.head_dim
        self.values_from_keys = shape.values_from_keys
        self.scale = cfg.attn_scale
        self.comm = comm if split else None
        q_out, kv_out = self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim
        self.splits = (q_out, kv_out, kv_out)
        if cfg.fused_qkv:
            self.qkv_proj = nn.Linear(cfg.d_model, q_out + 2 * kv_out, bias=cfg.qkv_bias)
        else:
            self.q_proj = nn.Linear(cfg.d_model, q_out, bias=cfg.qkv_bias)
            self.k_proj = nn.Linear(cfg.d_model, kv_out, bias=cfg.qkv_bias)
            if not self.values_from_keys:
                self.v_proj = nn.Linear(cfg.d_model, kv_out, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(q_out, cfg.d_model, bias=cfg.o_bias)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, cfg.norm_eps, cfg.norm_weight_fp32)
            self.k_norm = RMSNorm(self.head_dim, cfg.norm_eps, cfg.norm_weight_fp32)
        self.qk_norm = cfg.qk_norm
        self.v_norm = RMSNorm(self.head_dim, cfg.norm_eps, scale=False) if cfg.v_norm else None

    def _weights(self, which: int):
        """(weight, bias) of the query (0), key (1) or value (2) projection: rows of the fused
        projection (views, no copy) or the separate one."""
        if hasattr(self, "qkv_proj"):
            a = sum(self.splits[:which])
            b = a + self.splits[which]
            bias = self.qkv_proj.bias
            return self.qkv_proj.weight[a:b], None if bias is None else bias[a:b]
        proj = getattr(self, ("q_proj", "k_proj", "v_proj")[which])
        return proj.weight, proj.bias

    def _project(self, which, x, n_heads):
        """The raw heads [N, H, T, D] of projection ``which`` (0 query, 1 key, 2 value)."""
        n, t, _ = x.shape
        return ops.linear(x, *self._weights(which)).view(n, t, n_heads, self.head_dim).transpose(1, 2)

    def _queries(self, x, cos, sin):
        q = self._project(0, x, self.n_heads)
        if self.qk_norm:
            q = self.q_norm(q)
        return apply_rotary(q, cos, sin)

    def _kv(self, x, cos, sin):
        """Keys (normed, after rotary) and values (normed with ``v_norm``) [N, Hkv, T, D]."""
        k = self._project(1, x, self.n_kv_heads)
        v = k if self.values_from_keys else self._project(2, x, self.n_kv_heads)
        if self.qk_norm:
            k = self.k_norm(k)
        if self.v_norm is not None:
            v = self.v_norm(v)
        return apply_rotary(k, cos, sin), v

    def _qkv(self, x, cos, sin):
        return (self._queries(x, cos, sin), *self._kv(x, cos, sin))

    def forward(self, x, cos, sin, attn_bias, out_index=None):
        """(attention output [N, T, d], or [N, P, d] for the query rows ``out_index`` only (every
        position still serves as a key); keys after rotary and values [N, Hkv, T, D]).

        Keys and values are always returned (a KV cache keeps them; otherwise they are dropped):
        a compiled block then has one graph whether or not the caller keeps them."""
        q = self._queries(take_rows(x, out_index), take_rows(cos, out_index),
                          take_rows(sin, out_index))
        k, v = self._kv(x, cos, sin)
        out = self._attend(q, k, v, attn_bias)
        n, p = q.shape[0], q.shape[2]
        return self._out(out.transpose(1, 2).reshape(n, p, -1)), k, v

    def _attend(self, q, k, v, attn_bias):
        """``ops.attention`` of queries ``q`` over keys ``k``/``v`` as ``attn_bias`` allows. A
        :class:`.shadow.ShadowMask` (a shadow call: the last ``S`` queries and keys are the
        shadow's) makes two calls: the canvas queries over the canvas keys with the canvas
        mask (the call without a shadow), the shadow queries over every key with theirs. A
        canvas network's sliding-window layer splits the same way (:meth:`_biases`): its
        context rows in the first call, its canvas rows (the last ``S``) in the second."""
        gqa = self.n_kv_heads != self.n_heads
        if not isinstance(attn_bias, ShadowMask):
            return ops.attention(q, k, v, attn_bias, gqa, self.scale)
        s = attn_bias.shadow.shape[-2]
        t = k.shape[2] - s
        canvas = ops.attention(q[:, :, :-s], k[:, :, :t], v[:, :, :t], attn_bias.canvas, gqa,
                               self.scale)
        shadow = ops.attention(q[:, :, -s:], k, v, attn_bias.shadow, gqa, self.scale)
        return torch.cat([canvas, shadow], dim=2)

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
        out = ops.attention(q, k, v, attn_bias, self.n_kv_heads != self.n_heads, self.scale)
        return self._out(out.transpose(1, 2).reshape(r, t, -1))


class Block(nn.Module):
    """One layer: attention then the feed-forward part, each with a residual add.

    The plain layer (LLaMA, Qwen, ...): ``x + attn(norm(x))``, then ``x + mlp(norm(x))`` with a
    gated MLP or routed experts. With ``sandwich`` (Gemma-4): ``x + post_attn_norm(attn(
    attn_norm(x)))``, then ``x + post_ffn_norm(post_mlp_norm(mlp(mlp_norm(x))) +
    post_moe_norm(moe(moe_norm(x))))`` where the experts' router reads ``x`` itself, and the
    result times the layer's scalar: ``layer_scalar`` on canvas rows, ``encoder_layer_scalar``
    on context rows (DiffusionGemma's encoder and decoder keep one each)."""

    def __init__(self, cfg: TransformerConfig, layer: int = 0, shard=None, comm=None):
        super().__init__()
        norm = lambda: RMSNorm(cfg.d_model, cfg.norm_eps, cfg.norm_weight_fp32)   # noqa: E731
        self.attn_norm = norm()
        self.attn = Attention(cfg, shard, comm, layer)
        self.mlp_norm = norm()
        routed = cfg.moe is not None and cfg.moe.routed(layer)
        if routed and not cfg.sandwich:
            self.mlp = RoutedExperts(cfg.d_model, cfg.moe, shard, comm, cfg.norm_eps)
        elif shard is not None and shard.mlp:
            self.mlp = MLP(cfg.d_model, shard.width(cfg.ffn_hidden, True), comm, cfg.activation)
        else:
            self.mlp = MLP(cfg.d_model, cfg.ffn_hidden, act=cfg.activation)
        self.sandwich = cfg.sandwich
        if cfg.sandwich:
            self.post_attn_norm, self.post_mlp_norm, self.post_ffn_norm = norm(), norm(), norm()
            self.moe = None
            if routed:
                self.moe_norm, self.post_moe_norm = norm(), norm()
                self.moe = RoutedExperts(cfg.d_model, cfg.moe, shard, comm, cfg.norm_eps)
            self.register_buffer("layer_scalar", torch.ones(1))
            self.register_buffer("encoder_layer_scalar", torch.ones(1))

    def forward(self, x, cos, sin, attn_bias, context=None):
        """[N, T, d] -> ([N, T, d], this layer's keys and values); ``context`` [1|N, T, 1]
        boolean: the rows of the encoder/canvas split's context (``sandwich`` only)."""
        return self._forward(x, cos, sin, attn_bias, None, context)

    def forward_rows(self, x, cos, sin, attn_bias, out_index, context=None):
        """[N, T, d] -> ([N, P, d] at the rows ``out_index`` [N, P], keys, values): the last
        layer. A method of its own, so that a compiled block keeps separate (few) graphs for the
        two kinds of call instead of recompiling between them."""
        return self._forward(x, cos, sin, attn_bias, out_index, context)

    def _forward(self, x, cos, sin, attn_bias, out_index, context):
        a, k, v = self.attn(self.attn_norm(x), cos, sin, attn_bias, out_index)
        x = self._feed_forward(take_rows(x, out_index), a)
        if self.sandwich:
            x = x * self._scalar(None if context is None else take_rows(context, out_index))
        return x, k, v

    def _feed_forward(self, x, a):
        """The residual stream after the attention output ``a`` and the feed-forward part."""
        if not self.sandwich:
            x = x + a
            return x + self.mlp(self.mlp_norm(x))
        x = x + self.post_attn_norm(a)
        h = self.post_mlp_norm(self.mlp(self.mlp_norm(x)))
        if self.moe is not None:
            h = h + self.post_moe_norm(self.moe(self.moe_norm(x), router_x=x))
        return x + self.post_ffn_norm(h)

    def _scalar(self, context):
        """The layer's scalar per row: the encoder's on ``context`` rows (None: none)."""
        if context is None:
            return self.layer_scalar
        return torch.where(context, self.encoder_layer_scalar, self.layer_scalar)

    def forward_cached(self, x, cos, sin, ck, cv, attn_bias):
        x = self._feed_forward(x, self.attn.forward_cached(self.attn_norm(x), cos, sin, ck, cv,
                                                           attn_bias))
        return x * self.layer_scalar if self.sandwich else x


class SelfConditioning(nn.Module):
    """DiffusionGemma's canvas input: the canvas embedding ``e`` and the previous denoising
    step's logits ``s`` [N, C, V] (None at a canvas's first step) give
    ``unit_norm(e + mlp(pre_norm(soft)))``, ``soft = softmax(s) @ embedding table * sqrt(d)``:
    ``s`` rounded to the working dtype (as transformers' ``generate`` hands it over), its softmax
    in float32 and rounded back, the embedding scale rounded to the working dtype. Without
    ``s`` the signal is 0 and ``mlp(pre_norm(0))`` is exactly 0: ``unit_norm(e)``."""

    def __init__(self, d_model: int, hidden: int, eps: float, act: str):
        super().__init__()
        self.pre_norm = RMSNorm(d_model, eps, weight_fp32=True)
        self.mlp = MLP(d_model, hidden, act=act)
        self.post_norm = RMSNorm(d_model, eps, scale=False)

    def forward(self, embedded, logits, table, embed_scale):
        if logits is None:
            return self.post_norm(embedded)
        probs = torch.softmax(logits.to(table.dtype), dim=-1, dtype=torch.float32).to(table.dtype)
        soft = ops.linear(probs, table.t()) * embed_scale
        return self.post_norm(embedded + self.mlp(self.pre_norm(soft)))


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
        self.self_conditioning = (SelfConditioning(cfg.d_model, cfg.ffn_hidden, cfg.norm_eps,
                                                   cfg.activation)
                                  if cfg.self_conditioning else None)

    def init_weights(self, seed: int) -> None:
        """Deterministic small-normal init for training from scratch."""
        gen = torch.Generator().manual_seed(seed)
        std = 0.02
        for name, p in self.named_parameters():
            if name.endswith(("norm.weight", "scale")):
                nn.init.ones_(p)
            elif name.endswith(".bias"):
                nn.init.zeros_(p)
            else:
                scale = std / math.sqrt(2 * self.cfg.n_layers) if name.endswith(("o_proj.weight", "down_proj.weight")) else std
                with torch.no_grad():
                    p.copy_(torch.randn(p.shape, generator=gen) * scale)

    def _rotary(self, position_ids: torch.Tensor, dtype: torch.dtype, layer: int = 0):
        """Rotary tables of ``layer``'s attention in the dtype the rotation runs in: float32
        with ``rope_full_precision``."""
        table_dtype = torch.float32 if self.cfg.rope_full_precision else dtype
        a = self.cfg.attention_of(layer)
        return rotary_tables(position_ids, a.rotary_dim or a.head_dim, a.rope_theta, table_dtype,
                             a.rope_pairs)

    def _embed(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        return x if not self.cfg.embed_scale else x * self._embed_scale(x.dtype)

    def _embed_scale(self, dtype: torch.dtype) -> torch.Tensor:
        """sqrt(d_model) rounded to float32 and then to ``dtype`` (Gemma's embedding scale)."""
        return torch.tensor(math.sqrt(self.cfg.d_model), dtype=torch.float32).to(dtype)

    def _canvas_input(self, x: torch.Tensor, self_conditioning) -> torch.Tensor:
        """Embeddings [N, T, d] with the canvas columns (the last ``canvas_length``) through the
        self-conditioning input; ``self_conditioning`` [N, canvas_length, V] or None."""
        c = self.cfg.canvas_length
        if self.self_conditioning is None:
            if self_conditioning is not None:
                raise ValueError("self_conditioning was given, but the network has no "
                                 "self-conditioning input")
            return x
        canvas = self.self_conditioning(x[:, -c:], self_conditioning, self.embed.weight,
                                        self._embed_scale(x.dtype))
        return torch.cat([x[:, :-c], canvas], dim=1)

    def _allowed(self, position_ids: torch.Tensor, t: int, layer: int):
        """[N|1, T, T] boolean (query, key) of ``layer`` before padding, or None: no mask."""
        if self.cfg.canvas_length is not None:
            return split_attention(position_ids, t - self.cfg.canvas_length,
                                   self.cfg.window_of(layer))
        if self.block_size is not None:
            return block_causal(position_ids, self.block_size)
        return None

    def hidden(self, tokens: torch.Tensor, attention_mask: torch.Tensor | None = None,
               position_ids: torch.Tensor | None = None, kv_out: list | None = None,
               out_index: torch.Tensor | None = None,
               self_conditioning: torch.Tensor | None = None, shadow=None) -> torch.Tensor:
        """Final-norm hidden states [N, T, d_model], or [N, P, d_model] at ``out_index`` ([P] or
        [N, P] canvas indices): the last layer then computes only those query rows (exact: the
        other rows' outputs feed nothing), which spares the positions no caller reads.

        ``attention_mask`` [N, T] (1 = real token, 0 = padding) hides padded keys from every query;
        ``position_ids`` [N, T] default to the count of real tokens before each position, so left
        padding does not shift rotary positions. ``kv_out``: a list that receives, per layer, the
        (keys after rotary, values) [N, Hkv, T, D] of this call (to build a KV cache).

        With ``self.block_size`` set, a query also sees only keys whose block (position id //
        block_size) is not after its own: blocks count real tokens from 0, so left padding does
        not move them. With ``canvas_length`` set, the last ``canvas_length`` columns are the
        canvas and the columns before them the context (``canvas.py`` says who sees whom);
        ``self_conditioning`` [N, canvas_length, V]: the previous denoising step's logits for
        the canvas input (None: none, a canvas's first step).

        ``shadow`` (``tensors.shadow.Shadow``): the last ``shadow.length`` columns of ``tokens``
        are shadow rows of the canvas columns ``shadow.start + j`` (``shadow.py`` says who sees
        whom); ``attention_mask``, ``position_ids`` and ``out_index`` cover the canvas columns;
        the result holds the canvas rows (all of them, or ``out_index``'s) followed by the
        shadow rows, and ``kv_out`` the keys and values of both.
        """
        n, t = tokens.shape
        x = self._embed(tokens)
        s = 0
        if shadow is not None:
            if self.cfg.canvas_length is not None:
                raise ValueError("shadow rows are not defined for a network with a canvas "
                                 "(canvas_length)")
            s = shadow.length
            t -= s
        context = None
        if self.cfg.canvas_length is not None:
            if t < self.cfg.canvas_length:
                raise ValueError(f"tokens hold {t} columns, fewer than the canvas of "
                                 f"{self.cfg.canvas_length}")
            x = self._canvas_input(x, self_conditioning)
            context = (torch.arange(t, device=tokens.device) < t - self.cfg.canvas_length)[None, :, None]
        elif self_conditioning is not None:
            raise ValueError("self_conditioning is for a network with a canvas (canvas_length)")
        keep = None if attention_mask is None else attention_mask.to(torch.bool)
        if keep is not None and position_ids is None:
            position_ids = (keep.long().cumsum(-1) - 1).clamp(min=0)
        if position_ids is None:     # one table row for all: broadcast, not N copies
            position_ids = torch.arange(t, device=tokens.device)[None]
        if out_index is not None and out_index.dim() == 1:
            out_index = out_index.expand(n, -1).contiguous()   # one index form: one compiled graph
        canvas_positions, canvas_index = position_ids, out_index
        if shadow is not None:
            columns = shadow_columns(shadow.start, s)
            position_ids = shadow_positions(position_ids, columns)
            shadow_bias = additive_bias(
                shadow_visible(position_ids, columns, keep, self.block_size)[:, None], x.dtype)
            if out_index is not None:
                rows = torch.arange(t, t + s, device=tokens.device).expand(n, -1)
                out_index = torch.cat([out_index, rows], dim=1)
        last = len(self.blocks) - 1
        kinds = {}      # per kind of layer (global or not): tables and masks, built once
        for i, block in enumerate(self.blocks):
            kind = self.cfg.is_global(i)
            if kind not in kinds:
                biases = self._biases(canvas_positions, t, i, keep, x.dtype, canvas_index)
                if shadow is not None:
                    biases = tuple(ShadowMask(b, shadow_bias) for b in biases)
                kinds[kind] = (*self._rotary(position_ids, x.dtype, i), *biases)
            cos, sin, attn_bias, last_bias = kinds[kind]
            extra = () if context is None else (context,)
            if i == last and out_index is not None:
                x, k, v = block.forward_rows(x, cos, sin, last_bias, out_index, *extra)
            else:
                x, k, v = block(x, cos, sin, attn_bias, *extra)
            if kv_out is not None:      # keys after rotary: cached keys carry their positions
                kv_out.append((k, v))
            del k, v
        return self.norm(x)

    def _biases(self, position_ids, t: int, layer: int, keep, dtype, out_index):
        """(additive bias of every query row, of the rows ``out_index``) for ``layer``'s kind;
        None where nothing is hidden."""
        allowed = self._allowed(position_ids, t, layer)
        if allowed is None:
            if keep is None:
                return None, None
            # Additive bias rather than a boolean mask: a fully padded query row would otherwise
            # produce NaNs in SDPA.
            bias = additive_bias(keep[:, None, None, :], dtype)
            return bias, bias
        if keep is not None:
            allowed = allowed & keep[:, None, :]
        last = None
        if out_index is not None:
            last = additive_bias(take_rows(allowed, out_index)[:, None], dtype)
        bias = additive_bias(allowed[:, None], dtype)
        n_context = t - (self.cfg.canvas_length or 0)
        if (self.cfg.window_of(layer) is not None and n_context > 0
                and ops.active() is not ops.TORCH):
            # under the batch-invariant kernels a sliding-window layer of a canvas call attends
            # in two calls, as a shadow call does: the context rows over the context keys, the
            # canvas rows over every key. Those kernels pack the keys some query of a call sees
            # and tile them from the first: the canvas rows' call then packs exactly their own
            # keys (the last window - 1 context keys and the canvas), which is all a cached call
            # holds (``canvas_cached``), so both sum over the same tiles. torch's own kernels
            # promise no such equality, so they keep the one call
            bias = ShadowMask(bias[:, :, :n_context, :n_context], bias[:, :, n_context:])
        return bias, last

    def hidden_cached(self, tokens: torch.Tensor, position_ids: torch.Tensor, kv: list,
                      attn_bias: torch.Tensor) -> torch.Tensor:
        """Final-norm hidden states [R, Q, d_model] of query tokens [R, Q] at ``position_ids``
        [R, Q], attending per layer to cached (keys, values) ``kv[layer]`` [R, Hkv, T, D] and to
        the queries' own fresh keys, as ``attn_bias`` [R, 1, Q, T + Q] (additive) allows."""
        if self.cfg.canvas_length is not None or self.cfg.global_layers is not None:
            raise ValueError("KV-cached calls are not implemented for a network with a canvas "
                             "(canvas_length) or global layers")
        x = self._embed(tokens)
        cos, sin = self._rotary(position_ids, x.dtype)
        for block, (ck, cv) in zip(self.blocks, kv):
            x = block.forward_cached(x, cos, sin, ck, cv, attn_bias)
        return self.norm(x)

    def canvas_cached(self, tokens: torch.Tensor, start: torch.Tensor, kv: list,
                      key_pos: torch.Tensor, key_keep: torch.Tensor,
                      self_conditioning: torch.Tensor | None = None) -> torch.Tensor:
        """Final-norm hidden states [N, C, d_model] of the canvas ``tokens`` [N, C] (C =
        ``canvas_length``; position ids ``start`` [N] onwards), its context read from a cache:
        ``W`` context columns at position ids ``key_pos`` [N, W], real where ``key_keep``
        [N, W], and per layer the encoder's keys after rotary and values ``kv[layer]``
        [N, Hkv, W_l, D] of the last ``W_l <= W`` of them (a sliding-window layer's cache may
        hold only the keys its canvas rows see, ``canvas.py``). The same rows as
        :meth:`hidden`'s canvas rows over context + canvas: the context rows are causal, so
        their keys do not depend on the canvas."""
        c = self.cfg.canvas_length
        if c is None or tokens.shape[1] != c:
            raise ValueError(f"canvas_cached takes the canvas of a network with canvas_length "
                             f"({c}); got {tokens.shape[1]} columns")
        x = self._canvas_input(self._embed(tokens), self_conditioning)
        pos = start[:, None] + torch.arange(c, device=tokens.device)
        w = key_pos.shape[1]
        kinds = {}
        for i, (block, (ck, cv)) in enumerate(zip(self.blocks, kv)):
            kind = self.cfg.is_global(i)
            if kind not in kinds:
                cols = slice(w - ck.shape[2], w)        # the columns this kind's cache holds
                seen = cached_canvas_keys(key_pos[:, cols], key_keep[:, cols], start, c,
                                          self.cfg.window_of(i))
                kinds[kind] = (*self._rotary(pos, x.dtype, i), additive_bias(seen, x.dtype))
            x = block.forward_cached(x, *kinds[kind][:2], ck, cv, kinds[kind][2])
        return self.norm(x)

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits [.., V] of final hidden states: the working dtype, or float32 with
        ``logit_softcap`` (``cap * tanh(logits / cap)``, computed in float32)."""
        if self.head_spans is None:
            out = _project(self.lm_head, hidden)
        else:
            out = self.comm.gather_spans(_project(self.lm_head, hidden), self.head_spans)
        cap = self.cfg.logit_softcap
        return out if cap is None else torch.tanh(out.float() / cap) * cap

    def forward(self, tokens, attention_mask=None, position_ids=None):
        return self.head(self.hidden(tokens, attention_mask, position_ids))
