"""lm-eval's requests as the decoders take them: the planner of a run.

A ``generate_until`` call becomes a :class:`GenerationPlan`: every request prepared before any
is decoded (its decoding parameters from the model args, the task's preset and its generation
kwargs; its prompt encoded and fitted to the context; its seed key), so that bad generation
settings or ``truncation=error`` stop the run before any work; the evaluator's padding copies
set apart; batches formed as HFLM's ``Collator`` does (``batching.batches``), of the size
``batch_size`` or ``batch_size=auto`` gives. Likelihood requests are encoded and ordered here
too, and the chat template is chosen and rendered here (:class:`Prompts`).
"""

from __future__ import annotations

import copy
import dataclasses
import zlib
from collections import defaultdict
from typing import Callable, NamedTuple

from ..decoding.params import PARAMS, DecodeParams, override
from ..decoding.registry import DECODERS, PLANNING_DECODERS
from ..one_line import exit_in_one_line
from .batching import batches
from .request_checks import check_gen_kwargs, fit_prompt, max_gen_toks_value
from .task_presets import task_preset

#: the decoding parameters a request may set (``generation_kwargs``) and the results report
DECODER_KEYS = tuple(name for name, p in PARAMS.items() if p.public)


def public_params(params: DecodeParams) -> dict:
    """The parameters as the results report them (lists for tuples)."""
    return {k: list(v) if isinstance(v, tuple) else v
            for k, v in ((k, getattr(params, k)) for k in DECODER_KEYS)}


def reads_is_greedy(requests) -> list[bool]:
    """Per ``loglikelihood`` request, whether lm-eval reads its ``is_greedy``.

    lm-eval builds one request per document for an ``output_type: loglikelihood`` task (its
    ``acc`` is ``is_greedy``, lambada's) and one per choice for a ``multiple_choice`` task, whose
    accuracy reads the log-likelihoods only. A request read is one alone of its (task, document);
    a request without a document (the Python API's own lists) is read. The evaluator repeats a
    request object ``repeats`` times: the same object counts once."""
    seen: dict[tuple, set[int]] = defaultdict(set)
    for r in requests:
        doc = getattr(r, "doc_id", None)
        if doc is not None:
            seen[(getattr(r, "task_name", None), doc)].add(id(r))
    out = []
    for r in requests:
        doc = getattr(r, "doc_id", None)
        out.append(doc is None or len(seen[(getattr(r, "task_name", None), doc)]) == 1)
    return out


class Prompts:
    """How text becomes prompt ids for ``tokenizer``: a context's encoding (``add_bos_token``),
    lm-eval's split of a likelihood pair, and the chat template, chosen as HFLM's and rendered
    in a worker process (``models/chat_render.py``)."""

    def __init__(self, tokenizer, pretrained: str, add_bos_token: bool | None,
                 notice: Callable[[str], None]):
        self.tokenizer, self.pretrained = tokenizer, pretrained
        self.add_bos_token, self.notice = add_bos_token, notice
        self.template_name: str | None = None

    def encode(self, text: str) -> list[int]:
        """A context's token ids: no special tokens, or with ``add_bos_token=true`` the BOS token
        first unless the text starts with it already (HFLM's ``tok_encode``: a chat template may
        have written it)."""
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        bos = self.tokenizer.bos_token
        if self.add_bos_token and not (bos and text.startswith(bos)):
            ids = [self.tokenizer.bos_token_id, *ids]
        return ids

    def pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        """lm-eval's split: trailing context whitespace moves to the continuation; the
        continuation ids are the tail of the joint encoding."""
        n_spaces = len(context) - len(context.rstrip())
        if n_spaces:
            continuation = context[-n_spaces:] + continuation
            context = context[:-n_spaces]
        whole = self.encode(context + continuation)
        ctx = self.encode(context) if context or self.add_bos_token else []
        return whole[:len(ctx)], whole[len(ctx):]

    def _none(self) -> ValueError:
        error = ValueError(f"--apply_chat_template: the tokenizer of {self.pretrained!r} has no "
                           "chat template (a base checkpoint?); drop --apply_chat_template or use "
                           "an instruct checkpoint")
        exit_in_one_line(error)
        return error

    def chat_template(self, chat_template: bool | str = False) -> str | None:
        """The chat template, chosen as HFLM's (lm-eval's ``TemplateLM.chat_template``): a
        tokenizer with named templates gives the one ``--apply_chat_template NAME`` names (an
        unknown name is a one-line error listing them) or its ``default``; a tokenizer with one
        template gives it (a name is then ignored, with lm-eval's warning). The template chosen
        is the one :meth:`render` applies (HFLM logs the named one but applies the tokenizer's
        default)."""
        from lm_eval.api.model import TemplateLM

        if not chat_template:
            return getattr(self.tokenizer, "chat_template", None)
        if not getattr(self.tokenizer, "chat_template", None):
            raise self._none()
        try:
            chosen = TemplateLM.chat_template(self, chat_template)   # reads self.tokenizer only
        except ValueError as error:
            exit_in_one_line(error)
            raise
        named = isinstance(chat_template, str) and isinstance(self.tokenizer.chat_template, dict)
        self.template_name = chat_template if named else None
        return chosen

    def render(self, chat_history: list[dict[str, str]], add_generation_prompt: bool) -> str:
        """``chat_history`` rendered by the chosen template in a worker process with a time,
        memory and output limit (the template is the checkpoint's program). As HFLM's: a
        template that rejects it (jinja2's ``TemplateError``: many refuse a system message) is
        tried once more without the system messages, with HFLM's warning."""
        from ..models.chat_render import RENDERER, TemplateRejected

        if not getattr(self.tokenizer, "chat_template", None):
            raise self._none()

        def render(history):
            return RENDERER.render(self.tokenizer, history,
                                   add_generation_prompt=add_generation_prompt,
                                   continue_final_message=not add_generation_prompt,
                                   where=repr(self.pretrained), template=self.template_name)
        try:
            return render(chat_history)
        except TemplateRejected:
            self.notice("Failed to apply chat template. removing the system role in chat history.")
            return render([m for m in chat_history if m["role"] != "system"])


