"""The decode loop's own tensor work as compiled programs: the statistics pass of every model
call (the ``compile`` option) and the round's step (the ``compile_round`` option).

``stats_from_logits`` is a dozen operations over [N, P, V] (mask, maximum, gathers, the
max-shifted normaliser, exponentials); eager, each is a kernel launch and a pass over the
vocabulary. Compiled (``torch.compile``, dynamic shapes, no duck shapes: the rows N and
positions P of a call vary every round and a coincidence N == P must not become a guard) it is a
few fused kernels, the same program for every call shape but size 1 (one row, one position),
and whether Gumbel noise is added (temperature > 0). It returns the same tokens as the eager
pass; the probabilities can differ from the eager ones in the last float32 bits (the fused
reduction sums the normaliser in its own order).

``decode_batch(..., compile_step=...)`` asks for it (``torch.compile`` options; the adapter's
``compile`` model arg), and the round's step (:mod:`.rounds`: ``settle`` after the call,
``prepare`` after the cache commit) with ``compile_round=...``; nothing is global. Eager, the
round's step dispatches some 100-300 small operations per round (the step's selections and
rankings, the early-stop rule, the next call's layout and cache flags), each a kernel launch
on a GPU; compiled, they are fused kernels of two programs. Shapes are dynamic
and size-oblivious (the live requests R, rows M and canvas L; a batch of one shares the
program), the decoder and its parameters are constants of the program (a new decoder or
parameter value compiles again). The programs make the eager step's decisions: selections,
rankings and comparisons are exact; a float sum over positions (PVF's C_total, VIG) is the
only value whose last bits can differ from the eager one. ``batch_invariant`` is refused with
a compiled round (``options.ROUND_NOT_INVARIANT``): inductor does not compile its fixed-order
sums over a dynamic canvas.
"""

from __future__ import annotations

import types

from torch import Tensor

from ..tensors.compiling import compiled
from . import rounds
from .stats import stats_from_logits

_programs: dict[tuple, object] = {}


def _options_key(options: dict) -> tuple:
    """``torch.compile`` options as a key of :data:`_programs`."""
    return tuple(sorted((k, repr(v)) for k, v in options.items()))


def compiled_stats_from_logits(logits: Tensor, cur: Tensor, mask_id: int | None,
                               temperature: float = 0.0, noise: Tensor | None = None, *,
                               options: dict | None = None, top_k: int | None = None,
                               top_p: float | None = None, float64: bool = False):
    """:func:`.stats.stats_from_logits` as one compiled program (``options``: extra
    ``torch.compile`` options, e.g. ``backend``; shapes always dynamic); same arguments and
    results."""
    options = options or {}
    key = _options_key(options)
    fn = _programs.get(key)
    if fn is None:
        opts = {k: v for k, v in options.items() if k != "dynamic"}
        fn = _programs[key] = compiled(stats_from_logits, dict(opts, dynamic=True))
    return fn(logits, cur, mask_id, temperature, noise, top_k=top_k, top_p=top_p, float64=float64)


def round_programs(options: dict | None, config: tuple = ()):
    """(settle, prepare) of :mod:`.rounds` for the decode loop: eager with ``options`` None, else
    compiled with these ``torch.compile`` options (dynamic shapes unless ``dynamic`` says
    otherwise; sizes oblivious: a batch of one shares the programs), one pair per decode
    configuration ``config`` (hashable: the decoding parameters and what else the programs hold
    constant), reused by every batch of it."""
    if options is None:
        return rounds.settle, rounds.prepare
    key = ("round", _options_key(options), config)
    pair = _programs.get(key)
    if pair is None:
        opts = dict(options)
        opts.setdefault("dynamic", True)
        pair = _programs[key] = tuple(compiled(_own_code(fn), opts, size_oblivious=True)
                                      for fn in (rounds.settle, rounds.prepare))
    return pair


def _own_code(fn):
    """A copy of ``fn`` with a code object of its own. Dynamo keeps a function's compiled
    programs, and counts its recompiles against a small limit (beyond which it runs eager),
    per code object: each configuration's programs must not use up another's."""
    return types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__,
                              fn.__defaults__, fn.__closure__)
