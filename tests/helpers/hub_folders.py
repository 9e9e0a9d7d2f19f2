"""Hub-shaped checkpoint folders of LLaDA-8B-Instruct and Dream-v0-Instruct-7B, built from facts.

What a researcher downloads, at a small size: the real ``config.json`` keys (``auto_map``
included) with small shapes, bfloat16 weights under the real parameter names in two shards with
``model.safetensors.index.json``, the folder's Python files (here: files that raise, and leave a
marker, if anything imports them), and the real tokenizer layout. Dream's tokenizer is what its
hub folder has: ``vocab.json`` + ``merges.txt`` + ``tokenizer_config.json`` whose
``tokenizer_class`` is the remote ``DreamTokenizer`` (``auto_map``), and no ``tokenizer.json``.

The Dream vocabulary is faithful where the tests look and dense everywhere: the 256 byte symbols
at ids 0-255 (GPT-2's byte-to-unicode order, as in Qwen2), ``Hello`` at 9707 and ``Ġworld`` at
1879 (Qwen2's ids) with the merges that build them, filler entries up to id 151642 so that the
vocabulary has Qwen2's 151,643 regular tokens, and Qwen2.5's 22 added tokens (151643-151664)
plus Dream's ``<|beginoftext|>`` (151665) and ``<|mask|>`` (151666). The ids of the intermediate
merge results (``He``, ``llo``, ``Ġw``, ...) are not Qwen2's: nothing observable depends on them.
Nothing here is copied from the models' code; the facts are in ``shared/notes/references.md``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

FIXTURES = Path(__file__).resolve().parents[2] / "pvf_lmeval" / "fixtures"

# --- Dream tokenizer ------------------------------------------------------------------------------

QWEN2_REGULAR = 151643          # regular (BPE) tokens of Qwen2: ids 0..151642
QWEN25_ADDED = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>",
                "<|object_ref_end|>", "<|box_start|>", "<|box_end|>", "<|quad_start|>",
                "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
                "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>",
                "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>")
DREAM_ADDED = QWEN25_ADDED + ("<|beginoftext|>", "<|mask|>")
DREAM_IDS = {t: QWEN2_REGULAR + i for i, t in enumerate(DREAM_ADDED)}
assert DREAM_IDS["<|im_end|>"] == 151645 and DREAM_IDS["<|mask|>"] == 151666
#: strings whose Qwen2 ids the fixture reproduces
DREAM_KNOWN = {"Hello world": [9707, 1879]}
DREAM_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def byte_symbols() -> list[str]:
    """The 256 byte-level symbols in id order: printable Latin-1 bytes stand for themselves, the
    other 68 bytes for chr(256 + n) in byte order (so the space is 'Ġ' at id 220)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    return [chr(b) for b in printable] + [chr(256 + n) for n in range(len(others))]


def dream_vocab() -> tuple[dict[str, int], list[tuple[str, str]]]:
    """(vocab.json mapping, merges in rank order)."""
    symbols = byte_symbols()
    assert symbols[220] == "Ġ" and symbols[198] == "Ċ"
    merges = [("l", "l"), ("H", "e"), ("ll", "o"), ("He", "llo"),           # Hello
              ("o", "r"), ("l", "d"), ("or", "ld"), ("Ġ", "w"), ("Ġw", "orld")]  # Ġworld
    fixed = {"Hello": 9707, "Ġworld": 1879}
    vocab = {s: i for i, s in enumerate(symbols)}
    spare = iter(range(150000, QWEN2_REGULAR))      # ids for the intermediate merge results
    for a, b in merges:
        token = a + b
        vocab[token] = fixed[token] if token in fixed else next(spare)
    used = set(vocab.values())
    for i in range(QWEN2_REGULAR):
        if i not in used:
            vocab[f"<unused_{i}>"] = i      # never produced: no merge builds it
    assert sorted(vocab.values()) == list(range(QWEN2_REGULAR))
    return vocab, merges


def write_dream_tokenizer(folder: Path) -> None:
    vocab, merges = dream_vocab()
    (folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
    (folder / "merges.txt").write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges),
                                       encoding="utf-8")
    added = {str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                      "single_word": False, "special": True} for t, i in DREAM_IDS.items()}
    config = {
        "add_bos_token": False, "add_prefix_space": False,
        "added_tokens_decoder": added,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "auto_map": {"AutoTokenizer": ["tokenization_dream.DreamTokenizer", None]},
        "bos_token": "<|beginoftext|>", "chat_template": DREAM_CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False, "eos_token": "<|endoftext|>", "errors": "replace",
        "mask_token": "<|mask|>", "model_max_length": 131072, "pad_token": "<|endoftext|>",
        "split_special_tokens": False, "tokenizer_class": "DreamTokenizer", "unk_token": None,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False))
    (folder / "special_tokens_map.json").write_text(json.dumps({
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"], "bos_token": "<|beginoftext|>",
        "eos_token": "<|endoftext|>", "mask_token": "<|mask|>", "pad_token": "<|endoftext|>"}))


