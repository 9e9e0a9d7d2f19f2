"""What a decoding parameter is, declared once where it is read (docs/design.md, "Parameters").

A :class:`Param` says everything about one parameter: its name, type, default and what ``None``
means, its bounds (``"(0, 1]"``, ``">= 1"``: the text is the error message's), its cap (a
typo's limit, checked first), its allowed values, the preset field it reads, whether only the
decoders that read it may set it, and its meaning in one line. The loop's parameters are declared
in :mod:`.params`, those several decoders read in :mod:`.shared_params`, and each decoder's own
in its step module (``Step.reads``, with :class:`Read` for a parameter read only when another has
a given value, and ``Step.checks``, the rules across parameters: :func:`less`, :func:`at_most`,
:class:`Rule`). Coercion, validation, the ``--model_args`` table, ``pvf-dlm decoders`` and the
run identity derive from these declarations. Plain Python, no torch.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Callable

#: what a value error shows of the value given
SHOWN = 60


@dataclass(frozen=True)
class Cap:
    """The most a count may be, so that a typo fails in one line and not in the allocator:
    ``{name}={value} must be at most {limit}{why}``."""

    limit: int
    why: str = ""


#: rows one request sends in one model call grow with ``width`` and ``draft_steps``
ROWS = Cap(64, " (rows one request sends in one model call grow with it)")
#: positions are held to the longest context a checkpoint may declare
POSITIONS = Cap(1 << 24, " positions")


_INTERVAL = re.compile(r"^([\[(])\s*(-?[\d.]+)\s*,\s*(-?[\d.]+)\s*([\])])$")
_SIDE = re.compile(r"^(>=|>|<=|<)\s*(-?[\d.]+)$")


@dataclass(frozen=True)
class Bounds:
    """An interval written as users read it: ``"(0, 1]"``, ``"[0, 1]"``, ``">= 1"``, ``"> 0"``."""

    text: str

    def __post_init__(self):
        if not (_INTERVAL.match(self.text) or _SIDE.match(self.text)):
            raise ValueError(f"bounds {self.text!r} must read like '(0, 1]' or '>= 1'")

    def holds(self, v) -> bool:
        m = _INTERVAL.match(self.text)
        if m:
            left, lo, hi, right = m.groups()
            lo, hi = float(lo), float(hi)
            return ((lo < v) if left == "(" else (lo <= v)) and \
                ((v < hi) if right == ")" else (v <= hi))
        op, x = _SIDE.match(self.text).groups()
        x = float(x)
        return {">=": v >= x, ">": v > x, "<=": v <= x, "<": v < x}[op]

    @property
    def phrase(self) -> str:
        """``in (0, 1]`` or ``>= 1``: what the value must be."""
        return f"in {self.text}" if _INTERVAL.match(self.text) else self.text


@dataclass(frozen=True)
class Param:
    """One decoding parameter: a ``DecodeParams`` field and (unless ``public`` is false) a
    ``--model_args`` key and generation kwarg.

    kind:       ``int``, ``float``, ``bool`` or ``str`` (with ``choices``).
    default:    the value when none is given (``None``: ``none_means``, in words).
    bounds:     :class:`Bounds` text; ``finite``: inf and nan refused; ``cap``: a :class:`Cap`.
    choices:    the allowed strings (``choice_phrase`` joins them in the error).
    off:        the value that means ``None`` (``top_k=0``: no filter).
    preset:     the default comes from the preset table's field of this name
                (``params.preset_defaults``).
    exclusive:  only the decoders that read it may set it (its default is ``None``).
    parse:      ``(value) -> typed value`` for a type of its own (``band``); ``check``:
                ``(typed value) -> None`` raising a one-line error, run by validation.
    bound_text: the error's wording when it is not ``must be <bounds>``.
    allowed:    the table's "allowed" column when the declaration does not say it.
    """

    name: str
    kind: type
    default: Any
    meaning: str
    bounds: str | None = None
    finite: bool = False
    cap: Cap | None = None
    choices: tuple[str, ...] = ()
    choice_phrase: str = "must be one of"
    off: Any = None
    none_means: str = ""
    preset: bool = False
    exclusive: bool = False
    public: bool = True
    parse: Callable[[Any], Any] | None = None
    check: Callable[[Any], None] | None = None
    bound_text: str = ""
    allowed: str = ""

    def __post_init__(self):
        if self.bounds is not None:
            Bounds(self.bounds)
        if self.exclusive and self.default is not None:
            raise ValueError(f"parameter {self.name}: an exclusive parameter's default is None")

    def when(self, **condition) -> "Read":
        """Read only when other parameters have these values (``base_rule="threshold"``)."""
        return Read(self, tuple(sorted(condition.items())))

    # ------------------------------------------------------------ coercion and validation

    def coerce(self, v: Any) -> Any:
        """A loose value (text, number, a tensor's scalar) typed, or a one-line ValueError;
        ``off`` becomes None."""
        if self.parse is not None:
            return self.parse(v)
        if self.choices:
            return one_of(self.name, v, self.choices, self.choice_phrase)
        typed = {int: as_int, float: as_float, bool: as_bool, str: lambda n, x: str(x)}[
            self.kind](self.name, v)
        return None if self.off is not None and typed == self.off else typed

    def check_cap(self, v: Any) -> None:
        if self.cap is not None and v is not None and v > self.cap.limit:
            raise ValueError(f"{self.name}={v} must be at most {self.cap.limit}{self.cap.why}")

    def validate(self, v: Any) -> None:
        """The checks of one typed value: choices, bounds, finiteness, ``check``."""
        if v is None:
            return
        if self.choices:
            one_of(self.name, v, self.choices, self.choice_phrase)
        if self.bounds is not None and not Bounds(self.bounds).holds(v):
            raise ValueError(f"{self.name}={v} must be {self.bound_text or Bounds(self.bounds).phrase}")
        if self.finite and not math.isfinite(v):
            raise ValueError(f"{self.name}={v} must be a finite number")
        if self.check is not None:
            self.check(v)

    # ------------------------------------------------------------ as users read it

    def default_text(self) -> str:
        v = self.default
        if v is None:
            text = self.none_means or "none"
        elif isinstance(v, bool):
            text = str(v).lower()
        elif isinstance(v, tuple):
            text = ":".join(str(x) for x in v)
        elif isinstance(v, float) and v.is_integer():
            text = str(int(v))
        else:
            text = str(v)
        return f"{text} (or the preset's)" if self.preset else text

    def allowed_text(self, rules=()) -> str:
        """The allowed values in words: the declaration's, else from its type and bounds, with
        the rules that name it (``[0, 1], at most threshold``)."""
        words = [self.allowed or self._derived_allowed()]
        words += [r.text for r in rules if r.about == self.name and r.text]
        return ", ".join(w for w in words if w)

    def _derived_allowed(self) -> str:
        if self.choices:
            return ", ".join(self.choices)
        if self.kind is bool:
            return "true, false"
        b = self.bounds
        if self.kind is int:
            if b == ">= 1":
                return (f"1 to {self.cap.limit}" if self.cap is not None and self.cap is ROWS
                        else "a positive integer")
            return f"an integer {b}" if b else ""
        if self.kind is float and b is not None:
            if _INTERVAL.match(b):
                return b
            return f"a finite number {b}" if self.finite else f"a number {b}"
        return ""


@dataclass(frozen=True)
class Read:
    """A decoder reads ``param``, only while the other parameters hold ``when`` (an empty
    ``when``: always)."""

    param: Param
    when: tuple[tuple[str, Any], ...] = ()

    def applies(self, values) -> bool:
        """Whether the condition holds for ``values`` (a ``DecodeParams`` or a dict)."""
        get = values.get if isinstance(values, dict) else lambda k: getattr(values, k, None)
        return all(get(k) == v for k, v in self.when)

    @property
    def condition(self) -> str:
        return " and ".join(f"{k}={v}" for k, v in self.when)


def reads_of(declared) -> tuple[Read, ...]:
    """A step's ``reads`` as :class:`Read` records (a bare :class:`Param` is read always)."""
    return tuple(r if isinstance(r, Read) else Read(r) for r in declared)


@dataclass(frozen=True)
class Rule:
    """A check across parameters: ``check(params)`` returns the one-line error, or None.
    ``about``/``text``: the parameter it constrains and the constraint in words, for the
    ``--model_args`` table."""

    check: Callable[[Any], str | None]
    about: str = ""
    text: str = ""


def less(a: str, b: str) -> Rule:
    """``a < b``: ``plan_lo=0.7 must be < plan_hi=0.65``."""
    return Rule(lambda p: None if getattr(p, a) < getattr(p, b) else
                f"{a}={getattr(p, a)} must be < {b}={getattr(p, b)}", a, f"below {b}")


def at_most(a: str, b: str) -> Rule:
    """``a <= b``: ``plan_hi=0.95 must not exceed threshold=0.9``."""
    return Rule(lambda p: None if getattr(p, a) <= getattr(p, b) else
                f"{a}={getattr(p, a)} must not exceed {b}={getattr(p, b)}", a, f"at most {b}")


def multiple_of(a: str, b: str) -> Rule:
    """``a % b == 0``: ``gen_length=100 must be a multiple of block_length=32``."""
    return Rule(lambda p: None if getattr(p, a) % getattr(p, b) == 0 else
                f"{a}={getattr(p, a)} must be a multiple of {b}={getattr(p, b)}", a,
                f"a multiple of {b}")


# ---------------------------------------------------------------- coercion of loose values


def as_int(name: str, v: Any) -> int:
    if isinstance(v, bool):
        raise ValueError(f"{name}={v!r:.{SHOWN}} must be an integer")
    if isinstance(v, int):
        return v
    if hasattr(v, "item") and callable(v.item):  # 0-d tensors / numpy scalars
        v = v.item()
        if isinstance(v, int) and not isinstance(v, bool):
            return v
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, str):
        try:
            return int(v.strip())
        except ValueError:
            pass
    raise ValueError(f"{name}={v!r:.{SHOWN}} must be an integer")


