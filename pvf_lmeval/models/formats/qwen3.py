"""The Qwen3-layout families: SDAR and its fine-tunes such as TraDo (``sdar``), SDAR-MoE
(``sdar_moe``) and RND1 (``rnd1``).

Qwen3 attention: per-head RMSNorm on queries and keys (``q_norm``/``k_norm``) before rotary,
``head_dim`` independent of the width, biases on q/k/v/o only with ``attention_bias``.

- SDAR (``modeling_sdar.py``): block diffusion with blocks of ``block_size`` positions counted
  from position 0 (the reference ``generate`` builds that mask over prompt and generation; 4 when
  the key is absent, the reference ``generate``'s default), no logit shift, ``mask_token_id``
  from config.json.
- SDAR-MoE: SDAR's attention and blocks with Qwen3-MoE feed-forward layers (below).
- SDAR's every RMSNorm (input, post-attention, final, per-head q/k) is flash-attn's fused
  ``rms_norm_fn``: times the weight in float32, one rounding (``norm_weight_fp32``); SDAR-MoE's
  own file is not public, so it follows SDAR's. RND1's norms are transformers' Qwen3-MoE ones
  (vLLM's with ``moe_backend="vllm"``, the same rounding): rounded, then times the weight.
- RND1 (``modeling_rnd.py``): Qwen3-MoE, bidirectional, shifted logits (the output at ``i-1``
  predicts ``i``, ``sampling.py``), mask 151669 (its config class's default). Its config class
  overwrites the routing keys with Qwen3-30B-A3B's values whatever config.json says (every layer
  routed, weights renormalised: ``norm_topk_prob`` true; ``head_dim`` 128); so do we. It also
  writes ``rope_scaling: false``, read as no scaling, as its rotary reads it.

Qwen3-MoE feed-forward (transformers' ``Qwen3MoeSparseMoeBlock``): softmax over the experts in
float32, the ``num_experts_per_tok`` best, divided by their sum when ``norm_topk_prob`` (also for a
single expert), no shared expert, no bias; a layer is routed unless it is in ``mlp_only_layers``
or ``(i + 1) % decoder_sparse_step != 0`` (then a dense MLP of ``intermediate_size``).
"""

from __future__ import annotations

import json

from ..moe import MoEConfig
from ..transformer import TransformerConfig
from .base import (EXPERT, MAX_TABLE_LAYERS, QWEN_LAYER, CheckpointFormat, UnsupportedCheckpoint,
                   check_flags, count, expert_counts, need, null_or_count, qwen_names)

#: SDAR's block length when config.json has no ``block_size`` (the reference generate's default)
SDAR_BLOCK_SIZE = 4
#: RND1's mask id when config.json has none (its config class's default)
RND1_GENERATE_IDS = (("mask_token_id", 151669),)

#: Qwen3's names: per-head QK norm; biases present only with ``attention_bias``
QWEN3_NAMES = qwen_names(biases="qkvo", qk_norm=True)
QWEN3_MOE_NAMES = QWEN3_NAMES + (
    (QWEN_LAYER + r"mlp\.gate\.weight", "blocks.{i}.mlp.router.weight"),
    (QWEN_LAYER + r"mlp\." + EXPERT + r"gate_proj\.weight", "blocks.{i}.mlp.gate_proj"),
    (QWEN_LAYER + r"mlp\." + EXPERT + r"up_proj\.weight", "blocks.{i}.mlp.up_proj"),
    (QWEN_LAYER + r"mlp\." + EXPERT + r"down_proj\.weight", "blocks.{i}.mlp.down_proj"),
)

#: (key, the references' default when absent, values the native network implements)
QWEN3_FLAGS = (
    ("hidden_act", "silu", ("silu",)),
    ("rope_scaling", None, (None,)),
    ("use_sliding_window", False, (False,)),
    ("attention_bias", False, (False, True)),
    ("tie_word_embeddings", False, (False, True)),
)
#: RND1's: its config class writes ``rope_scaling: false`` (and ``sliding_window: false``, which
#: no reader uses), and its rotary, transformers' Qwen3-MoE one, reads anything but a dict as no
#: scaling; SDAR's config class raises on false (``rope_config_validation``)
RND1_FLAGS = tuple((key, default, (None, False) if key == "rope_scaling" else supported)
                   for key, default, supported in QWEN3_FLAGS)


