"""Per-request checks of ``generate_until``: fitting prompts into the context, generation kwargs.

Stock lm-eval tasks ask for more than a small model's context holds (``gsm8k``'s five shots are
~1,900 tokens). lm-eval's HFLM keeps the last ``max_length - max_gen_toks`` tokens of such a
prompt; ``truncation=left`` (the default) does the same with ``gen_length``, and
``truncation=error`` refuses, naming the first document that does not fit. Both are decided for
every request before any is decoded, so a run never fails half way through.
"""

from __future__ import annotations

import difflib

TRUNCATION_MODES = ("left", "error")

#: generation kwargs that lm-eval tasks and ``--gen_kwargs`` use for autoregressive models; the
#: ones that mean nothing to diffusion decoding are ignored with a notice (not an error)
LM_EVAL_GEN_KEYS = ("until", "max_gen_toks", "max_new_tokens", "max_tokens", "do_sample",
                    "temperature", "min_p", "num_beams", "repetition_penalty",
                    "length_penalty", "no_repeat_ngram_size", "seed", "num_return_sequences")


def truncation_mode(value) -> str:
    """``truncation=left|error`` (model arg)."""
    mode = str(value).strip().lower() if value is not None else "left"
    if mode not in TRUNCATION_MODES:
        raise ValueError(f"truncation={value!r} must be one of {', '.join(TRUNCATION_MODES)}")
    return mode


def check_gen_kwargs(keys, decoder_keys) -> None:
    """A key that is neither a decoding parameter nor an lm-eval generation key is a typo: a
    one-line error naming the closest valid key."""
    valid = tuple(decoder_keys) + LM_EVAL_GEN_KEYS
    for key in sorted(keys):
        if key not in valid:
            closest = difflib.get_close_matches(key, valid, n=1, cutoff=0.0)[0]
            raise ValueError(
                f"pvf-dlm: unknown generation kwarg {key!r} (task generation_kwargs or "
                f"--gen_kwargs); did you mean {closest!r}? Valid: decoding parameters "
                f"({', '.join(decoder_keys)}) and lm-eval's ({', '.join(LM_EVAL_GEN_KEYS)})")


def max_gen_toks_value(value) -> int | None:
    """The task's ``max_gen_toks`` as a positive integer (None when absent)."""
    if value is None:
        return None
    try:
        number = int(value)
        exact = float(value) == number
    except (TypeError, ValueError):
        number, exact = 0, False
    if number < 1 or not exact:
        raise ValueError(f"pvf-dlm: max_gen_toks={value!r} (task generation_kwargs or --gen_kwargs) "
                         f"must be a positive integer")
    return number


def fit_prompt(prompt_ids: list[int], gen_length: int, context: int, mode: str,
               where: str) -> tuple[list[int], bool]:
    """``(prompt ids that fit, whether they were cut)``: the prompt plus ``gen_length`` must fit
    ``context`` tokens; ``left`` keeps the prompt's last ``context - gen_length`` tokens,
    ``error`` raises naming ``where`` (task and document). ``gen_length`` alone must leave room
    for at least one prompt token."""
    if gen_length >= context:
        raise ValueError(f"pvf-dlm: gen_length={gen_length} does not fit the model's context of "
                         f"{context} tokens (it leaves no room for the prompt); lower gen_length "
                         f"or max_gen_toks")
    room = context - gen_length
    if len(prompt_ids) <= room:
        return prompt_ids, False
    if mode == "error":
        raise ValueError(f"pvf-dlm: truncation=error: {where}: prompt {len(prompt_ids)} tokens + "
                         f"gen_length {gen_length} > context {context}; use fewer few-shot "
                         f"examples, a lower gen_length, or truncation=left (keep the prompt's "
                         f"last {room} tokens, as lm-eval's HFLM does)")
    return prompt_ids[-room:], True
