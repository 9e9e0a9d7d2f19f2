"""What a run *is*: the identity two results must share to be compared, and what a comparison
with another decoder holds fixed (its budget).

An identity is a flat, JSON-able dict: model, model type and dtype, the decoder and every decoding
parameter it reads (as the run applied them: after presets and defaults, so passing a default
explicitly is the same run), the planning vocabulary (and ``vocab=online``'s settings), prompt
truncation, the model args that shape prompts when given (``max_length``, ``add_bos_token``,
``tokenizer``, ``revision``), ``--gen_kwargs`` overrides, ``--limit``, chat template and system instruction; and
per task its name, version, few-shot count (and seed, when there are shots), effective generation
length and, for likelihood tasks, the Monte Carlo draws. Two results with equal identities are two
runs of the same thing; the run part (without ``TASK_KEYS``) makes a table row, the task part a
column.

Where a run computed matters too: the device kind (``cpu``, ``cuda``: other kernels, other
rounding), ``batch_invariant`` (when on) and the batch size where it can change results: on
every device and dtype unless ``batch_invariant`` was on (library kernels reduce in an order
that depends on the batch's shape, on the CPU in float32 too, in the last bits, which can move a
near tie; see docs/batch-invariance.md).
"""

from __future__ import annotations

import json
import math
import re

from ..decoding.param_spec import reads_of
from ..decoding.params import LOOP_PARAMS as _LOOP_SPECS
from ..decoding.params import decoder_reads
from ..decoding.registry import DECODERS, PLANNING_DECODERS  # noqa: F401  (report code reads it here)

#: identity keys that belong to one task of a run (its table column) rather than the run (its row);
#: ``gen_length`` is the effective one, which lm-eval derives per task from ``max_gen_toks``
TASK_KEYS = ("task", "task_version", "num_fewshot", "fewshot_seed", "gen_length", "mc_num",
             "mc_stratum", "mask_logit")
#: the likelihood estimator's settings besides ``mc_num`` and their defaults: an identity holds
#: one only where a run chose another value (``cfg_scale`` is a decoding parameter)
LIKELIHOOD_CHOICES = (("mc_stratum", None), ("mask_logit", "excluded"))
#: identity keys shown as table columns of their own, never in the settings label
COLUMN_KEYS = ("model", "decoder", "threshold")
#: not identity parameters: the decoder is a key of its own, the preset is applied already (its values
#: are in the parameters) and the vocabulary is recorded as resolved
NOT_PARAMS = ("decoder", "preset", "plan_vocab")
#: decoding parameters of the shared loop: every decoder reads them (a comparison holds them fixed)
LOOP_PARAMS = tuple(p.name for p in _LOOP_SPECS if p.public and p.name not in NOT_PARAMS)
#: parameters each decoder reads besides the loop's (its step's ``reads``, some under a condition:
#: :func:`reads`); a parameter no decoder declares (one of another version) is kept in every identity
DECODER_PARAMS = {name: tuple(r.param.name for r in reads_of(cls.reads))
                  for name, cls in DECODERS.items()}
#: ``--model_args`` keys of any model type that do not change results
NOT_IDENTITY_ARGS = ("device", "batch_size", "max_batch_size", "parallelize", "trace",
                     "trust_remote_code", "compile", "compile_round")
#: directories in a recorded vocabulary source ("auto:/path/to/x.json", "/path/x.json")
_VOCAB_DIRS = re.compile(r"[^:]*[/\\]")
#: the lm-eval seed that picks few-shot examples (matters only with shots)
FEWSHOT_SEED = "fewshot_seed"


def canon(v):
    """One spelling per value: ``"0.9"``, ``0.9`` -> 0.9; ``1.0`` -> 1; ``"true"`` -> True;
    ``(0.2, 0.6)`` and ``"0.2:0.6"`` -> ``"0.2:0.6"``."""
    if v is None or isinstance(v, bool):
        return v
    if isinstance(v, (int, float)):
        f = float(v)
        return int(f) if math.isfinite(f) and f.is_integer() else f
    if isinstance(v, (list, tuple)):
        return ":".join(str(canon(x)) for x in v)
    s = str(v).strip()
    low = s.lower()
    if low in ("true", "false"):
        return low == "true"
    if ":" in s:
        return ":".join(str(canon(x)) for x in s.split(":"))
    try:
        return canon(float(s))
    except ValueError:
        return s