# --- hostile code files ---------------------------------------------------------------------------

def write_trap_modules(folder: Path, names: list[str]) -> Path:
    """``names`` as Python files that leave ``IMPORTED`` in the folder and raise when imported;
    returns the marker's path."""
    marker = folder / "IMPORTED"
    for name in names:
        (folder / name).write_text(
            "import pathlib\n"
            f"pathlib.Path({str(marker)!r}).write_text({name!r})\n"
            f"raise RuntimeError('remote code {name} was executed')\n")
    return marker


# --- weights --------------------------------------------------------------------------------------

def _random(shape, gen, kind: str) -> torch.Tensor:
    noise = torch.randn(shape, generator=gen)
    if kind == "norm":
        return 1.0 + 0.2 * noise
    if kind == "bias":
        return 0.2 * noise
    return noise / shape[-1] ** 0.5


def write_shards(folder: Path, tensors: dict[str, torch.Tensor]) -> None:
    """Two bfloat16 shards and the index, as the hub folders have them."""
    from safetensors.torch import save_file

    names = list(tensors)
    halves = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    weight_map = {}
    for shard, keys in halves.items():
        save_file({k: tensors[k].to(torch.bfloat16).contiguous() for k in keys}, str(folder / shard),
                  metadata={"format": "pt"})
        weight_map.update({k: shard for k in keys})
    total = sum(t.numel() * 2 for t in tensors.values())
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))


