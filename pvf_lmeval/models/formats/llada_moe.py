"""LLaDA-MoE (``lladamoe``; released folders say "llada"): bidirectional, Qwen-style names, per-head
QK norm (``qk_layernorm``), partial rotary (``partial_rotary_factor``), ``moe_layer_freq`` (per
layer: 0 = dense MLP of ``dense_intermediate_size``), a shared expert per routed layer. Its
reference router takes a softmax over the logits, adds ``expert_bias`` (with
``moe_router_enable_expert_bias``) and keeps the top-k of that sum as the weights, without
renormalisation: it reads neither ``norm_topk_prob``, ``moe_router_score_function``,
``routed_scaling_factor`` nor the router group keys, and neither do we.

Config keys, their defaults when absent and the weight names are those of the reference modeling
code (``modeling_lladamoe.py``); the routing rule it applies is written out in
:class:`..moe.MoEConfig` terms.
"""

from __future__ import annotations

import json

from ..moe import MoEConfig
from ..transformer import TransformerConfig
from .base import (EXPERT, QWEN_LAYER, CheckpointFormat, UnsupportedCheckpoint, check_flags, need,
                   expert_counts, null_or_count, positive, qwen_names, rotary_dim)

LLADA_MOE_NAMES = qwen_names(biases="qkvo", qk_norm=True) + (
    (QWEN_LAYER + r"mlp\.gate\.weight", "blocks.{i}.mlp.router.weight"),
    (QWEN_LAYER + r"mlp\.expert_bias", "blocks.{i}.mlp.expert_bias"),
    (QWEN_LAYER + r"mlp\." + EXPERT + r"gate_proj\.weight", "blocks.{i}.mlp.gate_proj"),
    (QWEN_LAYER + r"mlp\." + EXPERT + r"up_proj\.weight", "blocks.{i}.mlp.up_proj"),
    (QWEN_LAYER + r"mlp\." + EXPERT + r"down_proj\.weight", "blocks.{i}.mlp.down_proj"),
    (QWEN_LAYER + r"shared_expert\.gate_proj\.weight", "blocks.{i}.mlp.shared.gate_proj.weight"),
    (QWEN_LAYER + r"shared_expert\.up_proj\.weight", "blocks.{i}.mlp.shared.up_proj.weight"),
    (QWEN_LAYER + r"shared_expert\.down_proj\.weight", "blocks.{i}.mlp.shared.down_proj.weight"),
)

#: (key, the reference's default when absent, values the native network implements)
LLADA_MOE_FLAGS = (
    ("hidden_act", "silu", ("silu",)),
    ("rope_scaling", None, (None,)),
    ("clip_qkv", None, (None,)),
    ("attention_bias", False, (False, True)),
    ("tie_word_embeddings", False, (False, True)),
)


def _routed_layers(freq, n_layers: int, mt: str) -> tuple[bool, ...]:
    """``moe_layer_freq`` as the reference reads it: layer ``i`` is dense when entry ``i`` equals
    0 (``0``, ``0.0``, ``false``) and routed otherwise; a list of at least ``num_hidden_layers``
    numbers, entries past the last layer never read (the released 7B-A1B: 16 ones, every layer
    routed)."""
    if (not isinstance(freq, list) or len(freq) < n_layers
            or not all(isinstance(v, (int, float)) for v in freq[:n_layers])):
        shown = json.dumps(freq)
        shown = shown if len(shown) <= 80 else shown[:77] + "..."
        raise UnsupportedCheckpoint(f"config.json: moe_layer_freq={shown}; a {mt} checkpoint "
                                    f"needs a list of at least num_hidden_layers={n_layers} "
                                    f"numbers, one per layer (0 = dense, else routed)")
    return tuple(v != 0 for v in freq[:n_layers])