def reads(decoder: str, params: dict) -> set[str]:
    """The parameters ``decoder`` reads among ``params`` (unknown ones included: never drop
    something that may matter)."""
    known = {p for ps in DECODER_PARAMS.values() for p in ps}
    mine = set(LOOP_PARAMS)
    if decoder in DECODERS:
        mine |= set(decoder_reads(decoder, params))
    return {k for k in params if k not in NOT_PARAMS and (k in mine or k not in known)}


def decoding_identity(decoder: str, params: dict) -> dict:
    """The parameters of ``params`` that ``decoder`` reads, canonical, ``None`` values dropped
    (an unset ``steps`` and no ``steps`` are the same run). ``gen_length`` stays in: the task
    part of an identity overrides it with the effective one."""
    params = {k: canon(v) for k, v in params.items()}
    return {k: params[k] for k in sorted(reads(decoder, params)) if params[k] is not None}


def split(identity: dict) -> tuple[dict, dict]:
    """(run part, task part) of a full identity."""
    run = {k: v for k, v in identity.items() if k not in TASK_KEYS}
    return run, {k: v for k, v in identity.items() if k in TASK_KEYS}


def key_of(identity: dict, drop=()) -> str:
    """A hashable, order-independent spelling of (part of) an identity."""
    return json.dumps({k: v for k, v in identity.items() if k not in drop}, sort_keys=True)


def differences(a: dict, b: dict) -> list[str]:
    """``key: a -> b`` for every key where two identities differ (``-`` = absent)."""
    out = []
    for k in sorted(set(a) | set(b)):
        if a.get(k) != b.get(k):
            out.append(f"{k}: {fmt_value(a.get(k, '-'))} -> {fmt_value(b.get(k, '-'))}")
    return out


def fmt_value(v) -> str:
    if isinstance(v, bool):
        return str(v).lower()
    return "none" if v is None else str(v)


def label(identity: dict, keys) -> str:
    """``k=v ...`` of ``keys`` that the identity has, sorted; ``-`` when none."""
    return " ".join(f"{k}={fmt_value(identity[k])}" for k in sorted(keys) if k in identity) or "-"


# ----------------------------------------------------------------------------- from lm-eval output


def batch_size_matters(batch_invariant: bool) -> bool:
    """Whether the batch size can change a run's results (module docstring)."""
    return not batch_invariant


def parse_args_string(s) -> dict:
    """``--model_args`` / ``--gen_kwargs`` as lm-eval stores them (a dict or ``k=v,k=v``)."""
    if isinstance(s, dict):
        return dict(s)
    out = {}
    for part in str(s or "").split(","):
        if "=" in part:
            k, v = part.split("=", 1)
            out[k.strip()] = v.strip()
    return out


def run_identity(r: dict) -> dict:
    """The run part of the identity of an lm-eval results dict (``results_*.json``).

    ``--model pvf-dlm`` runs are described by ``config.pvf`` (what the adapter applied);
    other model types by their ``--model_args``."""
    cfg = r.get("config") or {}
    pvf = cfg.get("pvf") if isinstance(cfg.get("pvf"), dict) else {}
    model_args = parse_args_string(cfg.get("model_args"))
    gen_kwargs = {k: canon(v) for k, v in parse_args_string(cfg.get("gen_kwargs")).items()}
    model_type = str(cfg.get("model") or r.get("model_source") or "?")
    ident = {"model_type": model_type}
    if pvf:
        decoder = str(pvf["decoder"])
        params = dict(pvf.get("params") or {})
        # --gen_kwargs reach every request of the run as decoder parameters
        params.update({k: v for k, v in gen_kwargs.items() if k in params})
        gen_kwargs = {k: v for k, v in gen_kwargs.items() if k not in params}
        ident.update(model=str(pvf["pretrained"]), decoder=decoder,
                     dtype=canon(pvf.get("dtype", model_args.get("dtype", "auto"))),
                     **decoding_identity(decoder, params))
        if decoder in PLANNING_DECODERS:
            # the artifact's file name: vocab=auto resolves to an absolute path that differs
            # between checkouts of the same code
            ident["vocab"] = _VOCAB_DIRS.sub("", str(pvf.get("vocab")))
        if isinstance(pvf.get("online"), dict):   # vocab=online: what it learns depends on these
            ident.update({f"online.{k}": canon(v) for k, v in pvf["online"].items() if k != "updates"})
        if "truncation" in pvf:
            ident["truncation"] = canon(pvf["truncation"])
        for key in ("max_length", "add_bos_token", "tokenizer", "revision"):  # given: the prompts
            if pvf.get(key) is not None:
                ident[key] = canon(pvf[key])
        kind = str(pvf.get("device") or "").split(":")[0]
        if kind:
            ident["device"] = kind
        invariant = canon(pvf.get("batch_invariant", False)) is True
        if invariant:
            ident["batch_invariant"] = True
        bs = pvf.get("batch_size", cfg.get("batch_size"))
        if bs is not None and batch_size_matters(invariant):
            ident["batch_size"] = canon(bs)
    else:
        decoder = str(model_args.get("decoder") or ("threshold" if model_type == "pvf-dlm"
                                                      else model_type))
        ident.update(model=str(model_args.get("pretrained") or r.get("model_name") or model_type),
                     decoder=decoder)
        ident.update({k: canon(v) for k, v in model_args.items()
                      if k not in NOT_IDENTITY_ARGS and k not in ("pretrained", "decoder")})
    ident.update({f"gen_kwargs.{k}": v for k, v in gen_kwargs.items()})
    if cfg.get("limit") is not None:
        ident["limit"] = canon(cfg["limit"])
    if r.get("chat_template") or r.get("chat_template_sha"):
        ident["chat_template"] = str(r.get("chat_template_sha") or "yes")[:12]
        ident["fewshot_as_multiturn"] = bool(r.get("fewshot_as_multiturn"))
    if r.get("system_instruction") or r.get("system_instruction_sha"):
        ident["system_instruction"] = str(r.get("system_instruction_sha") or "yes")[:12]
    return ident