def dream_weights(cfg: dict, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    d, f, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    hd = d // cfg["num_attention_heads"]
    kv = cfg["num_key_value_heads"] * hd
    t = {"model.embed_tokens.weight": _random((v, d), gen, "w")}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t.update({
            p + "input_layernorm.weight": _random((d,), gen, "norm"),
            p + "self_attn.q_proj.weight": _random((d, d), gen, "w"),
            p + "self_attn.q_proj.bias": _random((d,), gen, "bias"),
            p + "self_attn.k_proj.weight": _random((kv, d), gen, "w"),
            p + "self_attn.k_proj.bias": _random((kv,), gen, "bias"),
            p + "self_attn.v_proj.weight": _random((kv, d), gen, "w"),
            p + "self_attn.v_proj.bias": _random((kv,), gen, "bias"),
            p + "self_attn.o_proj.weight": _random((d, d), gen, "w"),
            p + "post_attention_layernorm.weight": _random((d,), gen, "norm"),
            p + "mlp.gate_proj.weight": _random((f, d), gen, "w"),
            p + "mlp.up_proj.weight": _random((f, d), gen, "w"),
            p + "mlp.down_proj.weight": _random((d, f), gen, "w"),
        })
    t["model.norm.weight"] = _random((d,), gen, "norm")
    t["lm_head.weight"] = _random((v, d), gen, "w")
    return t


def llada_weights(cfg: dict, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    d, f, v = cfg["d_model"], cfg["mlp_hidden_size"], cfg["embedding_size"]
    t = {"model.transformer.wte.weight": _random((v, d), gen, "w")}
    for i in range(cfg["n_layers"]):
        p = f"model.transformer.blocks.{i}."
        t.update({
            p + "attn_norm.weight": _random((d,), gen, "norm"),
            p + "q_proj.weight": _random((d, d), gen, "w"),
            p + "k_proj.weight": _random((d, d), gen, "w"),
            p + "v_proj.weight": _random((d, d), gen, "w"),
            p + "attn_out.weight": _random((d, d), gen, "w"),
            p + "ff_norm.weight": _random((d,), gen, "norm"),
            p + "ff_proj.weight": _random((f, d), gen, "w"),
            p + "up_proj.weight": _random((f, d), gen, "w"),
            p + "ff_out.weight": _random((d, f), gen, "w"),
        })
    t["model.transformer.ln_f.weight"] = _random((d,), gen, "norm")
    t["model.transformer.ff_out.weight"] = _random((v, d), gen, "w")
    return t


# --- folders --------------------------------------------------------------------------------------

def dream_config(**shape) -> dict:
    """Dream-v0-Instruct-7B's config.json with small shapes (``shape`` overrides)."""
    cfg = {
        "architectures": ["DreamModel"],
        "attention_dropout": 0.0,
        "auto_map": {"AutoConfig": "configuration_dream.DreamConfig",
                     "AutoModel": "modeling_dream.DreamModel"},
        "bos_token_id": 151643, "eos_token_id": 151643, "pad_token_id": 151643,
        "mask_token_id": 151666,
        "hidden_act": "silu", "hidden_size": 32, "initializer_range": 0.02,
        "intermediate_size": 64, "max_position_embeddings": 131072, "max_window_layers": 28,
        "model_type": "Dream", "num_attention_heads": 4, "num_hidden_layers": 2,
        "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_scaling": None,
        "rope_theta": 1000000.0, "sliding_window": None, "tie_word_embeddings": False,
        "torch_dtype": "bfloat16", "transformers_version": "4.46.2", "use_cache": False,
        "use_sliding_window": False, "vocab_size": 152064,
    }
    cfg.update(shape)
    return cfg


def make_dream_folder(folder: Path, seed: int = 0, **shape) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    cfg = dream_config(**shape)
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    (folder / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": 151643, "eos_token_id": 151643, "pad_token_id": 151643}))
    write_shards(folder, dream_weights(cfg, seed))
    write_dream_tokenizer(folder)
    write_trap_modules(folder, ["configuration_dream.py", "modeling_dream.py",
                                "tokenization_dream.py", "generation_utils.py"])
    return folder


def llada_config(vocab: int, special: dict, **shape) -> dict:
    """LLaDA-8B-Instruct's config.json with small shapes (``shape`` overrides)."""
    cfg = {
        "activation_type": "silu", "alibi": False, "alibi_bias_max": 8.0,
        "architectures": ["LLaDAModelLM"], "attention_dropout": 0.0,
        "attention_layer_norm": False, "attention_layer_norm_with_affine": True,
        "auto_map": {"AutoConfig": "configuration_llada.LLaDAConfig",
                     "AutoModelForCausalLM": "modeling_llada.LLaDAModelLM",
                     "AutoModel": "modeling_llada.LLaDAModelLM"},
        "bias_for_layer_norm": False, "block_group_size": 1, "block_type": "llama",
        "d_model": 64, "embedding_dropout": 0.0, "embedding_size": vocab, "flash_attention": False,
        "include_bias": False, "include_qkv_bias": False, "init_cutoff_factor": None,
        "init_device": "meta", "init_fn": "mitchell", "init_std": 0.02, "input_emb_norm": False,
        "layer_norm_type": "rms", "layer_norm_with_affine": True, "max_sequence_length": 4096,
        "mlp_hidden_size": 96, "mlp_ratio": 4, "model_type": "llada", "multi_query_attention": None,
        "n_heads": 4, "n_kv_heads": 4, "n_layers": 2, "precision": "amp_bf16",
        "residual_dropout": 0.0, "rms_norm_eps": 1e-05, "rope": True, "rope_full_precision": True,
        "rope_theta": 500000.0, "scale_logits": False, "torch_dtype": "bfloat16",
        "transformers_version": "4.46.3", "use_cache": False, "vocab_size": vocab,
        "weight_tying": False, **special,
    }
    cfg.update(shape)
    return cfg


def make_llada_folder(folder: Path, seed: int = 0, **shape) -> Path:
    """LLaDA's layout; its tokenizer files (tokenizer.json + tokenizer_config.json, the real
    layout) are the bundled tiny-llada's, whose special tokens have their own small ids."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(FIXTURES / "tiny-llada" / name, folder / name)
    tj = json.loads((folder / "tokenizer.json").read_text())
    ids = dict(tj["model"]["vocab"])
    ids.update({t["content"]: t["id"] for t in tj["added_tokens"]})
    special = {"mask_token_id": ids["<|mdm_mask|>"], "eos_token_id": ids["<|endoftext|>"],
               "pad_token_id": ids["<|endoftext|>"]}
    cfg = llada_config(max(ids.values()) + 1, special, **shape)
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": special["eos_token_id"]}))
    write_shards(folder, llada_weights(cfg, seed))
    write_trap_modules(folder, ["configuration_llada.py", "modeling_llada.py"])
    return folder


def make_mmada_folder(folder: Path, seed: int = 0, **shape) -> Path:
    """MMaDA-8B's text model: LLaDA's layout and keys under ``model_type`` "mmada"
    (``MMadaModelLM`` subclasses ``LLaDAModelLM``) with MMaDA's own keys (Gen-Verse/MMaDA
    configs: llm_vocab_size 126464, codebook_size 8192, num_new_special_tokens 0)."""
    mmada = {"model_type": "mmada", "architectures": ["MMadaModelLM"],
             "auto_map": {"AutoConfig": "modeling_mmada.MMadaConfig",
                          "AutoModel": "modeling_mmada.MMadaModelLM"},
             "llm_vocab_size": 126464, "codebook_size": 8192, "num_vq_tokens": 256,
             "num_new_special_tokens": 0, "new_vocab_size": 134656}
    make_llada_folder(folder, seed, **{**mmada, **shape})
    write_trap_modules(folder, ["modeling_mmada.py", "modeling_llada.py",
                                "configuration_llada.py"])
    return folder
