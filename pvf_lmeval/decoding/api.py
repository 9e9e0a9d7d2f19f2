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

Optional: ``device`` (tokens are built there; default: the prompt's device), ``pad_id``, and
``batch_invariant()``: a context manager inside which the model computes every row the same way
whatever the batch (``batch_invariant=True``; it raises a one-line ValueError where it cannot).
"""

from __future__ import annotations

from typing import Iterable

import torch

from .common import invariant_mode
from .loop import DecodeResult, run
from .params import DecodeParams, params_for_call
from .plan_vocab import FixedVocab
from .registry import DECODERS


def _device(model, prompt_ids) -> torch.device:
    dev = getattr(model, "device", None)
    if dev is None:
        dev = prompt_ids.device if isinstance(prompt_ids, torch.Tensor) else "cpu"
    return torch.device(dev)


def planning_vocab(params: DecodeParams, online=None, device="cpu"):
    """The vocabulary a decoder with ``params`` reads: ``online`` when given, else the fixed
    ``plan_vocab`` ids; None for decoders that read none."""
    if not DECODERS[params.decoder].uses_vocab:
        return None
    if online is not None:
        return online
    return FixedVocab(params.plan_vocab or (), device=device)


def decode_batch(model, prompts, decoder: str | None = None, *, params: DecodeParams | None = None,
                 request_indices: list[int] | None = None, repeat_indices: list[int] | None = None,
                 trace: bool = False, online=None, preset: str | None = None,
                 batch_invariant: bool = False, **overrides) -> list[DecodeResult]:
    """Decode several prompts (lists of ids or 1-D tensors) with the same parameters, together.

    ``decoder`` None means "threshold" (or, with ``params``, the decoder in ``params``).
    Parameters are the fields of :class:`DecodeParams` as keyword ``overrides`` (None = default
    / preset / keep); with ``params`` given, the overrides replace its fields and the result is
    re-validated. ``request_indices``/``repeat_indices`` join ``seed`` in seeding every random
    draw (default: 0..n-1 and 0). ``online``: an ``OnlineVocab`` (``vocab=online``) that
    replaces ``plan_vocab``; it records planning outcomes but changes only when its owner calls
    ``update()`` between batches. Outputs and per-request NFE equal those of decoding each
    prompt alone with the same request/repeat index.

    ``batch_invariant``: every per-request result (tokens, routes, every statistic) is
    bit-identical whatever the batch also on devices whose library kernels depend on the batch's
    shape (CUDA in bfloat16/float16): the model computes in its batch-invariant kernels and the
    decoding side sums in a fixed order. A model or device without those kernels is a one-line
    ValueError naming the argument (no fallback).
    """
    params = params_for_call(decoder, params, preset, **overrides)
    mode = invariant_mode(model, bool(batch_invariant))
    prompts = list(prompts)
    if not prompts:
        return []
    dev = _device(model, prompts[0])
    prompts = [torch.as_tensor(p, dtype=torch.long).to(dev).reshape(-1) for p in prompts]
    step = DECODERS[params.decoder](params)
    with mode:
        return run(model, prompts, params, step, request_indices=request_indices,
                   repeat_indices=repeat_indices, trace=trace,
                   vocab=planning_vocab(params, online, dev), invariant=bool(batch_invariant))


def decode(model, prompt_ids: Iterable[int] | torch.Tensor, decoder: str | None = None, *,
           params: DecodeParams | None = None, request_index: int = 0, repeat_index: int = 0,
           trace: bool = False, online=None, preset: str | None = None,
           batch_invariant: bool = False, **overrides) -> DecodeResult:
    """Decode ``gen_length`` tokens after ``prompt_ids`` (list[int] or 1-D LongTensor): a batch
    of one (see :func:`decode_batch` for the arguments)."""
    return decode_batch(model, [prompt_ids], decoder, params=params,
                        request_indices=[request_index], repeat_indices=[repeat_index],
                        trace=trace, online=online, preset=preset,
                        batch_invariant=batch_invariant, **overrides)[0]
