"""The folders a researcher downloads: hub-shaped LLaDA-8B-Instruct and Dream-v0-Instruct-7B.

Built by ``hub_folders`` from facts (real config keys with ``auto_map``, sharded bfloat16 weights
under the real names, Dream's vocab.json + merges.txt tokenizer whose class is remote code, and
Python files that leave a marker and raise if imported). They must load without prompting,
without importing anything from the folder, with Dream's real token ids; LLaDA's full-precision
rotary must hold in bfloat16; configurations the native network does not implement are refused
in one line naming the key.
"""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers import hub_folders
from helpers.edited_folders import DROP, edit_config, edited_copy
from pvf_lmeval.models import load_model
from pvf_lmeval.models.formats import UnsupportedCheckpoint

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPT_TEXT = "custom code"        # transformers: "Do you wish to run the custom code? [y/N]"


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("hub")
    return {"dream": hub_folders.make_dream_folder(root / "Dream-v0-Instruct-7B", seed=1),
            "llada": hub_folders.make_llada_folder(root / "LLaDA-8B-Instruct", seed=2)}


@pytest.fixture(scope="module")
def dream(folders):
    return load_model(str(folders["dream"]), device="cpu")


def _one_line(exc) -> str:
    msg = str(exc.value)
    assert msg and "\n" not in msg, f"not one line: {msg!r}"
    return msg


# --- the fixture is as hostile as the real folders ----------------------------------------------

def test_folders_have_the_real_layout(folders):
    dream, llada = folders["dream"], folders["llada"]
    assert not (dream / "tokenizer.json").exists()
    assert {"vocab.json", "merges.txt", "tokenizer_config.json"} <= {p.name for p in dream.iterdir()}
    tc = json.loads((dream / "tokenizer_config.json").read_text())
    assert tc["tokenizer_class"] == "DreamTokenizer"
    assert tc["auto_map"]["AutoTokenizer"][0] == "tokenization_dream.DreamTokenizer"
    for folder in (dream, llada):
        assert "auto_map" in json.loads((folder / "config.json").read_text())
        index = json.loads((folder / "model.safetensors.index.json").read_text())
        assert len(set(index["weight_map"].values())) == 2 and not (folder / "model.safetensors").exists()
        assert any(folder.glob("*.py")) and not (folder / "IMPORTED").exists()


def test_plain_transformers_refuses_the_dream_tokenizer(folders):
    """What the loader used to do fails on this folder: the fixture reproduces the bug."""
    from transformers import AutoTokenizer

    with pytest.raises(ValueError, match=r"(?s)contains custom code which must be executed .*"
                                         r"pass the argument `trust_remote_code=True`"):
        AutoTokenizer.from_pretrained(str(folders["dream"]), trust_remote_code=False)
    assert not (folders["dream"] / "IMPORTED").exists()


# --- loading: no prompt, no folder code --------------------------------------------------------

LOAD_SNIPPET = """
import sys
from pvf_lmeval.models import load_model
for folder in sys.argv[1:]:
    m = load_model(folder, device="cpu")
    print("LOADED", m.family, m.mask_id, flush=True)
"""


