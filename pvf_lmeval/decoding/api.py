"""Public entry points: ``decode(model, prompt_ids, decoder=None, *, params=None, **overrides)``
and ``decode_batch`` (several prompts decoded together).

Model protocol (the only thing decoders rely on)::

    mask_id: int
    eos_ids: tuple[int, ...]
    def logits(self, tokens, positions, *, attention_mask=None, cache=None) -> FloatTensor[N, P, V]
        # tokens LongTensor[N, T]; positions LongTensor[P] or [N, P]; row p predicts canvas
        # position positions[p]. attention_mask [N, T] (1 = real token) hides left padding;
        # cache: per-request KV caches (see models/kv.py). The decoder may modify the returned
        # tensor in place.

Optional: ``device`` (tokens are built there; default: the prompt's device), ``pad_id``,
``block_size`` (a block-diffusion model: block-causal attention over blocks of that many
positions, which the model applies itself; see :mod:`.blocks`), ``max_length`` (the context:
``gen_length`` plus the longest prompt must fit it), ``tokenizer`` (needed by
``rules=reference``, whose planning vocabulary includes the capitalised tokens), and
``batch_invariant()``: a context manager inside which the model computes every row the same way
whatever the batch (``batch_invariant=True``; it raises a one-line ValueError where it cannot).

A uniform-state model (DiffusionGemma) has ``canvas_length`` (config.json's), ``vocab_size``
and no mask token (``mask_id`` raises a one-line ValueError; ``decode_batch`` refuses the
decoders that fill masks on it, and ``renoise`` on a masked model, in one line), and its ``logits``
take ``self_conditioning``: ``tokens`` = context + canvas, the canvas the last
``canvas_length`` columns (named by ``positions``; the context, which may be left-padded, is
read causally), ``self_conditioning`` [N, canvas_length, V] the previous denoising step's
processed logits over the canvas (the softcapped logits divided by that step's temperature;
None at a canvas's first step); ``eos_ids`` holds every id of config.json's ``eos_token_id``;
``sliding_windows`` (per layer, its sliding window or None) says what ``cache=prefix`` keeps of
each layer (:class:`.cache.ContextKV`).
"""

from __future__ import annotations

from typing import Iterable

import torch

from .blocks import block_size_of, check_canvas, default_block_length, on_model
from .options import DecodeOptions, invariant_mode
from .loop import DecodeResult, run
from .params import DecodeParams, params_for_call
from .plan_vocab import FixedVocab, capitalised_ids
from .registry import DECODERS
from .rules import rules_for


def _device(model, prompt_ids) -> torch.device:
    dev = getattr(model, "device", None)
    if dev is None:
        dev = prompt_ids.device if isinstance(prompt_ids, torch.Tensor) else "cpu"
    return torch.device(dev)


def planning_vocab(params: DecodeParams, online=None, device="cpu", tokenizer=None):
    """The vocabulary a decoder with ``params`` reads: ``online`` when given, else the fixed
    ``plan_vocab`` ids, plus the ``tokenizer``'s capitalised tokens when the rules say so
    (``rules=reference``, switch 2); None for decoders that read none."""
    if not DECODERS[params.decoder].uses_vocab:
        return None
    capitalised = rules_for(params.rules).capitalised_plan_tokens
    if online is not None:
        if capitalised:
            raise ValueError(f"rules={params.rules} adds capitalised tokens to a fixed planning "
                             "vocabulary; an online vocabulary learns its own (use rules=paper "
                             "or plan_vocab)")
        return online
    ids = params.plan_vocab or ()
    if capitalised:
        if tokenizer is None:
            raise ValueError(f"rules={params.rules} plans on capitalised tokens: the model needs a "
                             "tokenizer attribute (or use rules=paper)")
        ids = set(ids) | capitalised_ids(tokenizer)
    return FixedVocab(ids, device=device)


def check_context(model, prompts, gen_length: int) -> None:
    """The longest prompt plus ``gen_length`` must fit the model's context (``max_length``,
    when the model has one), else a one-line ``ValueError`` naming the three."""
    context = getattr(model, "max_length", None)
    longest = max(len(p) for p in prompts)
    if context is not None and longest + gen_length > context:
        raise ValueError(f"gen_length={gen_length} after a prompt of {longest} tokens needs "
                         f"{longest + gen_length} positions, more than the model's context of "
                         f"{context} tokens; lower gen_length or shorten the prompt")