def as_float(name: str, v: Any) -> float:
    if isinstance(v, bool):
        raise ValueError(f"{name}={v!r:.{SHOWN}} must be a number")
    if isinstance(v, (int, float)):
        return float(v)
    if hasattr(v, "item") and callable(v.item):
        return as_float(name, v.item())
    if isinstance(v, str):
        try:
            return float(v.strip())
        except ValueError:
            pass
    raise ValueError(f"{name}={v!r:.{SHOWN}} must be a number")


def as_bool(name: str, v: Any) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, int) and v in (0, 1):
        return bool(v)
    if isinstance(v, str) and v.strip().lower() in ("true", "false", "1", "0", "yes", "no"):
        return v.strip().lower() in ("true", "1", "yes")
    raise ValueError(f"{name}={v!r:.{SHOWN}} must be true or false")


def one_of(name: str, v: Any, allowed: tuple[str, ...], phrase: str = "must be one of") -> str:
    if not isinstance(v, str) or v not in allowed:
        raise ValueError(f"{name}={v!r:.{SHOWN}} {phrase} {', '.join(allowed)}")
    return v


__all__ = ["Bounds", "Cap", "POSITIONS", "Param", "ROWS", "Read", "Rule", "as_bool", "as_float",
           "as_int", "at_most", "less", "multiple_of", "one_of", "reads_of"]