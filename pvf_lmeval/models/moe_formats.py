"""Checkpoint formats of the mixture-of-experts families: LLaDA-MoE and LLaDA 2.x.

Config keys, their defaults when absent and the weight names are those of the families' reference
modeling code (``modeling_lladamoe.py``, ``modeling_llada2_moe.py``); the routing rule each
reference applies is written out in :class:`.moe.MoEConfig` terms below.

LLaDA-MoE (``lladamoe``; released folders say "llada"): bidirectional, Qwen-style names, per-head
QK norm (``qk_layernorm``), partial rotary (``partial_rotary_factor``), ``moe_layer_freq`` (per
layer: 0 = dense MLP of ``dense_intermediate_size``), a shared expert per routed layer. Its
reference router takes a softmax over the logits, adds ``expert_bias`` (with
``moe_router_enable_expert_bias``) and keeps the top-k of that sum as the weights, without
renormalisation: it reads neither ``norm_topk_prob``, ``moe_router_score_function``,
``routed_scaling_factor`` nor the router group keys, and neither do we.

LLaDA 2.x (``llada2_moe``): fused ``query_key_value``, QK norm, partial rotary (default 0.5),
``head_dim``, the first ``first_k_dense_replace`` layers dense, sigmoid scores in float32, an
``expert_bias`` for selection only, group-limited top-k (``n_group``/``topk_group``), weights
renormalised (top-k > 1) and scaled by ``routed_scaling_factor``, ``num_shared_experts`` shared
experts of ``moe_intermediate_size`` each. Block diffusion: blocks of 32 positions (the block
length of the reference ``generate``).
"""

from __future__ import annotations

import json

from .checkpoints import CheckpointFormat, UnsupportedCheckpoint, _need, check_flags
from .moe import MoEConfig
from .transformer import TransformerConfig

#: block length of LLaDA2's reference ``generate`` (its default ``block_length``)
LLADA2_BLOCK_SIZE = 32
#: LLaDA2's reference ``generate`` defaults: mask and end-of-text ids
LLADA2_GENERATE_IDS = (("mask_token_id", 156895), ("eos_token_id", 156892))

_LAYER = r"model\.layers\.(?P<i>\d+)\."
_EXPERT = r"experts\.(?P<e>\d+)\."


def _rotary_dim(head_dim: int, factor, model_type: str) -> int:
    """``int(head_dim * partial_rotary_factor)``, as the reference's rotary tables are sized."""
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not 0 < factor <= 1:
        raise UnsupportedCheckpoint(f"config.json: partial_rotary_factor={json.dumps(factor)}; a "
                                    f"{model_type} checkpoint needs it in (0, 1]")
    dim = int(head_dim * factor)
    if dim < 2 or dim % 2:
        raise UnsupportedCheckpoint(f"config.json: partial_rotary_factor={factor} rotates {dim} of "
                                    f"{head_dim} head dimensions; rotary needs an even number >= 2")
    return dim


def _positive(cfg: dict, key: str, default, model_type: str) -> float:
    value = cfg.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise UnsupportedCheckpoint(f"config.json: {key}={json.dumps(value)}; a {model_type} "
                                    f"checkpoint needs it as a positive number")
    return value


# --- LLaDA-MoE ----------------------------------------------------------------------------------

