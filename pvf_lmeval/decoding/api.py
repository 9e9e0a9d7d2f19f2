"""Public entry point: ``decode(model, prompt_ids, decoder, **params) -> DecodeResult``.

Model protocol (the only thing decoders rely on)::

    mask_id: int
    eos_ids: tuple[int, ...]
    def logits(self, tokens, positions, *, attention_mask=None, cache=None) -> FloatTensor[N, P, V]
        # tokens LongTensor[N, T]; positions LongTensor[P]; row p predicts canvas position
        # positions[p]. The decoder may modify the returned tensor in place.

Optional: ``device`` (tokens are built there; default: the prompt's device).
"""

from __future__ import annotations

from typing import Any, Iterable

import torch

from .explore import ExploreDecoder
from .freedave import FreeDaveDecoder
from .loop import DecodeResult, run_loop
from .params import DecodeParams, params_for_call
from .pvf import PVFDecoder
from .static import StaticDecoder
from .threshold import ThresholdDecoder

#: decoder name -> step class (constructed once per request from DecodeParams).
DECODERS = {
    "static": StaticDecoder,
    "threshold": ThresholdDecoder,
    "freedave": FreeDaveDecoder,
    "pvf": PVFDecoder,
    "explore": ExploreDecoder,
}


def _device(model, prompt_ids) -> torch.device:
    dev = getattr(model, "device", None)
    if dev is None:
        dev = prompt_ids.device if isinstance(prompt_ids, torch.Tensor) else "cpu"
    return torch.device(dev)


def decode(model, prompt_ids: Iterable[int] | torch.Tensor, decoder: str | None = None,
           *, params: DecodeParams | None = None, request_index: int = 0, repeat_index: int = 0,
           trace: bool = False, preset: str | None = None, gen_length: int | None = None,
           block_length: int | None = None, threshold: float | None = None,
           factor: float | None = None, steps: int | None = None,
           temperature: float | None = None, early_stop: bool | None = None,
           seed: int | None = None, draft_steps: int | None = None,
           base_rule: str | None = None, plan_lo: float | None = None,
           plan_hi: float | None = None, ar_lo: float | None = None, width: int | None = None,
           reveal_next: int | None = None, routes: str | None = None,
           plan_vocab: Any = None, plan_self_check: bool | None = None,
           pick: str | None = None, band: Any = None, cache: str | None = None,
           online=None) -> DecodeResult:
    """Decode ``gen_length`` tokens after ``prompt_ids`` (list[int] or 1-D LongTensor).

    ``decoder`` None means "threshold" (or, with ``params``, the decoder in ``params``).

    Parameters are those of :class:`DecodeParams` (None = default / preset). With ``params``
    given (e.g. built once by the adapter), ``decoder`` and the keyword arguments that are not
    None override its fields and the result is re-validated.
    ``request_index``/``repeat_index`` join ``seed`` in seeding every random draw.
    ``online``: an ``OnlineVocab`` (``vocab=online``) that replaces ``plan_vocab``; it records
    planning outcomes but changes only when its owner calls ``update()`` between requests.
    """
    kw = dict(gen_length=gen_length, block_length=block_length, threshold=threshold,
              factor=factor, steps=steps, temperature=temperature, early_stop=early_stop,
              seed=seed, draft_steps=draft_steps, base_rule=base_rule, plan_lo=plan_lo,
              plan_hi=plan_hi, ar_lo=ar_lo, width=width, reveal_next=reveal_next,
              routes=routes, plan_vocab=plan_vocab, plan_self_check=plan_self_check,
              pick=pick, band=band, cache=cache)
    params = params_for_call(decoder, params, preset, **kw)
    dev = _device(model, prompt_ids)
    prompt = torch.as_tensor(prompt_ids, dtype=torch.long).to(dev).reshape(-1)
    step = DECODERS[params.decoder](params)
    return run_loop(model, prompt, params, step, request_index=request_index,
                    repeat_index=repeat_index, trace=trace, online=online)
