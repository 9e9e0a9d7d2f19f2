"""LLaDA 2.x (``llada2_moe``): fused ``query_key_value``, QK norm, partial rotary (default 0.5),
``head_dim``, the first ``first_k_dense_replace`` layers dense, sigmoid scores in float32, an
``expert_bias`` for selection only, group-limited top-k (``n_group``/``topk_group``), weights
renormalised (top-k > 1) and scaled by ``routed_scaling_factor``, ``num_shared_experts`` shared
experts of ``moe_intermediate_size`` each. Block diffusion: blocks of 32 positions (the block
length of the reference ``generate``).

Config keys, their defaults when absent and the weight names are those of the reference modeling
code (``modeling_llada2_moe.py``); the routing rule it applies is written out in
:class:`..moe.MoEConfig` terms.
"""

from __future__ import annotations

import json

from ..moe import MoEConfig
from ..transformer import TransformerConfig
from .base import (EXPERT, MAX_TABLE_LAYERS, QWEN_LAYER, CheckpointFormat, UnsupportedCheckpoint,
                   check_flags, count, expert_counts, need, positive, rotary_dim)

#: block length of LLaDA2's reference ``generate`` (its default ``block_length``)
LLADA2_BLOCK_SIZE = 32
#: LLaDA2's reference ``generate`` defaults: mask and end-of-text ids
LLADA2_GENERATE_IDS = (("mask_token_id", 156895), ("eos_token_id", 156892))


