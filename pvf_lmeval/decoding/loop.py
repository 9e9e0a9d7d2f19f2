"""The one decode loop and its result record (docs/decoding.md, "Shared loop" and "Statistics").

Every request of a batch (one included) goes through the same rounds::

    stats = call([y])                          # NFE 1, on the initial canvas
    while some request still decodes:
        rows  = step.branches(y, stats)        # [R, M, L] + rows per request (0: no call)
        out   = call(rows)                     # one round of model calls for every request
        y, stats = step.choose(rows, out)      # the committed row and its stats, per request
        early stop, finished requests leave the batch

All of it runs as tensor operations over the live requests (:class:`Live`). A round is: call
(:class:`.runner.Runner`), settle and prepare (:mod:`.rounds`), with the cache commit between
them, then one host read and the retirement of the finished requests (:func:`retire`). The
next round's branches are built at the end of the round before, so that the host reads their
call layout together with the round's stop positions and flags (one :class:`.host_row.HostRow`
per request); the branches of requests that finished are then dropped. Outside the rounds: the
initial call's layout, round 0's, and at the end the finished requests' outputs, one read each.
After every commit the early-stop rule is applied: e = first end-of-text position with every
earlier position settled (decided, and for a revocable decoder in a block before its active
one); every later position gets the token at e (overwriting) and route None.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from torch import Tensor

from ..tensors.uploads import upload
from . import rounds
from .batch import Batch
from .cache import cache_exact
from .compiled import round_programs
from .rounds import TALLY, Settled
from .host_row import HostRow
from .runner import Runner
from .stats import Stats
from .step import AR, BASE, EDIT, EXPLORE, FORCED, NONE, PLAN, ROUTE_NAMES, Branches, take_rows

#: exactly the keys of docs/decoding.md "Statistics", in order.
STAT_KEYS = ("nfe", "branch_rows", "gen_length", "gen_tokens", "committed", "tpf", "wall_s",
             "tps", "tokens_base", "tokens_plan", "tokens_ar", "tokens_forced", "tokens_explore",
             "tokens_edit", "edits", "remasks")
#: the rates of the statistics, as (numerator, denominator): tokens per forward (model call),
#: tokens per second; over several requests, a ratio of sums
RATES = {"tpf": ("gen_tokens", "nfe"), "tps": ("gen_tokens", "wall_s")}


def rate(numerator: float, denominator: float) -> float:
    """A rate of :data:`RATES`: ``numerator / denominator``, 0 when nothing ran (no call, no
    time)."""
    return numerator / denominator if denominator > 0 else 0.0


@dataclass
class DecodeResult:
    """Outcome of decoding one request.

    tokens:      the ``gen_length`` generated ids (early-stop fill included).
    nfe:         model calls, the initial one included; branch_rows: sum of their batch rows.
    routes:      per generated position 'base'|'plan'|'ar'|'forced'|'explore'|'edit', or None
                 for positions filled by early stop (or remasked and never decided again).
    committed:   tokens the decoder committed itself (positions with a route).
    gen_tokens:  tokens before the first end-of-text id (the LM may lower it for ``until``;
                 use ``dataclasses.replace``).
    wall_s:      wall seconds of decoding, device synchronised.
    early_stop:  whether the early-stop option was on.
    steps:       per-step trace records when decoding with ``trace=True``, else None.
    """

    tokens: list[int]
    nfe: int
    branch_rows: int
    routes: list[str | None]
    committed: int
    gen_tokens: int
    gen_length: int
    wall_s: float
    early_stop: bool
    tokens_base: int = 0
    tokens_plan: int = 0
    tokens_ar: int = 0
    tokens_forced: int = 0
    tokens_explore: int = 0
    tokens_edit: int = 0
    #: rewrites of a decided token / decided positions made open again (revocable decoders;
    #: every one counted, also of one position twice)
    edits: int = 0
    remasks: int = 0
    decoder: str = ""
    steps: list[dict] | None = field(default=None, repr=False)
    #: planning candidates verified / passing the impact-set check (pvf); not in ``stats()``
    plan_tried: int = 0
    plan_passed: int = 0
    #: the model's attention block size (None: bidirectional); not in ``stats()``
    block_size: int | None = None
    #: whether the KV cache gives exactly the logits of uncached calls: no cache, or any cache
    #: on a block-diffusion model (finished blocks cannot see later ones) or a uniform-state
    #: one (the encoder's keys of the context); not in ``stats()``
    cache_exact: bool = True

    @property
    def tpf(self) -> float:
        return rate(self.gen_tokens, self.nfe)

    @property
    def tps(self) -> float:
        return rate(self.gen_tokens, self.wall_s)

    def stats(self) -> dict:
        """The "Statistics" record of docs/decoding.md (exactly ``STAT_KEYS``)."""
        return {k: getattr(self, k) for k in STAT_KEYS}


@dataclass
class Live:
    """The decoding state of the live requests, one row each, in ``ids`` order.

    ids: the requests' numbers; y [R, L]: committed states; st: their stats; routes [R, L] int8
    and tally [R, 4] (:data:`.rounds.TALLY`): what their result records so far; state: the
    step's per-request state (``Step.start``); br: the branches prepared for the next call,
    draws: the draws they were built with (the call hook reads them) and layout: their call
    layout as the host read it."""

    ids: list[int]
    y: Tensor
    st: Stats
    routes: Tensor
    tally: Tensor
    state: dict | None
    br: Branches
    draws: tuple
    layout: list[HostRow]


def run(model, prompts: list[Tensor], params, step, *, request_indices: list[int] | None = None,
        repeat_indices: list[int] | None = None, trace: bool = False, vocab=None,
        invariant: bool = False, compile_step: dict | None = None,
        compile_round: dict | None = None) -> list[DecodeResult]:
    """Decode ``prompts`` (1-D long tensors on the model device) together with ``step`` (a
    decoder step object); results in order.

    Every round is: call (the runner makes the model calls of the prepared branches), settle
    (the step's choice, the commit, early stop), commit (the KV caches keep the committed
    rows), prepare (the next round's branches and call layout), read (one host read: stop flags
    and that layout) and retire (finished requests leave with their outputs).

    ``vocab``: the planning vocabulary (``eligible_mask(tok)``; an online one also records),
    None for none. Wall time: every request is charged an equal share of the batch's wall
    time, so that ``tps`` (a ratio of sums) is the batch's throughput. ``invariant``: the
    decoding side's sums in a fixed order (batch-invariant decoding; the model's own kernels
    are the caller's to select). ``compile_step`` / ``compile_round``: ``torch.compile``
    options of the statistics pass / the round's programs (None: eager).
    """
    n = len(prompts)
    if n == 0:
        return []
    b = Batch(model, prompts, params, vocab=vocab,
              request_indices=list(request_indices) if request_indices is not None else
              list(range(n)),
              repeat_indices=list(repeat_indices) if repeat_indices is not None else [0] * n,
              reveal=step.reveal, invariant=invariant, switches=step.switches)
    runner = Runner(model, b, compile_step=compile_step, hook=step.call_hook)
    settle, prepare = round_programs(compile_round, _config(b, step))
    records = [[] for _ in range(n)] if trace else None
    finals: list[tuple[list[int], Tensor]] = []     # finished requests, outputs on the device
    _sync(b.device)
    t0 = time.perf_counter()
    live = _start(b, runner, step)
    t = 0
    while live is not None:
        br = live.br
        out = runner.call(br.rows, br.n, layout=live.layout, entropy=br.entropy,
                          cover=br.cover, max_rows=step.max_rows, open=br.open,
                          draws=live.draws, hook_args=br.hook, shadow=br.shadow)
        s = settle(b, step, live.y, live.st, live.state, br, out, live.routes, live.tally)
        if s.choice.record is not None:     # a step's side effects are the loop's
            step.record(b, s.choice.record)
        runner.commit_caches(s.y)
        runner.commit_carry(s.pick, s.made)
        # the next round's branches, for every live request (those that finish now are dropped
        # below), so that their layout comes with the stop flags in the round's one read
        draws = _draws(b, step, s.choice.state, s.st)
        nbr, table = prepare(b, runner, step, s.y, s.st, s.choice.state, draws,
                             s.stop, s.finished, s.made, s.unmade, s.unsettled)
        host = _count_unmade(runner, live.ids, HostRow.read(table))
        if records is not None:
            _trace(records, step, live.ids, t, runner, s, br, host)
        t += 1
        for h in host:
            if not h.finished and not h.made_call:
                raise RuntimeError(f"decoder {step.name!r} made no call on an unfinished state")
            if h.unsettled:
                raise RuntimeError(f"decoder {step.name!r} remasked or edited a settled position "
                                   "(revocable commits stay inside the working blocks)")
        live = retire(b, runner, live.ids, s, nbr, draws, host, finals)
    done_at = _outputs(finals, n, b.L)                          # the finished requests: one read
    _sync(b.device)
    share = (time.perf_counter() - t0) / n
    eos = set(int(i) for i in model.eos_ids)
    results = []
    L = params.gen_length
    for i in range(n):
        tokens, route_codes, (tried, passed, edits, remasks) = done_at[i]
        tokens, route_codes = b.answer(i, tokens), b.answer(i, route_codes)
        counts = [route_codes.count(c) for c in range(len(ROUTE_NAMES))]
        gen_tokens = next((k for k, tk in enumerate(tokens) if tk in eos), L)
        results.append(DecodeResult(
            tokens=tokens, nfe=runner.nfe[i], branch_rows=runner.rows[i],
            routes=[ROUTE_NAMES[c] for c in route_codes], committed=L - counts[NONE],
            gen_tokens=gen_tokens, gen_length=L, wall_s=share, early_stop=b.early_stop,
            tokens_base=counts[BASE], tokens_plan=counts[PLAN], tokens_ar=counts[AR],
            tokens_forced=counts[FORCED], tokens_explore=counts[EXPLORE],
            tokens_edit=counts[EDIT], edits=edits, remasks=remasks, decoder=step.name,
            steps=records[i] if records is not None else None, plan_tried=tried,
            plan_passed=passed, block_size=b.block_size,
            cache_exact=cache_exact(params.cache, b.block_size, b.uniform)))
    return results


def _start(b: Batch, runner: Runner, step) -> Live:
    """Every request live, after the initial call (NFE 1, on the initial canvas; it reads its
    own layout) and its cache commit, with round 0's branches prepared (eager) and read."""
    n, dev = b.n, b.device
    y = b.initial()
    ones = torch.ones(n, dtype=torch.long, device=dev)
    state = step.start(b)
    st = runner.call(y.unsqueeze(1), ones, open=step.open(b, y, state).unsqueeze(1),
                     entropy=step.entropy, draws=b.draw(step.first_draws(b, state))).pick(
        torch.zeros_like(ones))
    runner.commit_caches(y)
    runner.commit_carry(torch.zeros_like(ones), ones.bool())
    none = torch.zeros(n, dtype=torch.bool, device=dev)
    draws = _draws(b, step, state, st)
    br, table = rounds.prepare(b, runner, step, y, st, state, draws,
                               torch.full_like(ones, -1), none, none)
    layout = _count_unmade(runner, b.ids, HostRow.read(table))
    return Live(b.ids, y, st, torch.zeros((n, b.L), dtype=torch.int8, device=dev),
                torch.zeros((n, len(TALLY)), dtype=torch.long, device=dev), state, br, draws,
                layout)