def _block_size(cfg: dict, mt: str) -> int:
    value = cfg.get("block_size", SDAR_BLOCK_SIZE)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UnsupportedCheckpoint(f"config.json: block_size={json.dumps(value)}; a {mt} "
                                    f"checkpoint needs it as a positive integer")
    return value


def _routed_layers(cfg: dict, n_layers: int, mt: str) -> tuple[bool, ...] | None:
    """Qwen3-MoE's rule: layer i is routed unless it is in ``mlp_only_layers`` or
    ``(i + 1) % decoder_sparse_step`` is not 0 (None: every layer routed)."""
    step = cfg.get("decoder_sparse_step", 1)
    dense = cfg.get("mlp_only_layers") or []
    if isinstance(step, bool) or not isinstance(step, int) or step < 1:
        raise UnsupportedCheckpoint(f"config.json: decoder_sparse_step={json.dumps(step)}; a {mt} "
                                    f"checkpoint needs it as a positive integer")
    if not isinstance(dense, list) or not all(isinstance(i, int) and not isinstance(i, bool)
                                              for i in dense):
        raise UnsupportedCheckpoint(f"config.json: mlp_only_layers={json.dumps(dense)}; a {mt} "
                                    f"checkpoint needs a list of layer indices")
    if step == 1 and not dense:
        return None                                      # every layer routed
    if n_layers > MAX_TABLE_LAYERS:     # the weights' layer count is checked later: no 10**9 table
        raise UnsupportedCheckpoint(f"config.json: num_hidden_layers={n_layers} with dense layers "
                                    f"(decoder_sparse_step, mlp_only_layers); a {mt} checkpoint "
                                    f"has at most {MAX_TABLE_LAYERS}")
    dense = set(dense)
    return tuple(i not in dense and (i + 1) % step == 0 for i in range(n_layers))


