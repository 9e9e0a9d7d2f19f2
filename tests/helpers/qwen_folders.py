"""Hub-shaped checkpoint folders of the Qwen-tokenizer families, built from facts: SDAR / TraDo
(``sdar``), SDAR-MoE (``sdar_moe``), RND1 (``rnd1``) and Fast-dLLM v2 (``Fast_dLLM_Qwen``).

Config keys are those of the released ``config.json`` files (SDAR-4B/8B-Chat and Fast_dLLM_v2_7B
as committed to JetAstra/SDAR and to Fast-dLLM forks; RND1's from its config class, whose values
it forces; SDAR-MoE's are Qwen3-MoE's keys, its hub file not being public), at small shapes;
weights in two bfloat16 shards under the reference modeling code's names. The tokenizer is the
Qwen2 byte-level vocabulary of :mod:`hub_folders` with each family's added tokens at their real
ids: Qwen3's 151643-151668 and SDAR's ``<|MASK|>`` 151669; Qwen2.5's 151643-151664 and Fast-dLLM
v2's ``|<MASK>|`` 151665. The chat templates are short stand-ins in Qwen's
``<|im_start|>role\\n...<|im_end|>`` shape (the real ones are long Jinja files), written as the
folders ship them: ``chat_template.jinja``. Nothing here is copied from the models' code; the
facts and their sources are in shared/notes/families.md.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import torch
from .hub_folders import (QWEN2_REGULAR, QWEN25_ADDED, _random, dream_vocab, write_shards,
                          write_trap_modules)
from .moe_folders import _swiglu

QWEN3_ADDED = QWEN25_ADDED + ("<tool_response>", "</tool_response>", "<think>", "</think>")
#: stand-in chat template in Qwen's shape (marked: not the released file)
QWEN_CHAT_TEMPLATE = (
    "{# stand-in for the released Qwen template #}"
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


@functools.lru_cache(maxsize=1)
def _qwen2_files() -> tuple[str, str]:
    """(vocab.json, merges.txt) of :func:`dream_vocab`, serialised once per session."""
    vocab, merges = dream_vocab()
    return (json.dumps(vocab, ensure_ascii=False),
            "#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges))


def write_qwen_tokenizer(folder: Path, added: tuple[str, ...], *, eos: str, pad: str,
                         extra: dict | None = None) -> dict[str, int]:
    """Qwen2's byte-level BPE (vocab.json + merges.txt) with ``added`` from id 151643, a
    ``tokenizer_config.json`` naming the built-in Qwen2Tokenizer, and ``chat_template.jinja``.
    Returns the added tokens' ids."""
    vocab_json, merges_txt = _qwen2_files()
    (folder / "vocab.json").write_text(vocab_json)
    (folder / "merges.txt").write_text(merges_txt, encoding="utf-8")
    ids = {t: QWEN2_REGULAR + i for i, t in enumerate(added)}
    decoder = {str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                        "single_word": False, "special": True} for t, i in ids.items()}
    config = {"add_bos_token": False, "add_prefix_space": False, "added_tokens_decoder": decoder,
              "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
              "bos_token": None, "clean_up_tokenization_spaces": False, "eos_token": eos,
              "errors": "replace", "model_max_length": 131072, "pad_token": pad,
              "split_special_tokens": False, "tokenizer_class": "Qwen2Tokenizer", "unk_token": None,
              **(extra or {})}
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False))
    (folder / "chat_template.jinja").write_text(QWEN_CHAT_TEMPLATE)
    return ids


