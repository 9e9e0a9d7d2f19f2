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

A model asks for it with a ``compile_step`` attribute holding ``torch.compile`` options (a dict;
``DiffusionLM.compile`` sets it); the decode loop reads that attribute, so nothing is global.

The round's step (:mod:`.round`: ``settle`` after the call, ``prepare`` after the cache commit)
is asked for the same way, with a ``compile_round`` attribute (``DiffusionLM.compile_round``).
Eager, the round's step dispatches some 100-300 small operations per round (the step's
selections and rankings, the early-stop rule, the next call's layout and cache flags), each a
kernel launch on a GPU; compiled, they are fused kernels of two programs. Shapes are dynamic
and size-oblivious (the live requests R, rows M and canvas L; a batch of one shares the
program), the decoder and its parameters are constants of the program (a new decoder or
parameter value compiles again). The programs make the eager step's decisions: selections,
rankings and comparisons are exact; a float sum over positions (PVF's C_total, VIG) is the
only value whose last bits can differ from the eager one. ``batch_invariant`` is refused with
a compiled round (``common.ROUND_NOT_INVARIANT``): inductor does not compile its fixed-order
sums over a dynamic canvas.
"""

from __future__ import annotations

import types

import torch
from torch import Tensor

from . import round as round_step
from .common import stats_from_logits

_programs: dict[tuple, object] = {}


def _options_key(options: dict) -> tuple:
    """``torch.compile`` options as a key of :data:`_programs`."""
    return tuple(sorted((k, repr(v)) for k, v in options.items()))


def _program(options: dict):
    key = _options_key(options)
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


def round_programs(options: dict | None, config: tuple = ()):
    """(settle, prepare) of :mod:`.round` for the decode loop: eager with ``options`` None, else
    compiled with these ``torch.compile`` options (dynamic shapes unless ``dynamic`` says
    otherwise), one pair per decode configuration ``config`` (hashable: the decoding
    parameters and what else the programs hold constant), reused by every batch of it."""
    if options is None:
        return round_step.settle, round_step.prepare
    _keep_outside_programs()
    key = ("round", _options_key(options), config)
    pair = _programs.get(key)
    if pair is None:
        opts = dict(options)
        opts.setdefault("dynamic", True)
        pair = _programs[key] = tuple(_no_duck_shapes(torch.compile(_own_code(fn), **opts))
                                      for fn in (round_step.settle, round_step.prepare))
    return pair


#: (module, class, method) that a compiled round calls as they are, outside its programs: explore's
#: per-request draws (``Batch.rand``, one generator per request) and the online vocabulary's queue
#: of records (``OnlineVocab.record``, a list that grows every round)
OUTSIDE_PROGRAMS = (("pvf_lmeval.decoding.batch", "Batch", "rand"),
                    ("pvf_lmeval.planning.online", "OnlineVocab", "record"))
_outside_marked = False


def _keep_outside_programs() -> None:
    """Mark :data:`OUTSIDE_PROGRAMS` with ``torch.compiler.disable`` (once, when a first round
    program is asked for: eager decoding never imports dynamo, which imports Triton). The
    marked methods run exactly as before when called eagerly."""
    global _outside_marked
    if _outside_marked:
        return
    import importlib

    for module, cls_name, name in OUTSIDE_PROGRAMS:
        cls = getattr(importlib.import_module(module), cls_name)
        setattr(cls, name, torch.compiler.disable(getattr(cls, name)))
    _outside_marked = True


def _own_code(fn):
    """A copy of ``fn`` with a code object of its own. Dynamo keeps a function's compiled
    programs, and counts its recompiles against a small limit (beyond which it runs eager),
    per code object: each configuration's programs must not use up another's."""
    return types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__,
                              fn.__defaults__, fn.__closure__)


def _no_duck_shapes(fn):
    """``fn`` run without duck shapes (two sizes that happen to be equal in one round, the live
    requests and the batch say, must not become a guard that fails in the next) and with
    size-oblivious sizes (a size of 1 is not specialised: a batch of one shares the program)."""
    from torch.fx.experimental import _config as fx_config

    def run(*args):
        with fx_config.patch(use_duck_shape=False, backed_size_oblivious=True):
            return fn(*args)
    return run