LLADA_MOE_NAMES = (
    (r"model\.embed_tokens\.weight", "embed.weight"),
    (_LAYER + r"input_layernorm\.weight", "blocks.{i}.attn_norm.weight"),
    (_LAYER + r"self_attn\.q_proj\.weight", "blocks.{i}.attn.q_proj.weight"),
    (_LAYER + r"self_attn\.k_proj\.weight", "blocks.{i}.attn.k_proj.weight"),
    (_LAYER + r"self_attn\.v_proj\.weight", "blocks.{i}.attn.v_proj.weight"),
    (_LAYER + r"self_attn\.o_proj\.weight", "blocks.{i}.attn.o_proj.weight"),
    (_LAYER + r"self_attn\.q_proj\.bias", "blocks.{i}.attn.q_proj.bias"),
    (_LAYER + r"self_attn\.k_proj\.bias", "blocks.{i}.attn.k_proj.bias"),
    (_LAYER + r"self_attn\.v_proj\.bias", "blocks.{i}.attn.v_proj.bias"),
    (_LAYER + r"self_attn\.o_proj\.bias", "blocks.{i}.attn.o_proj.bias"),
    (_LAYER + r"self_attn\.q_norm\.weight", "blocks.{i}.attn.q_norm.weight"),
    (_LAYER + r"self_attn\.k_norm\.weight", "blocks.{i}.attn.k_norm.weight"),
    (_LAYER + r"post_attention_layernorm\.weight", "blocks.{i}.mlp_norm.weight"),
    (_LAYER + r"mlp\.gate_proj\.weight", "blocks.{i}.mlp.gate_proj.weight"),
    (_LAYER + r"mlp\.up_proj\.weight", "blocks.{i}.mlp.up_proj.weight"),
    (_LAYER + r"mlp\.down_proj\.weight", "blocks.{i}.mlp.down_proj.weight"),
    (_LAYER + r"mlp\.gate\.weight", "blocks.{i}.mlp.router.weight"),
    (_LAYER + r"mlp\.expert_bias", "blocks.{i}.mlp.expert_bias"),
    (_LAYER + r"mlp\." + _EXPERT + r"gate_proj\.weight", "blocks.{i}.mlp.gate_proj"),
    (_LAYER + r"mlp\." + _EXPERT + r"up_proj\.weight", "blocks.{i}.mlp.up_proj"),
    (_LAYER + r"mlp\." + _EXPERT + r"down_proj\.weight", "blocks.{i}.mlp.down_proj"),
    (_LAYER + r"shared_expert\.gate_proj\.weight", "blocks.{i}.mlp.shared.gate_proj.weight"),
    (_LAYER + r"shared_expert\.up_proj\.weight", "blocks.{i}.mlp.shared.up_proj.weight"),
    (_LAYER + r"shared_expert\.down_proj\.weight", "blocks.{i}.mlp.shared.down_proj.weight"),
    (r"model\.norm\.weight", "norm.weight"),
    (r"lm_head\.weight", "lm_head.weight"),
)

#: (key, the reference's default when absent, values the native network implements)
LLADA_MOE_FLAGS = (
    ("hidden_act", "silu", ("silu",)),
    ("rope_scaling", None, (None,)),
    ("clip_qkv", None, (None,)),
    ("attention_bias", False, (False, True)),
    ("tie_word_embeddings", False, (False, True)),
)


def _lladamoe_read(cfg: dict) -> TransformerConfig:
    mt = "LLaDA-MoE"
    check_flags(cfg, LLADA_MOE_FLAGS, mt)
    d_model, n_heads = _need(cfg, "hidden_size", mt), _need(cfg, "num_attention_heads", mt)
    n_layers = _need(cfg, "num_hidden_layers", mt)
    head_dim = d_model // n_heads
    if head_dim * n_heads != d_model:
        raise UnsupportedCheckpoint(f"config.json: hidden_size={d_model} is not a multiple of "
                                    f"num_attention_heads={n_heads}")
    if cfg.get("head_dim") not in (None, head_dim):
        raise UnsupportedCheckpoint(f"config.json: head_dim={cfg['head_dim']} differs from "
                                    f"hidden_size/num_attention_heads={head_dim}, which {mt} attention uses")
    freq = cfg.get("moe_layer_freq")
    if not isinstance(freq, list) or len(freq) != n_layers:
        raise UnsupportedCheckpoint(f"config.json: moe_layer_freq={json.dumps(freq)}; a {mt} "
                                    f"checkpoint needs a list of {n_layers} entries (0 = dense layer)")
    routed = tuple(v != 0 for v in freq)
    shared = cfg.get("shared_expert_intermediate_size")
    moe = MoEConfig(
        n_experts=_need(cfg, "num_experts", mt), top_k=_need(cfg, "num_experts_per_tok", mt),
        expert_hidden=_need(cfg, "expert_intermediate_size", mt),
        shared_hidden=0 if shared is None else _need(cfg, "shared_expert_intermediate_size", mt),
        score="softmax", expert_bias=bool(cfg.get("moe_router_enable_expert_bias")),
        bias_in_weight=True, normalize=False, layers=routed)
    bias = bool(cfg.get("attention_bias", False))
    return TransformerConfig(
        vocab_size=_need(cfg, "vocab_size", mt), d_model=d_model, n_layers=n_layers,
        n_heads=n_heads, n_kv_heads=cfg.get("num_key_value_heads") or n_heads,
        ffn_hidden=_need(cfg, "dense_intermediate_size", mt) if not all(routed) else 0,
        norm_eps=cfg.get("rms_norm_eps", 1e-5),
        rope_theta=_positive(cfg, "rope_theta", -1, mt),
        qkv_bias=bias, o_bias=bias, max_seq_len=cfg.get("max_position_embeddings", 4096),
        rotary_dim=_rotary_dim(head_dim, cfg.get("partial_rotary_factor", -1), mt),
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
)