def retire(b: Batch, runner: Runner, ids: list[int], s: Settled, nbr: Branches, draws: tuple,
           host: list[HostRow], finals: list) -> Live | None:
    """The live requests after a round (``s``, the next branches ``nbr`` and the draws they
    were built with, the round's ``host`` rows): the finished ones get the early-stop fill and
    leave, their outputs (tokens, route codes, tally) appended to ``finals`` on the device;
    None when none is left."""
    y, routes, tally, st, state = s.y, s.routes, s.tally, s.st, s.choice.state
    if any(h.finished for h in host):
        e = s.stop
        fill = (b.idx > b.fill_from(e)[:, None]) & (e[:, None] >= 0)
        y = torch.where(fill, y.gather(1, e.clamp(min=0)[:, None]), y)
        routes = torch.where(fill, torch.zeros_like(routes), routes)
        end = [r for r, h in enumerate(host) if h.finished]
        finals.append(([ids[r] for r in end], torch.cat([y, routes.long(), tally], 1)
                       .index_select(0, upload(end, b.device))))
        keep = [r for r, h in enumerate(host) if not h.finished]
        ids, host = [ids[r] for r in keep], [host[r] for r in keep]
        if not ids:
            return None
        kt = upload(keep, b.device)
        y, routes, tally, st = (y.index_select(0, kt), routes.index_select(0, kt),
                                tally.index_select(0, kt), st.select(kt))
        state, nbr, draws = take_rows(state, kt), nbr.select(kt), take_rows(draws, kt)
        b.live(ids)
    return Live(ids, y, st, routes, tally, state, nbr, draws, host)


