"""Hub-shaped folders of google/diffusiongemma-26B-A4B-it at small shapes, built from facts.

``config.json`` carries the published keys (transformers' ``DiffusionGemmaConfig`` /
``DiffusionGemmaTextConfig`` as the released folder writes them, read from third-party copies of
it: hidden 2816, 30 layers of 5 ``sliding_attention`` then 1 ``full_attention``, 16 heads, 8
key/value heads of 256 on sliding layers and 2 of 512 on global ones, 128 experts of 704, top 8,
a dense MLP of 2112, window 1024, canvas 256, end ids [1, 106]) with the sizes scaled down; the
weights are written under the released names in two bfloat16 shards with the index: the text
stack once under ``model.decoder.*`` (the head is the embedding), the encoder's own
``layer_scalar`` buffers, the self-conditioning MLP, and a vision tower of a tiny
``gemma4_vision`` config (``model.encoder.vision_tower.*``, ``model.encoder.embed_vision.*``),
which the text network ignores. No ``v_proj`` on global layers (their values are the keys).
:func:`make_saved_gemma_folder` writes the same folder's config.json with transformers' own
``DiffusionGemmaConfig.save_pretrained`` (``per_layer_config`` in place of the global keys).

The tokenizer is a stand-in: a word-level vocabulary with Gemma's special ids (``<pad>`` 0,
``<eos>`` 1, ``<bos>`` 2, ``<unk>`` 3) and an end-of-turn token at 106 (config.json's second end
id); the other entries are plain words.
Nothing here is copied from the models' code.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from .hub_folders import _random, write_shards

SLIDING, FULL = "sliding_attention", "full_attention"
#: the published text_config values that shape the weights
PUBLISHED = dict(vocab_size=262144, hidden_size=2816, intermediate_size=2112,
                 num_hidden_layers=30, num_attention_heads=16, num_key_value_heads=8,
                 head_dim=256, global_head_dim=512, num_global_key_value_heads=2,
                 num_experts=128, top_k_experts=8, moe_intermediate_size=704,
                 sliding_window=1024, max_position_embeddings=262144,
                 layer_types=([SLIDING] * 5 + [FULL]) * 5)
#: the same keys scaled down: every layer kind as released, real head / expert ratios smaller
TINY = dict(hidden_size=64, intermediate_size=48, num_hidden_layers=6, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, global_head_dim=32,
            num_global_key_value_heads=1, num_experts=8, top_k_experts=2,
            moe_intermediate_size=16, sliding_window=4, max_position_embeddings=512,
            layer_types=[SLIDING] * 5 + [FULL])
#: a gemma4_vision config small enough to write (its tensors are ignored by the text network)
VISION = dict(model_type="gemma4_vision", hidden_size=16, intermediate_size=32,
              num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2, head_dim=8,
              patch_size=4, position_embedding_size=16, standardize=True,
              use_clipped_linears=False, hidden_activation="gelu_pytorch_tanh",
              rms_norm_eps=1e-6)
VOCAB = 512
END_OF_TURN = 106


def text_config(vocab: int, **changes) -> dict:
    cfg = {
        "model_type": "diffusion_gemma_text", "vocab_size": vocab,
        "hidden_activation": "gelu_pytorch_tanh", "rms_norm_eps": 1e-06,
        "rope_parameters": {
            FULL: {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0,
                   "rope_type": "proportional"},
            SLIDING: {"rope_theta": 10000.0, "rope_type": "default"}},
        "final_logit_softcapping": 30.0, "use_bidirectional_attention": "vision",
        "attention_bias": False, "attention_dropout": 0.0, "initializer_range": 0.02,
        "pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 2, "tie_word_embeddings": True,
        "dtype": "bfloat16", **TINY,
    }
    cfg.update(changes)
    return cfg


def gemma_config(vocab: int = VOCAB, canvas_length: int = 8, top: dict | None = None,
                 **changes) -> dict:
    """config.json: the published top level around :func:`text_config` (``changes`` go to the
    text config, ``top`` to the top level)."""
    return {
        "architectures": ["DiffusionGemmaForBlockDiffusion"], "model_type": "diffusion_gemma",
        "canvas_length": canvas_length, "boi_token_id": 255999, "eoi_token_id": 258882,
        "image_token_id": 258880, "initializer_range": 0.02, "eos_token_id": [1, END_OF_TURN],
        "tie_word_embeddings": True, "dtype": "bfloat16", "transformers_version": "5.8.0.dev0",
        "text_config": text_config(vocab, **changes), "vision_config": dict(VISION),
        **(top or {}),
    }


def _layer_shape(text: dict, i: int) -> tuple[int, int]:
    """(head_dim, key/value heads) of layer ``i`` in the published keys."""
    if text["layer_types"][i] == FULL:
        return text["global_head_dim"], text["num_global_key_value_heads"]
    return text["head_dim"], text["num_key_value_heads"]


def vision_weights(vision: dict, text_hidden: int, gen) -> dict[str, torch.Tensor]:
    h, f, p = vision["hidden_size"], vision["intermediate_size"], vision["patch_size"]
    hd = vision["head_dim"]
    v = "model.encoder.vision_tower."
    t = {v + "patch_embedder.input_proj.weight": _random((h, 3 * p * p), gen, "w"),
         v + "patch_embedder.position_embedding_table":
             _random((2, vision["position_embedding_size"], h), gen, "w"),
         v + "std_bias": _random((h,), gen, "bias"), v + "std_scale": _random((h,), gen, "norm"),
         "model.encoder.embed_vision.embedding_projection.weight":
             _random((text_hidden, h), gen, "w")}
    for i in range(vision["num_hidden_layers"]):
        e = v + f"encoder.layers.{i}."
        for name in ("q", "k", "v", "o"):
            t[e + f"self_attn.{name}_proj.linear.weight"] = _random((h, h), gen, "w")
        t[e + "self_attn.q_norm.weight"] = _random((hd,), gen, "norm")
        t[e + "self_attn.k_norm.weight"] = _random((hd,), gen, "norm")
        t[e + "mlp.gate_proj.linear.weight"] = _random((f, h), gen, "w")
        t[e + "mlp.up_proj.linear.weight"] = _random((f, h), gen, "w")
        t[e + "mlp.down_proj.linear.weight"] = _random((h, f), gen, "w")
        for norm in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                     "post_feedforward_layernorm"):
            t[e + f"{norm}.weight"] = _random((h,), gen, "norm")
    return t


def gemma_weights(cfg: dict, seed: int, encoder_scalars: str = "equal") -> dict[str, torch.Tensor]:
    """The released tensor names at ``cfg``'s shapes. ``encoder_scalars``: "equal" (as
    released: the encoder's layer scalars are the decoder's) or "own" (drawn apart)."""
    gen = torch.Generator().manual_seed(seed)
    text = cfg["text_config"]
    d, v, n = text["hidden_size"], text["vocab_size"], text["num_attention_heads"]
    e, fe, ff = text["num_experts"], text["moe_intermediate_size"], text["intermediate_size"]
    t = {"model.decoder.embed_tokens.weight": _random((v, d), gen, "w")}
    for i in range(text["num_hidden_layers"]):
        p = f"model.decoder.layers.{i}."
        hd, kv = _layer_shape(text, i)
        t.update({
            p + "input_layernorm.weight": _random((d,), gen, "norm"),
            p + "self_attn.q_proj.weight": _random((n * hd, d), gen, "w"),
            p + "self_attn.k_proj.weight": _random((kv * hd, d), gen, "w"),
            p + "self_attn.o_proj.weight": _random((d, n * hd), gen, "w"),
            p + "self_attn.q_norm.weight": _random((hd,), gen, "norm"),
            p + "self_attn.k_norm.weight": _random((hd,), gen, "norm"),
            p + "post_attention_layernorm.weight": _random((d,), gen, "norm"),
            p + "pre_feedforward_layernorm.weight": _random((d,), gen, "norm"),
            p + "mlp.gate_proj.weight": _random((ff, d), gen, "w"),
            p + "mlp.up_proj.weight": _random((ff, d), gen, "w"),
            p + "mlp.down_proj.weight": _random((d, ff), gen, "w"),
            p + "post_feedforward_layernorm_1.weight": _random((d,), gen, "norm"),
            p + "pre_feedforward_layernorm_2.weight": _random((d,), gen, "norm"),
            p + "router.proj.weight": _random((e, d), gen, "w"),
            p + "router.scale": _random((d,), gen, "norm"),
            p + "router.per_expert_scale": _random((e,), gen, "norm"),
            p + "experts.gate_up_proj": _random((e, 2 * fe, d), gen, "w"),
            p + "experts.down_proj": _random((e, d, fe), gen, "w"),
            p + "post_feedforward_layernorm_2.weight": _random((d,), gen, "norm"),
            p + "post_feedforward_layernorm.weight": _random((d,), gen, "norm"),
            p + "layer_scalar": _random((1,), gen, "norm"),
        })
        if text["layer_types"][i] == SLIDING:
            t[p + "self_attn.v_proj.weight"] = _random((kv * hd, d), gen, "w")
        t[f"model.encoder.language_model.layers.{i}.layer_scalar"] = (
            t[p + "layer_scalar"] if encoder_scalars == "equal" else _random((1,), gen, "norm"))
    t["model.decoder.norm.weight"] = _random((d,), gen, "norm")
    s = "model.decoder.self_conditioning."
    t.update({s + "pre_norm.weight": _random((d,), gen, "norm"),
              s + "gate_proj.weight": _random((ff, d), gen, "w"),
              s + "up_proj.weight": _random((ff, d), gen, "w"),
              s + "down_proj.weight": _random((d, ff), gen, "w")})
    t.update(vision_weights(cfg["vision_config"], d, gen))
    return t


def write_gemma_tokenizer(folder: Path, vocab: int = VOCAB) -> None:
    """The stand-in tokenizer (module docstring): ``vocab`` ids, a word-level model."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    special = {0: "<pad>", 1: "<eos>", 2: "<bos>", 3: "<unk>", END_OF_TURN: "<turn|>"}
    words = {special.get(i, f"w{i}"): i for i in range(vocab)}
    tok = Tokenizer(models.WordLevel(words, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(list(special.values()))
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<bos>", "eos_token": "<eos>",
        "pad_token": "<pad>", "unk_token": "<unk>", "add_bos_token": False,
        "model_max_length": 512}, indent=1))


