"""Checkpoint formats: LLaDA and Dream configs and weight names, mapped onto the native network.

A format knows how to read its ``config.json`` into a ``TransformerConfig``, how its weight names
map to the native parameter names (both ways, so the tiny fixtures are written in the real
formats), and whether its logits are shifted (Dream: the output at ``i-1`` predicts ``i``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

from .transformer import TransformerConfig


class UnsupportedCheckpoint(ValueError):
    """The folder holds something other than a supported diffusion LM."""


@dataclass(frozen=True)
class CheckpointFormat:
    model_type: str
    family: str                      # "llada" | "dream": the key used by vocabulary artifacts
    logit_shift: int                 # 1 when the output at i-1 predicts position i
    name_map: tuple[tuple[str, str], ...]   # (checkpoint regex, native template) with {i} = layer
    read_config: Callable[[dict], TransformerConfig]
    write_config: Callable[[TransformerConfig, dict], dict]
    tied_names: tuple[str, str]      # (checkpoint head name, checkpoint embedding name)
    tie_flag: str                    # config key that says the head is the embedding

    def to_native(self, name: str) -> str | None:
        for pattern, native in self.name_map:
            m = re.fullmatch(pattern, name)
            if m:
                return native.format(**m.groupdict())
        return None

    def from_native(self, name: str) -> str:
        for pattern, native in self.name_map:
            native_re = re.escape(native).replace(r"\{i\}", r"(?P<i>\d+)")
            m = re.fullmatch(native_re, name)
            if m:
                plain = pattern.replace(r"(?P<i>\d+)", "{i}").replace("\\.", ".")
                return plain.format(**m.groupdict())
        raise KeyError(f"native parameter {name!r} has no {self.model_type} name")


def _require(cfg: dict, key: str, expected) -> None:
    if key in cfg and cfg[key] != expected:
        raise UnsupportedCheckpoint(
            f"config.json: {key}={cfg[key]!r} is not supported (only {expected!r})"
        )


# --- LLaDA (OLMo-style names, model_type "llada") -------------------------------------------

_LLADA_BLOCK = r"model\.transformer\.blocks\.(?P<i>\d+)\."
LLADA_NAMES = (
    (r"model\.transformer\.wte\.weight", "embed.weight"),
    (_LLADA_BLOCK + r"attn_norm\.weight", "blocks.{i}.attn_norm.weight"),
    (_LLADA_BLOCK + r"q_proj\.weight", "blocks.{i}.attn.q_proj.weight"),
    (_LLADA_BLOCK + r"k_proj\.weight", "blocks.{i}.attn.k_proj.weight"),
    (_LLADA_BLOCK + r"v_proj\.weight", "blocks.{i}.attn.v_proj.weight"),
    (_LLADA_BLOCK + r"q_proj\.bias", "blocks.{i}.attn.q_proj.bias"),
    (_LLADA_BLOCK + r"k_proj\.bias", "blocks.{i}.attn.k_proj.bias"),
    (_LLADA_BLOCK + r"v_proj\.bias", "blocks.{i}.attn.v_proj.bias"),
    (_LLADA_BLOCK + r"attn_out\.weight", "blocks.{i}.attn.o_proj.weight"),
    (_LLADA_BLOCK + r"ff_norm\.weight", "blocks.{i}.mlp_norm.weight"),
    (_LLADA_BLOCK + r"ff_proj\.weight", "blocks.{i}.mlp.gate_proj.weight"),
    (_LLADA_BLOCK + r"up_proj\.weight", "blocks.{i}.mlp.up_proj.weight"),
    (_LLADA_BLOCK + r"ff_out\.weight", "blocks.{i}.mlp.down_proj.weight"),
    (r"model\.transformer\.ln_f\.weight", "norm.weight"),
    (r"model\.transformer\.ff_out\.weight", "lm_head.weight"),
)


def _llada_read(cfg: dict) -> TransformerConfig:
    for key, expected in (("block_type", "llama"), ("layer_norm_type", "rms"),
                          ("activation_type", "silu"), ("alibi", False), ("scale_logits", False),
                          ("include_bias", False)):
        _require(cfg, key, expected)
    d_model, n_heads = cfg["d_model"], cfg["n_heads"]
    ffn = cfg.get("mlp_hidden_size") or cfg.get("mlp_ratio", 4) * d_model
    return TransformerConfig(
        vocab_size=cfg.get("embedding_size") or cfg["vocab_size"],
        d_model=d_model,
        n_layers=cfg["n_layers"],
        n_heads=n_heads,
        n_kv_heads=cfg.get("n_kv_heads") or n_heads,
        ffn_hidden=ffn,
        norm_eps=cfg.get("rms_norm_eps", 1e-5),
        rope_theta=cfg.get("rope_theta", 10000.0),
        qkv_bias=bool(cfg.get("include_qkv_bias", False)),
        max_seq_len=cfg.get("max_sequence_length", 4096),
    )


def _llada_write(c: TransformerConfig, special: dict) -> dict:
    return {
        "architectures": ["LLaDAModelLM"],
        "model_type": "llada",
        "d_model": c.d_model,
        "n_layers": c.n_layers,
        "n_heads": c.n_heads,
        "n_kv_heads": c.n_kv_heads,
        "mlp_hidden_size": c.ffn_hidden,
        "mlp_ratio": c.ffn_hidden // c.d_model,
        "vocab_size": c.vocab_size,
        "embedding_size": c.vocab_size,
        "max_sequence_length": c.max_seq_len,
        "rope": True,
        "rope_theta": c.rope_theta,
        "rope_full_precision": True,
        "rms_norm_eps": c.norm_eps,
        "layer_norm_type": "rms",
        "layer_norm_with_affine": True,
        "activation_type": "silu",
        "block_type": "llama",
        "include_bias": False,
        "include_qkv_bias": c.qkv_bias,
        "weight_tying": False,
        "scale_logits": False,
        "alibi": False,
        "use_cache": False,
        "torch_dtype": "float32",
        **special,
    }


LLADA = CheckpointFormat(
    model_type="llada", family="llada", logit_shift=0, name_map=LLADA_NAMES,
    read_config=_llada_read, write_config=_llada_write,
    tied_names=("model.transformer.ff_out.weight", "model.transformer.wte.weight"),
    tie_flag="weight_tying",
)

# --- Dream (Qwen2 names, model_type "Dream") ----------------------------------------------

_QWEN_LAYER = r"model\.layers\.(?P<i>\d+)\."
DREAM_NAMES = (
    (r"model\.embed_tokens\.weight", "embed.weight"),
    (_QWEN_LAYER + r"input_layernorm\.weight", "blocks.{i}.attn_norm.weight"),
    (_QWEN_LAYER + r"self_attn\.q_proj\.weight", "blocks.{i}.attn.q_proj.weight"),
    (_QWEN_LAYER + r"self_attn\.k_proj\.weight", "blocks.{i}.attn.k_proj.weight"),
    (_QWEN_LAYER + r"self_attn\.v_proj\.weight", "blocks.{i}.attn.v_proj.weight"),
    (_QWEN_LAYER + r"self_attn\.q_proj\.bias", "blocks.{i}.attn.q_proj.bias"),
    (_QWEN_LAYER + r"self_attn\.k_proj\.bias", "blocks.{i}.attn.k_proj.bias"),
    (_QWEN_LAYER + r"self_attn\.v_proj\.bias", "blocks.{i}.attn.v_proj.bias"),
    (_QWEN_LAYER + r"self_attn\.o_proj\.weight", "blocks.{i}.attn.o_proj.weight"),
    (_QWEN_LAYER + r"post_attention_layernorm\.weight", "blocks.{i}.mlp_norm.weight"),
    (_QWEN_LAYER + r"mlp\.gate_proj\.weight", "blocks.{i}.mlp.gate_proj.weight"),
    (_QWEN_LAYER + r"mlp\.up_proj\.weight", "blocks.{i}.mlp.up_proj.weight"),
    (_QWEN_LAYER + r"mlp\.down_proj\.weight", "blocks.{i}.mlp.down_proj.weight"),
    (r"model\.norm\.weight", "norm.weight"),
    (r"lm_head\.weight", "lm_head.weight"),
)


def _dream_read(cfg: dict) -> TransformerConfig:
    _require(cfg, "hidden_act", "silu")
    n_heads = cfg["num_attention_heads"]
    return TransformerConfig(
        vocab_size=cfg["vocab_size"],
        d_model=cfg["hidden_size"],
        n_layers=cfg["num_hidden_layers"],
        n_heads=n_heads,
        n_kv_heads=cfg.get("num_key_value_heads") or n_heads,
        ffn_hidden=cfg["intermediate_size"],
        norm_eps=cfg.get("rms_norm_eps", 1e-6),
        rope_theta=cfg.get("rope_theta", 10000.0),
        qkv_bias=True,
        max_seq_len=cfg.get("max_position_embeddings", 2048),
    )


def _dream_write(c: TransformerConfig, special: dict) -> dict:
    return {
        "architectures": ["DreamModel"],
        "model_type": "Dream",
        "hidden_size": c.d_model,
        "num_hidden_layers": c.n_layers,
        "num_attention_heads": c.n_heads,
        "num_key_value_heads": c.n_kv_heads,
        "intermediate_size": c.ffn_hidden,
        "vocab_size": c.vocab_size,
        "rms_norm_eps": c.norm_eps,
        "rope_theta": c.rope_theta,
        "hidden_act": "silu",
        "max_position_embeddings": c.max_seq_len,
        "tie_word_embeddings": False,
        "use_cache": False,
        "torch_dtype": "float32",
        **special,
    }


DREAM = CheckpointFormat(
    model_type="Dream", family="dream", logit_shift=1, name_map=DREAM_NAMES,
    read_config=_dream_read, write_config=_dream_write,
    tied_names=("lm_head.weight", "model.embed_tokens.weight"),
    tie_flag="tie_word_embeddings",
)

FORMATS = {f.model_type: f for f in (LLADA, DREAM)}


def format_for(config: dict, where: str = "config.json") -> CheckpointFormat:
    """The format of a checkpoint config, or a one-line error naming ``model_type``."""
    model_type = config.get("model_type")
    fmt = FORMATS.get(model_type)
    if fmt is None:
        raise UnsupportedCheckpoint(
            f"model_type={model_type!r} in {where} is not a supported diffusion LM; "
            f"supported model_type values: {', '.join(FORMATS)}"
        )
    return fmt
