"""How the loop computes, never what it decides: ``batch_invariant`` (every float sum of a
request independent of its batch) and the compiled parts of the loop, ``compile_step`` (the
statistics pass of every model call) and ``compile_round`` (the round's tensor work around the
call). They are :class:`DecodeOptions`, a value checked once, when it is made (``decode_batch``
makes one from its arguments, or takes one made before).

A compiled part takes ``torch.compile`` options: None or False (eager), True (the defaults), or a
dict of options (e.g. ``{"backend": "eager"}``).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

#: why ``compile_round`` and ``batch_invariant`` are refused together
ROUND_NOT_INVARIANT = ("batch_invariant=true cannot be combined with compile_round=true: "
                       "inductor does not compile the round's fixed-order sums over a dynamic "
                       "canvas; turn one of them off")


def compile_options(name: str, value) -> dict | None:
    """The ``torch.compile`` options of the compiled part ``name`` (None: it runs eager), or a
    one-line ValueError naming it."""
    if value is None or value is False:
        return None
    if value is True:
        return {}
    if isinstance(value, dict):
        return dict(value)
    raise ValueError(f"{name}={value!r} must be true, false or a dict of torch.compile options")


@dataclass(frozen=True)
class DecodeOptions:
    """How a decode computes: ``batch_invariant``, and the ``torch.compile`` options of
    ``compile_step`` and ``compile_round`` (None: eager). Every instance is valid: the options
    that cannot go together are a one-line ValueError when it is made."""

    batch_invariant: bool = False
    compile_step: dict | None = None
    compile_round: dict | None = None

    def __post_init__(self) -> None:
        if self.batch_invariant and self.compile_round is not None:
            raise ValueError(ROUND_NOT_INVARIANT)

    @classmethod
    def of(cls, batch_invariant=False, compile_step=None, compile_round=None) -> "DecodeOptions":
        """From loose values (``compile_*``: True, False, None or a dict of options)."""
        return cls(bool(batch_invariant), compile_options("compile_step", compile_step),
                   compile_options("compile_round", compile_round))


def invariant_mode(model, on: bool):
    """The context a batch-invariant call runs in: the model's ``batch_invariant()`` (it raises
    where its kernels cannot run), or nothing when ``on`` is False."""
    if not on:
        return contextlib.nullcontext()
    enter = getattr(model, "batch_invariant", None)
    if enter is None:
        raise ValueError(f"batch_invariant=true: the model ({type(model).__name__}) has no "
                         "batch-invariant kernels (a loaded pvf_lmeval DiffusionLM has them)")
    return enter()
