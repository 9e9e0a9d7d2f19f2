"""The lm-eval model ``pvf-dlm``: diffusion LMs decoded by PVF and the baseline decoders.

    lm_eval --model pvf-dlm --model_args pretrained=tiny-llada,decoder=pvf --tasks ...

This module holds lm-eval's protocol only: the settings are parsed once (:mod:`.settings`),
requests become batches in the planner (:mod:`.planner`: parameters, prompts, chat templates,
truncation, grouping) and answers go to the sink (:mod:`.sink`: text, totals, trace, the
response cache, the online vocabulary). Decoding lives in ``pvf_lmeval.decoding``, model loading
in ``pvf_lmeval.models``.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
from contextlib import contextmanager

import lm_eval.models  # noqa: F401  (fills the registry with the built-ins before we register)
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model
from lm_eval.utils import simple_parse_args_string
from tqdm import tqdm

from ..decoding import DECODERS, decode_batch
from ..decoding.blocks import block_size_of
from ..decoding.cache import cache_exact
from ..models.diffusion_lm import compile_seconds
from ..one_line import exit_in_one_line, one_line_errors
from ..planning.vocab import RunVocab
from .generation import LikelihoodScore
from .launch import start
from .model_args import default_pretrained_notice
from .planner import Planner, Prompts, public_params, reads_is_greedy
from .settings import CLI_DEVICE, RunSettings
from .sink import Sink
from .task_presets import task_preset

log = logging.getLogger("pvf_lmeval")

#: what the CLI passes as ``--device`` when the user said nothing
CLI_DEFAULT_DEVICE = "cuda:0"
#: what the CLI passes as ``--batch_size`` when the user said nothing
CLI_DEFAULT_BATCH_SIZE = "1"


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
    """lm-eval adapter for masked diffusion LMs (LLaDA, Dream, the block-diffusion and MoE
    families, the bundled tiny fixtures).

    ``--model_args``: the model (``pretrained``, ``dtype``, ``device``, ...), the processes
    (``tensor_parallel_size``), the planning vocabulary (``vocab``), every decoding parameter
    (``decoder``, ``gen_length``, ``block_length``, ``threshold``, ...) and the run's options
    (``batch_size``, ``batch_invariant``, ``trace``, ...): ``pvf-dlm args`` lists them. Task
    ``generation_kwargs`` and ``--gen_kwargs`` override decoding parameters per request.
    """

    def __init__(self, **model_args):
        super().__init__()
        # every argument is checked here, before the model loads: bad input fails fast, in one line
        self.settings = RunSettings.parse(model_args)
        self.vocab = RunVocab(self.settings.vocabulary.spec, self.settings.vocabulary.cfg)
        if self.settings.remote_code_asked:
            _notice("pvf-dlm: trust_remote_code is ignored: checkpoints load into the native "
                    "network, no remote code runs")
        # several processes: the (dp, mp) mesh; lm-eval sees the data-parallel rank and size
        self.ranks, self.model = start(self.settings, _notice)
        self._rank, self._world_size = self.ranks.dp_rank, self.ranks.dp_size
        self.run = self.settings.bind(self.model)
        self._compile_s0 = self._compile()
        self.tokenizer = self.model.tokenizer
        self.pretrained = self.settings.model.pretrained
        self.prompts = Prompts(self.tokenizer, self.pretrained, self.settings.options.add_bos_token,
                               _notice)
        self.planner = Planner(self.run, self.model, self.prompts, self._with_vocab, self.ranks,
                               _notice)
        self.sink = Sink(tokenizer=self.tokenizer, model_name=self.pretrained,
                         model_family=self.model.family, vocab=self.vocab,
                         options=self.settings.options, ranks=self.ranks)

    def _compile(self) -> float | None:
        """torch.compile the model call (``compile``, off by default); the compile seconds
        spent so far when something runs compiled (the warm-up is what compiles after this)."""
        scope = self.settings.model.compile
        if scope:
            self.model.compile(scope=scope)
        if scope or self.settings.options.decode.compile_round is not None:
            return compile_seconds()
        return None

    def _with_vocab(self, params):
        """``params`` carrying the planning vocabulary, resolved once on first need."""
        return self.vocab.resolve(params, model=self.model, tokenizer=self.tokenizer,
                                  model_name=self.pretrained)

    # ------------------------------------------------------------------ what ran

    @property
    def params(self):
        """The run's decoding parameters (before any task's preset or generation kwargs)."""
        return self.planner.params

    @property
    def max_length(self) -> int:
        """The context in tokens: the ``max_length`` model arg (as HFLM's: prompts are cut to
        it), else the checkpoint's."""
        return self.run.context

    @property
    def batch_size(self) -> int | str:
        return self.settings.options.batch_size

    @property
    def batch_sizes(self) -> dict:
        """``batch_size=auto``: the batch picked per (canvas tokens, rows per request) (lm-eval
        reports these values as ``batch_sizes``)."""
        auto = self.settings.options.auto
        return dict(auto.sizes) if auto is not None else {}

    @property
    def online(self):
        """The run's ``OnlineVocab`` (``vocab=online``), else None."""
        return self.vocab.online

    @property
    def vocab_source(self) -> str:
        return self.vocab.source

    @property
    def device(self):
        return self.model.device

    @property
    def tokenizer_name(self) -> str:
        return self.pretrained.replace("/", "__")

    # ------------------------------------------------------------------ lm-eval plumbing

    @classmethod
    def _merge(cls, args: dict, additional_config: dict | None) -> dict:
        """``--model_args`` win over the CLI's ``batch_size``/``device`` defaults; a
        ``batch_size`` in ``--model_args`` and another ``--batch_size`` than lm-eval's default
        (1, which the CLI passes when none is given) is a one-line error, as HFLM refuses both."""
        merged = dict(args)
        for key, value in (additional_config or {}).items():
            if key == "batch_size" and key in merged and value is not None and \
                    str(value) not in (str(merged[key]), CLI_DEFAULT_BATCH_SIZE):
                error = ValueError(f"pvf-dlm: batch_size={merged[key]} in --model_args and "
                                   f"--batch_size {value} disagree; give one of them")
                exit_in_one_line(error)
                raise error
            if value is None or key in merged:
                continue
            merged[key] = value
            if key == "device" and value == CLI_DEFAULT_DEVICE:
                merged[CLI_DEVICE] = True
        return merged

    @classmethod
    def _create(cls, args: dict):
        """The model, or the argument error, which lm-eval's CLI then prints as one line."""
        if notice := default_pretrained_notice(args):
            _notice(notice)
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

    def chat_template(self, chat_template: bool | str = False) -> str | None:
        """The chat template, chosen as HFLM's (``planner.Prompts.chat_template``)."""
        return self.prompts.chat_template(chat_template)

    def apply_chat_template(self, chat_history: list[dict[str, str]],
                            add_generation_prompt: bool = True) -> str:
        """``chat_history`` rendered by the chosen template (``planner.Prompts.render``)."""
        return self.prompts.render(chat_history, add_generation_prompt)

    def all_gather(self, tensor):
        return self.ranks.all_gather(tensor)

    def gather_object(self, obj, dst: int = 0) -> list:
        """Every model copy's ``obj``, on every process, with the copies' statistics not yet
        shared (``Sink.gather``; lm-eval 0.4.13's evaluator calls it with dst=0)."""
        return self.sink.gather(obj)

    def barrier(self) -> None:
        self.ranks.barrier()

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

        identity = cache_identity(self._info(), self.settings.options.mc_num,
                                  weights=self.model.weights_fingerprint,
                                  tokenizer_hash=tokenizer_hash(self.tokenizer))
        self.sink.cache = ResponseCache.claim(
            db, identity, seed=self._run_seed(), task_decoding=self._task_decoding,
            record=lambda text: self.sink.pending.add(text.task, text.meta, from_cache=True))

    def _task_decoding(self, task: str) -> dict:
        """How ``task``'s requests decode before their own generation kwargs (which lm-eval's
        cache key holds): the run's parameters under the task's preset, spelled as the run
        identity spells them, without the seed (``response_cache`` records it per answer)."""
        from .identity import decoding_identity

        params = public_params(self.planner.params_under(task_preset(task)))
        params.pop("seed")
        return decoding_identity(self.params.decoder, params)

    def get_model_info(self) -> dict:
        """``config.pvf`` of the results: what ran, and the totals of the evaluation's requests.

        lm-eval calls it once per evaluation, at its end (``simple_evaluate``), so the report
        closes the evaluation: each evaluation on one model instance reports its own requests
        (a second call without new requests reports none)."""
        info = {"pvf": {**self._info(), "totals": self.sink.close()}}
        self.planner.tasks.close()
        return info

    def _info(self) -> dict:
        """What ran: model, device, decoder and parameters (the seed that draws), vocabulary,
        batching, likelihood settings, compile."""
        s, params = self.settings, public_params(self.params)
        params["seed"] = self._run_seed()
        block = block_size_of(self.model)
        return {
            "pretrained": self.pretrained,
            "model_family": self.model.family,
            "device": str(self.model.device),       # what ran, not lm-eval's --device default
            "dtype": str(self.model.dtype).replace("torch.", ""),
            "truncation": s.options.truncation,
            # what shapes the prompts besides the checkpoint (None: the checkpoint's own)
            "max_length": s.model.max_length, "add_bos_token": s.options.add_bos_token,
            "tokenizer": s.model.tokenizer, "revision": s.model.revision,
            "decoder": self.params.decoder,
            "params": params,
            "seed_from": "seed model arg" if s.decoding.seed_given else "lm-eval --seed (torch's seed)",
            "early_stop": self.params.early_stop,
            "task_presets": dict(self.planner.tasks.presets),
            "task_params": self.planner.tasks.info(),
            # a block-diffusion or uniform-state model's cache is exact (docs/decoding.md)
            "block_size": block,
            "cache_exact": cache_exact(self.params.cache, block,
                                       getattr(self.model, "canvas_length", None) is not None),
            **self.vocab.info(),
            "batch_size": self.batch_size,
            "batch_invariant": s.options.decode.batch_invariant,
            "parallel": self.ranks.info(self.model),
            "likelihood": {**dataclasses.asdict(s.options.likelihood),
                           "mc_batch": s.options.mc_batch},
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

    # ------------------------------------------------------------------ requests

    @one_line_errors
    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Plan every request (none decoded before all are checked), decode the plan's batches,
        answer each through the sink."""
        self.ranks.same_on_every_rank("the requests", [r.args for r in requests])
        plan = self.planner.generation(requests, seed=self._run_seed())
        batch_size = self.planner.batch_size(plan.requests)
        gather = self.gather_object if self.world_size > 1 else None
        with self.sink.answering(plan, quiet=disable_tqdm or self.ranks.rank != 0,
                                 gather=gather) as answers:
            for batch in plan.batches(batch_size):
                answers.next_batch()
                answers.add(batch, self._decode(batch))
        return plan.results()

    def _decode(self, batch) -> list:
        """The decode results of ``batch``, planned requests with identical parameters, decoded
        as one batch (an out-of-memory error says what to lower). Every rank of a model copy
        decodes alike, trace records included."""
        import torch

        params = batch[0].params
        rows = DECODERS[params.decoder].rows_per_call(params)
        longest = max(len(r.prompt_ids) for r in batch) + params.gen_length
        with self._oom_guard("decoding", rows * len(batch), longest):
            outs = decode_batch(
                self.model, [torch.tensor(r.prompt_ids) for r in batch], params=params,
                request_indices=[r.request_index for r in batch],
                repeat_indices=[r.repeat for r in batch], trace=bool(self.settings.options.trace),
                online=self.online, options=self.settings.options.decode)
        self.ranks.same_on_every_rank("the committed tokens", [o.tokens for o in outs])
        return outs

    @contextmanager
    def _oom_guard(self, what: str, rows: int, tokens: int):
        """Re-raise an out-of-memory error as one line saying what to lower."""
        import torch

        try:
            yield
        except torch.OutOfMemoryError:
            raise PVFOutOfMemoryError(oom_message(
                what=what, device=self.device, rows=rows, tokens=tokens, dtype=self.model.dtype,
                batch_size=self.batch_size, mc_batch=self.settings.options.mc_batch)) from None

    @one_line_errors
    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        """LLaDA's Monte Carlo ELBO of each continuation (``mc_num`` draws seeded by ``seed`` and
        the request's task/document, under ``cfg_scale``, ``mc_stratum`` and ``mask_logit``) and
        ``is_greedy`` where lm-eval reads it (:func:`reads_is_greedy`): LLaDA's
        ``suffix_greedy_prediction``, its first step read from the draws when they hold it
        (``decoding.likelihood``). Where lm-eval does not read it (the choices of a
        ``multiple_choice`` document) it is False and nothing runs for it.

        As HFLM's ``Collator`` does, requests are sorted (longest context first, the choices of
        one context together) and scored ``batch_size`` at a time: one batch's draws share model
        calls of at most ``batch_size * mc_batch`` distinct canvases, and so do its greedy
        checks. Each answer's costs (model calls, rows, canvases, draws) join its task's totals."""
        from ..decoding.likelihood import Continuation, loglikelihoods, suffix_greedy

        self.ranks.same_on_every_rank("the requests", [r.args for r in requests])
        opts = self.settings.options
        est = opts.likelihood
        out: list = [None] * len(requests)
        items: dict[int, Continuation] = {}
        for i, req in enumerate(requests):
            ctx_ids, cont_ids = self.prompts.pair(req.args[0], req.args[1])
            if not cont_ids:
                out[i] = (0.0, True)
                continue
            self.planner.check_context(len(ctx_ids) + len(cont_ids), "context + continuation")
            items[i] = Continuation(ctx_ids, cont_ids, self.planner.likelihood_key(req, i))
        greedy_read = reads_is_greedy(requests)
        order = sorted(items, key=lambda i: (-len(items[i].prefix), items[i].prefix,
                                             -len(items[i].target)))
        size = self.planner.likelihood_batch_size([items[i] for i in order])
        seed = self._run_seed()
        bar = tqdm(total=len(requests), initial=len(requests) - len(items),
                   disable=disable_tqdm or self.ranks.rank != 0, desc="pvf-dlm loglikelihood")
        try:
            for a in range(0, len(order), size):
                batch = order[a:a + size]
                chunk = [items[i] for i in batch]
                longest = max(len(c.prefix) + len(c.target) for c in chunk)
                rows = size * opts.mc_batch
                with self._oom_guard("scoring continuations", rows * est.rows_per_canvas,
                                     longest):
                    scores = loglikelihoods(self.model, chunk, estimator=est, rows_per_call=rows,
                                            seed=seed, batch_invariant=opts.decode.batch_invariant)
                    check = [j for j, i in enumerate(batch)
                             if greedy_read[i] and scores[j].is_greedy is None]
                    checks = suffix_greedy(
                        self.model, [chunk[j] for j in check],
                        [scores[j].greedy_first for j in check], estimator=est,
                        rows_per_call=rows, batch_invariant=opts.decode.batch_invariant)
                checked = dict(zip(check, checks))
                for j, (i, r) in enumerate(zip(batch, scores)):
                    task = getattr(requests[i], "task_name", None) or "unknown"
                    greedy, stats = (bool(r.is_greedy) if greedy_read[i] else False), r.stats()
                    if j in checked:            # the check's own calls join the answer's
                        c = checked[j]
                        greedy = c.value
                        stats.update(nfe=stats["nfe"] + c.calls,
                                     canvases=stats["canvases"] + c.canvases,
                                     branch_rows=stats["branch_rows"]
                                     + c.canvases * est.rows_per_canvas)
                    out[i] = (LikelihoodScore(r.logprob, stats), greedy)
                    self.sink.pending.add_likelihood(task, stats, greedy_check=j in checked)
                    self.cache_hook.add_partial("loglikelihood", requests[i].args[:2], out[i])
                self.sink.drew("likelihood")
                bar.update(len(batch))
        finally:
            bar.close()
        return out

    @one_line_errors
    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """Sum of ELBO estimates over lm-eval's disjoint rolling windows of the model's context
        (each window conditioned on one token before it, as lm-eval does for causal models); the
        windows of one text share model calls of at most ``batch_size * mc_batch`` canvases."""
        from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

        from ..decoding.likelihood import rolling_loglikelihood

        opts = self.settings.options
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
            rows = (self.batch_size if opts.auto is None else 1) * opts.mc_batch
            with self._oom_guard("scoring a rolling window",
                                 rows * opts.likelihood.rows_per_canvas, self.max_length):
                r = rolling_loglikelihood(self.model, windows, estimator=opts.likelihood,
                                          mc_batch=rows, seed=self._run_seed(),
                                          request_index=self.planner.likelihood_key(req, i),
                                          batch_invariant=opts.decode.batch_invariant)
            out.append(LikelihoodScore(r.logprob, r.stats()))
            self.sink.pending.add_likelihood(getattr(req, "task_name", None) or "unknown",
                                             r.stats())
            self.cache_hook.add_partial("loglikelihood_rolling", (string,), r.logprob)
            self.sink.drew("likelihood")
        return out