def _draws(b: Batch, step, state: dict | None, st) -> tuple:
    """The draws of the step's plan for the next round (``Step.draw_plan``; ``st``: the stats
    the step's branches get), made before the step."""
    return b.draw(step.draw_plan(b, state, st))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _config(b, step) -> tuple:
    """What the round's compiled programs hold constant (``compile_round``): the decoder and
    its parameters, and the batch's rules that do not depend on its requests."""
    vocab = b.vocab
    return (type(step), b.p, b.mask_id, b.block_size, b.invariant, type(vocab),
            getattr(vocab, "learning", None), getattr(vocab, "explore_slots", None))


def _count_unmade(runner: Runner, ids: list[int], host: list[HostRow]) -> list[HostRow]:
    """Adds each live request's unmade calls (``HostRow.unmade``: this round's, and the next
    round's of those that stay live) to its NFE; returns ``host``."""
    for i, h in zip(ids, host):
        runner.nfe[i] += h.unmade
    return host


def _outputs(finals: list[tuple[list[int], Tensor]], n: int, L: int) -> list[tuple]:
    """(tokens, route codes, tally) of every request, from ``finals``: (requests, their rows
    [k, 2L + 4] of tokens, route codes and tally on the device) as they finished; one read."""
    rows = torch.cat([t for _, t in finals]).tolist()
    out: list[tuple | None] = [None] * n
    for i, h in zip((i for ids, _ in finals for i in ids), rows):
        out[i] = (h[:L], h[L:2 * L], h[2 * L:])
    return out


def _committed_positions(labels: list[int]) -> list[list]:
    return [[i, ROUTE_NAMES[c]] for i, c in enumerate(labels) if c]


def _trace(records, step, ids, t, runner: Runner, s: Settled, br: Branches,
           host: list[HostRow]) -> None:
    """Append each live request's step record (trace mode only: reads per request)."""
    lab = s.labels.tolist()
    for r, (i, h) in enumerate(zip(ids, host)):
        rec = {"step": t, "committed": _committed_positions(lab[r]), "nfe": runner.nfe[i],
               "branch_rows": runner.rows[i], "made_call": bool(h.made_call)}
        rec.update(step.info(r, bool(h.made_call), br, s.choice))
        if h.stop >= 0:
            rec["early_stop_at"] = h.stop
        records[i].append(rec)