def make_gemma_folder(folder: Path, seed: int = 0, encoder_scalars: str = "equal",
                      canvas_length: int = 8, top: dict | None = None, **changes) -> Path:
    """A tiny DiffusionGemma folder (``changes``: text_config keys; ``top``: top-level keys)."""
    folder.mkdir(parents=True, exist_ok=True)
    write_gemma_tokenizer(folder)
    cfg = gemma_config(VOCAB, canvas_length, top, **changes)
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    write_shards(folder, gemma_weights(cfg, seed, encoder_scalars))
    return folder


def make_saved_gemma_folder(folder: Path, seed: int = 0, **changes) -> Path:
    """:func:`make_gemma_folder` with the config.json transformers' ``DiffusionGemmaConfig``
    writes of it (``save_pretrained``): the global layers' shape as ``per_layer_config``, no
    ``global_head_dim`` / ``num_global_key_value_heads``, no top-level end ids."""
    from transformers import DiffusionGemmaConfig

    make_gemma_folder(folder, seed, **changes)
    cfg = json.loads((folder / "config.json").read_text())
    text = {k: v for k, v in cfg["text_config"].items() if k not in ("model_type", "dtype")}
    DiffusionGemmaConfig(text_config=text, vision_config=dict(VISION),
                         canvas_length=cfg["canvas_length"]).save_pretrained(folder)
    return folder