LLADA2_NAMES = (
    (r"model\.word_embeddings\.weight", "embed.weight"),
    (QWEN_LAYER + r"input_layernorm\.weight", "blocks.{i}.attn_norm.weight"),
    (QWEN_LAYER + r"attention\.query_key_value\.weight", "blocks.{i}.attn.qkv_proj.weight"),
    (QWEN_LAYER + r"attention\.query_key_value\.bias", "blocks.{i}.attn.qkv_proj.bias"),
    (QWEN_LAYER + r"attention\.query_layernorm\.weight", "blocks.{i}.attn.q_norm.weight"),
    (QWEN_LAYER + r"attention\.key_layernorm\.weight", "blocks.{i}.attn.k_norm.weight"),
    (QWEN_LAYER + r"attention\.dense\.weight", "blocks.{i}.attn.o_proj.weight"),
    (QWEN_LAYER + r"attention\.dense\.bias", "blocks.{i}.attn.o_proj.bias"),
    (QWEN_LAYER + r"post_attention_layernorm\.weight", "blocks.{i}.mlp_norm.weight"),
    (QWEN_LAYER + r"mlp\.gate_proj\.weight", "blocks.{i}.mlp.gate_proj.weight"),
    (QWEN_LAYER + r"mlp\.up_proj\.weight", "blocks.{i}.mlp.up_proj.weight"),
    (QWEN_LAYER + r"mlp\.down_proj\.weight", "blocks.{i}.mlp.down_proj.weight"),
    (QWEN_LAYER + r"mlp\.gate\.weight", "blocks.{i}.mlp.router.weight"),
    (QWEN_LAYER + r"mlp\.gate\.expert_bias", "blocks.{i}.mlp.expert_bias"),
    (QWEN_LAYER + r"mlp\." + EXPERT + r"gate_proj\.weight", "blocks.{i}.mlp.gate_proj"),
    (QWEN_LAYER + r"mlp\." + EXPERT + r"up_proj\.weight", "blocks.{i}.mlp.up_proj"),
    (QWEN_LAYER + r"mlp\." + EXPERT + r"down_proj\.weight", "blocks.{i}.mlp.down_proj"),
    (QWEN_LAYER + r"mlp\.shared_experts\.gate_proj\.weight", "blocks.{i}.mlp.shared.gate_proj.weight"),
    (QWEN_LAYER + r"mlp\.shared_experts\.up_proj\.weight", "blocks.{i}.mlp.shared.up_proj.weight"),
    (QWEN_LAYER + r"mlp\.shared_experts\.down_proj\.weight", "blocks.{i}.mlp.shared.down_proj.weight"),
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


#: the largest ``routed_scaling_factor`` read (released checkpoints: 2.5; other MoEs up to 16):
#: a larger one scales the routed experts' sum past what the residual stream holds
MAX_ROUTED_SCALING = 1000.0


def _llada2_moe(cfg: dict, mt: str, routed: tuple[bool, ...]) -> MoEConfig:
    """LLaDA 2.x's routing from config.json, each count an integer in the range the reference's
    ``topk`` and group view need (absent: its config class's defaults)."""
    n_experts, top_k = expert_counts(cfg, mt, top_k_default=2)
    expert_hidden = need(cfg, "moe_intermediate_size", mt)
    # the reference builds no shared expert for a null count, and a zero-width one for 0
    shared = 0 if cfg.get("num_shared_experts") is None else count(cfg, "num_shared_experts", mt,
                                                                   low=0)
    n_groups = count(cfg, "n_group", mt, default=8)
    if n_experts % n_groups:
        raise UnsupportedCheckpoint(f"config.json: n_group is {n_groups}; a {mt} checkpoint needs "
                                    f"it as a divisor of num_experts={n_experts}")
    if n_groups > 1 and n_experts // n_groups < 2:
        raise UnsupportedCheckpoint(f"config.json: n_group is {n_groups}; a {mt} checkpoint needs "
                                    f"it at most {n_experts // 2} (num_experts={n_experts} / 2: a "
                                    f"group is scored by its two best experts)")
    return MoEConfig(
        n_experts=n_experts, top_k=top_k, expert_hidden=expert_hidden,
        shared_hidden=expert_hidden * shared, score="sigmoid", expert_bias=True,
        bias_in_weight=False, normalize=True,
        scaling=positive(cfg, "routed_scaling_factor", 2.5, mt, high=MAX_ROUTED_SCALING),
        n_groups=n_groups,
        topk_groups=count(cfg, "topk_group", mt, default=4, high=n_groups,
                          high_says=f"n_group={n_groups}"),
        router_fp32=True, layers=routed)


def _llada2_reader(model_type: str, zero_kv_means_all: bool):
    def read(cfg: dict) -> TransformerConfig:
        mt = model_type
        check_flags(cfg, LLADA2_FLAGS, mt)
        d_model, n_heads = need(cfg, "hidden_size", mt), need(cfg, "num_attention_heads", mt)
        n_layers = need(cfg, "num_hidden_layers", mt)
        n_kv = cfg.get("num_key_value_heads", 0)
        if n_kv == 0 and zero_kv_means_all:
            n_kv = n_heads
        if isinstance(n_kv, bool) or not isinstance(n_kv, int) or n_kv < 1 or n_heads % n_kv:
            raise UnsupportedCheckpoint(f"config.json: num_key_value_heads={json.dumps(n_kv)}; a {mt} "
                                        f"checkpoint needs a positive divisor of num_attention_heads={n_heads}")
        # the config class reads a null or 0 head_dim as the width / heads
        head_dim = need(cfg, "head_dim", mt) if cfg.get("head_dim") else d_model // n_heads
        dense = count(cfg, "first_k_dense_replace", mt, default=0, low=0)
        moe = None
        if n_layers > MAX_TABLE_LAYERS:
            raise UnsupportedCheckpoint(f"config.json: num_hidden_layers={n_layers}; a {mt} "
                                        f"checkpoint has at most {MAX_TABLE_LAYERS}")
        routed = tuple(i >= dense for i in range(n_layers))
        if cfg.get("num_experts") is not None and any(routed):
            moe = _llada2_moe(cfg, mt, routed)
        all_routed = moe is not None and all(routed)
        return TransformerConfig(
            vocab_size=need(cfg, "vocab_size", mt), d_model=d_model, n_layers=n_layers,
            n_heads=n_heads, n_kv_heads=n_kv,
            ffn_hidden=0 if all_routed else need(cfg, "intermediate_size", mt),
            norm_eps=cfg.get("rms_norm_eps", 1e-5),
            rope_theta=positive(cfg, "rope_theta", 10000.0, mt),
            qkv_bias=bool(cfg.get("use_qkv_bias", False)), o_bias=bool(cfg.get("use_bias", True)),
            max_seq_len=cfg.get("max_position_embeddings", 16384),
            head_size=head_dim if head_dim != d_model // n_heads else None,
            rotary_dim=rotary_dim(head_dim, cfg.get("partial_rotary_factor", 0.5), mt),
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


def _llada2_format(model_type: str, zero_kv_means_all: bool, title: str,
                   architectures: tuple[str, ...] = ()) -> CheckpointFormat:
    return CheckpointFormat(
        model_type=model_type, family="llada2", logit_shift=0, name_map=LLADA2_NAMES,
        read_config=_llada2_reader(model_type, zero_kv_means_all),
        write_config=_llada2_writer(model_type),
        tied_names=("lm_head.weight", "model.word_embeddings.weight"),
        tie_flag="tie_word_embeddings", tie_default=False,
        generate_defaults=LLADA2_GENERATE_IDS, title=title, architectures=architectures,
        attention=f"block-causal, blocks of {LLADA2_BLOCK_SIZE}",
    )


#: LLaDA2.0-mini/flash and LLaDA2.1 as their hub folders name them
LLADA2 = _llada2_format("llada2_moe", zero_kv_means_all=False, title="LLaDA 2.0, LLaDA 2.1",
                        architectures=("LLaDA2MoeModelLM",))
#: the same network under the model_type of the LLaDA2.1 port in dllm (num_key_value_heads 0 =
#: one key/value head per query head)
LLADA21 = _llada2_format("llada21_moe", zero_kv_means_all=True, title="LLaDA 2.1 (dllm's port)")