class RequestParams(NamedTuple):
    """One request's decoding parameters, its ``until`` strings, the generation kwargs that
    mean nothing to diffusion decoding (``ignored``, with a notice) and its ``max_gen_toks``
    (None: not given), the most answer tokens its text keeps."""

    params: DecodeParams
    until: list[str]
    ignored: list[str]
    max_gen_toks: int | None = None


@dataclasses.dataclass(frozen=True)
class Request:
    """A ``generate_until`` request ready to decode: its ``index`` in lm-eval's list, its
    decoding ``params``, ``until``, the ``prompt_ids`` fitted to the context, its ``task``, its
    ``key`` (``task/doc/idx``: seeds its draws, names its trace record), its ``repeat`` (the
    evaluator's repeats of one document), whether lm-eval's cache keeps its answer
    (``cached``: not ``do_sample``) and ``max_tokens``, the task's ``max_gen_toks`` (None: not
    given): the answer keeps at most that many tokens, whatever the canvas."""

    index: int
    params: DecodeParams
    until: list[str]
    prompt_ids: list[int]
    task: str
    key: str
    repeat: int
    cached: bool
    max_tokens: int | None = None

    @property
    def request_index(self) -> int:
        """The request's number in its seeds (``Batch``: with ``seed`` and ``repeat``)."""
        return zlib.crc32(self.key.encode())


@dataclasses.dataclass
class GenerationPlan:
    """A ``generate_until`` call prepared: the ``requests`` to decode, the evaluator's padding
    ``copies`` ((index, index of the request it copies): answered without decoding or
    counting), ``truncated`` prompts per task, and the ``answers`` as they come, by index."""

    requests: list[Request]
    copies: list[tuple[int, int]]
    truncated: dict[str, int]
    answers: list

    def batches(self, batch_size: int) -> list[list[Request]]:
        """The requests in decoding order, in batches of identical parameters."""
        return [[self.requests[k] for k in members] for members in batches(
            [r.params for r in self.requests], [len(r.prompt_ids) for r in self.requests],
            batch_size)]

    def results(self) -> list:
        """Every answer by index, the copies' included."""
        for i, src in self.copies:
            self.answers[i] = self.answers[src]
        return self.answers


