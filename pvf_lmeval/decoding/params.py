"""Decoding parameters: the loop's declared here, each decoder's in its step module
(:mod:`.param_spec`), gathered into :class:`DecodeParams`; validation, coercion and the PVF
presets (pure Python, no model needed).

The lm-eval adapter calls :func:`make_params` when it is built, so every bad argument fails
before any decoding with a one-line ``ValueError`` naming the argument and what is allowed.

``None`` for any argument means "use the default" (the preset's value where the preset has one,
else the SPEC default), so callers can forward unset options untouched.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable

from .param_spec import POSITIONS, Param, Read, Rule, multiple_of, reads_of
from .registry import DECODERS
from .rules import RULES, rules_for

DECODER_NAMES = tuple(DECODERS)
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
#: SPEC paper-defaults table, per task family: the preset fields (``Param.preset``) it sets.
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
#: a signed 64-bit integer: the range of ``seed``
SEED_RANGE = (-(1 << 63), (1 << 63) - 1)


#: a decoder's named parameter sets (``Step.presets``): preset name -> decoder
DECODER_PRESETS = {name: dec for dec, cls in DECODERS.items() for name in cls.presets}


def task_family(preset: str | None) -> str | None:
    """Task family of a preset (``math-word|knowledge|code|math``); ``None`` for no preset or a
    decoder's preset (:data:`DECODER_PRESETS`)."""
    if preset is None or preset == "" or preset in DECODER_PRESETS:
        return None
    if preset not in PRESETS:
        raise ValueError(f"preset={preset!r} is not one of "
                         f"{', '.join((*PRESETS, *DECODER_PRESETS))}")
    return PRESETS[preset]


def preset_defaults(preset: str | None = None, threshold: float | None = None) -> dict:
    """The preset fields (``Param.preset``: plan_lo, plan_hi, ar_lo, width, reveal_next) under
    a preset, and ``threshold`` when one is given.

    No preset gives SPEC "Defaults" (each field's declared default). For the code/math
    families, a ``threshold`` below 0.9 moves the planning band to (0.4, 0.6), as the paper's
    threshold sweeps do.
    """
    out = {p.name: p.default for p in PARAMS.values() if p.preset}
    fam = task_family(preset)
    if fam is not None:
        out.update(FAMILY_DEFAULTS[fam])
    if threshold is not None:
        out["threshold"] = threshold
        if fam in ("code", "math") and threshold < 0.9:
            out["plan_lo"], out["plan_hi"] = SWEEP_BAND
    return out


# ---------------------------------------------------------------- the loop's parameters


def _preset(v: Any) -> str:
    task_family(v)
    return v


def _rules(v: Any) -> str:
    rules_for(str(v))
    return str(v)


def _seed(v: int) -> None:
    lo, hi = SEED_RANGE
    if not lo <= v <= hi:
        raise ValueError(f"seed={v} must be a 64-bit integer in [{lo}, {hi}]")


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


#: LLaDA's classifier-free guidance (``generate.py``, ``get_log_likelihood.py``): the model also
#: sees each canvas with its prompt masked, and the logits are ``un + (cfg_scale + 1)(cond - un)``
CFG_SCALE = Param("cfg_scale", float, None, "classifier-free guidance as LLaDA's, in generation "
                  "and likelihood: logits un + (cfg_scale + 1) (cond - un), the prompt masked "
                  "in un; twice the rows per call", bounds=">= 0", finite=True, off=0.0,
                  allowed="a finite number >= 0 (0: none)")

#: the parameters of the shared loop: every decoder reads them
LOOP_PARAMS = (
    Param("decoder", str, "threshold", "the decoding algorithm (pvf-dlm decoders)",
          choices=DECODER_NAMES, choice_phrase="is not one of"),
    Param("preset", str, None, "the paper's PVF defaults of a task family (the pvf tasks name "
          "theirs), or a decoder's named parameters", parse=_preset, check=task_family,
          allowed=", ".join((*PRESETS, *DECODER_PRESETS)) + ", none"),
    Param("gen_length", int, 256, "generation positions L", bounds=">= 1", cap=POSITIONS),
    Param("block_length", int, 32, "block size B", bounds=">= 1", cap=POSITIONS),
    Param("temperature", float, 0.0, "> 0: Gumbel-max sampling, seeded", bounds=">= 0",
          finite=True),
    Param("top_k", int, None, "sampling: only the k most probable tokens (transformers' top_k)",
          bounds=">= 1", off=0, bound_text="a positive integer (0 or none: no limit)",
          allowed="a positive integer (0: none)"),
    Param("top_p", float, None, "sampling: only the most probable tokens holding top_p "
          "(transformers' top_p)", bounds="(0, 1]", off=1.0, allowed="(0, 1] (1: none)"),
    Param("seed", int, 0, "seed of every random draw", check=_seed, allowed="a 64-bit integer"),
    Param("early_stop", bool, True, "stop once end-of-text is committed with everything before "
          "it unmasked"),
    Param("cache", str, "none", "KV cache mode; none recomputes the whole canvas every call",
          choices=CACHES),
    Param("rules", str, "paper", "the paper's rules or the published code's (reference)",
          parse=_rules, check=rules_for, allowed=", ".join(RULES) + ", paper+<switch>+..."),
    CFG_SCALE,
    Param("plan_vocab", tuple, None, "the planning vocabulary's token ids (resolved by the "
          "caller)", parse=_vocab, public=False),
    Param("model_block", int, None, "the attention block size of the model decoded (a "
          "block-diffusion model; None: bidirectional attention): blocks.on_model sets it",
          public=False),
)