def qwen3_weights(cfg: dict, seed: int) -> dict[str, torch.Tensor]:
    """Qwen3 names: per-head q_norm/k_norm, ``head_dim`` apart from the width; routed layers
    (``num_experts`` present, Qwen3-MoE's rule) have ``mlp.gate`` and ``mlp.experts.{e}``."""
    gen = torch.Generator().manual_seed(seed)
    d, v, hd = cfg["hidden_size"], cfg["vocab_size"], cfg["head_dim"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    bias = cfg.get("attention_bias", False)
    step, dense = cfg.get("decoder_sparse_step", 1), set(cfg.get("mlp_only_layers") or [])
    t = {"model.embed_tokens.weight": _random((v, d), gen, "w")}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t.update({p + "input_layernorm.weight": _random((d,), gen, "norm"),
                  p + "self_attn.q_proj.weight": _random((q, d), gen, "w"),
                  p + "self_attn.k_proj.weight": _random((kv, d), gen, "w"),
                  p + "self_attn.v_proj.weight": _random((kv, d), gen, "w"),
                  p + "self_attn.o_proj.weight": _random((d, q), gen, "w"),
                  p + "self_attn.q_norm.weight": _random((hd,), gen, "norm"),
                  p + "self_attn.k_norm.weight": _random((hd,), gen, "norm"),
                  p + "post_attention_layernorm.weight": _random((d,), gen, "norm")})
        if bias:
            t.update({p + f"self_attn.{x}_proj.bias": _random((n,), gen, "bias")
                      for x, n in (("q", q), ("k", kv), ("v", kv), ("o", d))})
        routed = "num_experts" in cfg and i not in dense and (i + 1) % step == 0
        if routed:
            f = cfg["moe_intermediate_size"]
            t[p + "mlp.gate.weight"] = _random((cfg["num_experts"], d), gen, "w")
            for e in range(cfg["num_experts"]):
                t.update(_swiglu(p + f"mlp.experts.{e}.", d, f, gen))
        else:
            t.update(_swiglu(p + "mlp.", d, cfg["intermediate_size"], gen))
    t["model.norm.weight"] = _random((d,), gen, "norm")
    t["lm_head.weight"] = _random((v, d), gen, "w")
    return t


# --- SDAR / TraDo ----------------------------------------------------------------------------

def sdar_config(**shape) -> dict:
    """SDAR-4B-Chat's config.json at a small shape (``shape`` overrides)."""
    cfg = {
        "architectures": ["SDARForCausalLM"],
        "auto_map": {"AutoConfig": "configuration_sdar.SDARConfig",
                     "AutoModel": "modeling_sdar.SDARModel",
                     "AutoModelForCausalLM": "modeling_sdar.SDARForCausalLM"},
        "attention_bias": False, "attention_dropout": 0.0, "attn_implementation": "flex_attention",
        "bos_token_id": 151643, "debug": False, "eos_token_id": 151643, "block_size": 4,
        "mask_token_id": 151669, "ep_size": 1, "fuse_cross_entropy": True, "head_dim": 16,
        "hidden_act": "silu", "hidden_size": 32, "initializer_range": 0.02,
        "intermediate_size": 64, "max_position_embeddings": 32768, "max_window_layers": 36,
        "micro_forward": False, "model_type": "sdar", "num_attention_heads": 4,
        "num_hidden_layers": 2, "num_key_value_heads": 2, "rms_norm_eps": 1e-06,
        "rope_scaling": None, "rope_theta": 1000000, "skip_checkpoint": False,
        "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "transformers_version": "4.52.4", "use_cache": False, "use_deepep": False,
        "use_sliding_window": False, "vocab_size": 151936,
    }
    cfg.update(shape)
    return cfg


def sdar_moe_config(**shape) -> dict:
    """SDAR's keys with Qwen3-MoE's routing keys (SDAR-30B-A3B at a small shape)."""
    cfg = sdar_config(architectures=["SDARMoeForCausalLM"], model_type="sdar_moe",
                      auto_map={"AutoConfig": "configuration_sdar_moe.SDARMoeConfig",
                                "AutoModelForCausalLM": "modeling_sdar_moe.SDARMoeForCausalLM"},
                      num_experts=8, num_experts_per_tok=2, moe_intermediate_size=16,
                      norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
                      output_router_logits=False, router_aux_loss_coef=0.001)
    cfg.update(shape)
    return cfg


def _write_sdar_tokenizer(folder: Path) -> dict[str, int]:
    ids = write_qwen_tokenizer(
        folder, QWEN3_ADDED + ("<|MASK|>",), eos="<|endoftext|>", pad="<|endoftext|>",
        extra={"mask_token": "<|MASK|>",
               "auto_map": {"AutoTokenizer": ["tokenization_qwen2.Qwen2Tokenizer", None]}})
    assert ids["<|MASK|>"] == 151669 and ids["<|im_end|>"] == 151645 and ids["</think>"] == 151668
    return ids


def make_sdar_folder(folder: Path, seed: int = 0, moe: bool = False, **shape) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    cfg = (sdar_moe_config if moe else sdar_config)(**shape)
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    (folder / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": 151643, "do_sample": True, "eos_token_id": [151645, 151643],
         "pad_token_id": 151643, "temperature": 0.6, "top_k": 20, "top_p": 0.95}))
    write_shards(folder, qwen3_weights(cfg, seed))
    _write_sdar_tokenizer(folder)
    write_trap_modules(folder, ["configuration_sdar.py", "modeling_sdar.py",
                                "tokenization_qwen2.py", "fused_linear_diffusion_cross_entropy.py"])
    return folder


# --- RND1 ------------------------------------------------------------------------------------------

