"""Dream-Coder-7B and DiffuCoder-7B: Dream's layout, their own tokenizer settings and template.

Facts, with the public repositories they were read from (commit):

DiffuCoder (apple/DiffuCoder-7B-Instruct, DiffuCoder-7B-cpGRPO)

- config.json is Dream's: ``DreamModel``, model_type "Dream", Qwen2.5-7B shapes (28 layers of
  3584, 28 heads, 4 KV heads, vocab_size 152064, rope_theta 1e6, 131072 positions, untied head),
  mask_token_id 151666, bos/eos/pad 151643 (atsentia/ml-diffucoder@848b83d
  ``jax_lm/models/dream.py``, ``jax_lm/README_UPDATED.md``).
- The tokenizer adds ``<|dlm_pad|>`` 151667 after ``<|beginoftext|>`` 151665 and ``<|mask|>``
  151666 (``jax_lm/TOKENIZER.md``, same commit) and pads with it, while the model config's
  pad_token_id is another id (sjchen0/genpolicy-diffucoder@d47dd04 ``model/generation_utils.py``
  writes 151667 in place of ``self.config.pad_token_id``).
- The reference decodes the canvas after the prompt and keeps the text before the first
  ``<|dlm_pad|>``; its documented instruct prompt is Qwen's chat format with the system line
  "You are a helpful assistant." and the stripped query followed by a newline before
  ``<|im_end|>`` (apple/ml-diffucoder@f735e01 ``README.md``, ``inference_demo.py``).
- Not found in public code: the checkpoint's ``chat_template`` string. The folder here carries a
  template written to render the documented prompt; it stands in for the real string.

Dream-Coder (Dream-org/Dream-Coder-v0-Instruct-7B)

- Dream's config class with mask_token_id 151666, pad_token_id 151643 and
  max_position_embeddings 32768 (DreamLM/Dream-Coder@87409da
  ``instruct/src/inference/fast_dllm/configuration_dream.py``).
- Instruct prompts are the tokenizer's own chat template and answers end with the tokenizer's
  eos token (``README.md`` quickstart: ``apply_chat_template`` then cut at ``tokenizer.eos_token``;
  ``instruct/src/trainer/sft_dataset.py``: prompt by the chat template, response + eos token).
- Not found in public code: the checkpoint's ``chat_template`` string. The folder here carries a
  probe template of this test's own, marked as such, to show that the folder's template is the
  one applied.
"""

from __future__ import annotations

import json

import pytest
from helpers.hub_folders import make_dream_folder

from pvf_lmeval.models import load_model

pytestmark = pytest.mark.usefixtures("one_thread")

#: renders DiffuCoder's documented prompt (apple/ml-diffucoder README); not the checkpoint's string
DIFFUCODER_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] | trim "
    "+ '\\n<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
#: a probe, not Dream-Coder's template: its marker shows which template the tokenizer applied
PROBE_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + ' [folder template probe]\\n' + message['content'] "
    "+ '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
QUERY = [{"role": "user", "content": "Write a function."}]


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
    _edit_tokenizer(folder, extra={"<|dlm_pad|>": 151667}, pad_token="<|dlm_pad|>",
                    chat_template=DIFFUCODER_TEMPLATE)
    return load_model(str(folder), device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def dream_coder(tmp_path_factory):
    folder = make_dream_folder(tmp_path_factory.mktemp("coder") / "Dream-Coder-v0-Instruct-7B",
                               seed=6, max_position_embeddings=32768)
    _edit_tokenizer(folder, chat_template=PROBE_TEMPLATE)
    return load_model(str(folder), device="cpu", dtype="float32")


def test_diffucoder_special_ids(diffucoder):
    tok = diffucoder.tokenizer
    assert tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_end|>", "<|beginoftext|>", "<|mask|>",
                                      "<|dlm_pad|>"]) == [151643, 151645, 151665, 151666, 151667]
    assert diffucoder.mask_id == 151666
    # <|dlm_pad|> fills the canvas after the answer: it ends the answer as end of text and end of
    # turn do; it is not the mask
    assert {151643, 151645, 151667} <= set(diffucoder.eos_ids) and 151666 not in diffucoder.eos_ids
    # the prompt's left-padding filler is config.json's pad_token_id, not the tokenizer's pad
    assert tok.pad_token_id == 151667 and diffucoder.pad_id == 151643
    assert diffucoder.decodable == 151668 < diffucoder.vocab_size == 152064
    assert diffucoder.max_length == 131072
    assert diffucoder.family == "dream" and diffucoder.logit_shift == 1


def test_diffucoder_documented_prompt(diffucoder):
    tok = diffucoder.tokenizer
    documented = ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
                  "<|im_start|>user\nWrite a function.\n<|im_end|>\n<|im_start|>assistant\n")
    assert tok.apply_chat_template(QUERY, tokenize=False, add_generation_prompt=True) == documented
    # the chat markers stay single special tokens and the prompt decodes back to itself
    ids = tok(documented, add_special_tokens=False).input_ids
    assert [i for i in ids if i >= 151643] == [151644, 151645, 151644, 151645, 151644]
    assert ids[0] == 151644 and tok.decode(ids) == documented


def test_dream_coder_special_ids(dream_coder):
    tok = dream_coder.tokenizer
    assert dream_coder.mask_id == 151666 and dream_coder.pad_id == 151643
    # the answer ends at the tokenizer's eos token; Dream-Coder has no <|dlm_pad|>
    assert tok.eos_token_id == 151643 and tok.convert_tokens_to_ids("<|im_end|>") == 151645
    assert {151643, 151645} <= set(dream_coder.eos_ids) and 151666 not in dream_coder.eos_ids
    assert 151667 not in dream_coder.eos_ids
    assert dream_coder.decodable == 151667 < dream_coder.vocab_size == 152064
    assert dream_coder.max_length == 32768
    assert dream_coder.family == "dream" and dream_coder.logit_shift == 1


def test_dream_coder_applies_the_folders_template(dream_coder):
    text = dream_coder.tokenizer.apply_chat_template(QUERY, tokenize=False,
                                                     add_generation_prompt=True)
    assert text == ("<|im_start|>user [folder template probe]\nWrite a function.<|im_end|>\n"
                    "<|im_start|>assistant\n")