def _one_model_block(p) -> str | None:
    """A block-diffusion model decodes one of its attention blocks per decoding block."""
    if p.model_block is None or p.block_length == p.model_block:
        return None
    return (f"block_length={p.block_length} must equal the model's block size {p.model_block} "
            "(a block-diffusion model decodes one attention block at a time)")


def _guidance_without_cache(p) -> str | None:
    """The unconditional canvas of classifier-free guidance has no KV cache of its own."""
    if not p.cfg_scale or p.cache == "none":
        return None
    return (f"cfg_scale={p.cfg_scale} needs cache=none (the canvas with its prompt masked has "
            f"no KV cache of its own); drop cache={p.cache} or cfg_scale")


#: the loop's rules across parameters
LOOP_CHECKS = (multiple_of("gen_length", "block_length"),
               Rule(_guidance_without_cache, "cfg_scale", "with cache=none"),
               Rule(_one_model_block, "block_length", "the model's block size on a "
                                                      "block-diffusion model"))


def every_param(decoders: dict) -> dict[str, Param]:
    """The loop's parameters, then each of ``decoders``' (name -> step class, in order); a
    name declared twice (two :class:`Param` objects) is a TypeError."""
    out = {p.name: p for p in LOOP_PARAMS}
    for name, cls in decoders.items():
        for r in reads_of(cls.reads):
            known = out.setdefault(r.param.name, r.param)
            if known is not r.param:
                raise TypeError(f"decoder {name}: parameter {r.param.name!r} is declared twice; "
                                "declare it once (decoding/shared_params.py) and read that")
    return out


#: every decoding parameter by name: the fields of :class:`DecodeParams`, in table order
PARAMS = every_param(DECODERS)
PARAM_NAMES = tuple(PARAMS)


def readers(name: str) -> list[tuple[str, Read]]:
    """(decoder, how it reads it) of every decoder that reads parameter ``name``."""
    return [(d, r) for d, cls in DECODERS.items() for r in reads_of(cls.reads)
            if r.param.name == name]


def decoder_reads(decoder: str, values) -> list[str]:
    """The parameters ``decoder`` reads besides the loop's, under ``values`` (a
    ``DecodeParams`` or a dict: a conditional read counts when its condition holds)."""
    return [r.param.name for r in reads_of(DECODERS[decoder].reads) if r.applies(values)]


def _only_for_readers(spec: Param, p) -> str | None:
    """``steps=4 applies only to decoder=static``: an exclusive parameter set for a decoder
    that does not read it."""
    v = getattr(p, spec.name)
    found = readers(spec.name)
    if v is None or any(d == p.decoder and r.applies(p) for d, r in found):
        return None
    always = [d for d, r in found if not r.when]
    under = [f"{d} with {r.condition}" for d, r in found if r.when]
    return (f"{spec.name}={v} applies only to decoder={', '.join(always)}"
            + (f" (or {', '.join(under)})" if under else ""))


def _fail(message: str | None) -> None:
    if message:
        raise ValueError(message)


def validate_params(p) -> Any:
    """Check every rule of SPEC on an already-typed :class:`DecodeParams`; returns it: the
    caps first, then each parameter's own checks, the loop's rules, the exclusive parameters
    and the decoder's rules.

    Raises ``ValueError`` with a one-line message naming the offending argument.
    """
    PARAMS["decoder"].validate(p.decoder)
    for spec in PARAMS.values():
        spec.check_cap(getattr(p, spec.name))
    for spec in PARAMS.values():
        spec.validate(getattr(p, spec.name))
    for rule in LOOP_CHECKS:
        _fail(rule.check(p))
    for spec in PARAMS.values():
        if spec.exclusive:
            _fail(_only_for_readers(spec, p))
    for rule in DECODERS[p.decoder].checks:
        _fail(rule.check(p))
    allowed = DECODERS[p.decoder].caches
    if p.cache not in allowed:
        _fail(f"cache={p.cache}: decoder={p.decoder} allows cache={'|'.join(allowed)}")
    return p


def _post_init(self) -> None:
    validate_params(self)


DecodeParams = dataclasses.make_dataclass(
    "DecodeParams",
    [(p.name, p.kind if p.default is not None else p.kind | None, dataclasses.field(default=p.default))
     for p in PARAMS.values()],
    frozen=True,
    namespace={
        "__doc__": """Validated decoding parameters (rules: docs/decoding.md): one field per
        declared parameter (:data:`PARAMS`), with its default. Probabilities are in [0, 1].

        Every instance is valid: construction (``dataclasses.replace`` included) runs
        :func:`validate_params`, so code that receives one never validates it again.""",
        "__post_init__": _post_init,
        "family": property(lambda self: task_family(self.preset),
                           doc="The preset's task family, None without a preset."),
        "num_blocks": property(lambda self: self.gen_length // self.block_length,
                               doc="Blocks of ``block_length`` in ``gen_length``."),
    })
DecodeParams.__module__ = __name__      # pickles and reprs name this module


# ---------------------------------------------------------------- public


def coerce(name: str, v: Any) -> Any:
    """Type one loose argument value (int/float/bool from strings, ``band`` from ``lo:hi``;
    ``top_k=0`` and ``top_p=1`` are None: no filter)."""
    spec = PARAMS.get(name)
    if spec is None:
        raise ValueError(f"unknown decoding argument {name!r}; allowed: {', '.join(PARAM_NAMES)}")
    return spec.coerce(v)


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
    if preset in DECODER_PRESETS:
        if DECODER_PRESETS[preset] != dec:
            raise ValueError(f"preset={preset} applies only to decoder={DECODER_PRESETS[preset]}")
        d.update(DECODERS[dec].presets[preset])
    d.update({k: v for k, v in DECODERS[dec].defaults.items() if k not in d})
    for name, value in d.items():
        kw.setdefault(name, value)
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