# --- LLaDA 2.x ----------------------------------------------------------------------------------

LLADA2_NAMES = (
    (r"model\.word_embeddings\.weight", "embed.weight"),
    (_LAYER + r"input_layernorm\.weight", "blocks.{i}.attn_norm.weight"),
    (_LAYER + r"attention\.query_key_value\.weight", "blocks.{i}.attn.qkv_proj.weight"),
    (_LAYER + r"attention\.query_key_value\.bias", "blocks.{i}.attn.qkv_proj.bias"),
    (_LAYER + r"attention\.query_layernorm\.weight", "blocks.{i}.attn.q_norm.weight"),
    (_LAYER + r"attention\.key_layernorm\.weight", "blocks.{i}.attn.k_norm.weight"),
    (_LAYER + r"attention\.dense\.weight", "blocks.{i}.attn.o_proj.weight"),
    (_LAYER + r"attention\.dense\.bias", "blocks.{i}.attn.o_proj.bias"),
    (_LAYER + r"post_attention_layernorm\.weight", "blocks.{i}.mlp_norm.weight"),
    (_LAYER + r"mlp\.gate_proj\.weight", "blocks.{i}.mlp.gate_proj.weight"),
    (_LAYER + r"mlp\.up_proj\.weight", "blocks.{i}.mlp.up_proj.weight"),
    (_LAYER + r"mlp\.down_proj\.weight", "blocks.{i}.mlp.down_proj.weight"),
    (_LAYER + r"mlp\.gate\.weight", "blocks.{i}.mlp.router.weight"),
    (_LAYER + r"mlp\.gate\.expert_bias", "blocks.{i}.mlp.expert_bias"),
    (_LAYER + r"mlp\." + _EXPERT + r"gate_proj\.weight", "blocks.{i}.mlp.gate_proj"),
    (_LAYER + r"mlp\." + _EXPERT + r"up_proj\.weight", "blocks.{i}.mlp.up_proj"),
    (_LAYER + r"mlp\." + _EXPERT + r"down_proj\.weight", "blocks.{i}.mlp.down_proj"),
    (_LAYER + r"mlp\.shared_experts\.gate_proj\.weight", "blocks.{i}.mlp.shared.gate_proj.weight"),
    (_LAYER + r"mlp\.shared_experts\.up_proj\.weight", "blocks.{i}.mlp.shared.up_proj.weight"),
    (_LAYER + r"mlp\.shared_experts\.down_proj\.weight", "blocks.{i}.mlp.shared.down_proj.weight"),
    (r"model\.norm\.weight", "norm.weight"),
    (r"lm_head\.weight", "lm_head.weight"),
)

LLADA2_FLAGS = (
    ("hidden_act", "silu", ("silu",)),
    ("rope_scaling", None, (None,)),
    ("use_sliding_window", False, (False,)),
    ("norm_head", False, (False,)),
    ("use_qkv_bias", False, (False, True)),
    ("use_bias", True, (False, True)),
    ("use_qk_norm", True, (False, True)),
    ("tie_word_embeddings", False, (False, True)),
)


