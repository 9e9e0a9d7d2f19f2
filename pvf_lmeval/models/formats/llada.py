"""LLaDA and LLaDA-1.5 (OLMo-style names, ``model_type`` "llada"), read into the native network."""

from __future__ import annotations

from dataclasses import replace

import json

from ..transformer import TransformerConfig
from .base import CheckpointFormat, UnsupportedCheckpoint, check_flags, count, need

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


#: (key, LLaDA's default when absent, values the native network implements). The defaults are
#: those of LLaDA's model config class, which differ from the released checkpoint's values: an
#: OLMo "sequential" block, LayerNorm, SwiGLU-by-halves, no rotary, a tied head.
LLADA_FLAGS = (
    ("block_type", "sequential", ("llama",)),
    ("activation_type", "swiglu", ("silu",)),
    ("layer_norm_type", "default", ("rms",)),
    ("layer_norm_with_affine", True, (True,)),
    ("bias_for_layer_norm", None, (None, False)),
    ("attention_layer_norm", False, (False,)),
    ("rope", False, (True,)),
    ("rope_full_precision", True, (True, False)),
    ("alibi", False, (False,)),
    ("input_emb_norm", False, (False,)),
    ("scale_logits", False, (False,)),
    ("include_bias", False, (False,)),
    ("include_qkv_bias", False, (False, True)),
    ("weight_tying", True, (True, False)),
    ("block_group_size", 1, (1,)),
)


def _llada_kv_heads(cfg: dict, n_heads: int) -> int:
    """LLaDA's effective key/value head count (``n_kv_heads``, or ``multi_query_attention``)."""
    mqa = cfg.get("multi_query_attention")
    implied = None if mqa is None else (1 if mqa else n_heads)
    if cfg.get("n_kv_heads") is None:
        return implied or n_heads
    n_kv = need(cfg, "n_kv_heads", "LLaDA")
    if implied is not None and n_kv != implied:
        raise UnsupportedCheckpoint(f"config.json: n_kv_heads={n_kv} contradicts "
                                    f"multi_query_attention={json.dumps(mqa)}")
    return n_kv


def _llada_ffn(cfg: dict, d_model: int) -> int:
    """LLaDA's MLP width: ``mlp_hidden_size``, or ``mlp_ratio * d_model`` when it is null
    (both integers: the reference sizes ``nn.Linear`` with the product as it is)."""
    if cfg.get("mlp_hidden_size") is not None:
        return need(cfg, "mlp_hidden_size", "LLaDA")
    return count(cfg, "mlp_ratio", "LLaDA", default=4) * d_model


def _llada_vocab(cfg: dict) -> int:
    """The embedding rows: ``embedding_size``, or ``vocab_size`` when it is null, as LLaDA reads
    them; LLaDA refuses an ``embedding_size`` below ``vocab_size`` (0 included)."""
    vocab = need(cfg, "vocab_size", "LLaDA")
    if cfg.get("embedding_size") is None:
        return vocab
    rows = need(cfg, "embedding_size", "LLaDA")
    if rows < vocab:
        raise UnsupportedCheckpoint(f"config.json: embedding_size={rows} is smaller than "
                                    f"vocab_size={vocab}; LLaDA needs an embedding row per "
                                    f"token id")
    return rows


def _llada_read(cfg: dict) -> TransformerConfig:
    check_flags(cfg, LLADA_FLAGS, "LLaDA")
    d_model, n_heads = need(cfg, "d_model", "LLaDA"), need(cfg, "n_heads", "LLaDA")
    return TransformerConfig(
        vocab_size=_llada_vocab(cfg),
        d_model=d_model,
        n_layers=need(cfg, "n_layers", "LLaDA"),
        n_heads=n_heads,
        n_kv_heads=_llada_kv_heads(cfg, n_heads),
        ffn_hidden=_llada_ffn(cfg, d_model),
        norm_eps=cfg.get("rms_norm_eps", 1e-5),
        rope_theta=cfg.get("rope_theta", 10000.0),
        qkv_bias=bool(cfg.get("include_qkv_bias", False)),
        max_seq_len=cfg.get("max_sequence_length", 1024),
        rope_full_precision=bool(cfg.get("rope_full_precision", True)),
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
        "rope_full_precision": c.rope_full_precision,
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
    tie_flag="weight_tying", tie_default=True,
    title="LLaDA, LLaDA-1.5", architectures=("LLaDAModelLM",),
)
#: MMaDA's text model: LLaDA's network, names and keys under its own ``model_type`` (its
#: ``MMadaModelLM`` subclasses ``LLaDAModelLM``; text generation is LLaDA's)
MMADA = replace(LLADA, model_type="mmada", title="MMaDA (text)", architectures=("MMadaModelLM",))
