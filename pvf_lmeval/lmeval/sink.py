"""Where decoded requests go: the sink of a run.

An answer's text is cut at its end-of-text and its first ``until`` string (:meth:`Sink.text`);
its statistics join the evaluation's totals, shared across the data-parallel ranks by lm-eval's
gathers (:meth:`Sink.gather`) and closed by ``get_model_info`` (:meth:`Sink.close`); its
record goes to the trace file (``trace=PATH``: one file per model copy, emptied by a run's first
``generate_until`` unless ``trace_append``); lm-eval's ``--use_cache`` database, once claimed
(``response_cache``), records what each answer drew with; and ``vocab=online`` learns between
batches and is saved after each call.
"""

from __future__ import annotations

import dataclasses
import json
from contextlib import contextmanager

from tqdm import tqdm

from ..decoding.registry import DECODERS
from ..files.append import open_records
from .generation import GenerationText, cut_at_stop, tokens_before
from .stats import StatTotals
from .trace_records import trace_record


class Sink:
    """The answers of one run: ``tokenizer`` detokenizes, ``model_name`` and ``model_family``
    name the model in traces and artifacts, ``vocab`` is the run's planning vocabulary,
    ``options`` its settings' (trace), ``ranks`` the processes."""

    def __init__(self, *, tokenizer, model_name: str, model_family: str, vocab, options, ranks):
        self.tokenizer, self.model_name, self.model_family = tokenizer, model_name, model_family
        self.vocab, self.options, self.ranks = vocab, options, ranks
        #: this rank's statistics not yet shared with the other ranks, and the evaluation's
        #: totals (``get_model_info`` reports and closes them: lm-eval asks once per evaluation)
        self.pending, self.totals = StatTotals(), StatTotals()
        #: lm-eval's --use_cache database as claimed (``response_cache.ResponseCache``), or None
        self.cache = None
        self._traced = False

    # ------------------------------------------------------------ text and totals

    def text(self, out, until: list[str], max_tokens: int | None = None) -> tuple[str, dict]:
        """Text of a decode result, up to its end-of-text (``out.gen_tokens``), its first
        ``max_tokens`` tokens (the task's ``max_gen_toks``, HFLM's ``max_new_tokens``: the canvas
        may be longer) and the first ``until`` string, and its statistics (the decoder's, with
        ``gen_tokens`` lowered to the tokens kept)."""
        ids = out.tokens[:out.gen_tokens]
        if max_tokens is not None and len(ids) > max_tokens:
            ids = ids[:max_tokens]
            out = dataclasses.replace(out, gen_tokens=max_tokens)
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        cut = cut_at_stop(text, until)
        if cut < len(text):
            out = dataclasses.replace(out, gen_tokens=tokens_before(ids, cut, self.tokenizer))
            text = text[:cut]
        return text, out.stats()

    def gather(self, obj) -> list:
        """Every model copy's ``obj``, on every process (lm-eval's ``gather_object``).

        Each gather also carries every copy's statistics not yet shared, which each process adds
        to the evaluation's totals. lm-eval's evaluator gathers its metrics on every rank at the
        end of each evaluation, so rank 0 reports every copy's requests, those answered from
        ``--use_cache`` included, and ``generate_until`` needs no collective of its own (a rank
        answered wholly from the cache never calls it)."""
        out = self.ranks.gather_object((obj, self.pending.state()))
        self.pending = StatTotals()
        for _, state in out:
            self.totals.absorb(state)
        return [o for o, _ in out]

    def close(self) -> dict:
        """The evaluation's totals (under data parallel: shared already), and a fresh start."""
        self.totals.absorb(self.pending.state())
        self.pending = StatTotals()
        totals, self.totals = self.totals.summary(), StatTotals()
        return totals

    def drew(self, kind: str) -> None:
        """A likelihood answered (its draws follow the seed): the cache records it."""
        if self.cache is not None:
            self.cache.drew(kind)

    # ------------------------------------------------------------ one generate_until call

    @contextmanager
    def answering(self, plan, *, quiet: bool, gather):
        """An :class:`Answers` of ``plan`` while its batches are decoded, with its progress bar
        (``quiet``: none) and trace file open; then ``vocab=online`` learns from the call and is
        saved. ``gather`` merges the ranks' online outcomes (``online_merge``)."""
        for task, n in plan.truncated.items():
            self.pending.count(task, "truncated_prompts", n)
        trace = None
        if self.options.trace and self.ranks.writes:     # one file per model copy
            path = self.options.trace if self.ranks.dp_size == 1 else \
                f"{self.options.trace}.rank{self.ranks.dp_rank}"
            # a run starts its trace afresh (a rerun must not add duplicates), later calls of
            # the same run append; trace_append=true keeps what the file held
            trace = open_records(path, truncate=not (self.options.trace_append or self._traced))
            self._traced = True
        answers = Answers(self, plan, trace, gather,
                          tqdm(total=len(plan.answers), initial=len(plan.copies), disable=quiet,
                               desc="pvf-dlm"))
        try:
            yield answers
        finally:
            answers.bar.close()
            if trace is not None:
                trace.close()
        if self.vocab.online is not None:
            self.vocab.update(gather)
            self.vocab.requests += answers.done
            if self.ranks.writes:
                self.vocab.save(tokenizer=self.tokenizer, model_family=self.model_family,
                                model_name=self.model_name, rank=self.ranks.dp_rank,
                                world_size=self.ranks.dp_size)


class Answers:
    """The answers of one ``generate_until`` call as its batches are decoded."""

    def __init__(self, sink: Sink, plan, trace, gather, bar):
        self.sink, self.plan, self.trace, self.gather, self.bar = sink, plan, trace, gather, bar
        self.done = self.nfe = 0

    def next_batch(self) -> None:
        """``vocab=online`` learns between batches of requests, never inside one."""
        if self.sink.vocab.online is not None and self.done:
            self.sink.vocab.update(self.gather)

    def add(self, batch, outs) -> None:
        """The answers of ``batch`` (planned requests) from their decode results ``outs``."""
        sink = self.sink
        for r, out in zip(batch, outs):
            text, stats = sink.text(out, r.until, r.max_tokens)
            self.plan.answers[r.index] = GenerationText(text, meta=stats, task=r.task)
            sink.pending.add(r.task, stats)
            if sink.cache is not None and r.cached:
                sink.cache.answered(r.task, drew=r.params.temperature > 0
                                    or DECODERS[r.params.decoder].draws)
            if self.trace is not None:
                self.trace.write(json.dumps(trace_record(
                    out, request=r.key, prompt_ids=r.prompt_ids, tokenizer=sink.tokenizer,
                    model=sink.model_name, block_length=r.params.block_length)) + "\n")
            self.nfe += out.nfe
            self.done += 1
        self.bar.set_postfix(nfe=f"{self.nfe / self.done:.1f}")
        self.bar.update(len(batch))
