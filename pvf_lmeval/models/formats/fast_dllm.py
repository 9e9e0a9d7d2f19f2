"""Fast-dLLM v2 (``Fast_dLLM_Qwen``, NVIDIA's block diffusion adaptation of Qwen2.5): Qwen2 names
and biases (q/k/v always carry a bias: the reference hard-codes it), block diffusion with blocks
of ``bd_size`` positions counted from position 0 (the reference's ``eval_block_diff_mask``: a
query sees keys whose block is not after its own), and shifted logits (its ``generate`` reads
position ``i`` from the output at ``i - 1``: ``cat([logits[:, :1], logits[:, :-1]])``).

Its config.json has no mask id: the tokenizer's ``|<MASK>|`` (151665) is the mask, as its
``generate`` defaults say. Sliding-window keys are not read: the reference's inference mask never
applies a window.
"""

from __future__ import annotations

import json

from ..transformer import TransformerConfig
from .base import CheckpointFormat, UnsupportedCheckpoint
from .dream import DREAM_NAMES, qwen2_config

#: block length when config.json has no ``bd_size`` (its config class's default)
FAST_DLLM_BLOCK_SIZE = 32
#: the reference generate's defaults (``mask_id``, ``stop_token``)
FAST_DLLM_GENERATE_IDS = (("mask_token_id", 151665), ("eos_token_id", 151645))

#: (key, the reference's default when absent, values the native network implements)
FAST_DLLM_FLAGS = (
    ("hidden_act", "silu", ("silu",)),
    ("rope_scaling", None, (None,)),
    ("tie_word_embeddings", False, (False, True)),
)


def _read(cfg: dict) -> TransformerConfig:
    mt = "Fast-dLLM v2"
    block = cfg.get("bd_size", FAST_DLLM_BLOCK_SIZE)
    if isinstance(block, bool) or not isinstance(block, int) or block < 1:
        raise UnsupportedCheckpoint(f"config.json: bd_size={json.dumps(block)}; a {mt} "
                                    f"checkpoint needs it as a positive integer")
    return qwen2_config(cfg, mt, FAST_DLLM_FLAGS, block_size=block)


def _write(c: TransformerConfig, special: dict) -> dict:
    return {
        "architectures": ["Fast_dLLM_QwenForCausalLM"], "model_type": "Fast_dLLM_Qwen",
        "bd_size": c.block_size, "hidden_size": c.d_model, "num_hidden_layers": c.n_layers,
        "num_attention_heads": c.n_heads, "num_key_value_heads": c.n_kv_heads,
        "intermediate_size": c.ffn_hidden, "vocab_size": c.vocab_size, "rms_norm_eps": c.norm_eps,
        "rope_theta": c.rope_theta, "hidden_act": "silu", "max_position_embeddings": c.max_seq_len,
        "layer_types": ["full_attention"] * c.n_layers, "use_sliding_window": False,
        "tie_word_embeddings": False, "use_cache": False, "torch_dtype": "float32", **special,
    }


FAST_DLLM = CheckpointFormat(
    model_type="Fast_dLLM_Qwen", family="fast-dllm", logit_shift=1, name_map=DREAM_NAMES,
    read_config=_read, write_config=_write,
    tied_names=("lm_head.weight", "model.embed_tokens.weight"),
    tie_flag="tie_word_embeddings", tie_default=False, tokenizer_class="Qwen2Tokenizer",
    generate_defaults=FAST_DLLM_GENERATE_IDS, title="Fast-dLLM v2",
    architectures=("Fast_dLLM_QwenForCausalLM",),
    attention=f"block-causal, blocks of bd_size ({FAST_DLLM_BLOCK_SIZE} if absent)",
)
