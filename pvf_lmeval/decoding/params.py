"""Decoding parameters: validation, coercion and the PVF presets (pure Python, no model needed).

The lm-eval adapter calls :func:`make_params` when it is built, so every bad argument fails
before any decoding with a one-line ``ValueError`` naming the argument and what is allowed.

``None`` for any argument means "use the default" (the preset's value where the preset has one,
else the SPEC default), so callers can forward unset options untouched.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Iterable

from .registry import DECODERS
from .rules import rules_for

DECODER_NAMES = tuple(DECODERS)
ROUTES = ("plan+ar", "plan", "ar", "none")
PICKS = ("random", "planning")
BASE_RULES = ("static", "threshold")
#: KV cache modes (SPEC "Cache modes"): none = whole canvas every call (the paper's setting);
#: dual_base = dual, refreshed by the base row alone (docs/decoding.md, "Cache modes")
CACHES = ("none", "prefix", "dual", "dual_base")

#: preset name -> task family (used by ``vocab=auto`` elsewhere).
PRESETS = {
    "gsm8k": "math-word",
    "arith": "math-word",
    "mmlu_pro": "knowledge",
    "humaneval": "code",
    "math": "math",
}
#: SPEC "Defaults" (no preset).
SPEC_DEFAULTS = {
    "threshold": 0.9,
    "plan_lo": 0.2,
    "plan_hi": 0.65,
    "ar_lo": 0.1,
    "width": 3,
    "reveal_next": 0,
}
#: SPEC paper-defaults table, per task family.
FAMILY_DEFAULTS = {
    "math-word": {"plan_lo": 0.2, "plan_hi": 0.65, "ar_lo": 0.1, "reveal_next": 5},
    "knowledge": {"plan_lo": 0.2, "plan_hi": 0.65, "ar_lo": 0.1, "reveal_next": 5},
    "code": {"plan_lo": 0.8, "plan_hi": 0.9, "ar_lo": 0.3, "reveal_next": 0},
    "math": {"plan_lo": 0.8, "plan_hi": 0.9, "ar_lo": 0.3, "reveal_next": 0},
}
#: planning band the paper uses for code/math when the threshold is swept below 0.9.
SWEEP_BAND = (0.4, 0.6)
#: the paper's generation budget (L, B); callers pass gen_length/block_length explicitly.
PAPER_BUDGET = (512, 64)
#: caps on the counts a user or a task file sets, so that a typo fails here in one line and not
#: in the allocator: rows one request sends in one model call grow with ``width`` and
#: ``draft_steps``; positions (``gen_length``, ``block_length``, ``steps``, ``reveal_next``)
#: are held to the longest context a checkpoint may declare; ``seed`` to a signed 64-bit integer
MAX_ROWS_PARAM = 64
MAX_POSITIONS = 1 << 24
SEED_RANGE = (-(1 << 63), (1 << 63) - 1)


def task_family(preset: str | None) -> str | None:
    """Task family of a preset (``math-word|knowledge|code|math``); ``None`` for no preset."""
    if preset is None or preset == "":
        return None
    if preset not in PRESETS:
        raise ValueError(f"preset={preset!r} is not one of {', '.join(PRESETS)}")
    return PRESETS[preset]


def preset_defaults(preset: str | None = None, threshold: float | None = None) -> dict:
    """PVF defaults for a preset: threshold, plan_lo, plan_hi, ar_lo, width, reveal_next.

    No preset gives SPEC "Defaults". For the code/math families, a ``threshold`` below 0.9 moves
    the planning band to (0.4, 0.6), as the paper's threshold sweeps do.
    """
    out = dict(SPEC_DEFAULTS)
    fam = task_family(preset)
    if fam is not None:
        out.update(FAMILY_DEFAULTS[fam])
    if threshold is not None:
        out["threshold"] = threshold
        if fam in ("code", "math") and threshold < 0.9:
            out["plan_lo"], out["plan_hi"] = SWEEP_BAND
    return out


@dataclass(frozen=True)
class DecodeParams:
    """Validated decoding parameters (rules: docs/decoding.md). Probabilities are in [0, 1].

    Every instance is valid: construction (``dataclasses.replace`` included) runs
    :func:`validate_params`, so code that receives one never validates it again."""

    decoder: str = "threshold"
    gen_length: int = 256
    block_length: int = 32
    threshold: float = 0.9
    factor: float | None = None
    steps: int | None = None
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    early_stop: bool = True
    seed: int = 0
    draft_steps: int = 4
    base_rule: str = "static"
    plan_lo: float = 0.2
    plan_hi: float = 0.65
    ar_lo: float = 0.1
    width: int = 3
    reveal_next: int = 0
    routes: str = "plan+ar"
    plan_vocab: tuple[int, ...] | None = None
    plan_self_check: bool = False
    pick: str = "random"
    band: tuple[float, float] = (0.2, 0.6)
    cache: str = "none"
    rules: str = "paper"
    preset: str | None = None

    @property
    def family(self) -> str | None:
        return task_family(self.preset)

    @property
    def num_blocks(self) -> int:
        return self.gen_length // self.block_length

    def __post_init__(self) -> None:
        validate_params(self)


PARAM_NAMES = tuple(f.name for f in dataclasses.fields(DecodeParams))


# ---------------------------------------------------------------- coercion


def _int(name: str, v: Any) -> int:
    if isinstance(v, bool):
        raise ValueError(f"{name}={v!r:.60} must be an integer")
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
    raise ValueError(f"{name}={v!r:.60} must be an integer")


def _float(name: str, v: Any) -> float:
    if isinstance(v, bool):
        raise ValueError(f"{name}={v!r:.60} must be a number")
    if isinstance(v, (int, float)):
        return float(v)
    if hasattr(v, "item") and callable(v.item):
        return _float(name, v.item())
    if isinstance(v, str):
        try:
            return float(v.strip())
        except ValueError:
            pass
    raise ValueError(f"{name}={v!r:.60} must be a number")


def _bool(name: str, v: Any) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, int) and v in (0, 1):
        return bool(v)
    if isinstance(v, str) and v.strip().lower() in ("true", "false", "1", "0", "yes", "no"):
        return v.strip().lower() in ("true", "1", "yes")
    raise ValueError(f"{name}={v!r:.60} must be true or false")


def _choice(name: str, v: Any, allowed: tuple[str, ...], phrase: str = "must be one of") -> str:
    if not isinstance(v, str) or v not in allowed:
        raise ValueError(f"{name}={v!r:.60} {phrase} {', '.join(allowed)}")
    return v


def _band(v: Any) -> tuple[float, float]:
    msg = f"band={v!r} must be lo:hi with 0 <= lo <= hi <= 1"
    if isinstance(v, str):
        parts = v.split(":")
        if len(parts) != 2:
            raise ValueError(msg)
    elif isinstance(v, (tuple, list)) and len(v) == 2:
        parts = list(v)
    else:
        raise ValueError(msg)
    try:
        lo, hi = (_float("band", x) for x in parts)
    except ValueError:
        raise ValueError(msg) from None
    if not (0.0 <= lo <= hi <= 1.0):
        raise ValueError(msg)
    return (lo, hi)


def _vocab(v: Any) -> tuple[int, ...] | None:
    if v is None:
        return None
    msg = (
        f"plan_vocab={v!r:.60} must be a collection of token ids "
        "(resolve names/artifacts before decoding)"
    )
    if isinstance(v, (str, bytes)):
        raise ValueError(msg)
    if hasattr(v, "tolist") and callable(v.tolist):  # tensor / array
        v = v.tolist()
        if isinstance(v, int):
            v = [v]
    if not isinstance(v, Iterable):
        raise ValueError(msg)
    out = set()
    for t in v:
        if isinstance(t, bool) or not isinstance(t, int) or t < 0:
            raise ValueError(msg)
        out.add(t)
    return tuple(sorted(out))


# ---------------------------------------------------------------- public


def validate_params(p: DecodeParams) -> DecodeParams:
    """Check every rule of SPEC on an already-typed :class:`DecodeParams`; returns it.

    Raises ``ValueError`` with a one-line message naming the offending argument.
    """
    _choice("decoder", p.decoder, DECODER_NAMES, "is not one of")
    _caps(p)
    if p.gen_length < 1:
        raise ValueError(f"gen_length={p.gen_length} must be >= 1")
    if p.block_length < 1:
        raise ValueError(f"block_length={p.block_length} must be >= 1")
    if p.gen_length % p.block_length:
        raise ValueError(
            f"gen_length={p.gen_length} must be a multiple of block_length={p.block_length}"
        )
    if not (0.0 < p.threshold <= 1.0):
        raise ValueError(f"threshold={p.threshold} must be in (0, 1]")
    if p.factor is not None:
        if not p.factor > 0:
            raise ValueError(f"factor={p.factor} must be > 0")
        if not math.isfinite(p.factor):
            raise ValueError(f"factor={p.factor} must be a finite number")
        uses_rule = p.decoder == "freedave" and p.base_rule == "threshold"
        if not (p.decoder == "threshold" or uses_rule):
            raise ValueError(
                f"factor={p.factor} applies only to decoder=threshold "
                "(or freedave with base_rule=threshold)"
            )
    if p.steps is not None:
        nb = p.gen_length // p.block_length
        if p.decoder != "static":
            raise ValueError(f"steps={p.steps} applies only to decoder=static")
        if p.steps < 1 or p.steps % nb or p.steps > p.gen_length:
            raise ValueError(
                f"steps={p.steps} must be a multiple of the number of blocks ({nb}) "
                f"and at most gen_length={p.gen_length}"
            )
    if not p.temperature >= 0:
        raise ValueError(f"temperature={p.temperature} must be >= 0")
    if not math.isfinite(p.temperature):     # inf/inf is NaN: every position would sample the mask
        raise ValueError(f"temperature={p.temperature} must be a finite number")
    if p.top_k is not None and p.top_k < 1:
        raise ValueError(f"top_k={p.top_k} must be a positive integer (0 or none: no limit)")
    if p.top_p is not None and not 0.0 < p.top_p <= 1.0:
        raise ValueError(f"top_p={p.top_p} must be in (0, 1]")
    if p.draft_steps < 1:
        raise ValueError(f"draft_steps={p.draft_steps} must be >= 1")
    _choice("base_rule", p.base_rule, BASE_RULES)
    for name in ("plan_lo", "plan_hi", "ar_lo"):
        v = getattr(p, name)
        if not (0.0 <= v <= 1.0):
            raise ValueError(f"{name}={v} must be in [0, 1]")
    if p.decoder == "pvf":
        if not p.plan_lo < p.plan_hi:
            raise ValueError(f"plan_lo={p.plan_lo} must be < plan_hi={p.plan_hi}")
        if p.plan_hi > p.threshold:
            raise ValueError(f"plan_hi={p.plan_hi} must not exceed threshold={p.threshold}")
    if p.width < 1:
        raise ValueError(f"width={p.width} must be >= 1")
    if p.reveal_next < 0:
        raise ValueError(f"reveal_next={p.reveal_next} must be >= 0")
    _choice("routes", p.routes, ROUTES)
    _choice("pick", p.pick, PICKS)
    _choice("cache", p.cache, CACHES)
    rules_for(p.rules)
    lo, hi = p.band
    if not (0.0 <= lo <= hi <= 1.0):
        raise ValueError(f"band={lo}:{hi} must be lo:hi with 0 <= lo <= hi <= 1")
    task_family(p.preset)
    return p


def _caps(p: DecodeParams) -> None:
    """The upper bounds of :data:`MAX_ROWS_PARAM`, :data:`MAX_POSITIONS`, :data:`SEED_RANGE`."""
    for name in ("width", "draft_steps"):
        if getattr(p, name) > MAX_ROWS_PARAM:
            raise ValueError(f"{name}={getattr(p, name)} must be at most {MAX_ROWS_PARAM} (rows "
                             f"one request sends in one model call grow with it)")
    for name in ("gen_length", "block_length", "steps", "reveal_next"):
        v = getattr(p, name)
        if v is not None and v > MAX_POSITIONS:
            raise ValueError(f"{name}={v} must be at most {MAX_POSITIONS} positions")
    lo, hi = SEED_RANGE
    if not lo <= p.seed <= hi:
        raise ValueError(f"seed={p.seed} must be a 64-bit integer in [{lo}, {hi}]")


_INTS = ("gen_length", "block_length", "seed", "draft_steps", "steps", "width", "reveal_next",
         "top_k")
_FLOATS = ("threshold", "factor", "temperature", "plan_lo", "plan_hi", "ar_lo", "top_p")
#: the values that switch a sampling filter off, as in transformers (``top_k=0``, ``top_p=1``)
_NO_FILTER = {"top_k": 0, "top_p": 1.0}
_BOOLS = ("early_stop", "plan_self_check")
_CHOICES = {"decoder": DECODER_NAMES, "base_rule": BASE_RULES, "routes": ROUTES, "pick": PICKS,
            "cache": CACHES}


def coerce(name: str, v: Any) -> Any:
    """Type one loose argument value (int/float/bool from strings, ``band`` from ``lo:hi``;
    ``top_k=0`` and ``top_p=1`` are None: no filter)."""
    if name in _NO_FILTER:
        v = _int(name, v) if name in _INTS else _float(name, v)
        return None if v == _NO_FILTER[name] else v
    if name in _INTS:
        return _int(name, v)
    if name in _FLOATS:
        return _float(name, v)
    if name in _BOOLS:
        return _bool(name, v)
    if name in _CHOICES:
        return _choice(name, v, _CHOICES[name], "is not one of" if name == "decoder"
                       else "must be one of")
    if name == "rules":
        rules_for(str(v))
        return str(v)
    if name == "band":
        return _band(v)
    if name == "plan_vocab":
        return _vocab(v)
    if name == "preset":
        task_family(v)
        return v
    raise ValueError(f"unknown decoding argument {name!r}; allowed: {', '.join(PARAM_NAMES)}")


def make_params(decoder: str | None = "threshold", *, preset: str | None = None,
                **kwargs: Any) -> DecodeParams:
    """Build validated :class:`DecodeParams` from loose values (ints, floats, strings, None).

    Precedence: explicit argument > preset (SPEC paper table) > SPEC "Defaults".
    Accepts exactly the field names of :class:`DecodeParams`; an unknown name is an error.
    """
    if preset == "" or preset == "none":
        preset = None
    kw = {k: coerce(k, v) for k, v in kwargs.items() if v is not None}
    if preset is not None:
        coerce("preset", preset)
    dec = coerce("decoder", "threshold" if decoder is None else decoder)
    d = preset_defaults(preset, kw.get("threshold"))
    for name in ("threshold", "plan_lo", "plan_hi", "ar_lo", "width", "reveal_next"):
        kw.setdefault(name, d[name])
    return DecodeParams(decoder=dec, preset=preset, **kw)


def override(params: DecodeParams, **kwargs: Any) -> DecodeParams:
    """``params`` with some fields replaced (loose values, None = keep), validated; ``params``
    itself when nothing replaces a field."""
    kw = {k: coerce(k, v) for k, v in kwargs.items() if v is not None}
    return dataclasses.replace(params, **kw) if kw else params


def params_for_call(decoder: str | None, params: DecodeParams | None, preset: str | None,
                    **kwargs: Any) -> DecodeParams:
    """Parameters of one ``decode``/``decode_batch`` call: built from ``decoder`` + keyword
    arguments, or ``params`` with the non-None arguments overriding its fields."""
    if params is None:
        return make_params(decoder, preset=preset, **kwargs)
    if preset is not None:
        raise ValueError("preset applies only when building params; pass it to make_params")
    return override(params, decoder=decoder, **kwargs)