def rnd1_config(**shape) -> dict:
    """RND1-Base-0910's keys (its config class's forced values) at a small shape."""
    cfg = {
        "architectures": ["RND1LM"],
        "auto_map": {"AutoConfig": "configuration_rnd.RND1Config",
                     "AutoModel": "modeling_rnd.RND1Model",
                     "AutoModelForMaskedLM": "modeling_rnd.RND1LM"},
        "model_type": "rnd1", "attention_bias": False, "attention_dropout": 0.0,
        "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 16, "hidden_act": "silu",
        "hidden_size": 32, "initializer_range": 0.02, "intermediate_size": 96,
        "max_position_embeddings": 40960, "max_window_layers": 48, "mlp_only_layers": [],
        "moe_intermediate_size": 16, "norm_topk_prob": True, "num_attention_heads": 4,
        "num_experts": 8, "num_experts_per_tok": 2, "num_hidden_layers": 2,
        "num_key_value_heads": 2, "output_router_logits": False, "pad_token_id": 151643,
        "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000.0,
        "router_aux_loss_coef": 0.001, "sliding_window": None, "tie_word_embeddings": False,
        "torch_dtype": "bfloat16", "use_cache": False, "use_sliding_window": False,
        "vocab_size": 151936, "moe_backend": "hf", "num_diffusion_steps": 256,
        "mask_token_id": 151669, "is_causal": False,
    }
    cfg.update(shape)
    return cfg


def make_rnd1_folder(folder: Path, seed: int = 0, **shape) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    cfg = rnd1_config(**shape)
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    write_shards(folder, qwen3_weights(cfg, seed))
    # the tokenizer files of RND1's hub folder are not public: Qwen3's added tokens, with the
    # end of text and padding of Qwen3's tokenizer (an assumption, marked as such)
    write_qwen_tokenizer(folder, QWEN3_ADDED, eos="<|endoftext|>", pad="<|endoftext|>")
    write_trap_modules(folder, ["configuration_rnd.py", "modeling_rnd.py", "generation_utils.py"])
    return folder


# --- Fast-dLLM v2 ---------------------------------------------------------------------------------

def fast_dllm_config(**shape) -> dict:
    """Fast_dLLM_v2_7B's config.json at a small shape (``shape`` overrides)."""
    n = shape.get("num_hidden_layers", 2)
    cfg = {
        "architectures": ["Fast_dLLM_QwenForCausalLM"], "attention_dropout": 0.0,
        "auto_map": {"AutoConfig": "configuration.Fast_dLLM_QwenConfig",
                     "AutoModel": "modeling.Fast_dLLM_QwenModel",
                     "AutoModelForCausalLM": "modeling.Fast_dLLM_QwenForCausalLM"},
        "bd_size": 32, "bos_token_id": 151643, "conplemenrary_mask": True, "eos_token_id": 151645,
        "hidden_act": "silu", "hidden_size": 32, "initializer_range": 0.02,
        "intermediate_size": 64, "layer_types": ["full_attention"] * n,
        "max_position_embeddings": 32768, "max_window_layers": 28, "model_type": "Fast_dLLM_Qwen",
        "num_attention_heads": 4, "num_hidden_layers": n, "num_key_value_heads": 2,
        "pad_token_id": 151645, "rms_norm_eps": 1e-06, "rope_scaling": None,
        "rope_theta": 1000000.0, "sliding_window": None, "tie_word_embeddings": False,
        "torch_dtype": "bfloat16", "transformers_version": "4.53.1", "use_cache": True,
        "use_sliding_window": False, "vocab_size": 152064,
    }
    cfg.update(shape)
    return cfg


def make_fast_dllm_folder(folder: Path, seed: int = 0, **shape) -> Path:
    from .hub_folders import dream_weights

    folder.mkdir(parents=True, exist_ok=True)
    cfg = fast_dllm_config(**shape)
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    (folder / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": 151643, "do_sample": True, "eos_token_id": [151645, 151643],
         "pad_token_id": 151643, "repetition_penalty": 1.05, "temperature": 0.7, "top_k": 20,
         "top_p": 0.8}))
    write_shards(folder, dream_weights(cfg, seed))
    ids = write_qwen_tokenizer(folder, QWEN25_ADDED + ("|<MASK>|",), eos="<|im_end|>",
                               pad="<|endoftext|>",
                               extra={"additional_special_tokens": ["|<MASK>|"]})
    assert ids["|<MASK>|"] == 151665
    write_trap_modules(folder, ["configuration.py", "modeling.py"])
    return folder


def load_peaked(folder: Path, factor: float = 3.0):
    """The model of a test folder (CPU, float32) with its matrices scaled by ``factor``
    (routers and gates kept), so that its distributions are peaked: threshold decoders commit
    several tokens a call, PVF plans and falls back."""
    from pvf_lmeval.models import load_model

    m = load_model(str(folder), device="cpu", dtype="float32")
    with torch.no_grad():
        for name, p in m.net.named_parameters():
            if p.dim() > 1 and "router" not in name and "gate_proj" not in name:
                p.mul_(factor)
    return m