def _qwen3(cfg: dict, mt: str, *, head_dim_default: int | None, moe: MoEConfig | None = None,
           block_size: int | None = None, norm_weight_fp32: bool = False,
           flags: tuple = QWEN3_FLAGS) -> TransformerConfig:
    """The network of a Qwen3-layout config; ``head_dim_default``: the reference's ``head_dim``
    when the key is absent (None: ``hidden_size // num_attention_heads``); ``norm_weight_fp32``:
    the reference's norms are flash-attn's fused kernel (``TransformerConfig``)."""
    check_flags(cfg, flags, mt)
    d_model, n_heads = need(cfg, "hidden_size", mt), need(cfg, "num_attention_heads", mt)
    # Qwen3's attention sizes its projections by head_dim as it stands: a null or 0 one builds
    # nothing the weights fit, so only an absent key takes the default
    head_dim = (count(cfg, "head_dim", mt) if "head_dim" in cfg
                else head_dim_default or d_model // n_heads)
    all_routed = moe is not None and moe.all_routed
    bias = bool(cfg.get("attention_bias", False))
    return TransformerConfig(
        vocab_size=need(cfg, "vocab_size", mt), d_model=d_model,
        n_layers=need(cfg, "num_hidden_layers", mt), n_heads=n_heads,
        n_kv_heads=null_or_count(cfg, "num_key_value_heads", mt, null=n_heads),
        ffn_hidden=0 if all_routed else need(cfg, "intermediate_size", mt),
        norm_eps=cfg.get("rms_norm_eps", 1e-6), rope_theta=cfg.get("rope_theta", 10000.0),
        qkv_bias=bias, o_bias=bias, max_seq_len=cfg.get("max_position_embeddings", 32768),
        head_size=head_dim if head_dim != d_model // n_heads else None, qk_norm=True,
        norm_weight_fp32=norm_weight_fp32, moe=moe, block_size=block_size)


def _qwen3_moe(cfg: dict, mt: str, n_layers: int, normalize: bool) -> MoEConfig:
    n_experts, top_k = expert_counts(cfg, mt)
    return MoEConfig(
        n_experts=n_experts, top_k=top_k,
        expert_hidden=need(cfg, "moe_intermediate_size", mt), score="softmax",
        normalize=normalize, normalize_single=True, layers=_routed_layers(cfg, n_layers, mt))


def _sdar_read(cfg: dict) -> TransformerConfig:
    return _qwen3(cfg, "SDAR", head_dim_default=128, block_size=_block_size(cfg, "SDAR"),
                  norm_weight_fp32=True)


def _sdar_moe_read(cfg: dict) -> TransformerConfig:
    mt = "SDAR-MoE"
    moe = _qwen3_moe(cfg, mt, need(cfg, "num_hidden_layers", mt),
                     normalize=bool(cfg.get("norm_topk_prob", False)))
    return _qwen3(cfg, mt, head_dim_default=None, moe=moe, block_size=_block_size(cfg, mt),
                  norm_weight_fp32=True)


def _rnd1_read(cfg: dict) -> TransformerConfig:
    mt = "RND1"
    n_layers = need(cfg, "num_hidden_layers", mt)
    n_experts, top_k = expert_counts(cfg, mt)
    moe = MoEConfig(n_experts=n_experts, top_k=top_k,
                    expert_hidden=need(cfg, "moe_intermediate_size", mt), score="softmax",
                    normalize=True, normalize_single=True)
    return _qwen3(cfg, mt, head_dim_default=128, moe=moe, flags=RND1_FLAGS)


def _writer(model_type: str, architecture: str):
    def write(c: TransformerConfig, special: dict) -> dict:
        m = c.moe
        out = {
            "architectures": [architecture], "model_type": model_type,
            "vocab_size": c.vocab_size, "hidden_size": c.d_model,
            "num_hidden_layers": c.n_layers, "num_attention_heads": c.n_heads,
            "num_key_value_heads": c.n_kv_heads, "head_dim": c.head_dim,
            "intermediate_size": c.ffn_hidden, "attention_bias": c.qkv_bias,
            "rms_norm_eps": c.norm_eps, "rope_theta": c.rope_theta, "rope_scaling": None,
            "max_position_embeddings": c.max_seq_len, "hidden_act": "silu",
            "use_sliding_window": False, "tie_word_embeddings": False, "use_cache": False,
            "torch_dtype": "float32",
        }
        if c.block_size is not None:
            out["block_size"] = c.block_size
        if m is not None:
            out.update({"num_experts": m.n_experts, "num_experts_per_tok": m.top_k,
                        "moe_intermediate_size": m.expert_hidden, "norm_topk_prob": m.normalize,
                        "decoder_sparse_step": 1,
                        "mlp_only_layers": [i for i in range(c.n_layers) if not m.routed(i)]})
        return {**out, **special}
    return write


def _format(model_type, family, title, architecture, names, read, *, shift=0, defaults=(),
            attention="bidirectional"):
    return CheckpointFormat(
        model_type=model_type, family=family, logit_shift=shift, name_map=names,
        read_config=read, write_config=_writer(model_type, architecture),
        tied_names=("lm_head.weight", "model.embed_tokens.weight"),
        tie_flag="tie_word_embeddings", tie_default=False, tokenizer_class="Qwen2Tokenizer",
        generate_defaults=defaults, title=title, architectures=(architecture,),
        attention=attention)


_SDAR_BLOCKS = f"block-causal, blocks of block_size ({SDAR_BLOCK_SIZE} if absent)"
SDAR = _format("sdar", "sdar", "SDAR, TraDo", "SDARForCausalLM", QWEN3_NAMES, _sdar_read,
               attention=_SDAR_BLOCKS)
SDAR_MOE = _format("sdar_moe", "sdar", "SDAR-MoE", "SDARMoeForCausalLM", QWEN3_MOE_NAMES,
                   _sdar_moe_read, attention=_SDAR_BLOCKS)
RND1 = _format("rnd1", "rnd1", "RND1", "RND1LM", QWEN3_MOE_NAMES, _rnd1_read, shift=1,
               defaults=RND1_GENERATE_IDS)
