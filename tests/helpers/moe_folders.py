"""Hub-shaped checkpoint folders of LLaDA-MoE-7B-A1B and LLaDA2.0-mini, built from facts.

Config keys are those the families' config classes and released ``config.json`` files carry
(``auto_map`` included), at small shapes; weights are written under the reference modeling
code's parameter names (one tensor per expert) in two bfloat16 shards with the index. The
tokenizer files are the bundled tiny-llada's (their own small ids), named in the config. LLaDA-MoE's
released folders say ``model_type`` "llada" (the modeling code is picked through ``auto_map``).
Nothing here is copied from the models' code.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from .hub_folders import FIXTURES, _random, write_shards, write_trap_modules


def _tokenizer(folder: Path) -> dict:
    """Copy tiny-llada's tokenizer files; the special ids for config.json."""
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(FIXTURES / "tiny-llada" / name, folder / name)
    tj = json.loads((folder / "tokenizer.json").read_text())
    ids = dict(tj["model"]["vocab"])
    ids.update({t["content"]: t["id"] for t in tj["added_tokens"]})
    return {"vocab": max(ids.values()) + 1, "mask_token_id": ids["<|mdm_mask|>"],
            "eos_token_id": ids["<|endoftext|>"], "pad_token_id": ids["<|endoftext|>"]}


def _swiglu(prefix: str, d: int, f: int, gen) -> dict:
    return {prefix + "gate_proj.weight": _random((f, d), gen, "w"),
            prefix + "up_proj.weight": _random((f, d), gen, "w"),
            prefix + "down_proj.weight": _random((d, f), gen, "w")}


# --- LLaDA-MoE ----------------------------------------------------------------------------------

def lladamoe_config(vocab: int, special: dict, **shape) -> dict:
    cfg = {
        "architectures": ["LLaDAMoEModelLM"],
        "auto_map": {"AutoConfig": "configuration_lladamoe.LLaDAMoEConfig",
                     "AutoModel": "modeling_lladamoe.LLaDAMoEModelLM",
                     "AutoModelForCausalLM": "modeling_lladamoe.LLaDAMoEModelLM"},
        "model_type": "llada",
        "vocab_size": vocab, "hidden_size": 32, "num_hidden_layers": 3,
        "num_attention_heads": 4, "num_key_value_heads": 2,
        "dense_intermediate_size": 48, "expert_intermediate_size": 16,
        "shared_expert_intermediate_size": 24, "num_experts": 8, "num_experts_per_tok": 2,
        "moe_layer_freq": [0, 1, 1], "moe_router_enable_expert_bias": False,
        "moe_router_score_function": "softmax", "norm_topk_prob": True,
        "routed_scaling_factor": 1, "router_num_group": None, "router_topk_group": None,
        "qk_layernorm": True, "partial_rotary_factor": 0.5, "rope_theta": 50000,
        "rope_scaling": None, "attention_bias": False, "attention_dropout": 0.0,
        "clip_qkv": None, "hidden_act": "silu", "initializer_range": 0.02,
        "max_position_embeddings": 8192, "rms_norm_eps": 1e-05, "output_router_logits": False,
        "router_aux_loss_coef": 0.01, "tie_word_embeddings": False, "use_cache": False,
        "torch_dtype": "bfloat16", "transformers_version": "4.51.0", **special,
    }
    cfg.update(shape)
    return cfg