def _load_in_child(folders: list[Path], stdin_tty: bool) -> str:
    """Load ``folders`` in a fresh interpreter whose stdin is a terminal (or /dev/null); its
    output. A prompt would print, and on a terminal wait for an answer."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    env.pop("HF_HUB_OFFLINE", None)        # the prompt path is not gated by offline mode
    env.pop("TRANSFORMERS_OFFLINE", None)
    master = slave = None
    if stdin_tty:
        master, slave = pty.openpty()
    try:
        proc = subprocess.run([sys.executable, "-c", LOAD_SNIPPET, *map(str, folders)],
                              stdin=slave if stdin_tty else subprocess.DEVNULL,
                              capture_output=True, text=True, env=env, timeout=300)
    finally:
        for fd in (master, slave):
            if fd is not None:
                os.close(fd)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-2000:]
    return out


@pytest.mark.parametrize("stdin_tty", [True, False], ids=["stdin-terminal", "stdin-devnull"])
def test_loads_without_prompt_and_without_folder_code(folders, stdin_tty):
    out = _load_in_child([folders["dream"], folders["llada"]], stdin_tty)
    assert "LOADED dream 151666" in out and "LOADED llada" in out
    assert PROMPT_TEXT not in out and "[y/N]" not in out, out[-2000:]
    for folder in folders.values():
        assert not (folder / "IMPORTED").exists(), "a *.py file of the checkpoint folder was imported"


def test_hub_download_never_fetches_code():
    from fnmatch import fnmatch

    from pvf_lmeval.models.loader import HUB_PATTERNS

    for name in ("modeling_dream.py", "tokenization_dream.py", "configuration_llada.py",
                 "__init__.py", "setup.cfg", "model.pkl", "pytorch_model.bin"):
        assert not any(fnmatch(name, p) for p in HUB_PATTERNS), name
    for name in ("config.json", "model-00001-of-00004.safetensors", "vocab.json", "merges.txt",
                 "tokenizer.json", "chat_template.jinja"):
        assert any(fnmatch(name, p) for p in HUB_PATTERNS), name


# --- Dream's tokenizer and special ids ---------------------------------------------------------

def test_dream_token_ids_are_the_real_ones(dream):
    tok = dream.tokenizer
    assert tok("Hello world")["input_ids"] == [9707, 1879]
    assert tok.encode("Hello world", add_special_tokens=False) == [9707, 1879]
    ids = tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>",
                                     "<|beginoftext|>", "<|mask|>"])
    assert ids == [151643, 151644, 151645, 151665, 151666]
    assert tok.eos_token_id == tok.pad_token_id == 151643
    assert tok.decode([9707, 1879]) == "Hello world"
    assert len(tok) == 151667
    # what the model uses
    assert dream.mask_id == 151666 and dream.pad_id == 151643
    assert {151643, 151645} <= set(dream.eos_ids) and 151666 not in dream.eos_ids
    assert dream.decodable == 151667 < dream.vocab_size == 152064
    assert dream.family == "dream" and dream.logit_shift == 1


def test_dream_chat_template(dream):
    tok = dream.tokenizer
    text = tok.apply_chat_template([{"role": "user", "content": "Hello world"}], tokenize=False,
                                   add_generation_prompt=True)
    assert text == ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
                    "<|im_start|>user\nHello world<|im_end|>\n<|im_start|>assistant\n")
    ids = tok.encode(text, add_special_tokens=False)
    assert ids.count(151644) == 3 and ids.count(151645) == 2
    assert ids[0] == 151644                         # no bos in front
    hello = ids.index(9707)                         # ...user\nHello world<|im_end|>
    assert ids[hello:hello + 3] == [9707, 1879, 151645]
    assert tok.decode(ids) == text


def test_dream_logits_run_on_the_real_vocabulary(dream):
    tokens = torch.tensor([[9707, 1879, 151666, 151666]])
    logits = dream.logits(tokens, torch.arange(4))
    assert logits.shape == (1, 4, 152064)
    assert torch.isneginf(logits[..., 151667:]).all() and torch.isfinite(logits[..., :151667]).all()


# --- LLaDA: rotary in full precision -----------------------------------------------------------

def test_llada_rope_full_precision_is_read(folders, tmp_path):
    assert load_model(str(folders["llada"]), device="cpu").net.cfg.rope_full_precision is True
    folder = edited_copy(folders["llada"], tmp_path / "low-precision-rope", rope_full_precision=False)
    assert load_model(str(folder), device="cpu").net.cfg.rope_full_precision is False
    edit_config(folder, rope_full_precision=DROP)  # absent: LLaDA's default is true
    assert load_model(str(folder), device="cpu").net.cfg.rope_full_precision is True


def _float64_oracle(folder: Path):
    """The same network in float64 (transformers' Llama with is_causal=False), whose rotary
    tables are computed in float32 as LLaDA's are."""
    from test_models_oracle import hf_oracle

    return hf_oracle(folder, "eager").double()


def test_llada_bfloat16_matches_float64_with_float32_rotary(folders, tmp_path):
    folder = folders["llada"]
    ours = load_model(str(folder), device="cpu", dtype="bfloat16")
    oracle = _float64_oracle(folder)
    # Long canvases: rotary angles grow with the position, and so does a bfloat16 rotary's error.
    gen = torch.Generator().manual_seed(0)
    t = 1024
    tokens = torch.randint(0, ours.decodable, (2, t), generator=gen)
    tokens[:, -64:] = ours.mask_id
    with torch.no_grad():
        ref = oracle(input_ids=tokens, use_cache=False).logits
    v = ours.decodable
    ref = ref[..., :v]
    scale = ref.abs().max().item()

    def error(model):
        got = model.logits(tokens, torch.arange(t))[..., :v].double()
        diff = (got - ref).abs()
        agree = (got.argmax(-1) == ref.argmax(-1)).double().mean().item()
        return diff.max().item() / scale, diff.mean().item() / scale, agree

    full_max, full_mean, full_agree = error(ours)
    print(f"\n[bf16 vs f64] full-precision rotary: max {full_max:.3e} mean {full_mean:.3e} "
          f"argmax agreement {full_agree:.4f}")
    assert full_max < 0.05 and full_mean < 0.01 and full_agree > 0.95

    # The same weights with rotary applied in bfloat16 (Dream's way): the flag reaches the network.
    # (Against float64 both are within bfloat16 noise; which rounding each does is pinned exactly
    # by test_rotary_precision_in_the_network.)
    low = edited_copy(folder, tmp_path / "low", rope_full_precision=False)
    low_max, low_mean, low_agree = error(load_model(str(low), device="cpu", dtype="bfloat16"))
    print(f"[bf16 vs f64] bfloat16 rotary:       max {low_max:.3e} mean {low_mean:.3e} "
          f"argmax agreement {low_agree:.4f}")
    assert not torch.equal(ours.logits(tokens, torch.arange(t)),
                           load_model(str(low), device="cpu", dtype="bfloat16").logits(tokens, torch.arange(t)))


def test_rotary_precision_in_the_network():
    """With full precision the bfloat16 heads are rotated in float32 and rounded once."""
    from pvf_lmeval.models.transformer import apply_rotary, rotary_tables

    gen = torch.Generator().manual_seed(3)
    x = torch.randn(1, 2, 300, 16, generator=gen).to(torch.bfloat16)
    pos = torch.arange(300)[None] + 3000
    cos32, sin32 = rotary_tables(pos, 16, 500000.0, torch.float32)
    cos16, sin16 = rotary_tables(pos, 16, 500000.0, torch.bfloat16)
    full, low = apply_rotary(x, cos32, sin32), apply_rotary(x, cos16, sin16)
    assert full.dtype == low.dtype == torch.bfloat16
    exact = apply_rotary(x.double(), cos32.double(), sin32.double())
    assert torch.equal(full, exact.to(torch.bfloat16))       # one rounding, from the exact value
    assert (low.double() - exact).abs().mean() > (full.double() - exact).abs().mean()


# --- configurations the native network does not implement ---------------------------------------

LLADA_BAD = [
    ({"block_type": "sequential"}, (), "block_type", '"llama"'),
    ({}, ("block_type",), "block_type", "absent"),
    ({"activation_type": "swiglu"}, (), "activation_type", '"silu"'),
    ({}, ("activation_type",), "activation_type", "absent"),
    ({"layer_norm_type": "default"}, (), "layer_norm_type", '"rms"'),
    ({}, ("layer_norm_type",), "layer_norm_type", "absent"),
    ({"alibi": True}, (), "alibi", "false"),
    ({"input_emb_norm": True}, (), "input_emb_norm", "false"),
    ({"include_bias": True}, (), "include_bias", "false"),
    ({"bias_for_layer_norm": True}, (), "bias_for_layer_norm", "false"),
    ({"scale_logits": True}, (), "scale_logits", "false"),
    ({}, ("rope",), "rope", "absent"),
    ({"attention_layer_norm": True}, (), "attention_layer_norm", "false"),
]


@pytest.mark.parametrize("change,drop,key,says", LLADA_BAD,
                         ids=[f"{k}-{'absent' if d else 'value'}" for _, d, k, _ in LLADA_BAD])
def test_llada_unsupported_config_is_one_line(folders, tmp_path, change, drop, key, says):
    folder = edited_copy(folders["llada"], tmp_path / "bad", **change, **dict.fromkeys(drop, DROP))
    with pytest.raises(UnsupportedCheckpoint) as exc:
        load_model(str(folder), device="cpu")
    msg = _one_line(exc)
    assert f"{key}=" in msg and "supported" in msg and says in msg


def test_llada_weight_tying_absent_means_tied(folders, tmp_path):
    """LLaDA's default is a tied head: with the flag absent, a separate head weight is an error
    and without it the head is the embedding."""
    folder = edited_copy(folders["llada"], tmp_path / "tied", weight_tying=DROP)
    with pytest.raises(UnsupportedCheckpoint) as exc:
        load_model(str(folder), device="cpu")
    msg = _one_line(exc)
    assert "weight_tying" in msg and "ff_out" in msg
    # drop the head weight from its shard and the index: now it loads, tied
    from safetensors.torch import load_file, save_file

    index = json.loads((folder / "model.safetensors.index.json").read_text())
    shard = index["weight_map"].pop("model.transformer.ff_out.weight")
    tensors = load_file(str(folder / shard))
    del tensors["model.transformer.ff_out.weight"]
    save_file(tensors, str(folder / shard), metadata={"format": "pt"})
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    model = load_model(str(folder), device="cpu")
    assert model.net.lm_head.weight.data_ptr() == model.net.embed.weight.data_ptr()


DREAM_BAD = [
    ({"hidden_act": "gelu"}, "hidden_act", '"silu"'),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_scaling", "null"),
    ({"use_sliding_window": True}, "use_sliding_window", "false"),
]


@pytest.mark.parametrize("change,key,says", DREAM_BAD, ids=[k for _, k, _ in DREAM_BAD])
def test_dream_unsupported_config_is_one_line(folders, tmp_path, change, key, says):
    folder = tmp_path / "bad"
    folder.mkdir()
    for p in folders["dream"].iterdir():       # symlink the big files: only config.json changes
        (folder / p.name).symlink_to(p) if p.name != "config.json" else None
    cfg = json.loads((folders["dream"] / "config.json").read_text())
    cfg.update(change)
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedCheckpoint) as exc:
        load_model(str(folder), device="cpu")
    msg = _one_line(exc)
    assert f"{key}=" in msg and "supported" in msg and says in msg


def test_missing_shape_key_is_one_line(folders, tmp_path):
    folder = edited_copy(folders["llada"], tmp_path / "no-d-model", d_model=DROP)
    with pytest.raises(UnsupportedCheckpoint) as exc:
        load_model(str(folder), device="cpu")
    assert "d_model" in _one_line(exc)
