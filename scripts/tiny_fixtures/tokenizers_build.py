"""Byte-level BPE tokenizers for the tiny fixtures, with the real models' special tokens.

One BPE (digits split into single tokens, so arithmetic is learnable; byte-level, so any text
tokenizes without unknown tokens) is trained on the synthetic corpus plus some general text;
each fixture then appends the special tokens of the model family it mirrors and ships a chat
template of the same shape as the real one.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

BPE_VOCAB = 700  # byte alphabet (256) + merges; the specials come on top, total stays < 1,024

LLADA_SPECIALS = ["<|startoftext|>", "<|endoftext|>", "<|start_header_id|>", "<|end_header_id|>",
                  "<|eot_id|>", "<|mdm_mask|>"]
DREAM_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|beginoftext|>", "<|mask|>"]

LLADA_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.index0 == 0 %}{{ bos_token }}{% endif %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)
DREAM_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

GENERAL_TEXT = """Janet's ducks lay 16 eggs per day. She eats three for breakfast every morning and bakes
muffins for her friends every day with four. She sells the remainder at the farmers' market daily
for $2 per fresh duck egg. How much in dollars does she make every day at the farmers' market?
A robe takes 2 bolts of blue fiber and half that much white fiber. How many bolts in total does it
take? def add(a, b):\n    return a + b\nThe answer is (B). Let's think step by step. Question:
What is the capital of France? Paris is the capital. 0123456789 +-*/=()[]{}<>%$#@!?.,;:'"
"""


def train_bpe(corpus: list[str]) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        # One token per digit, the first carrying the preceding space (" 13" -> " 1", "3").
        pre_tokenizers.Split(Regex(r" ?[0-9]"), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=BPE_VOCAB, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(corpus + [GENERAL_TEXT] * 20, trainer=trainer)
    return tok


def fixture_corpus(per_task: int = 20_000) -> list[str]:
    """The text the fixtures' BPE is trained on: ``per_task`` training-stream items of `arith` and
    of `arith_var` (unfiltered, fixed seeds) as prompt plus answer. Fixed, so that the tokenizer
    (which the task data's length filter and every token-id artifact depend on) does not move
    with a training run's data seed."""
    import arith_data
    import arith_var_data

    items = (arith_data.make_split(arith_data.SPLITS["train"][0], per_task, set())
             + arith_var_data.make_split(arith_var_data.SPLITS["train"][0], per_task, set()))
    return [f"Question: {it['question']}\nAnswer: {it['answer']}" for it in items]


def write_tokenizer(bpe: Tokenizer, folder: Path, family: str) -> dict:
    """Write tokenizer.json + tokenizer_config.json; return the special ids by name."""
    tok = Tokenizer.from_str(bpe.to_str())
    specials = LLADA_SPECIALS if family == "llada" else DREAM_SPECIALS
    tok.add_special_tokens(specials)
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    ids = {t: tok.token_to_id(t) for t in specials}
    if family == "llada":
        cfg = {"bos_token": "<|startoftext|>", "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>",
               "mask_token": "<|mdm_mask|>", "chat_template": LLADA_TEMPLATE, "add_bos_token": False}
    else:
        cfg = {"bos_token": None, "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>",
               "mask_token": "<|mask|>", "chat_template": DREAM_TEMPLATE}
    cfg.update({"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 512,
                "clean_up_tokenization_spaces": False})
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return ids