def decode_batch(model, prompts, decoder: str | None = None, *, params: DecodeParams | None = None,
                 request_indices: list[int] | None = None, repeat_indices: list[int] | None = None,
                 trace: bool = False, online=None, preset: str | None = None,
                 batch_invariant: bool = False, compile_step: bool | dict | None = None,
                 compile_round: bool | dict | None = None, options: DecodeOptions | None = None,
                 **overrides) -> list[DecodeResult]:
    """Decode several prompts (lists of ids or 1-D tensors) with the same parameters, together.

    ``decoder`` None means "threshold" (or, with ``params``, the decoder in ``params``).
    Parameters are the fields of :class:`DecodeParams` as keyword ``overrides`` (None = default
    / preset / keep); with ``params`` given, the overrides replace its fields and the result is
    re-validated. On a block-diffusion model ``block_length`` defaults to the model's block
    size, and any other value is an error. ``request_indices``/``repeat_indices`` join
    ``seed`` in seeding every random draw (default: 0..n-1 and 0). ``online``: an ``OnlineVocab`` (``vocab=online``) that
    replaces ``plan_vocab``; it records planning outcomes but changes only when its owner calls
    ``update()`` between batches. Outputs and per-request NFE equal those of decoding each
    prompt alone with the same request/repeat index.

    ``batch_invariant``: every per-request result (tokens, routes, every statistic) is
    bit-identical whatever the batch also on devices whose library kernels depend on the batch's
    shape (CUDA in bfloat16/float16): the model computes in its batch-invariant kernels and the
    decoding side sums in a fixed order. A model or device without those kernels is a one-line
    ValueError naming the argument (no fallback).

    ``compile_step`` / ``compile_round``: the statistics pass of every model call / the round's
    tensor work around it as ``torch.compile`` programs (True, or a dict of ``torch.compile``
    options; None or False: eager). The same tokens and NFE as eager (docs/speed.md);
    ``compile_round`` cannot be combined with ``batch_invariant``. ``options``: the three as a
    :class:`~.options.DecodeOptions` made before (then those arguments are not read).
    """
    if params is None:
        overrides.setdefault("model_block", block_size_of(model))
        if overrides.get("block_length") is None:
            overrides["block_length"] = default_block_length(model, DecodeParams.block_length)
    params = on_model(params_for_call(decoder, params, preset, **overrides), model)
    check_canvas(params, model, DECODERS[params.decoder].uniform_state)
    if options is None:
        options = DecodeOptions.of(batch_invariant, compile_step, compile_round)
    mode = invariant_mode(model, options.batch_invariant)
    prompts = list(prompts)
    if not prompts:
        return []
    dev = _device(model, prompts[0])
    prompts = [torch.as_tensor(p, dtype=torch.long).to(dev).reshape(-1) for p in prompts]
    check_context(model, prompts, params.gen_length)
    vocab = planning_vocab(params, online, dev, getattr(model, "tokenizer", None))
    refused = DECODERS[params.decoder].refuse(model)
    if refused:
        raise ValueError(refused)
    step = DECODERS[params.decoder](params)
    with mode:
        return run(model, prompts, params, step, request_indices=request_indices,
                   repeat_indices=repeat_indices, trace=trace, vocab=vocab,
                   invariant=options.batch_invariant, compile_step=options.compile_step,
                   compile_round=options.compile_round)


def decode(model, prompt_ids: Iterable[int] | torch.Tensor, decoder: str | None = None, *,
           params: DecodeParams | None = None, request_index: int = 0, repeat_index: int = 0,
           trace: bool = False, online=None, preset: str | None = None,
           batch_invariant: bool = False, compile_step: bool | dict | None = None,
           compile_round: bool | dict | None = None, **overrides) -> DecodeResult:
    """Decode ``gen_length`` tokens after ``prompt_ids`` (list[int] or 1-D LongTensor): a batch
    of one (see :func:`decode_batch` for the arguments)."""
    return decode_batch(model, [prompt_ids], decoder, params=params,
                        request_indices=[request_index], repeat_indices=[repeat_index],
                        trace=trace, online=online, preset=preset,
                        batch_invariant=batch_invariant, compile_step=compile_step,
                        compile_round=compile_round, **overrides)[0]
