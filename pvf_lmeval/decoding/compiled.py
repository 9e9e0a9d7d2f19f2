"""The statistics pass of every model call as one compiled program (the ``compile`` option).

``stats_from_logits`` is a dozen operations over [N, P, V] (mask, maximum, gathers, the
max-shifted normaliser, exponentials); eager, each is a kernel launch and a pass over the
vocabulary. Compiled (``torch.compile``, dynamic shapes, no duck shapes: the rows N and
positions P of a call vary every round and a coincidence N == P must not become a guard) it is a
few fused kernels, the same program for every call shape but size 1 (one row, one position),
and whether Gumbel noise is added (temperature > 0). It returns the same tokens as the eager
pass; the probabilities can differ from the eager ones in the last float32 bits (the fused
reduction sums the normaliser in its own order).

A model asks for it with a ``compile_step`` attribute holding ``torch.compile`` options (a dict;
``DiffusionLM.compile`` sets it); the decode loop reads that attribute, so nothing is global.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .common import stats_from_logits

_programs: dict[tuple, object] = {}


def _program(options: dict):
    key = tuple(sorted((k, repr(v)) for k, v in options.items()))
    fn = _programs.get(key)
    if fn is None:
        opts = {k: v for k, v in options.items() if k != "dynamic"}
        fn = _programs[key] = torch.compile(stats_from_logits, dynamic=True, **opts)
    return fn


def compiled_stats_from_logits(logits: Tensor, cur: Tensor, mask_id: int,
                               temperature: float = 0.0, noise: Tensor | None = None, *,
                               options: dict | None = None):
    """:func:`.common.stats_from_logits` as one compiled program (``options``: extra
    ``torch.compile`` options, e.g. ``backend``); same arguments and results."""
    from torch.fx.experimental import _config as fx_config

    with fx_config.patch(use_duck_shape=False):
        return _program(options or {})(logits, cur, mask_id, temperature, noise)


def step_options(model) -> dict | None:
    """The ``torch.compile`` options of ``model``'s compiled statistics pass (its
    ``compile_step`` attribute, a dict), or None: the eager pass."""
    opts = getattr(model, "compile_step", None)
    return None if opts is None or opts is False else dict(opts)