def lladamoe_weights(cfg: dict, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    d, v, h = cfg["hidden_size"], cfg["vocab_size"], cfg["num_attention_heads"]
    hd = d // h
    kv = cfg["num_key_value_heads"] * hd
    t = {"model.embed_tokens.weight": _random((v, d), gen, "w")}
    for i in range(cfg["num_hidden_layers"]):      # moe_layer_freq may list more entries
        routed = cfg["moe_layer_freq"][i] != 0
        p = f"model.layers.{i}."
        t.update({
            p + "input_layernorm.weight": _random((d,), gen, "norm"),
            p + "self_attn.q_proj.weight": _random((d, d), gen, "w"),
            p + "self_attn.k_proj.weight": _random((kv, d), gen, "w"),
            p + "self_attn.v_proj.weight": _random((kv, d), gen, "w"),
            p + "self_attn.o_proj.weight": _random((d, d), gen, "w"),
            p + "self_attn.q_norm.weight": _random((hd,), gen, "norm"),
            p + "self_attn.k_norm.weight": _random((hd,), gen, "norm"),
            p + "post_attention_layernorm.weight": _random((d,), gen, "norm"),
        })
        if not routed:
            t.update(_swiglu(p + "mlp.", d, cfg["dense_intermediate_size"], gen))
            continue
        t[p + "mlp.gate.weight"] = _random((cfg["num_experts"], d), gen, "w")
        if cfg["moe_router_enable_expert_bias"]:
            t[p + "mlp.expert_bias"] = _random((cfg["num_experts"],), gen, "bias")
        for e in range(cfg["num_experts"]):
            t.update(_swiglu(p + f"mlp.experts.{e}.", d, cfg["expert_intermediate_size"], gen))
        t.update(_swiglu(p + "shared_expert.", d, cfg["shared_expert_intermediate_size"], gen))
    t["model.norm.weight"] = _random((d,), gen, "norm")
    t["lm_head.weight"] = _random((v, d), gen, "w")
    return t


def make_lladamoe_folder(folder: Path, seed: int = 0, **shape) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    special = _tokenizer(folder)
    cfg = lladamoe_config(special.pop("vocab"), special, **shape)
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    write_shards(folder, lladamoe_weights(cfg, seed))
    write_trap_modules(folder, ["configuration_lladamoe.py", "modeling_lladamoe.py"])
    return folder


# --- LLaDA2.0 -----------------------------------------------------------------------------------

def llada2_config(vocab: int, special: dict, **shape) -> dict:
    cfg = {
        "architectures": ["LLaDA2MoeModelLM"],
        "auto_map": {"AutoConfig": "configuration_llada2_moe.LLaDA2MoeConfig",
                     "AutoModel": "modeling_llada2_moe.LLaDA2MoeModel",
                     "AutoModelForCausalLM": "modeling_llada2_moe.LLaDA2MoeModelLM"},
        "model_type": "llada2_moe",
        "attention_dropout": 0.0, "embedding_dropout": 0.0, "output_dropout": 0.0,
        "num_hidden_layers": 3, "hidden_size": 32, "intermediate_size": 48,
        "first_k_dense_replace": 1, "hidden_act": "silu", "max_position_embeddings": 16384,
        "moe_intermediate_size": 16, "norm_topk_prob": True, "num_experts_per_tok": 2,
        "norm_head": False, "num_attention_heads": 4, "num_experts": 8, "num_key_value_heads": 2,
        "rope_theta": 600000, "rope_scaling": None, "tie_word_embeddings": False,
        "torch_dtype": "bfloat16", "use_bias": False, "use_rmsnorm": True, "rms_norm_eps": 1e-06,
        "head_dim": 16, "num_shared_experts": 1, "use_cache": False, "use_qkv_bias": False,
        "norm_softmax": False, "vocab_size": vocab, "rotary_dim": 8,
        "using_split_qkv_in_self_attention": False, "router_dtype": "fp32",
        "moe_router_enable_expert_bias": True, "routed_scaling_factor": 2.5, "n_group": 4,
        "topk_group": 2, "score_function": "sigmoid", "initializer_range": 0.02,
        "max_window_layers": 28, "output_router_logits": False, "partial_rotary_factor": 0.5,
        "use_sliding_window": False, **special,
    }
    cfg.update(shape)
    return cfg


def llada2_weights(cfg: dict, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    d, v, hd = cfg["hidden_size"], cfg["vocab_size"], cfg["head_dim"]
    qkv = (cfg["num_attention_heads"] + 2 * cfg["num_key_value_heads"]) * hd
    f = cfg["moe_intermediate_size"]
    t = {"model.word_embeddings.weight": _random((v, d), gen, "w")}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t.update({
            p + "input_layernorm.weight": _random((d,), gen, "norm"),
            p + "attention.query_key_value.weight": _random((qkv, d), gen, "w"),
            p + "attention.query_layernorm.weight": _random((hd,), gen, "norm"),
            p + "attention.key_layernorm.weight": _random((hd,), gen, "norm"),
            p + "attention.dense.weight": _random((d, cfg["num_attention_heads"] * hd), gen, "w"),
            p + "post_attention_layernorm.weight": _random((d,), gen, "norm"),
        })
        if i < cfg["first_k_dense_replace"]:
            t.update(_swiglu(p + "mlp.", d, cfg["intermediate_size"], gen))
            continue
        t[p + "mlp.gate.weight"] = _random((cfg["num_experts"], d), gen, "w")
        t[p + "mlp.gate.expert_bias"] = _random((cfg["num_experts"],), gen, "bias")
        for e in range(cfg["num_experts"]):
            t.update(_swiglu(p + f"mlp.experts.{e}.", d, f, gen))
        t.update(_swiglu(p + "mlp.shared_experts.", d, f * cfg["num_shared_experts"], gen))
    t["model.norm.weight"] = _random((d,), gen, "norm")
    t["lm_head.weight"] = _random((v, d), gen, "w")
    return t


def make_llada2_folder(folder: Path, seed: int = 0, **shape) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    special = _tokenizer(folder)
    cfg = llada2_config(special.pop("vocab"), special, **shape)
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    write_shards(folder, llada2_weights(cfg, seed))
    write_trap_modules(folder, ["configuration_llada2_moe.py", "modeling_llada2_moe.py"])
    return folder