def task_identity(r: dict, task: str, gen_length, run: dict) -> dict:
    """The task part: name, version, few-shot count (seed when there are shots), the effective
    ``gen_length`` (measured; else the run's parameter), for likelihood tasks ``mc_num``, and
    every decoding parameter the task's requests ran with where it differs from the run's
    (``config.pvf.task_params``: its preset's, its generation kwargs'), among those the decoder
    reads. Those override the run part's values (:func:`full_identity`): a run whose ``arith``
    decoded with ``reveal_next=5`` under arith's preset and a run that set ``reveal_next=5``
    decoded alike. An override to None (unset) stays None here."""
    out = {"task": task}
    version = (r.get("versions") or {}).get(task)
    if version is not None:
        out["task_version"] = canon(version)
    shots = (r.get("n-shot") or {}).get(task)
    if shots is not None:
        out["num_fewshot"] = canon(shots)
        if shots and (r.get("config") or {}).get(FEWSHOT_SEED) is not None:
            out["fewshot_seed"] = canon(r["config"][FEWSHOT_SEED])
    length = canon(gen_length) if gen_length is not None else run.get("gen_length")
    if length is not None:
        out["gen_length"] = length
    output_type = ((r.get("configs") or {}).get(task) or {}).get("output_type")
    pvf = (r.get("config") or {}).get("pvf")
    if output_type not in (None, "generate_until") and isinstance(pvf, dict):
        # likelihood tasks: scored by a Monte Carlo estimate with mc_num draws
        out["mc_num"] = canon((pvf.get("likelihood") or {}).get("mc_num"))
        out.update(likelihood_choices(pvf.get("likelihood")))
    own = ((pvf.get("task_params") if isinstance(pvf, dict) else None) or {}).get(task)
    if isinstance(own, dict) and "decoder" in run:
        # gen_length is the effective one above (measured per request)
        own = {k: canon(v) for k, v in own.items() if k != "gen_length"}
        out.update({k: own[k] for k in sorted(reads(str(run["decoder"]), own))})
    return out


def likelihood_choices(likelihood: dict | None) -> dict:
    """The estimator settings of ``config.pvf.likelihood`` that differ from their defaults
    (:data:`LIKELIHOOD_CHOICES`), canonical."""
    lik = likelihood if isinstance(likelihood, dict) else {}
    return {k: canon(lik[k]) for k, default in LIKELIHOOD_CHOICES if lik.get(k, default) != default}


def full_identity(run: dict, task: dict) -> dict:
    """A task's whole identity: the run part, its task part over it (an override to None
    removes the run's value: the task ran with the parameter unset)."""
    return {k: v for k, v in {**run, **task}.items() if not (v is None and k in task)}


def budget(identity: dict) -> dict:
    """What a comparison with another decoder holds fixed: everything but the decoder and the
    parameters only some decoders read (and the planning vocabulary)."""
    specific = {p for ps in DECODER_PARAMS.values() for p in ps} | {"decoder", "vocab"}
    return {k: v for k, v in identity.items() if k not in specific}
