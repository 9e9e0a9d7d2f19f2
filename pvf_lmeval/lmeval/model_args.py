"""The ``--model_args`` of ``pvf-dlm``: one spec per key (default, allowed values, meaning; the
decoding parameters' from their declarations) and the key check with "did you mean".

Free of lm-eval, so that ``pvf-dlm args`` prints the table without importing it. The values
are checked once, by :mod:`.settings`, before the model loads.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from ..decoding.likelihood import LIKELIHOOD_PARAMS
from ..decoding.param_spec import Param
from ..decoding.params import LOOP_CHECKS, PARAMS, readers
from ..decoding.registry import DECODERS, PLANNING_DECODERS
from ..planning.vocab import VOCAB_ARGS
from .parallel import ALIASES, LAYERS, habit_error
from .request_checks import TRUNCATION_MODES

#: ``batch_size=auto`` on the CPU (no memory to probe: host memory swaps before it runs out)
CPU_AUTO_BATCH = 8
#: the largest batch ``batch_size=auto`` tries when ``max_batch_size`` is not given (HFLM's)
AUTO_MAX_BATCH = 64
COMPILE_SCOPES = ("false", "true", "blocks", "model")


@dataclass(frozen=True)
class ArgSpec:
    """One ``--model_args`` key: its default and allowed values as shown to users, and what it
    does, in one line."""

    name: str
    default: str
    allowed: str
    meaning: str


def _one_of(names) -> str:
    return ", ".join(names)


#: model-level keys (loading, batching, outputs), in the order ``pvf-dlm args`` prints them
MODEL_ARGS = (
    ArgSpec("pretrained", "tiny-llada", "a checkpoint folder, a hub id, tiny-llada, tiny-dream",
            "the model to load (the families of `pvf-dlm models`)"),
    ArgSpec("revision", "the hub's default", "a branch, tag or commit",
            "hub ids: the revision of the checkpoint (and of tokenizer), as HFLM's"),
    ArgSpec("tokenizer", "pretrained's", "a checkpoint folder, a hub id, a bundled name",
            "read the tokenizer from there, as HFLM's (its ids must fit the checkpoint)"),
    ArgSpec("dtype", "auto", "auto, float32, bfloat16, float16",
            "weights and activations; auto is bfloat16 on CUDA, float32 on the CPU"),
    ArgSpec("device", "lm-eval's --device", "cuda, cuda:N, cpu",
            "where the model runs; lm-eval's default falls back to the CPU when there is no GPU"),
    ArgSpec("batch_size", "1", "a positive integer, auto (auto:N runs as auto)",
            "requests decoded together (outputs do not depend on it); auto: the largest batch "
            "whose canvas fits the GPU, probed once per canvas size; "
            f"{CPU_AUTO_BATCH} on the CPU"),
    ArgSpec("batch_invariant", "false", "true, false",
            "the same tokens and statistics at any batch size, bit for bit (batch-invariant "
            "products, attention and norms: Triton kernels on CUDA, fixed-shape products on the "
            "CPU in float32)"),
    ArgSpec("max_batch_size", str(AUTO_MAX_BATCH), "a positive integer",
            "the largest batch batch_size=auto may pick (bounds nothing else, as in HFLM)"),
    ArgSpec("compile", "false", _one_of(COMPILE_SCOPES),
            "torch.compile the model call: true/blocks each layer, model the whole stack"),
    ArgSpec("compile_round", "false", "true, false",
            "torch.compile the decode step around each model call (selections, early stop, "
            "the next call's layout)"),
    ArgSpec("max_length", "the checkpoint's", "a positive integer, at most the checkpoint's",
            "the context in tokens, as HFLM's: prompts are fitted to it (truncation)"),
    ArgSpec("truncation", "left", _one_of(TRUNCATION_MODES),
            "a prompt longer than the context minus gen_length: keep its last tokens, or stop"),
    ArgSpec("add_bos_token", "false", "true, false",
            "start every context with the tokenizer's BOS token, as HFLM's"),
    ArgSpec("trace", "none", "a file path",
            "write one JSONL record per request (render with pvf-trace); a run empties it first"),
    ArgSpec("trace_append", "false", "true, false",
            "trace only: keep the file's records and add this run's after them"),
    # the likelihood parameters, as declared (decoding.likelihood)
    *(ArgSpec(p.name, p.default_text(), p.allowed_text(), p.meaning) for p in LIKELIHOOD_PARAMS),
    ArgSpec("tensor_parallel_size", "1", "a positive integer dividing the launcher's processes",
            "processes per model copy (alias tp_size): the network splits over them "
            "(parallel_layers); launch with torchrun --nproc_per_node W -m lm_eval"),
    ArgSpec("parallel_layers", "all", _one_of(LAYERS),
            "tensor_parallel_size > 1: all splits attention heads, MLPs, the LM head and the "
            "routed experts (logits within 1e-5 of one process); experts splits only the routed "
            "experts (bit for bit one process's logits)"),
    ArgSpec("data_parallel_size", "processes / tensor_parallel_size", "that number",
            "model copies (alias dp_size): derived from the launch, checked when given"),
)

#: what the lm-eval adapter adds to a decoding parameter's declared words: its defaults (the
#: task's preset, ``max_gen_toks``, lm-eval's ``--seed``) and where a default comes from
ADAPTER_WORDS = {
    "preset": {"default": "the task's"},
    "gen_length": {"default": "max_gen_toks rounded up to blocks"},
    "seed": {"default": "lm-eval's --seed",
             "meaning": "seed of every random draw; without it, the torch seed of --seed "
                        "(1234 by default)"},
}


def decoding_arg(spec: Param) -> ArgSpec:
    """The table row of a declared decoding parameter: the decoders that read it name
    themselves before its meaning (none: the loop's, every decoder reads it)."""
    who = ", ".join(dict.fromkeys(d for d, _ in readers(spec.name)))
    words = ADAPTER_WORDS.get(spec.name, {})
    meaning = words.get("meaning", spec.meaning)
    # each rule once: a decoder that builds on another lists that one's rules too
    rules = tuple(dict.fromkeys(LOOP_CHECKS + tuple(r for cls in DECODERS.values()
                                                    for r in cls.checks)))
    own = [f"{d} {cls.defaults[spec.name]:g}" for d, cls in DECODERS.items()
           if spec.name in cls.defaults]                 # a decoder's own default (Step.defaults)
    default = words.get("default", spec.default_text()) + (f" ({', '.join(own)})" if own else "")
    return ArgSpec(spec.name, default,
                   spec.allowed_text(rules), f"{who}: {meaning}" if who else meaning)


#: decoding parameters (``decoding.params.PARAMS``, declared by the loop and the decoders); task
#: generation_kwargs and ``--gen_kwargs`` override them per request
DECODER_ARGS = tuple(decoding_arg(p) for p in PARAMS.values() if p.public)

#: planning-vocabulary keys (``planning.vocab``)
VOCAB_SPECS = (
    ArgSpec("vocab", "auto", "auto, none, a path, a bundled name (pvf-dlm vocab)",
            f"planning vocabulary of {', '.join(PLANNING_DECODERS[:-1])} and "
            f"{PLANNING_DECODERS[-1]}"),
    ArgSpec("vocab_force", "false", "true, false",
            "use an artifact made for another model family"),
    ArgSpec("rho_ver", "0.9", "[0, 1]", "vocab=online: verification rate a token needs"),
    ArgSpec("gamma_vig", "0.03", "a number", "vocab=online: the mean gain a token needs"),
    ArgSpec("online_level", "0.2", "(0, 1)", "vocab=online: confidence level of its bounds"),
    ArgSpec("online_explore", "1", "an integer >= 0",
            "vocab=online: verification slots for unproven tokens"),
    ArgSpec("online_explore_max", "30", "an integer >= 0",
            "vocab=online: trials after which a token stops being explored"),
    ArgSpec("online_seed", "none", "auto, a path, a bundled name",
            "vocab=online: statistics to start from"),
    ArgSpec("online_save", "none", "a file path", "vocab=online: write the learnt artifact"),
    ArgSpec("online_frozen", "false", "true, false", "vocab=online: use the seed, learn nothing"),
    ArgSpec("online_merge", "false", "true, false",
            "vocab=online, several ranks: merge every rank's outcomes"),
)

ALL_ARGS = MODEL_ARGS + DECODER_ARGS + VOCAB_SPECS
#: every key that works, in table order
ARG_NAMES = tuple(a.name for a in ALL_ARGS)
#: accepted for command lines written for lm-eval's HFLM, and ignored (not listed as working)
IGNORED_ARGS = ("trust_remote_code",)

assert set(a.name for a in VOCAB_SPECS) == {"vocab", *VOCAB_ARGS}


class ModelArgError(ValueError):
    """A bad ``--model_args`` value or combination (a one-line message)."""


def positive_int(name: str, value) -> int:
    """``value`` (an int or its text) as a positive integer, else a one-line error."""
    try:
        number = int(value)
    except (TypeError, ValueError):
        number = 0
    if number < 1 or str(value).strip() not in (str(number), f"{number}.0"):
        raise ModelArgError(f"{name}={value!r} must be a positive integer")
    return number


def did_you_mean(key: str, names=ARG_NAMES) -> str | None:
    """The closest name to a mistyped ``key``, or None when nothing is close."""
    close = difflib.get_close_matches(key, names, n=1, cutoff=0.6)
    return close[0] if close else None


def check_keys(keys) -> None:
    """Raise :class:`ModelArgError` for the first key (sorted) that is not a model arg."""
    for key in sorted(keys):
        if key in ARG_NAMES or key in IGNORED_ARGS or key in ALIASES:
            continue
        habit = habit_error(key)
        if habit:
            raise ModelArgError(habit)
        guess = did_you_mean(key)
        hint = f"did you mean {guess!r}? " if guess else ""
        raise ModelArgError(f"pvf-dlm: unknown model arg {key!r}; {hint}allowed: "
                            f"{', '.join(ARG_NAMES)} (pvf-dlm args explains each)")


def default_pretrained_notice(args) -> str | None:
    """The line for model args ``args`` that name no ``pretrained`` (the bundled default then
    loads), else None. ``lm-eval run --config FILE`` takes ``model_args`` from the file as one
    mapping, and a ``--model_args`` on the command line replaces that mapping whole (lm-eval
    0.4.13's ``EvaluatorConfig.from_cli``): the checkpoint the file names is dropped without a
    word from lm-eval, and HFLM, whose ``pretrained`` has no default, fails there instead."""
    if "pretrained" in args:
        return None
    default = next(a.default for a in MODEL_ARGS if a.name == "pretrained")
    return (f"pvf-dlm: no pretrained in the model args, so the bundled {default} loads (with "
            "lm-eval run --config, a --model_args on the command line replaces the file's "
            "model_args whole, pretrained included)")


def markdown_table() -> str:
    """The model-args table of docs/arguments.md (``pvf-dlm args --markdown``)."""
    lines = ["| key | default | allowed | meaning |", "|---|---|---|---|"]
    for a in ALL_ARGS:
        lines.append(f"| `{a.name}` | {a.default} | {a.allowed} | {a.meaning} |")
    return "\n".join(lines) + "\n"
