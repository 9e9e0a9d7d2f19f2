"""The lm-eval model ``pvf-dlm``: diffusion LMs decoded by PVF and the baseline decoders.

    lm_eval --model pvf-dlm --model_args pretrained=tiny-llada,decoder=pvf --tasks ...

This module owns the lm-eval side only: arguments, prompts and chat templates, ``until`` and
``max_gen_toks``, data parallel, statistics. Decoding lives in ``pvf_lmeval.decoding``, model
loading in ``pvf_lmeval.models``.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import sys
import zlib
from collections import defaultdict
from contextlib import contextmanager

import lm_eval.models  # noqa: F401  (fills the registry with the built-ins before we register)
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model
from lm_eval.utils import simple_parse_args_string
from tqdm import tqdm

from ..decoding import DECODERS, PLANNING_DECODERS, decode_batch
from ..decoding.blocks import block_size_of
from ..decoding.cache import cache_exact
from ..decoding.params import PARAMS, override
from ..files.append import open_records
from ..models.chat_render import RENDERER
from ..models.diffusion_lm import compile_seconds
from .batching import batches
from .generation import GenerationText, cut_at_stop, tokens_before
from .launch import quiet_git_probe, single_rank_warning
from .parallel import Ranks
from ..one_line import exit_in_one_line, one_line_errors
from .settings import CLI_DEVICE, RunSettings
from .request_checks import check_gen_kwargs, fit_prompt, max_gen_toks_value
from .stats import StatTotals
from .task_presets import task_preset
from .trace_records import trace_record
from ..planning.vocab import RunVocab

log = logging.getLogger("pvf_lmeval")

#: the decoding parameters a request may set (``generation_kwargs``) and the results report
DECODER_KEYS = tuple(name for name, p in PARAMS.items() if p.public)
#: what the CLI passes as ``--device`` when the user said nothing
CLI_DEFAULT_DEVICE = "cuda:0"


def _notice(msg: str) -> None:
    with tqdm.external_write_mode(file=sys.stderr):   # above a progress bar, not inside its line
        log.warning(msg)


class PVFOutOfMemoryError(RuntimeError):
    """Out of (GPU) memory, with what to lower in the message."""


def oom_message(*, what: str, device, rows: int, tokens: int, dtype, batch_size: int,
                mc_batch: int) -> str:
    """One line: where memory ran out and the model args that lower it."""
    dt = str(dtype).replace("torch.", "")
    use_dtype = ("dtype=bfloat16 (now float32)" if dt == "float32"
                 else f"fewer branches (width); dtype={dt} is already half precision")
    return (f"pvf-dlm: out of memory on {device} while {what} ({rows} rows x {tokens} tokens, "
            f"{dt}): lower batch_size (now {batch_size}), mc_batch (now {mc_batch}, likelihood "
            f"tasks) or gen_length; use {use_dtype}; or cache=prefix or cache=dual")


@register_model("pvf-dlm")
class PVFDiffusionLM(LM):
    """lm-eval adapter for masked diffusion LMs (LLaDA, Dream, the bundled tiny fixtures).

    ``--model_args``: ``pretrained`` (checkpoint folder, hub id, ``tiny-llada`` or ``tiny-dream``),
    ``dtype`` (auto|float32|bfloat16|float16), ``device``, ``batch_size``, ``batch_invariant``
    (true: the same results at any batch size on CUDA too; docs/batch-invariance.md), ``vocab``
    (planning vocabulary: auto|none|PATH|bundled name) and every decoder parameter (``decoder``,
    ``gen_length``, ``block_length``, ``threshold``, ...; see ``pvf_lmeval.decoding.params``).
    Task ``generation_kwargs`` and ``--gen_kwargs`` override decoder parameters per request.
    """

    def __init__(self, **model_args):
        super().__init__()
        # every argument is checked here, before the model loads: bad input fails fast, in one line
        self.settings = RunSettings.parse(model_args)
        opts = self.settings.options
        self.batch_size, self._auto_batch = opts.batch_size, opts.auto
        self.batch_invariant = opts.decode.batch_invariant
        self.truncation, self.add_bos_token = opts.truncation, opts.add_bos_token
        self.mc_num, self.mc_batch = opts.mc_num, opts.mc_batch
        #: trace=PATH is emptied by a run's first generate_until unless trace_append is true
        self.trace_path, self.trace_append = opts.trace, opts.trace_append
        self._trace_opened = False
        self.revision = self.settings.model.revision
        self.tokenizer_source = self.settings.model.tokenizer
        self._preset_params: dict = {}
        self.task_presets: dict[str, str] = {}   # task -> the preset its requests ran with
        # task -> parameter -> the values its requests ran with, where they differ from the run's
        self._task_params: dict[str, dict[str, set]] = {}
        self.vocab = RunVocab(self.settings.vocabulary.spec, self.settings.vocabulary.cfg)
        if self.settings.remote_code_asked:
            _notice("pvf-dlm: trust_remote_code is ignored: checkpoints load into the native network, "
                    "no remote code runs")
        self.model = self._load()
        self.run = self.settings.bind(self.model)
        self.params = self.run.params
        self._compile_s0 = None
        if self.settings.model.compile:          # torch.compile of the model call (off by default)
            self.model.compile(scope=self.settings.model.compile)
        if self.settings.model.compile or opts.decode.compile_round is not None:
            self._compile_s0 = compile_seconds()   # the warm-up is what compiles after this
        self._device = self.model.device
        self.tokenizer = self.model.tokenizer
        self.pretrained = self.settings.model.pretrained
        if self.params.decoder in PLANNING_DECODERS:
            self.params = self._with_vocab(self.params)
        # The statistics of the evaluation under way: this rank's requests not yet shared with
        # the other ranks (gather_object shares them), and the evaluation's totals, which
        # get_model_info reports and closes (lm-eval asks for it once, at each evaluation's end).
        self._pending = StatTotals()
        self.totals = StatTotals()
        self._length_notices: set = set()
        #: lm-eval's --use_cache database as claimed (set_cache_hook), else None
        self._response_cache = None

    def _load(self):
        """Join the run's processes and load the model on this process's device (the
        batch-invariant kernels checked for it before any weight is read)."""
        import torch

        from ..models import load_model
        from ..models.loader import is_hub_id, resolve_device

        m = self.settings.model
        # several processes: the (dp, mp) mesh; lm-eval sees the data-parallel rank and size
        self.ranks = Ranks.launch(self.settings.parallel, m.device)
        self._rank, self._world_size = self.ranks.dp_rank, self.ranks.dp_size
        if self.ranks.world > 1:
            dev = self.ranks.device
        elif m.cli_device and not torch.cuda.is_available():
            _notice(f"pvf-dlm: no CUDA GPU; using the CPU instead of the default device {m.device!r}")
            dev = torch.device("cpu")
        else:
            dev = resolve_device(m.device)
        warning = single_rank_warning(self.world_size)
        if warning:
            _notice(warning)
        quiet_git_probe()
        if m.revision is not None and not is_hub_id(m.pretrained):
            _notice(f"pvf-dlm: revision={m.revision} is for hub ids; pretrained={m.pretrained} is "
                    "a local or bundled folder, which has no revisions (transformers ignores it "
                    "there too)")
        model = load_model(m.pretrained, device=dev, dtype=m.dtype, comm=self.ranks.comm,
                           parallel_layers=self.settings.parallel.layers, revision=m.revision,
                           tokenizer=m.tokenizer,
                           batch_invariant=self.settings.options.decode.batch_invariant)
        model.check_ranks = self.settings.parallel.check_ranks
        return model

    # ------------------------------------------------------------------ construction

    @property
    def max_length(self) -> int:
        """The context in tokens: the ``max_length`` model arg (as HFLM's: prompts are cut to
        it), else the checkpoint's."""
        return self.run.context

    def _encode_context(self, text: str) -> list[int]:
        """A context's token ids: no special tokens, or with ``add_bos_token=true`` the BOS token
        first unless the text starts with it already (HFLM's ``tok_encode``: a chat template may
        have written it)."""
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        bos = self.tokenizer.bos_token
        if self.add_bos_token and not (bos and text.startswith(bos)):
            ids = [self.tokenizer.bos_token_id, *ids]
        return ids

    def _with_vocab(self, params):
        """``params`` carrying the planning vocabulary, resolved once on first need."""
        return self.vocab.resolve(params, model=self.model, tokenizer=self.tokenizer,
                                  model_name=self.pretrained)

    @property
    def online(self):
        """The run's ``OnlineVocab`` (``vocab=online``), else None."""
        return self.vocab.online

    @property
    def vocab_source(self) -> str:
        return self.vocab.source

    @property
    def plan_vocab(self):
        return self.vocab.ids

    # ------------------------------------------------------------------ vocab=online

    def _online_update(self) -> None:
        """Fold the pending outcomes in; with online_merge, every rank's, in rank order."""
        self.vocab.update(self.gather_object if self.world_size > 1 else None)

    @classmethod
    def _merge(cls, args: dict, additional_config: dict | None) -> dict:
        """``--model_args`` win over the CLI's ``batch_size``/``device`` defaults."""
        merged = dict(args)
        for key, value in (additional_config or {}).items():
            if value is None or key in merged:
                continue
            merged[key] = value
            if key == "device" and value == CLI_DEFAULT_DEVICE:
                merged[CLI_DEVICE] = True
        return merged

    @classmethod
    def _create(cls, args: dict):
        """The model, or the argument error, which lm-eval's CLI then prints as one line."""
        try:
            return cls(**args)
        except ValueError as error:
            exit_in_one_line(error)
            raise

    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: dict | None = None):
        return cls._create(cls._merge(simple_parse_args_string(arg_string), additional_config))

    @classmethod
    def create_from_arg_obj(cls, arg_dict: dict, additional_config: dict | None = None):
        return cls._create(cls._merge(arg_dict, additional_config))

    # ------------------------------------------------------------------ lm-eval plumbing

    @property
    def device(self):
        return self._device

    @property
    def tokenizer_name(self) -> str:
        return self.pretrained.replace("/", "__")

    def _no_chat_template(self) -> ValueError:
        error = ValueError(f"--apply_chat_template: the tokenizer of {self.pretrained!r} has no "
                           "chat template (a base checkpoint?); drop --apply_chat_template or use "
                           "an instruct checkpoint")
        exit_in_one_line(error)
        return error

    def chat_template(self, chat_template: bool | str = False) -> str | None:
        """The chat template, chosen as HFLM's (lm-eval's ``TemplateLM.chat_template``): a
        tokenizer with named templates gives the one ``--apply_chat_template NAME`` names (an
        unknown name is a one-line error listing them) or its ``default``; a tokenizer with one
        template gives it (a name is then ignored, with lm-eval's warning). lm-eval's CLI asks
        for it before any request (to log it); the template chosen is also the one
        :meth:`apply_chat_template` applies (HFLM logs the named one but applies the
        tokenizer's default)."""
        from lm_eval.api.model import TemplateLM

        if not chat_template:
            return getattr(self.tokenizer, "chat_template", None)
        if not getattr(self.tokenizer, "chat_template", None):
            raise self._no_chat_template()
        try:
            chosen = TemplateLM.chat_template(self, chat_template)
        except ValueError as error:
            exit_in_one_line(error)
            raise
        named = isinstance(chat_template, str) and isinstance(self.tokenizer.chat_template, dict)
        self._chat_template_name = chat_template if named else None
        return chosen

    def apply_chat_template(self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        """``chat_history`` rendered by the chosen template (:meth:`chat_template`) in a worker
        process with a time, memory and output limit (the template is the checkpoint's program:
        ``models/chat_render.py``). As HFLM's: a template that rejects it (jinja2's
        ``TemplateError``: many refuse a system message) is tried once more without the system
        messages, with HFLM's warning."""
        from ..models.chat_render import TemplateRejected

        if not getattr(self.tokenizer, "chat_template", None):
            raise self._no_chat_template()

        def render(history):
            return RENDERER.render(self.tokenizer, history,
                                   add_generation_prompt=add_generation_prompt,
                                   continue_final_message=not add_generation_prompt,
                                   where=repr(self.pretrained),
                                   template=getattr(self, "_chat_template_name", None))
        try:
            return render(chat_history)
        except TemplateRejected:
            _notice("Failed to apply chat template. removing the system role in chat history.")
            return render([m for m in chat_history if m["role"] != "system"])

    def all_gather(self, tensor):
        return self.ranks.all_gather(tensor)

    def gather_object(self, obj, dst: int = 0) -> list:
        """Every model copy's ``obj``, on every process (lm-eval 0.4.13's evaluator calls it
        with dst=0).

        Each gather also carries every copy's statistics not yet shared, which each process adds
        to the evaluation's totals. lm-eval's evaluator gathers its metrics on every rank at the
        end of each evaluation, so rank 0 reports every copy's requests, those answered from
        ``--use_cache`` included, and ``generate_until`` needs no collective of its own (a rank
        answered wholly from the cache never calls it)."""
        out = self.ranks.gather_object((obj, self._pending.state()))
        self._pending = StatTotals()
        for _, state in out:
            self.totals.absorb(state)
        return [o for o, _ in out]

    def set_cache_hook(self, cache_hook) -> None:
        """lm-eval's ``--use_cache`` hands its database over here, before any request: it is
        claimed for this run's decoding (another decoding's cache is a one-line error), its
        answer rows are read as data only, and the answers read from it count in the totals with
        the costs of the run that made them (``response_cache``)."""
        super().set_cache_hook(cache_hook)
        db = getattr(cache_hook, "dbdict", None)
        if db is None:
            return
        from ..planning.vocab import tokenizer_hash
        from .response_cache import ResponseCache, cache_identity

        identity = cache_identity(self._info(), self.mc_num,
                                  weights=self.model.weights_fingerprint,
                                  tokenizer_hash=tokenizer_hash(self.tokenizer))
        self._response_cache = ResponseCache.claim(
            db, identity, seed=self._run_seed(), task_decoding=self._task_decoding,
            record=lambda text: self._pending.add(text.task, text.meta, from_cache=True))

    def _task_decoding(self, task: str) -> dict:
        """How ``task``'s requests decode before their own generation kwargs (which lm-eval's
        cache key holds): the run's parameters under the task's preset, spelled as the run
        identity spells them, without the seed (``response_cache`` records it per answer)."""
        from ..cli.report.identity import decoding_identity

        params = self._public_params(self._params_with_preset(task_preset(task)))
        params.pop("seed")
        return decoding_identity(self.params.decoder, params)

    def barrier(self) -> None:
        self.ranks.barrier()

    def get_model_info(self) -> dict:
        """``config.pvf`` of the results: what ran, and the totals of the evaluation's requests.

        lm-eval calls it once per evaluation, at its end (``simple_evaluate``), so the report
        closes the evaluation: each evaluation on one model instance reports its own requests
        (a second call without new requests reports none)."""
        self.totals.absorb(self._pending.state())   # under data parallel: shared already
        self._pending = StatTotals()
        totals, self.totals = self.totals.summary(), StatTotals()
        info = {"pvf": {**self._info(), "totals": totals}}
        self._task_params = {}
        return info

    def _info(self) -> dict:
        """What ran: model, device, decoder and parameters (the seed that draws), vocabulary,
        batching, likelihood settings, compile."""
        params = self._public_params(self.params)
        params["seed"] = self._run_seed()
        return {
            "pretrained": self.pretrained,
            "model_family": self.model.family,
            "device": str(self.model.device),       # what ran, not lm-eval's --device default
            "dtype": str(self.model.dtype).replace("torch.", ""),
            "truncation": self.truncation,
            # what shapes the prompts besides the checkpoint (None: the checkpoint's own)
            "max_length": self.settings.model.max_length, "add_bos_token": self.add_bos_token,
            "tokenizer": self.tokenizer_source, "revision": self.revision,
            "decoder": self.params.decoder,
            "params": params,
            "seed_from": "seed model arg" if self.settings.decoding.seed_given else "lm-eval --seed (torch's seed)",
            "early_stop": self.params.early_stop,
            "task_presets": dict(self.task_presets),
            "task_params": self._task_params_info(),
            # a block-diffusion model's cache is exact (docs/decoding.md, "Block-diffusion models")
            "block_size": block_size_of(self.model),
            "cache_exact": cache_exact(self.params.cache, block_size_of(self.model)),
            **self.vocab.info(),
            "batch_size": self.batch_size,
            "batch_invariant": self.batch_invariant,
            "parallel": self.ranks.info(self.model),
            "likelihood": {"mc_num": self.mc_num, "mc_batch": self.mc_batch},
            "compile": self._compile_info(),
        }

    def _run_seed(self) -> int:
        """The seed of every random draw (sampling, the explore pick, the likelihood's masks): the
        ``seed`` model arg, else lm-eval's ``--seed``. lm-eval seeds python, numpy and torch
        globally (``simple_evaluate``: ``torch.manual_seed(torch_random_seed)``, the third value
        of ``--seed``, 1234 by default) and passes no seed to the model; HFLM samples from torch's
        global generator, so its samples follow ``--seed`` but depend on the batch. Here that
        seed is read back (``torch.initial_seed()``) and each request draws from its own
        generator seeded by it and the request's task, document and repeat: the same ``--seed``
        reproduces a run bit for bit, whatever the batch."""
        if self.settings.decoding.seed_given:
            return self.params.seed
        import torch

        return torch.initial_seed() % (1 << 63)

    def _compile_info(self) -> dict | None:
        """None when nothing runs compiled; else ``scope``, what ``compile`` resolved to (None:
        the model call runs eager), ``round``, whether the decode step runs compiled
        (``compile_round``), and ``compile_s``, the seconds torch.compile spent compiling
        during this run (the warm-up its first batches paid; included in their wall time and
        so in ``tps``), None where torch keeps no record of it."""
        scope, decode = self.settings.model.compile, self.settings.options.decode
        if not scope and decode.compile_round is None:
            return None
        now, s0 = compile_seconds(), self._compile_s0
        return {"scope": self.model.compile_scope if scope else None,
                "round": decode.compile_round is not None,
                "compile_s": None if now is None or s0 is None else round(now - s0, 3)}

    def _record_task_params(self, task: str, params, run: dict) -> None:
        """Note the decoding parameters of one of ``task``'s requests that differ from the run's
        (``run``: its public parameters): its preset's, its ``max_gen_toks``, its generation
        kwargs (``temperature``, ...)."""
        mine = self._task_params.setdefault(task, {})
        for k, v in self._public_params(params).items():
            if v != run[k]:
                mine.setdefault(k, set()).add(tuple(v) if isinstance(v, list) else v)

    def _task_params_info(self) -> dict:
        """``config.pvf.task_params``: per task, each decoding parameter its requests ran with
        where it differs from ``params``: the value, or the sorted values when they differed."""
        def shown(values: set):
            out = sorted(values, key=repr)
            out = [list(v) if isinstance(v, tuple) else v for v in out]
            return out[0] if len(out) == 1 else out

        return {task: {k: shown(v) for k, v in sorted(ps.items())}
                for task, ps in sorted(self._task_params.items())}

    @staticmethod
    def _public_params(params) -> dict:
        out = {}
        for k in DECODER_KEYS:
            v = getattr(params, k)
            out[k] = list(v) if isinstance(v, tuple) else v
        return out

    # ------------------------------------------------------------------ requests

    @contextmanager
    def _oom_guard(self, what: str, rows: int, tokens: int):
        """Re-raise an out-of-memory error as one line saying what to lower."""
        import torch

        try:
            yield
        except torch.OutOfMemoryError:
            raise PVFOutOfMemoryError(oom_message(
                what=what, device=self.device, rows=rows, tokens=tokens, dtype=self.model.dtype,
                batch_size=self.batch_size, mc_batch=self.mc_batch)) from None

    def _check_context(self, n_tokens: int, what: str) -> None:
        limit = self.max_length
        if n_tokens > limit:
            raise ValueError(f"pvf-dlm: {what} is {n_tokens} tokens, longer than the model's context "
                             f"of {limit} tokens; shorten the prompt (fewer few-shot examples) or "
                             "lower gen_length")

    def _encode_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        """lm-eval's split: trailing context whitespace moves to the continuation; the
        continuation ids are the tail of the joint encoding."""
        n_spaces = len(context) - len(context.rstrip())
        if n_spaces:
            continuation = context[-n_spaces:] + continuation
            context = context[:-n_spaces]
        whole = self._encode_context(context + continuation)
        ctx = self._encode_context(context) if context or self.add_bos_token else []
        return whole[:len(ctx)], whole[len(ctx):]

    @staticmethod
    def _likelihood_key(req, i: int) -> int:
        """Seed key of a likelihood request: task and document, so that every choice of one
        question is scored under the same random masks (common random numbers)."""
        task = getattr(req, "task_name", None) or "unknown"
        doc = getattr(req, "doc_id", None)
        return zlib.crc32(f"{task}/{doc if doc is not None else i}".encode())

    @one_line_errors
    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        """LLaDA's Monte Carlo ELBO of each continuation (``mc_num`` draws seeded by ``seed`` and
        the request's task/document) and HFLM's ``is_greedy``: whether the configured decoder at
        temperature 0 generates the continuation (``decoding.likelihood``).

        As HFLM's ``Collator`` does, requests are sorted (longest context first, the choices of
        one context together) and scored ``batch_size`` at a time: one batch's draws share model
        calls of at most ``batch_size * mc_batch`` distinct canvases, and its distinct contexts
        share one greedy decode each."""
        from ..decoding.likelihood import Continuation, greedy_matches, loglikelihoods

        self.ranks.same_on_every_rank("the requests", [r.args for r in requests])
        out: list = [None] * len(requests)
        items: dict[int, Continuation] = {}
        for i, req in enumerate(requests):
            ctx_ids, cont_ids = self._encode_pair(req.args[0], req.args[1])
            if not cont_ids:
                out[i] = (0.0, True)
                continue
            self._check_context(len(ctx_ids) + len(cont_ids), "context + continuation")
            items[i] = Continuation(ctx_ids, cont_ids, self._likelihood_key(req, i))
        order = sorted(items, key=lambda i: (-len(items[i].prefix), items[i].prefix,
                                             -len(items[i].target)))
        size = self._likelihood_batch_size([items[i] for i in order])
        params = override(self.params, seed=self._run_seed())
        if params.decoder in PLANNING_DECODERS:
            params = self._with_vocab(params)
        bar = tqdm(total=len(requests), initial=len(requests) - len(items),
                   disable=disable_tqdm or self.ranks.rank != 0, desc="pvf-dlm loglikelihood")
        try:
            for a in range(0, len(order), size):
                batch = order[a:a + size]
                chunk = [items[i] for i in batch]
                longest = max(len(c.prefix) + len(c.target) for c in chunk)
                with self._oom_guard("scoring continuations", size * self.mc_batch, longest):
                    scores = loglikelihoods(self.model, chunk, mc_num=self.mc_num,
                                            rows_per_call=size * self.mc_batch,
                                            seed=params.seed, batch_invariant=self.batch_invariant)
                    greedy = greedy_matches(self.model, [c.prefix for c in chunk],
                                            [c.target for c in chunk], params,
                                            keys=[c.key for c in chunk], batch_size=size,
                                            context=self.max_length,
                                            batch_invariant=self.batch_invariant,
                                            online=self.online)
                for i, r, g in zip(batch, scores, greedy):
                    out[i] = (r.logprob, bool(g))
                    self.cache_hook.add_partial("loglikelihood", requests[i].args[:2], out[i])
                if self._response_cache is not None:
                    self._response_cache.drew("likelihood")
                bar.update(len(batch))
        finally:
            bar.close()
        return out

    def _likelihood_batch_size(self, items) -> int:
        """Continuations per batch of ``loglikelihood``: ``batch_size``, or for
        ``batch_size=auto`` the largest batch of ``mc_batch`` rows per continuation whose
        longest canvas fits (the smallest over the ranks)."""
        if self._auto_batch is None:
            return self.batch_size
        if not items:
            return self._auto_fit(None, 0, 0)
        return self._auto_fit(max(len(c.prefix) + len(c.target) for c in items),
                              max(len(c.target) for c in items), self.mc_batch)

    @one_line_errors
    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """Sum of ELBO estimates over lm-eval's disjoint rolling windows of the model's context
        (each window conditioned on one token before it, as lm-eval does for causal models); the
        windows of one text share model calls of at most ``batch_size * mc_batch`` canvases."""
        from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

        from ..decoding.likelihood import rolling_loglikelihood

        bos = getattr(self.tokenizer, "bos_token_id", None)
        prefix = bos if bos is not None else self.model.eos_ids[0]
        self.ranks.same_on_every_rank("the requests", [r.args for r in requests])
        out = []
        for i, req in enumerate(tqdm(requests, disable=disable_tqdm or self.ranks.rank != 0,
                                     desc="pvf-dlm loglikelihood_rolling")):
            (string,) = req.args[:1]
            ids = self.tokenizer.encode(string, add_special_tokens=False)
            windows = [make_disjoint_window(w) for w in get_rolling_token_windows(
                token_list=ids, prefix_token=prefix, max_seq_len=self.max_length - 1,
                context_len=1)]
            rows = (self.batch_size if self._auto_batch is None else 1) * self.mc_batch
            with self._oom_guard("scoring a rolling window", rows, self.max_length):
                r = rolling_loglikelihood(self.model, windows, mc_num=self.mc_num,
                                          mc_batch=rows, seed=self._run_seed(),
                                          request_index=self._likelihood_key(req, i),
                                          batch_invariant=self.batch_invariant)
            out.append(r.logprob)
            self.cache_hook.add_partial("loglikelihood_rolling", (string,), r.logprob)
            if self._response_cache is not None:
                self._response_cache.drew("likelihood")
        return out

    def _params_with_preset(self, preset):
        """The run's parameters under a task's ``preset`` (``task_presets``); a ``preset``
        model arg wins over it."""
        if preset is None or self.settings.decoding.preset_given:
            return self.params
        if preset not in self._preset_params:
            self._preset_params[preset] = self.run.params_under(preset)
        return self._preset_params[preset]

    def _request_params(self, gen_kwargs: dict, task: str | None = None, seed: int | None = None):
        """Decoder parameters for one request: model args, the preset of its ``task`` (or of
        its generation kwargs), the run's ``seed`` (without a seed model arg), then the
        request's own overrides."""
        kwargs = dict(gen_kwargs)
        for alias in ("max_new_tokens", "max_tokens"):
            if alias in kwargs:
                kwargs.setdefault("max_gen_toks", kwargs.pop(alias))
        until = kwargs.pop("until", None) or []
        if isinstance(until, str):
            until = [until]
        max_gen_toks = max_gen_toks_value(kwargs.pop("max_gen_toks", None))
        do_sample = kwargs.pop("do_sample", None)
        check_gen_kwargs(kwargs, DECODER_KEYS)
        overrides = {k: kwargs.pop(k) for k in list(kwargs) if k in DECODER_KEYS}
        if do_sample is False:
            overrides["temperature"] = 0.0
        if seed is not None and not self.settings.decoding.seed_given:
            overrides.setdefault("seed", seed)
        ignored = sorted(kwargs)
        if ignored and tuple(ignored) not in self._length_notices:
            self._length_notices.add(tuple(ignored))
            _notice(f"pvf-dlm: generation kwargs {ignored} do not apply to diffusion decoding and are ignored")
        # a preset in the kwargs wins over the task's, none included (lm-eval parses it as None)
        preset = overrides.pop("preset") if "preset" in overrides else task_preset(task)
        base = self._params_with_preset(preset)
        if base is not self.params:
            self.task_presets[task or "unknown"] = preset
        params = override(base, **overrides) if overrides else base
        if params.decoder in PLANNING_DECODERS:
            params = self._with_vocab(params)
        if "gen_length" not in overrides and "gen_length" not in self.settings.decoding.given and max_gen_toks:
            blocks = -(-max_gen_toks // params.block_length)
            length = blocks * params.block_length
            key = (max_gen_toks, length)
            if length != max_gen_toks and key not in self._length_notices:
                self._length_notices.add(key)
                _notice(f"pvf-dlm: gen_length={length} (the task's max_gen_toks={max_gen_toks} rounded "
                        f"up to whole blocks of {params.block_length}); pass gen_length to fix it")
            params = override(params, gen_length=length)
        return params, until, ignored

    @one_line_errors
    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        results: list = [None] * len(requests)
        seen: dict[int, list[int]] = defaultdict(list)
        self.ranks.same_on_every_rank("the requests", [r.args for r in requests])
        trace_file = None
        if self.trace_path and self.ranks.writes:     # one file per model copy
            path = self.trace_path if self.world_size == 1 else f"{self.trace_path}.rank{self.rank}"
            # a run starts its trace afresh (a rerun must not add duplicates), later calls of
            # the same run append; trace_append=true keeps what the file held
            trace_file = open_records(path, truncate=not (self.trace_append or self._trace_opened))
            self._trace_opened = True
        bar = None                  # started after the notices of preparing the requests
        nfe_sum = 0
        done = 0
        copies: list[tuple[int, int]] = []
        seed = self._run_seed()
        run_params = self._public_params(self.params if self.settings.decoding.seed_given else
                                         override(self.params, seed=seed))
        try:
            # Every request is prepared (parameters, prompt fitted to the context) before any is
            # decoded: bad generation kwargs or truncation=error stop the run before any work.
            prepared = []
            truncated = 0
            for i, req in enumerate(requests):
                occurrences = seen[id(req)]
                repeats = max(1, int(getattr(req, "repeats", 1) or 1))
                if len(occurrences) >= repeats:
                    # The evaluator pads the last rank with copies of its last request: answer
                    # them without decoding again and without counting them.
                    copies.append((i, occurrences[len(occurrences) % repeats]))
                    occurrences.append(i)
                    continue
                repeat_index = len(occurrences)
                occurrences.append(i)
                context, gen_kwargs = req.args
                task = getattr(req, "task_name", None) or "unknown"
                params, until, _ = self._request_params(copy.deepcopy(gen_kwargs), task, seed)
                self._record_task_params(task, params, run_params)
                doc = getattr(req, "doc_id", i)
                prompt_ids, cut = fit_prompt(
                    self._encode_context(context), params.gen_length,
                    self.max_length, self.truncation, where=f"task {task} doc_id {doc}")
                if cut:
                    truncated += 1
                    self._pending.count(task, "truncated_prompts")
                key = f"{task}/{doc}/{getattr(req, 'idx', 0)}"
                prepared.append(dict(i=i, params=params, until=until, prompt_ids=prompt_ids,
                                     task=task, key=key, repeat_index=repeat_index,
                                     # lm-eval's cache never serves a do_sample request
                                     cached=not gen_kwargs.get("do_sample", False)))
            if truncated:
                _notice(f"pvf-dlm: {truncated} of {len(prepared)} prompts did not fit the model's "
                        f"context of {self.max_length} tokens with gen_length and were "
                        "left-truncated (as lm-eval's HFLM does; truncation=error refuses instead)")
            batch_size = self._batch_size_for(prepared)
            bar = tqdm(total=len(requests), initial=len(copies),
                       disable=disable_tqdm or self.ranks.rank != 0, desc="pvf-dlm")
            for members in batches([c["params"] for c in prepared],
                                   [len(c["prompt_ids"]) for c in prepared], batch_size):
                # one batch: requests with identical decoding parameters
                chunk = [prepared[k] for k in members]
                if self.online is not None and done:
                    self._online_update()   # between batches of requests, never inside one
                # every rank of a model copy decodes alike, trace records included; mp rank 0
                # writes them
                outs = self._decode(chunk, trace=bool(self.trace_path))
                self.ranks.same_on_every_rank("the committed tokens", [o.tokens for o in outs])
                for c, out in zip(chunk, outs):
                    text, stats = self._finish(out, c["until"])
                    results[c["i"]] = GenerationText(text, meta=stats, task=c["task"])
                    self._pending.add(c["task"], stats)
                    if self._response_cache is not None and c["cached"]:
                        p = c["params"]
                        self._response_cache.answered(
                            c["task"], drew=p.temperature > 0 or DECODERS[p.decoder].draws)
                    if trace_file is not None:
                        trace_file.write(json.dumps(trace_record(
                            out, request=c["key"], prompt_ids=c["prompt_ids"],
                            tokenizer=self.tokenizer, model=self.pretrained,
                            block_length=c["params"].block_length)) + "\n")
                    nfe_sum += out.nfe
                    done += 1
                bar.set_postfix(nfe=f"{nfe_sum / done:.1f}")
                bar.update(len(chunk))
            for i, src in copies:
                results[i] = results[src]
        finally:
            if bar is not None:
                bar.close()
            if trace_file is not None:
                trace_file.close()
        if self.online is not None:
            self._online_update()
            self.vocab.requests += done
            if self.ranks.writes:
                self.vocab.save(tokenizer=self.tokenizer, model_family=self.model.family,
                                model_name=self.pretrained, rank=self.rank,
                                world_size=self.world_size)
        return results

    def _decode(self, chunk: list[dict], *, trace: bool) -> list:
        """The decode results of ``chunk``, prepared requests with identical parameters, decoded
        as one batch (an out-of-memory error says what to lower)."""
        import torch

        params = chunk[0]["params"]
        rows = DECODERS[params.decoder].rows_per_call(params)
        longest = max(len(c["prompt_ids"]) for c in chunk) + params.gen_length
        with self._oom_guard("decoding", rows * len(chunk), longest):
            return decode_batch(
                self.model, [torch.tensor(c["prompt_ids"]) for c in chunk], params=params,
                request_indices=[zlib.crc32(c["key"].encode()) for c in chunk],
                repeat_indices=[c["repeat_index"] for c in chunk], trace=trace,
                online=self.online, options=self.settings.options.decode)

    @property
    def batch_sizes(self) -> dict:
        """``batch_size=auto``: the batch picked per (canvas tokens, rows per request) (lm-eval
        reports these values as ``batch_sizes``)."""
        return dict(self._auto_batch.sizes) if self._auto_batch is not None else {}

    def _batch_size_for(self, prepared: list[dict]) -> int:
        """Requests per decoded batch: ``batch_size``, or for ``batch_size=auto`` the largest
        batch of the run's canvas (longest prompt plus gen_length) that fits, the smallest over
        the ranks."""
        if self._auto_batch is None:
            return self.batch_size
        if not prepared:
            return self._auto_fit(None, 0, 0)
        return self._auto_fit(
            max(len(c["prompt_ids"]) + c["params"].gen_length for c in prepared),
            max(c["params"].gen_length for c in prepared),
            max(DECODERS[c["params"].decoder].rows_per_call(c["params"]) for c in prepared))

    def _auto_fit(self, canvas: int | None, gen_length: int, rows: int) -> int:
        """``batch_size=auto``: the largest batch of ``rows`` rows per request on a canvas of
        ``canvas`` tokens (the last ``gen_length`` predicted) that fits (None: no request, the
        limit), the smallest over the ranks."""
        size = self._auto_batch.limit if canvas is None else self._auto_batch.size(
            self.model, canvas=canvas, gen_length=gen_length, rows_per_request=rows)
        return min(self.ranks.gather_world(size))

    def _finish(self, out, until: list[str]) -> tuple[str, dict]:
        """Text of a decode result, up to its end-of-text (``out.gen_tokens``) and the first
        ``until`` string, and its statistics (the decoder's, with ``gen_tokens`` lowered to the
        tokens before that string)."""
        ids = out.tokens[:out.gen_tokens]
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        cut = cut_at_stop(text, until)
        if cut < len(text):
            out = dataclasses.replace(out, gen_tokens=tokens_before(ids, cut, self.tokenizer))
            text = text[:cut]
        return text, out.stats()