def _lladamoe_read(cfg: dict) -> TransformerConfig:
    mt = "LLaDA-MoE"
    check_flags(cfg, LLADA_MOE_FLAGS, mt)
    d_model, n_heads = need(cfg, "hidden_size", mt), need(cfg, "num_attention_heads", mt)
    n_layers = need(cfg, "num_hidden_layers", mt)
    head_dim = d_model // n_heads
    if head_dim * n_heads != d_model:
        raise UnsupportedCheckpoint(f"config.json: hidden_size={d_model} is not a multiple of "
                                    f"num_attention_heads={n_heads}")
    if cfg.get("head_dim") not in (None, head_dim):
        raise UnsupportedCheckpoint(f"config.json: head_dim={json.dumps(cfg['head_dim'])} differs from "
                                    f"hidden_size/num_attention_heads={head_dim}, which {mt} attention uses")
    routed = _routed_layers(cfg.get("moe_layer_freq"), n_layers, mt)
    shared = cfg.get("shared_expert_intermediate_size")
    n_experts, top_k = expert_counts(cfg, mt)
    moe = MoEConfig(
        n_experts=n_experts, top_k=top_k,
        expert_hidden=need(cfg, "expert_intermediate_size", mt),
        shared_hidden=0 if shared is None else need(cfg, "shared_expert_intermediate_size", mt),
        score="softmax", expert_bias=bool(cfg.get("moe_router_enable_expert_bias")),
        bias_in_weight=True, normalize=False, layers=routed)
    bias = bool(cfg.get("attention_bias", False))
    return TransformerConfig(
        vocab_size=need(cfg, "vocab_size", mt), d_model=d_model, n_layers=n_layers,
        n_heads=n_heads, n_kv_heads=null_or_count(cfg, "num_key_value_heads", mt, null=n_heads),
        ffn_hidden=0 if all(routed) else need(cfg, "dense_intermediate_size", mt),
        norm_eps=cfg.get("rms_norm_eps", 1e-5),
        rope_theta=positive(cfg, "rope_theta", -1, mt),
        qkv_bias=bias, o_bias=bias, max_seq_len=cfg.get("max_position_embeddings", 4096),
        rotary_dim=rotary_dim(head_dim, cfg.get("partial_rotary_factor", -1), mt),
        qk_norm=bool(cfg.get("qk_layernorm")), moe=moe)


def _lladamoe_write(c: TransformerConfig, special: dict) -> dict:
    m = c.moe
    return {
        "architectures": ["LLaDAMoEModelLM"],
        "model_type": "lladamoe",
        "vocab_size": c.vocab_size, "hidden_size": c.d_model, "num_hidden_layers": c.n_layers,
        "num_attention_heads": c.n_heads, "num_key_value_heads": c.n_kv_heads,
        "dense_intermediate_size": c.ffn_hidden, "expert_intermediate_size": m.expert_hidden,
        "shared_expert_intermediate_size": m.shared_hidden or None,
        "num_experts": m.n_experts, "num_experts_per_tok": m.top_k,
        "moe_layer_freq": [int(m.routed(i)) for i in range(c.n_layers)],
        "moe_router_enable_expert_bias": m.expert_bias,
        "norm_topk_prob": False, "moe_router_score_function": "softmax",
        "qk_layernorm": c.qk_norm, "partial_rotary_factor": c.rope_dim / c.head_dim,
        "rope_theta": c.rope_theta, "rms_norm_eps": c.norm_eps, "attention_bias": c.qkv_bias,
        "max_position_embeddings": c.max_seq_len, "hidden_act": "silu",
        "tie_word_embeddings": False, "use_cache": False, "torch_dtype": "float32",
        **special,
    }


LLADA_MOE = CheckpointFormat(
    model_type="lladamoe", family="llada-moe", logit_shift=0, name_map=LLADA_MOE_NAMES,
    read_config=_lladamoe_read, write_config=_lladamoe_write,
    tied_names=("lm_head.weight", "model.embed_tokens.weight"),
    tie_flag="tie_word_embeddings", tie_default=False,
    title="LLaDA-MoE", architectures=("LLaDAMoEModelLM",),
)
