"""A run's ``--model_args``, parsed once.

:meth:`RunSettings.parse` splits the arguments into typed groups: the model to load
(:class:`ModelSettings`), the processes (:class:`~.parallel.ParallelArgs`), the planning
vocabulary (:class:`VocabSettings`), the decoding parameters (:class:`DecodingSettings`) and the
run's options (:class:`Options`). Each group is checked once, with a one-line error naming the
argument (a mistyped key gets "did you mean"), before any process group, weight or file exists.
:meth:`RunSettings.bind` then resolves, once, what depends on the loaded model: the decoding
parameters on its blocks (``block_length`` defaults to a block-diffusion model's block size,
which it must equal), the context and the BOS token. Nothing downstream checks these again.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from ..decoding.blocks import block_size_of, default_block_length
from ..decoding.likelihood import LIKELIHOOD_PARAMS, Estimator
from ..decoding.options import DecodeOptions
from ..decoding.param_spec import as_bool
from ..decoding.params import DecodeParams, make_params
from ..files.append import check_target
from ..planning.vocab import VOCAB_ARGS, RunVocab
from .auto_batch import AutoBatch, batch_size_arg
from .model_args import COMPILE_SCOPES, ModelArgError, check_keys, positive_int
from .parallel import ALIASES, CHECK_RANKS, LAYERS, ParallelArgs
from .parallel import KEYS as PARALLEL_KEYS
from .request_checks import truncation_mode

MODEL_KEYS = ("pretrained", "dtype", "device", "revision", "tokenizer", "max_length", "compile")
OPTION_KEYS = ("batch_size", "max_batch_size", "batch_invariant", "compile_round", "truncation",
               "add_bos_token", "trace", "trace_append", *(p.name for p in LIKELIHOOD_PARAMS))
#: set by the adapter when ``--device`` is lm-eval's default rather than the user's
CLI_DEVICE = "_device_is_cli_default"


def _text(v) -> str | None:
    return None if v is None else str(v)


def compile_scope(v) -> str | None:
    """``compile=false|true|blocks|model`` -> None or the ``DiffusionLM.compile`` scope.

    true: the fastest option measured on the model's device (``models.diffusion_lm.COMPILE_TRUE``;
    blocks: on the 8B shapes it compiles in ~25 s and gets most of model's speed-up, while model
    needs 1-2 min per call shape, which a GSM8K-sized run does not win back)."""
    if isinstance(v, str) and v.strip().lower() in ("model", "blocks"):
        return v.strip().lower()
    try:
        return "true" if as_bool("compile", v) else None
    except ValueError:
        raise ValueError(f"compile={v!r} must be one of {', '.join(COMPILE_SCOPES)}") from None


@dataclass(frozen=True)
class ModelSettings:
    """What loads the model: ``pretrained``, ``dtype``, ``device`` (``cli_device``: lm-eval's
    default, which falls back to the CPU without a GPU), ``revision``, ``tokenizer``,
    ``max_length`` (None: the checkpoint's) and the ``compile`` scope (None: eager)."""

    pretrained: str = "tiny-llada"
    dtype: str = "auto"
    device: str | None = None
    cli_device: bool = False
    revision: str | None = None
    tokenizer: str | None = None
    max_length: int | None = None
    compile: str | None = None

    @classmethod
    def parse(cls, args: dict, cli_device: bool = False) -> "ModelSettings":
        length = args.get("max_length")
        return cls(pretrained=str(args.get("pretrained") or cls.pretrained),
                   dtype=str(args.get("dtype") or cls.dtype), device=_text(args.get("device")),
                   cli_device=cli_device, revision=_text(args.get("revision")),
                   tokenizer=_text(args.get("tokenizer")),
                   max_length=None if length is None else positive_int("max_length", length),
                   compile=compile_scope(args.get("compile", False)))


@dataclass(frozen=True)
class Options:
    """How the run computes and what it writes: ``batch_size`` (an int, or ``"auto"`` with
    ``auto``, the probe of ``batch_size=auto``), the loop's ``decode`` options (batch
    invariance, the compiled round: :class:`~pvf_lmeval.decoding.options.DecodeOptions`),
    prompt ``truncation`` and ``add_bos_token``, the ``trace`` file, the likelihoods' estimate
    (``likelihood``: ``mc_num`` draws, ``mc_stratum``, ``cfg_scale``, ``mask_logit``) and its
    draws per call (``mc_batch``)."""

    batch_size: int | str = 1
    auto: AutoBatch | None = None
    decode: DecodeOptions = field(default_factory=DecodeOptions)
    truncation: str = "left"
    add_bos_token: bool | None = None
    trace: str | None = None
    trace_append: bool = False
    likelihood: Estimator = field(default_factory=Estimator)
    mc_batch: int = 32

    @property
    def mc_num(self) -> int:
        return self.likelihood.mc_num

    @classmethod
    def parse(cls, args: dict, compiled_model: bool = False,
              cfg_scale: float | None = None) -> "Options":
        """``compiled_model``: the model call runs compiled (``compile``), and so does the
        statistics pass of every call (the loop's ``compile_step``); ``cfg_scale``: the run's
        (a decoding parameter, typed), which the likelihoods read too."""
        batch_size, auto = batch_size_arg(args.get("batch_size", 1), args.get("max_batch_size"))
        decode = DecodeOptions.of(
            batch_invariant=as_bool("batch_invariant", args.get("batch_invariant", False)),
            compile_step=compiled_model,
            compile_round=as_bool("compile_round", args.get("compile_round", False)))
        bos = args.get("add_bos_token")
        trace = args.get("trace")
        return cls(
            batch_size=batch_size, auto=auto, decode=decode,
            truncation=truncation_mode(args.get("truncation", "left")),
            # HFLM's add_bos_token: None keeps the default (contexts encoded without specials)
            add_bos_token=None if bos is None else as_bool("add_bos_token", bos),
            # its folder must exist and the path be no link: an error now, not after the load
            trace=str(check_target(trace, "trace")) if trace else None,
            trace_append=as_bool("trace_append", args.get("trace_append", False)),
            **likelihood_options(args, cfg_scale))


def likelihood_options(args: dict, cfg_scale: float | None = None) -> dict:
    """``likelihood`` (an :class:`Estimator`, with the run's ``cfg_scale``) and ``mc_batch``
    from the model args, each typed and checked by its declaration
    (``decoding.likelihood.LIKELIHOOD_PARAMS``)."""
    typed = {}
    for spec in LIKELIHOOD_PARAMS:
        v = args.get(spec.name)
        typed[spec.name] = spec.default if v is None else spec.coerce(v)
        spec.check_cap(typed[spec.name])
        spec.validate(typed[spec.name])
    mc_batch = typed.pop("mc_batch")
    return {"likelihood": Estimator(**typed, cfg_scale=cfg_scale or 0.0), "mc_batch": mc_batch}


@dataclass(frozen=True)
class VocabSettings:
    """``vocab`` (auto, none, online, a path, a bundled name, or ids from Python) and its
    settings (``RunVocab.settings``: ``vocab_force``, the ``vocab=online`` ones)."""

    spec: Any = "auto"
    cfg: dict = field(default_factory=dict)

    @classmethod
    def parse(cls, spec, args: dict) -> "VocabSettings":
        return cls(spec, RunVocab.settings(spec, args))


@dataclass(frozen=True)
class DecodingSettings:
    """The decoding parameters given as model args, typed (``given``, without ``decoder`` and
    ``preset``); ``preset_given``: a ``preset`` model arg (``none`` included) wins over the
    tasks' presets."""

    decoder: str = "threshold"
    given: dict = field(default_factory=dict)
    preset: str | None = None
    preset_given: bool = False

    @property
    def seed_given(self) -> bool:
        """Without a ``seed`` model arg, every random draw follows lm-eval's ``--seed``."""
        return "seed" in self.given

    @classmethod
    def parse(cls, args: dict) -> "DecodingSettings":
        """Every value typed and checked with the rules that the model cannot change: without a
        ``block_length``, ``gen_length`` stands for the one block until :meth:`params` gets the
        model's."""
        given = {k: v for k, v in args.items() if v is not None}
        decoder = given.pop("decoder", "threshold")
        preset = given.pop("preset", None)
        one_block = ({} if "block_length" in given else
                     {"block_length": given.get("gen_length", DecodeParams.gen_length)})
        checked = make_params(decoder, preset=preset, **given, **one_block)
        return cls(checked.decoder, {k: getattr(checked, k) for k in given}, checked.preset,
                   "preset" in args)

    def params(self, model_block: int | None, preset: Any = "given",
               block_default: int | None = None) -> DecodeParams:
        """The parameters on a model with attention blocks of ``model_block`` positions (None:
        bidirectional): ``block_length`` as given, else the model's block, else
        ``block_default`` (a uniform-state model's canvas), else the default; under ``preset``
        (a task's; ``"given"``: the model arg's)."""
        default = model_block or block_default or DecodeParams.block_length
        given = {"block_length": default, **self.given}
        return make_params(self.decoder, preset=self.preset if preset == "given" else preset,
                           model_block=model_block, **given)


def parse_parallel(given: dict, env=None) -> ParallelArgs:
    """The parallel model args checked against the launch (``env``: the launcher's environment,
    default ``os.environ``), before any process group exists or any weight is read."""
    env = os.environ if env is None else env
    given = {k: v for k, v in given.items() if v is not None}
    for alias, name in ALIASES.items():
        if alias in given:
            value = given.pop(alias)
            if name in given and str(given[name]) != str(value):
                raise ModelArgError(f"{alias}={value} and {name}={given[name]} disagree; "
                                    f"give one of them")
            given[name] = value
    tp = positive_int("tensor_parallel_size", given.get("tensor_parallel_size", 1))
    world = positive_int("WORLD_SIZE", env.get("WORLD_SIZE", "1"))
    layers = str(given.get("parallel_layers", "all")).strip().lower()
    if layers not in LAYERS:
        raise ModelArgError(f"parallel_layers={given['parallel_layers']!r} must be one of "
                            f"{', '.join(LAYERS)}")
    if tp > 1 and world == 1:
        raise ModelArgError(
            f"tensor_parallel_size={tp} needs {tp} processes per model copy and this run has "
            f"one: launch it with torchrun --nproc_per_node {tp} -m lm_eval ... (or "
            f"accelerate launch --num_processes {tp} -m lm_eval ...)")
    if world % tp:
        raise ModelArgError(f"tensor_parallel_size={tp} must divide the launcher's "
                            f"{world} processes (WORLD_SIZE)")
    local = env.get("LOCAL_WORLD_SIZE")
    if tp > 1 and local is not None and int(local) % tp:
        raise ModelArgError(
            f"tensor_parallel_size={tp} must divide the {local} processes per node "
            f"(LOCAL_WORLD_SIZE): the ranks of a model copy share a node")
    dp = world // tp
    if "data_parallel_size" in given:
        asked = positive_int("data_parallel_size", given["data_parallel_size"])
        if asked != dp:
            raise ModelArgError(
                f"data_parallel_size={asked}, but {world} processes at "
                f"tensor_parallel_size={tp} make {dp} model copies; launch {asked * tp} "
                f"processes or drop data_parallel_size (it is derived)")
    try:
        check = as_bool(CHECK_RANKS, env.get(CHECK_RANKS, "0"))
    except ValueError as error:
        raise ModelArgError(str(error)) from None
    return ParallelArgs(tp=tp, dp=dp, world=world, layers=layers, check_ranks=check)


@dataclass(frozen=True)
class RunSettings:
    """Every ``--model_args`` key of a run, typed and checked, by group."""

    model: ModelSettings
    parallel: ParallelArgs
    vocabulary: VocabSettings
    decoding: DecodingSettings
    options: Options
    #: ``trust_remote_code`` was given (HFLM's; ignored here, with a notice)
    remote_code_asked: bool = False

    @classmethod
    def parse(cls, model_args: dict, env=None) -> "RunSettings":
        """The groups of ``model_args`` (lm-eval's parsed ``--model_args`` with its CLI
        defaults), in the order their errors are reported: keys, processes, decoding, options,
        model, vocabulary; what is left after the named groups are decoding parameters."""
        args = dict(model_args)
        cli_device = bool(args.pop(CLI_DEVICE, False))
        remote = args.pop("trust_remote_code", None) is not None
        check_keys(args)

        def take(keys) -> dict:
            return {k: args.pop(k) for k in keys if k in args}

        parallel = parse_parallel(take(PARALLEL_KEYS), env)
        model, options = take(MODEL_KEYS), take(OPTION_KEYS)
        vocab = take(("vocab", *VOCAB_ARGS))
        decoding = DecodingSettings.parse(args)
        options = Options.parse(options, compiled_model=compile_scope(
            model.get("compile", False)) is not None,
            cfg_scale=decoding.given.get("cfg_scale"))
        return cls(model=ModelSettings.parse(model, cli_device), parallel=parallel,
                   vocabulary=VocabSettings.parse(vocab.pop("vocab", "auto"), vocab),
                   decoding=decoding, options=options, remote_code_asked=remote)

    def bind(self, model) -> "BoundRun":
        """The settings on the loaded ``model``: the context (``max_length``, at most the
        checkpoint's), the BOS token ``add_bos_token`` needs, the run's decoding parameters on
        its blocks; one-line errors."""
        context = self.model.max_length
        if context is not None and context > model.max_length:
            raise ValueError(f"max_length={context} is longer than the checkpoint's "
                             f"context of {model.max_length} tokens; use at most that")
        if self.options.add_bos_token and model.tokenizer.bos_token_id is None:
            raise ValueError(f"add_bos_token=true: the tokenizer of {self.model.pretrained!r} "
                             "has no BOS token; drop add_bos_token")
        block = default_block_length(model, DecodeParams.block_length)
        return BoundRun(self, self.decoding.params(block_size_of(model), block_default=block),
                        context or model.max_length)


@dataclass(frozen=True)
class BoundRun:
    """A run's settings on its loaded model: the run's decoding ``params`` (the model args'
    preset, before any task's) and the ``context`` prompts are fitted to."""

    settings: RunSettings
    params: DecodeParams
    context: int

    def params_under(self, preset: str | None) -> DecodeParams:
        """The run's parameters under a task's ``preset`` (None or "none": no preset)."""
        return self.settings.decoding.params(self.params.model_block,
                                             None if preset in ("", "none") else preset,
                                             block_default=self.params.block_length)
