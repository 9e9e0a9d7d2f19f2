"""Dream-Coder-7B and DiffuCoder-7B: Dream's layout, their own tokenizer settings and chat template.

Facts used: both are Dream-layout checkpoints (``DreamModel``, Qwen2 weight names, Dream's
remote tokenizer class over vocab.json + merges.txt). DiffuCoder's tokenizer adds
``<|dlm_pad|>`` at 151667 after Dream's ``<|beginoftext|>`` 151665 and ``<|mask|>`` 151666 and
uses it as its padding token; DiffuCoder fills the canvas after its answer with it and its
reference decoding cuts the text there; its documented prompt is Qwen's chat format with the
system line "You are a helpful assistant.". Dream-Coder's instruct generation applies the
tokenizer's own chat template.
"""

from __future__ import annotations

import json

import pytest
from hub_folders import make_dream_folder

from pvf_lmeval.models import load_model

pytestmark = pytest.mark.usefixtures("one_thread")

#: a chat template of the folder's own, distinct from Dream's fixture template
CODER_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a coding assistant.<|im_end|>\\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def _edit_tokenizer(folder, *, extra: dict | None = None, **keys) -> None:
    path = folder / "tokenizer_config.json"
    cfg = json.loads(path.read_text())
    for token, i in (extra or {}).items():
        cfg["added_tokens_decoder"][str(i)] = {"content": token, "lstrip": False,
                                               "normalized": False, "rstrip": False,
                                               "single_word": False, "special": True}
    cfg.update(keys)
    path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False))


@pytest.fixture(scope="module")
def diffucoder(tmp_path_factory):
    folder = make_dream_folder(tmp_path_factory.mktemp("coder") / "DiffuCoder-7B-Instruct", seed=5)
    _edit_tokenizer(folder, extra={"<|dlm_pad|>": 151667}, pad_token="<|dlm_pad|>")
    return load_model(str(folder), device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def dream_coder(tmp_path_factory):
    folder = make_dream_folder(tmp_path_factory.mktemp("coder") / "Dream-Coder-v0-Instruct-7B",
                               seed=6)
    _edit_tokenizer(folder, chat_template=CODER_TEMPLATE)
    return load_model(str(folder), device="cpu", dtype="float32")


def test_diffucoder_special_ids(diffucoder):
    tok = diffucoder.tokenizer
    assert tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_end|>", "<|beginoftext|>", "<|mask|>",
                                      "<|dlm_pad|>"]) == [151643, 151645, 151665, 151666, 151667]
    assert diffucoder.mask_id == 151666
    # <|dlm_pad|> ends the answer, as end of text and end of turn do; it is not the mask
    assert {151643, 151645, 151667} <= set(diffucoder.eos_ids) and 151666 not in diffucoder.eos_ids
    assert diffucoder.decodable == 151668 < diffucoder.vocab_size == 152064
    assert diffucoder.family == "dream" and diffucoder.logit_shift == 1


def test_diffucoder_prompt_is_qwens_chat_format(diffucoder):
    text = diffucoder.tokenizer.apply_chat_template(
        [{"role": "user", "content": "Write a function."}], tokenize=False, add_generation_prompt=True)
    assert text == ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
                    "<|im_start|>user\nWrite a function.<|im_end|>\n<|im_start|>assistant\n")


def test_dream_coder_uses_its_own_chat_template(dream_coder):
    tok = dream_coder.tokenizer
    text = tok.apply_chat_template([{"role": "user", "content": "Hello world"}], tokenize=False,
                                   add_generation_prompt=True)
    assert text == ("<|im_start|>system\nYou are a coding assistant.<|im_end|>\n"
                    "<|im_start|>user\nHello world<|im_end|>\n<|im_start|>assistant\n")
    assert dream_coder.mask_id == 151666 and dream_coder.pad_id == 151643
    assert {151643, 151645} <= set(dream_coder.eos_ids) and 151667 not in dream_coder.eos_ids