class TaskDecoding:
    """What each task decoded with: the ``presets`` its requests ran with (over the run's
    lifetime) and, per evaluation, every parameter that differed from the run's (``close``
    hands them over and starts afresh)."""

    def __init__(self):
        self.presets: dict[str, str] = {}
        self.params: dict[str, dict[str, set]] = {}

    def note(self, task: str, params: DecodeParams, run: dict) -> None:
        mine = self.params.setdefault(task, {})
        for k, v in public_params(params).items():
            if v != run[k]:
                mine.setdefault(k, set()).add(tuple(v) if isinstance(v, list) else v)

    def info(self) -> dict:
        """``config.pvf.task_params``: per task, each decoding parameter its requests ran with
        where it differs from the run's: the value, or the sorted values when they differed."""
        def shown(values: set):
            out = sorted(values, key=repr)
            out = [list(v) if isinstance(v, tuple) else v for v in out]
            return out[0] if len(out) == 1 else out

        return {task: {k: shown(v) for k, v in sorted(ps.items())}
                for task, ps in sorted(self.params.items())}

    def close(self) -> None:
        self.params = {}


class Planner:
    """The requests of a run (``run``: its settings bound to ``model``) as the decoders take
    them. ``with_vocab`` gives parameters their planning vocabulary; ``ranks`` agree on a
    ``batch_size=auto`` batch; ``notice`` prints a one-line notice."""

    def __init__(self, run, model, prompts: Prompts, with_vocab: Callable, ranks,
                 notice: Callable[[str], None]):
        self.run, self.model, self.prompts = run, model, prompts
        self.decoding, self.options = run.settings.decoding, run.settings.options
        self.with_vocab, self.ranks, self.notice = with_vocab, ranks, notice
        self.params = run.params if run.params.decoder not in PLANNING_DECODERS else \
            with_vocab(run.params)
        self.tasks = TaskDecoding()
        self._presets: dict = {}
        self._notices: set = set()

    # ------------------------------------------------------------ parameters

    def params_under(self, preset) -> DecodeParams:
        """The run's parameters under a task's ``preset`` (``task_presets``); a ``preset``
        model arg wins over it."""
        if preset is None or self.decoding.preset_given:
            return self.params
        if preset not in self._presets:
            self._presets[preset] = self.run.params_under(preset)
        return self._presets[preset]

    def request_params(self, gen_kwargs: dict, task: str | None = None,
                       seed: int | None = None) -> RequestParams:
        """Decoder parameters for one request: model args, the preset of its ``task`` (or of
        its generation kwargs), the run's ``seed`` (without a seed model arg), then the
        request's own overrides; ``gen_length`` is the task's ``max_gen_toks`` rounded up to
        whole blocks unless one is given. ``do_sample=true`` with a temperature of 0 (none given
        in the request or the model args) is a one-line error, as HFLM's."""
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
        if seed is not None and not self.decoding.seed_given:
            overrides.setdefault("seed", seed)
        ignored = sorted(kwargs)
        if ignored and self._first(tuple(ignored)):
            self.notice(f"pvf-dlm: generation kwargs {ignored} do not apply to diffusion "
                        "decoding and are ignored")
        # a preset in the kwargs wins over the task's, none included (lm-eval parses it as None)
        preset = overrides.pop("preset") if "preset" in overrides else task_preset(task)
        base = self.params_under(preset)
        if base is not self.params:
            self.tasks.presets[task or "unknown"] = preset
        params = override(base, **overrides) if overrides else base
        if do_sample is True and params.temperature == 0:
            raise ValueError(
                f"pvf-dlm: do_sample=True with temperature={params.temperature} (task "
                "generation_kwargs, --gen_kwargs or the temperature model arg): sampling needs a "
                "temperature > 0 (HFLM refuses it too); give one, e.g. --gen_kwargs "
                "do_sample=true,temperature=0.7, or do_sample=false for greedy decoding")
        if params.decoder in PLANNING_DECODERS:
            params = self.with_vocab(params)
        if "gen_length" not in overrides and "gen_length" not in self.decoding.given and \
                max_gen_toks:
            length = -(-max_gen_toks // params.block_length) * params.block_length
            if length != max_gen_toks and self._first((max_gen_toks, length)):
                self.notice(f"pvf-dlm: gen_length={length} (the task's max_gen_toks="
                            f"{max_gen_toks} rounded up to whole blocks of {params.block_length}"
                            "); pass gen_length to fix it")
            params = override(params, gen_length=length)
        return RequestParams(params, until, ignored, max_gen_toks)

    def _first(self, key) -> bool:
        """Whether a notice keyed ``key`` is due (each is printed once per run)."""
        if key in self._notices:
            return False
        self._notices.add(key)
        return True

    # ------------------------------------------------------------ generate_until

    def generation(self, requests, seed: int) -> GenerationPlan:
        """Every request of a ``generate_until`` call prepared (``seed``: the run's, for
        requests without their own); the tasks' parameters noted."""
        seen: dict[int, list[int]] = defaultdict(list)
        run = public_params(self.params if self.decoding.seed_given else
                            override(self.params, seed=seed))
        plan = GenerationPlan([], [], {}, [None] * len(requests))
        for i, req in enumerate(requests):
            occurrences = seen[id(req)]
            repeats = max(1, int(getattr(req, "repeats", 1) or 1))
            if len(occurrences) >= repeats:
                # The evaluator pads the last rank with copies of its last request: answer
                # them without decoding again and without counting them.
                plan.copies.append((i, occurrences[len(occurrences) % repeats]))
                occurrences.append(i)
                continue
            repeat = len(occurrences)
            occurrences.append(i)
            context, gen_kwargs = req.args
            task = getattr(req, "task_name", None) or "unknown"
            params, until, _, max_tokens = self.request_params(copy.deepcopy(gen_kwargs), task,
                                                               seed)
            self.tasks.note(task, params, run)
            doc = getattr(req, "doc_id", i)
            prompt_ids, cut = fit_prompt(self.prompts.encode(context), params.gen_length,
                                         self.run.context, self.options.truncation,
                                         where=f"task {task} doc_id {doc}")
            if cut:
                plan.truncated[task] = plan.truncated.get(task, 0) + 1
            plan.requests.append(Request(
                i, params, until, prompt_ids, task, f"{task}/{doc}/{getattr(req, 'idx', 0)}",
                repeat, cached=not gen_kwargs.get("do_sample", False),   # lm-eval's cache
                max_tokens=max_tokens))
        truncated = sum(plan.truncated.values())
        if truncated:
            self.notice(f"pvf-dlm: {truncated} of {len(plan.requests)} prompts did not fit the "
                        f"model's context of {self.run.context} tokens with gen_length and were "
                        "left-truncated (as lm-eval's HFLM does; truncation=error refuses "
                        "instead)")
        return plan

    # ------------------------------------------------------------ batch sizes

    def batch_size(self, requests: list[Request]) -> int:
        """Requests per decoded batch: ``batch_size``, or for ``batch_size=auto`` the largest
        batch of the run's canvas (longest prompt plus gen_length) that fits, the smallest over
        the ranks."""
        if self.options.auto is None:
            return self.options.batch_size
        if not requests:
            return self.auto_fit(None, 0, 0)
        return self.auto_fit(
            max(len(r.prompt_ids) + r.params.gen_length for r in requests),
            max(r.params.gen_length for r in requests),
            max(DECODERS[r.params.decoder].rows_per_call(r.params) for r in requests))

    def likelihood_batch_size(self, items) -> int:
        """Continuations per batch of ``loglikelihood``: ``batch_size``, or for
        ``batch_size=auto`` the largest batch of ``mc_batch`` rows per continuation whose
        longest canvas fits (the smallest over the ranks)."""
        if self.options.auto is None:
            return self.options.batch_size
        if not items:
            return self.auto_fit(None, 0, 0)
        return self.auto_fit(max(len(c.prefix) + len(c.target) for c in items),
                             max(len(c.target) for c in items), self.options.mc_batch)

    def auto_fit(self, canvas: int | None, gen_length: int, rows: int) -> int:
        """``batch_size=auto``: the largest batch of ``rows`` rows per request on a canvas of
        ``canvas`` tokens (the last ``gen_length`` predicted) that fits (None: no request, the
        limit), the smallest over the ranks."""
        auto = self.options.auto
        size = auto.limit if canvas is None else auto.size(
            self.model, canvas=canvas, gen_length=gen_length, rows_per_request=rows)
        return min(self.ranks.gather_world(size))

    # ------------------------------------------------------------ likelihoods

    @staticmethod
    def likelihood_key(req, i: int) -> int:
        """Seed key of a likelihood request: task and document, so that every choice of one
        question is scored under the same random masks (common random numbers)."""
        task = getattr(req, "task_name", None) or "unknown"
        doc = getattr(req, "doc_id", None)
        return zlib.crc32(f"{task}/{doc if doc is not None else i}".encode())

    def check_context(self, n_tokens: int, what: str) -> None:
        if n_tokens > self.run.context:
            raise ValueError(f"pvf-dlm: {what} is {n_tokens} tokens, longer than the model's "
                             f"context of {self.run.context} tokens; shorten the prompt (fewer "
                             "few-shot examples) or lower gen_length")
