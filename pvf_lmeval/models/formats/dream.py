"""Dream (Qwen2 names, ``model_type`` "Dream"): Qwen2 with bidirectional attention and logits
shifted by one (the output at ``i-1`` predicts ``i``)."""

from __future__ import annotations

from ..transformer import TransformerConfig
from .base import CheckpointFormat, check_flags, need, null_or_count, qwen_names

#: Qwen2's names: q/k/v biases, no QK norm
DREAM_NAMES = qwen_names(biases="qkv")


#: (key, Dream's default when absent, values the native network implements). Dream is Qwen2
#: with bidirectional attention: q/k/v always carry a bias, o_proj and the MLP never do.
DREAM_FLAGS = (
    ("hidden_act", "silu", ("silu",)),
    ("rope_scaling", None, (None,)),
    ("use_sliding_window", False, (False,)),
    ("tie_word_embeddings", False, (False, True)),
)


def qwen2_config(cfg: dict, mt: str, flags: tuple = DREAM_FLAGS, **extra) -> TransformerConfig:
    """The network of a Qwen2-layout config (q/k/v biases, no QK norm); ``mt`` names the family
    in errors, ``extra`` adds fields (``block_size``)."""
    check_flags(cfg, flags, mt)
    n_heads = need(cfg, "num_attention_heads", mt)
    return TransformerConfig(
        vocab_size=need(cfg, "vocab_size", mt),
        d_model=need(cfg, "hidden_size", mt),
        n_layers=need(cfg, "num_hidden_layers", mt),
        n_heads=n_heads,
        n_kv_heads=null_or_count(cfg, "num_key_value_heads", mt, null=n_heads),
        ffn_hidden=need(cfg, "intermediate_size", mt),
        norm_eps=cfg.get("rms_norm_eps", 1e-6),
        rope_theta=cfg.get("rope_theta", 10000.0),
        qkv_bias=True,
        max_seq_len=cfg.get("max_position_embeddings", 32768),
        **extra,
    )


def _dream_read(cfg: dict) -> TransformerConfig:
    return qwen2_config(cfg, "Dream")


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
    tie_flag="tie_word_embeddings", tie_default=False, tokenizer_class="Qwen2Tokenizer",
    title="Dream, Dream-Coder, DiffuCoder", architectures=("DreamModel",),
)