def _llada2_reader(model_type: str, zero_kv_means_all: bool):
    def read(cfg: dict) -> TransformerConfig:
        mt = model_type
        check_flags(cfg, LLADA2_FLAGS, mt)
        d_model, n_heads = _need(cfg, "hidden_size", mt), _need(cfg, "num_attention_heads", mt)
        n_layers = _need(cfg, "num_hidden_layers", mt)
        n_kv = cfg.get("num_key_value_heads", 0)
        if n_kv == 0 and zero_kv_means_all:
            n_kv = n_heads
        if isinstance(n_kv, bool) or not isinstance(n_kv, int) or n_kv < 1 or n_heads % n_kv:
            raise UnsupportedCheckpoint(f"config.json: num_key_value_heads={json.dumps(n_kv)}; a {mt} "
                                        f"checkpoint needs a positive divisor of num_attention_heads={n_heads}")
        head_dim = cfg.get("head_dim") or d_model // n_heads
        dense = cfg.get("first_k_dense_replace", 0)
        if isinstance(dense, bool) or not isinstance(dense, int) or dense < 0:
            raise UnsupportedCheckpoint(f"config.json: first_k_dense_replace={json.dumps(dense)} must "
                                        f"be a non-negative integer")
        moe = None
        routed = tuple(i >= dense for i in range(n_layers))
        if cfg.get("num_experts") is not None and any(routed):
            shared = cfg.get("num_shared_experts", 0) or 0
            expert_hidden = _need(cfg, "moe_intermediate_size", mt)
            moe = MoEConfig(
                n_experts=_need(cfg, "num_experts", mt), top_k=cfg.get("num_experts_per_tok", 2),
                expert_hidden=expert_hidden, shared_hidden=expert_hidden * shared,
                score="sigmoid", expert_bias=True, bias_in_weight=False, normalize=True,
                scaling=float(cfg.get("routed_scaling_factor", 2.5)),
                n_groups=cfg.get("n_group", 8), topk_groups=cfg.get("topk_group", 4),
                router_fp32=True, layers=routed)
        all_routed = moe is not None and all(routed)
        return TransformerConfig(
            vocab_size=_need(cfg, "vocab_size", mt), d_model=d_model, n_layers=n_layers,
            n_heads=n_heads, n_kv_heads=n_kv,
            ffn_hidden=0 if all_routed else _need(cfg, "intermediate_size", mt),
            norm_eps=cfg.get("rms_norm_eps", 1e-5),
            rope_theta=_positive(cfg, "rope_theta", 10000.0, mt),
            qkv_bias=bool(cfg.get("use_qkv_bias", False)), o_bias=bool(cfg.get("use_bias", True)),
            max_seq_len=cfg.get("max_position_embeddings", 16384),
            head_size=head_dim if head_dim != d_model // n_heads else None,
            rotary_dim=_rotary_dim(head_dim, cfg.get("partial_rotary_factor", 0.5), mt),
            qk_norm=bool(cfg.get("use_qk_norm", True)), fused_qkv=True, moe=moe,
            block_size=LLADA2_BLOCK_SIZE)
    return read


def _llada2_writer(model_type: str):
    def write(c: TransformerConfig, special: dict) -> dict:
        m = c.moe
        dense = next((i for i in range(c.n_layers) if m is not None and m.routed(i)), c.n_layers)
        return {
            "architectures": ["LLaDA2MoeModelLM"],
            "model_type": model_type,
            "vocab_size": c.vocab_size, "hidden_size": c.d_model, "num_hidden_layers": c.n_layers,
            "num_attention_heads": c.n_heads, "num_key_value_heads": c.n_kv_heads,
            "head_dim": c.head_dim, "intermediate_size": c.ffn_hidden,
            "moe_intermediate_size": m.expert_hidden if m else None,
            "num_experts": m.n_experts if m else None,
            "num_experts_per_tok": m.top_k if m else 2,
            "num_shared_experts": (m.shared_hidden // m.expert_hidden) if m else 0,
            "n_group": m.n_groups if m else 1, "topk_group": m.topk_groups if m else 1,
            "routed_scaling_factor": m.scaling if m else 1.0,
            "first_k_dense_replace": dense,
            "use_qkv_bias": c.qkv_bias, "use_bias": c.o_bias, "use_qk_norm": c.qk_norm,
            "partial_rotary_factor": c.rope_dim / c.head_dim, "rope_theta": c.rope_theta,
            "rms_norm_eps": c.norm_eps, "max_position_embeddings": c.max_seq_len,
            "hidden_act": "silu", "norm_head": False, "tie_word_embeddings": False,
            "use_cache": False, "torch_dtype": "float32",
            **special,
        }
    return write


def _llada2_format(model_type: str, zero_kv_means_all: bool) -> CheckpointFormat:
    return CheckpointFormat(
        model_type=model_type, family="llada2", logit_shift=0, name_map=LLADA2_NAMES,
        read_config=_llada2_reader(model_type, zero_kv_means_all),
        write_config=_llada2_writer(model_type),
        tied_names=("lm_head.weight", "model.word_embeddings.weight"),
        tie_flag="tie_word_embeddings", tie_default=False,
        generate_defaults=LLADA2_GENERATE_IDS,
    )


#: LLaDA2.0-mini/flash and LLaDA2.1 as their hub folders name them
LLADA2 = _llada2_format("llada2_moe", zero_kv_means_all=False)
#: the same network under the model_type of the LLaDA2.1 port in dllm (num_key_value_heads 0 =
#: one key/value head per query head)
LLADA21 = _llada2_format("llada21_moe", zero_kv_means_all=True)
