"""Routed experts: the feed-forward layer of mixture-of-experts checkpoints (LLaDA-MoE, LLaDA 2.x,
the Qwen3-MoE families: SDAR-MoE, RND1).

A router scores every token against ``n_experts`` experts; each token goes to its ``top_k``
experts, whose SwiGLU outputs are summed with the routing weights; shared experts (a SwiGLU MLP
every token goes through) are added on top. Tokens are grouped by expert (sorted, one product
per expert through :func:`ops.grouped_linear`), never looped over.

Routing (:func:`route`), in the order it is computed, all in float32:

0. with ``router_input_norm`` (Gemma-4) the router reads RMSNorm(x) without a weight, times
   the learned vector ``router_scale`` and ``d_model ** -0.5``, in the working dtype; else x;
1. scores = softmax or sigmoid of the router logits;
2. selection scores = scores + ``expert_bias`` (when the checkpoint has one);
3. with ``n_groups > 1``: the experts are split into ``n_groups`` consecutive groups, each group
   is scored by the sum of its two best selection scores, and only the ``topk_groups`` best
   groups stay eligible;
4. the ``top_k`` eligible experts with the highest selection scores are chosen;
5. their weights are the scores (``bias_in_weight``: the selection scores), divided by their sum
   when ``normalize`` (plus 1e-20; for ``top_k == 1`` only with ``normalize_single``), times
   ``scaling``, and with ``per_expert_scale`` times the chosen experts' learned factors.

The families' rules in these terms: LLaDA-MoE = softmax, ``expert_bias`` in the weights, no
normalisation; LLaDA 2.x = sigmoid, bias for selection only, groups, normalised (top-k > 1),
scaled; Qwen3-MoE = softmax, normalised (``norm_topk_prob``, a single expert too: weight 1), no
bias, no shared expert; Gemma-4 (DiffusionGemma) = the normed router input, softmax, normalised
(a single expert too), per-expert factors, GeGLU experts whose gate and up rows are one stacked
``gate_up_proj`` [E, 2F, d] (gate rows first).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from . import ops
from .mlp import ACTIVATIONS, MLP

SCORE_FUNCTIONS = ("softmax", "sigmoid")


@dataclass(frozen=True)
class MoEConfig:
    """Shape and routing rule of the routed-expert layers (see the module docstring)."""

    n_experts: int
    top_k: int
    expert_hidden: int
    #: width of the shared expert MLP (0 = none)
    shared_hidden: int = 0
    score: str = "softmax"
    #: an ``expert_bias`` vector [n_experts] added to the scores for selection
    expert_bias: bool = False
    #: the chosen weights include the expert bias (LLaDA-MoE's reference); else selection only
    bias_in_weight: bool = False
    normalize: bool = False
    #: with ``normalize``, a single chosen expert is divided by its own score too (weight 1:
    #: Qwen3-MoE); LLaDA 2.x's reference leaves a single expert's score as it is
    normalize_single: bool = False
    scaling: float = 1.0
    n_groups: int = 1
    topk_groups: int = 1
    #: the router's product in float32 (LLaDA2) rather than the working dtype (LLaDA-MoE)
    router_fp32: bool = False
    #: per layer, whether it is routed (False = a dense MLP of ``ffn_hidden``); None = all
    layers: tuple[bool, ...] | None = None
    #: the experts' gate activation (``mlp.ACTIVATIONS``)
    activation: str = "silu"
    #: gate and up projections stacked in one parameter ``gate_up_proj`` [E, 2F, d]
    fused_gate_up: bool = False
    #: step 0 of the routing (module docstring): a learned ``router_scale`` [d] on the normed input
    router_input_norm: bool = False
    #: the chosen weights times a learned factor per expert (``per_expert_scale`` [E])
    per_expert_scale: bool = False

    def routed(self, layer: int) -> bool:
        return self.layers is None or bool(self.layers[layer])

    @property
    def all_routed(self) -> bool:
        """Whether every layer is routed (no dense MLP anywhere)."""
        return self.layers is None or all(self.layers)

    def __post_init__(self):
        if self.score not in SCORE_FUNCTIONS:
            raise ValueError(f"score={self.score!r} must be one of {', '.join(SCORE_FUNCTIONS)}")
        if not 1 <= self.top_k <= self.n_experts:
            raise ValueError(f"top_k={self.top_k} must be in 1..n_experts={self.n_experts}")
        if self.n_groups < 1 or self.n_experts % self.n_groups:
            raise ValueError(f"n_groups={self.n_groups} must divide n_experts={self.n_experts}")
        if self.n_groups > 1 and self.n_experts // self.n_groups < 2:
            raise ValueError(f"n_groups={self.n_groups}: a group is scored by its two best "
                             f"experts, so it needs at least 2 of the {self.n_experts}")
        if not 1 <= self.topk_groups <= self.n_groups:
            raise ValueError(f"topk_groups={self.topk_groups} must be in 1..n_groups={self.n_groups}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation={self.activation!r} must be one of {', '.join(ACTIVATIONS)}")


def route(logits: torch.Tensor, cfg: MoEConfig, expert_bias: torch.Tensor | None = None,
          per_expert_scale: torch.Tensor | None = None):
    """(expert ids [M, top_k], weights [M, top_k] float32) for router ``logits`` [M, n_experts]
    (steps 1-5 of the module docstring)."""
    logits = logits.float()
    scores = torch.softmax(logits, dim=-1) if cfg.score == "softmax" else torch.sigmoid(logits)
    select = scores if expert_bias is None else scores + expert_bias.float()
    if cfg.n_groups > 1:
        m = select.shape[0]
        grouped = select.view(m, cfg.n_groups, -1)
        group_score = grouped.topk(2, dim=-1).values.sum(-1)                     # [M, G]
        kept = group_score.topk(cfg.topk_groups, dim=-1).indices
        eligible = torch.zeros_like(group_score, dtype=torch.bool).scatter_(1, kept, True)
        select = grouped.masked_fill(~eligible[..., None], float("-inf")).view(m, -1)
    top, idx = select.topk(cfg.top_k, dim=-1)
    weight = top if cfg.bias_in_weight else scores.gather(1, idx)
    if cfg.normalize and (cfg.top_k > 1 or cfg.normalize_single):
        weight = weight / (weight.sum(-1, keepdim=True) + 1e-20)
    weight = weight * cfg.scaling
    if per_expert_scale is not None:
        weight = weight * per_expert_scale[idx]
    return idx, weight


def gated(x: torch.Tensor, gate: torch.Tensor, up: torch.Tensor | None, down: torch.Tensor,
          sizes: list[int], act: str = "silu") -> torch.Tensor:
    """Expert gated MLP (``act``: SwiGLU's silu or GeGLU's gelu_tanh, by ``ops.ACTIVATIONS``
    name) over rows ``x`` [M, d] grouped by expert (``sizes[e]`` consecutive rows per expert);
    ``gate``/``up`` [E, F, d], or with ``up`` None ``gate`` the stacked gate and up rows
    [E, 2F, d]; ``down`` [E, d, F].

    On the CPU the activation runs expert by expert: a CPU elementwise kernel computes the
    elements of each thread's last partial vector stride in scalar code, which may round
    differently, so an element's value could depend on how many rows of other experts come
    before it. Per expert, a row's activation depends on its own expert's rows only, as under
    expert parallel, where a rank holds some of the experts (bit for bit one process's); under
    the CPU's batch-invariant ops (``batch_invariant=true``) each row is also padded to whole
    vector steps (``ops.activation``), so no row's elements reach the scalar loop. A CUDA
    elementwise kernel computes every element alike, so there it is one operation."""
    if up is None:
        g, u = ops.grouped_linear(x, gate, sizes).chunk(2, dim=-1)
    else:
        g, u = ops.grouped_linear(x, gate, sizes), ops.grouped_linear(x, up, sizes)
    nonempty = [n for n in sizes if n]
    if x.device.type != "cpu" or len(nonempty) < 2:
        h = ops.activation(g, act) * u
    else:
        h = torch.cat([ops.activation(a, act) * b
                       for a, b in zip(g.split(nonempty), u.split(nonempty))])
    return ops.grouped_linear(h, down, sizes)


class RoutedExperts(nn.Module):
    """[N, T, d] -> [N, T, d]: routed top-k experts (stacked weights ``gate_proj``/``up_proj``
    [E, F, d], or ``gate_up_proj`` [E, 2F, d], and ``down_proj`` [E, d, F]) plus the shared MLP.

    Expert parallel (``shard``, ``comm``): this rank holds experts ``shard.experts`` = [lo, hi)
    (the stacked weights are theirs only) and the whole router; every rank routes every token
    the same way, computes the (token, slot) rows of its own experts exactly as one process
    does (the same grouped products over the same rows), and one all-reduce of the rows, each
    nonzero on its owner only, gives every rank every row bit for bit. The weighted sum over
    the slots is then one process's. With ``shard.mlp`` the shared MLP is split as well."""

    def __init__(self, d_model: int, cfg: MoEConfig, shard=None, comm=None,
                 norm_eps: float = 1e-6):
        super().__init__()
        self.cfg = cfg
        self.eps = norm_eps                         # the router input's RMSNorm (step 0)
        self.experts = shard.experts if shard is not None else (0, cfg.n_experts)
        self.comm = comm
        e, f = self.experts[1] - self.experts[0], cfg.expert_hidden
        self.router = nn.Linear(d_model, cfg.n_experts, bias=False)
        if cfg.expert_bias:
            self.register_buffer("expert_bias", torch.zeros(cfg.n_experts))
        else:
            self.expert_bias = None
        self.router_scale = nn.Parameter(torch.ones(d_model)) if cfg.router_input_norm else None
        self.per_expert_scale = (nn.Parameter(torch.ones(cfg.n_experts))
                                 if cfg.per_expert_scale else None)
        if cfg.fused_gate_up:
            self.gate_up_proj = nn.Parameter(torch.empty(e, 2 * f, d_model))
        else:
            self.gate_proj = nn.Parameter(torch.empty(e, f, d_model))
            self.up_proj = nn.Parameter(torch.empty(e, f, d_model))
        self.down_proj = nn.Parameter(torch.empty(e, d_model, f))
        self.act = cfg.activation
        self.shared = None
        if cfg.shared_hidden:
            split = shard is not None and shard.mlp
            hidden = shard.width(cfg.shared_hidden, split) if shard else cfg.shared_hidden
            self.shared = MLP(d_model, hidden, comm if split else None, cfg.activation)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """Router logits [M, E] in float32 for rows ``h`` [M, d]."""
        if self.router_scale is not None:       # step 0: Gemma-4's router input
            unit = torch.ones(h.shape[-1], dtype=h.dtype, device=h.device)
            h = ops.rms_norm(h, unit, self.eps, True) * self.router_scale * h.shape[-1] ** -0.5
        w = self.router.weight
        if self.cfg.router_fp32:
            return ops.linear(h.float(), w.float())
        return ops.linear(h, w).float()

    def _projections(self):
        """(gate or stacked gate-up, up or None, down) weights of this rank's experts."""
        if self.cfg.fused_gate_up:
            return self.gate_up_proj, None, self.down_proj
        return self.gate_proj, self.up_proj, self.down_proj

    def forward(self, x: torch.Tensor, router_x: torch.Tensor | None = None) -> torch.Tensor:
        """``router_x`` (same shape as ``x``): what the router reads when it is not ``x``
        (Gemma-4 routes the layer's un-normed input and feeds the experts a normed one)."""
        shape = x.shape
        h = x.reshape(-1, shape[-1])
        r = h if router_x is None else router_x.reshape(-1, shape[-1])
        idx, weight = route(self.logits(r), self.cfg, self.expert_bias, self.per_expert_scale)
        k = self.cfg.top_k
        flat = idx.reshape(-1)                                   # [M * k] expert per (token, slot)
        order = flat.argsort(stable=True)
        # group sizes are the split points of the grouped product: one read back per layer
        sizes = torch.bincount(flat, minlength=self.cfg.n_experts).tolist()
        lo, hi = self.experts
        if self.comm is None:
            y = gated(h[order // k], *self._projections(), sizes, self.act)
            per_slot = torch.empty_like(y).index_copy_(0, order, y)
        else:       # this rank's experts own a contiguous run of the sorted slots
            a, b = sum(sizes[:lo]), sum(sizes[:hi])
            mine = order[a:b]
            y = gated(h[mine // k], *self._projections(), sizes[lo:hi], self.act)
            per_slot = self.comm.all_reduce(
                h.new_zeros(flat.shape[0], shape[-1]).index_copy_(0, mine, y))
        per_slot = per_slot.view(-1, k, shape[-1])
        out = (per_slot.float() * weight[..., None]).sum(1).to(x.dtype)
        if self.shared is not None:
            out = out + self.shared(h)
        return out.view(shape)
