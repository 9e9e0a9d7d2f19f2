"""What a decoder step is: the contract every decoder implements (:class:`Step`), the branches it
sends to the model each round (:class:`Branches`), the row it commits (:class:`Choice`), and the
route codes that label every committed position.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch
from torch import Tensor

from .draws import Draw
from .param_spec import reads_of
from .rules import LOOP_SWITCHES, rules_for
from .select import first_true
from .stats import Stats

#: route codes (int8 in tensors); index into ROUTE_NAMES for the public label. ``edit``: the
#: position's token was rewritten after its commit (a revocable step's edit; docs/decoding.md)
NONE, BASE, PLAN, AR, FORCED, EXPLORE, EDIT = 0, 1, 2, 3, 4, 5, 6
ROUTE_NAMES = (None, "base", "plan", "ar", "forced", "explore", "edit")
#: every KV cache mode (``Step.caches``' default; the parameter's choices, params.CACHES)
CACHE_MODES = ("none", "prefix", "dual", "dual_base")


@dataclass
class Branches:
    """What a step sends to the model this round, for every live request at once.

    rows:    [R, M] + [L] long: candidate generation regions, M = the step's rows per call.
             Row 0 is the request's *base* state: what it commits when it makes no call.
    n:       [R] long: rows each request sends (its first ``n`` rows; 0 = no call: the base
             state is finished, no mask left or stopped early).
    labels:  [R, L] int8: route codes of the base state's commits.
    entropy: whether the call also computes entropies (``Stats.ent``).
    cover:   optional [R] long: the call must also cover stats from this generation position
             on (else it starts at the rows' earliest active block).
    memo:    whatever the step's ``choose`` needs from this round: tensors with the requests
             along dim 0, tuples of them, or plain values (see :meth:`select`).
    unmade:  optional [R] long: calls the request counts on its NFE without making them
             (``rules=reference``, switch 9), if it stays live; the loop adds them when it
             reads the round (calls a request counts also when it finishes: ``Choice.unmade``).
    open:    optional [R, M, L] bool: the rows' open positions (:meth:`Step.open`); None: the
             rows' masks. The call's layout (active blocks) reads it.
    hook:    optional values for the step's call hook (``Step.call_hook``), each [R, ...]:
             the hook sees each row's request's (``CallView.args``).
    shadow:  optional [R] long: the call also evaluates a shadow copy of the block starting at
             this generation position (``tensors/shadow.py``; ``Stats.pback``), per request.
    """

    rows: Tensor
    n: Tensor
    labels: Tensor
    entropy: bool = False
    memo: dict = field(default_factory=dict)
    cover: Tensor | None = None
    unmade: Tensor | None = None
    open: Tensor | None = None
    hook: dict | None = None
    shadow: Tensor | None = None

    def select(self, keep: Tensor) -> "Branches":
        """The branches of the requests ``keep`` (index tensor along dim 0 of every tensor,
        ``memo``'s and ``hook``'s included)."""
        return take_rows(self, keep)


def take_rows(v, keep: Tensor):
    """Rows ``keep`` of a tensor (dim 0), of each tensor of a tuple, a dict's values or a
    record's fields (a dataclass); other values as they are."""
    if isinstance(v, Tensor):
        return v.index_select(0, keep)
    if isinstance(v, tuple):
        return tuple(take_rows(x, keep) for x in v)
    if isinstance(v, dict):
        return {k: take_rows(x, keep) for k, x in v.items()}
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return dataclasses.replace(v, **{f.name: take_rows(getattr(v, f.name), keep)
                                         for f in dataclasses.fields(v)})
    return v


@dataclass
class Outcomes:
    """A round's planning candidates as verified, [R, K] each: ``tok`` (the token it placed),
    ``nonvacuous`` (its impact set holds a position besides its own), ``passed``, ``vig`` (its
    verification information gain), ``tried`` (a candidate, not an empty slot); ``req`` [R, K]:
    the request of each, where the record keeps it (calibration), else None."""

    tok: Tensor
    nonvacuous: Tensor
    passed: Tensor
    vig: Tensor
    tried: Tensor
    req: Tensor | None = None


@dataclass
class Choice:
    """Which row each request commits after the call.

    pick:   [R] long: index into the request's rows (ignored for requests that made no call).
    labels: [R, L] int8: route codes of everything that row commits.
    tally:  optional [R] long counters to add to the request's record (``plan_tried``,
            ``plan_passed``).
    extra:  optional [R, L] bool: positions also committed, with the token of the stats the
            step was given, on top of the picked row (``rules=reference``: a token forced after
            the call). The state is then no row of the call: the step must not use the picked
            row's stats for it (it makes a fresh call next round).
    remask: optional [R, L] bool: positions of the picked row that are masked again (they
            conditioned the call but are not committed; ``rules=reference``). The picked row's
            stats still feed the next round, as in the reference code.
    memo:   tensors the trace reads (only read when decoding with ``trace=True``).
    state:  the step's per-request state for the next round (see :meth:`Step.start`), None for
            steps without one.
    record: what the loop hands to :meth:`Step.record` after the round (outside a compiled
            round's programs): the round's :class:`Outcomes`, or None for nothing to record.
    hold:   optional [R] bool: the request keeps working on its current block although nothing
            in it is open (a *held* block: a phase after the block's last commit); it is not
            finished while held. The step keeps the held block in its state and reports its
            start as the settled frontier (:meth:`Step.settled`).
    unmade: optional [R] long: calls of this round the request counts on its NFE without
            making them, finished or not (``rules=reference`` switch ``unmade_extra_calls``: a
            reference's call whose outputs are never used, as on a block it just completed).
    """

    pick: Tensor
    labels: Tensor
    tally: dict = field(default_factory=dict)
    extra: Tensor | None = None
    remask: Tensor | None = None
    memo: dict = field(default_factory=dict)
    state: dict | None = None
    record: Outcomes | None = None
    hold: Tensor | None = None
    unmade: Tensor | None = None


class Step:
    """A decoder: how one round builds each request's branch rows and picks the committed one.

    Decoders describe themselves: ``name`` and ``summary`` (one line, ``pvf-dlm decoders``);
    ``reads``, the parameters it reads besides the loop's (:class:`.param_spec.Param`, its own,
    declared here, or a shared one of :mod:`.shared_params`; ``.when(...)`` for one read under a
    condition) and ``checks``, its rules across parameters (:class:`.param_spec.Rule`): the
    parameters, their validation, the ``--model_args`` table and the run identity derive from
    them; ``uses_vocab`` (reads the planning vocabulary); ``reveals`` (honours ``reveal_next``,
    early cross-block revelation: it reads it); ``draws`` (needs uniform draws each round);
    ``baseline`` (one the report compares the others with); ``rows_per_call(params)`` (M, the
    most rows a request sends in one round). ``max_rows`` caps the rows of one physical model
    call (None: no cap).

    A step is pure: ``branches`` and ``choose`` are tensor operations on their arguments only,
    never a host value that changes from round to round (``b.ids`` included) and never a side
    effect, so that a round runs as a compiled program (``compile_round``). What a step needs
    beyond the round's tensors comes from the loop:

    - ``branches(b, y, st, state, draws)`` gets the committed states ``y`` [R, L] of the live
      requests (their numbers: ``b.req`` on the device), their stats [R, L], the step's
      per-request ``state`` (rows of the live requests) and the round's draws (one tensor
      [R, ...] per :class:`.draws.Draw` of :meth:`draw_plan`, from each request's own
      generator, made by the loop before the step; a step with ``draws``: ``draws[0]`` [R, L]
      uniforms);
    - ``choose(b, y, st, br, out)`` gets the stats [R, M, L] of the rows sent and returns a
      :class:`Choice`: the committed row, the step's next ``state``, and what to ``record``;
    - the loop keeps ``state`` between rounds (:meth:`start` gives its first value: a dict of
      tensors [n, ...] indexed by request, or None) and drops a finished request's rows of it
      as it drops its canvas; it hands ``Choice.record`` to :meth:`record`, outside a compiled
      round's programs (the default: the online vocabulary's queue of planning outcomes).

    ``info(r, made_call, br, choice)`` is the trace record of live request r (trace mode only;
    it may read tensors).

    The loop's seams (docs/design.md, "Seams of the loop"), each a no-op by default:

    - ``entropy``: every call computes entropies (``Stats.ent``), the initial one included (a
      round's calls: ``Branches.entropy``);
    - :meth:`open`: which positions a state still has to decide (default: its masks);
    - ``revocable``: a round may remask or edit committed positions of the working blocks
      (counted by the loop: ``edits``, ``remasks``); early stop then only reads *settled*
      positions (:meth:`settled`);
    - ``caches``: the KV cache modes it allows (others refused in one line before any call);
    - ``loop_switches``: the ``rules=reference`` switches of the loop that apply to it
      (:data:`.rules.LOOP_SWITCHES`); ``switches`` holds those on under its rules;
    - :meth:`draw_plan`: its random draws of a round (``draws = True``: one uniform per
      generation position), and :meth:`first_draws`, those of the initial call;
    - ``uniform_state``: it decodes a uniform-state canvas (a model with ``canvas_length`` and
      no mask token: docs/decoding.md, "Uniform-state canvases"); the others fill masks;
    - ``call_hook(b, view)``: per-call work on the logits and a carry between calls
      (:mod:`.hooks`), None for none.

    The loop builds a round's branches at the end of the round before, for every request live
    then, so that one host read carries their call layout with that round's stop flags; the
    branches of the requests that finished in that round are then dropped
    (:meth:`Branches.select`). So ``branches`` never reads the host, keeps what ``choose``
    needs in ``memo``, and changes nothing that a finished request's result depends on (calls
    it counts without making go to ``Branches.unmade``); per-round accounting belongs in
    ``choose``.
    """

    name = ""
    summary = ""
    reads: tuple = ()
    checks: tuple = ()
    uses_vocab = False
    reveals = False
    draws = False
    baseline = False
    max_rows: int | None = None
    entropy = False
    revocable = False
    caches: tuple = CACHE_MODES
    #: the decoder's own defaults of parameters it shares with others (``{"threshold": 0.6}``):
    #: they replace the declared default when the caller gives no value (``make_params``)
    defaults: dict = {}
    #: named parameter sets of the decoder (``preset=NAME``: {name: {parameter: value}})
    presets: dict = {}
    loop_switches: tuple = ()
    call_hook = None
    uniform_state = False

    @classmethod
    def refuse(cls, model) -> str | None:
        """Why the decoder cannot decode ``model`` (a one-line error, checked before any
        call), or None."""
        return None

    @classmethod
    def reads_param(cls, name: str) -> bool:
        """Whether the decoder reads the parameter ``name`` (besides the loop's)."""
        return any(r.param.name == name for r in reads_of(cls.reads))

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls.reveals = cls.reads_param("reveal_next")

    @staticmethod
    def rows_per_call(params) -> int:
        return 1

    def __init__(self, params):
        self.p = params
        self.reveal = params.reveal_next if self.reveals else 0
        self.rows = self.rows_per_call(params)
        self.rules = rules_for(params.rules)
        unknown = set(self.loop_switches) - set(LOOP_SWITCHES)
        if unknown:
            raise TypeError(f"{type(self).__name__}.loop_switches names {sorted(unknown)}: "
                            f"the loop's switches are {', '.join(LOOP_SWITCHES)}")
        #: the loop switches on for this step (its ``loop_switches`` its rules turn on)
        self.switches = frozenset(s for s in self.loop_switches if getattr(self.rules, s))

    def start(self, b) -> dict | None:
        """The step's per-request state before the first round (tensors [n, ...]), or None."""
        return None

    def open(self, b, rows: Tensor, state: dict | None = None) -> Tensor:
        """[..., L] bool: the positions state(s) ``rows`` [..., L] still have to decide (the
        request's ``state`` rows, when the answer depends on it). Default: the masks."""
        return rows == b.mask_id

    def settled(self, b, open: Tensor, state: dict | None = None) -> Tensor:
        """[R] long: every position before it is settled (no later round changes it), for
        states whose open positions are ``open`` [R, L]. Early stop reads settled positions
        only. Default: the first open position; a revocable step: the start of the block of
        its first open position (a step that holds a block returns the held block's start)."""
        first = first_true(open)
        return (first // b.B) * b.B if self.revocable else first

    def draw_plan(self, b, state: dict | None = None, st: Stats | None = None
                  ) -> tuple[Draw, ...]:
        """The random draws the loop makes for this round before the step, per request from
        its own generator, in order (:mod:`.draws`); ``branches`` gets one tensor [R, ...] per
        draw (``st``: the stats ``branches`` will get, for a plan that depends on them).
        Default: one uniform per generation position for a step with ``draws``."""
        return (Draw("uniform", (b.L,)),) if self.draws else ()

    def first_draws(self, b, state: dict | None = None) -> tuple[Draw, ...]:
        """The draws the loop makes before the initial call (its call hook reads them).
        Default: none."""
        return ()

    def branches(self, b, y: Tensor, st: Stats, state: dict | None = None,
                 draws: tuple = ()) -> Branches:
        raise NotImplementedError

    def choose(self, b, y: Tensor, st: Stats, br: Branches, out: Stats) -> Choice:
        """Single-row steps: the request commits its one row."""
        return Choice(torch.zeros_like(br.n), br.labels)

    def record(self, b, record: Outcomes) -> None:
        """Keep a round's ``Choice.record`` (called by the loop): the planning outcomes go to the
        online vocabulary's queue."""
        b.vocab.record(record.tok, record.nonvacuous, record.passed, record.vig, record.tried)

    def info(self, r: int, made_call: bool, br: Branches, choice: Choice) -> dict:
        return {"route": "base"}


def single_row(b, zb: Tensor, labels: Tensor, open: Tensor | None = None,
               hold: Tensor | None = None, settled: Tensor | None = None) -> Branches:
    """Branches of a step that commits ``zb`` [R, L] with a single-row call (none once finished:
    :meth:`.batch.Batch.finished` with ``open`` [R, L] (None: its masks), ``hold`` [R] and
    ``settled`` [R], as the loop's settle will judge it)."""
    return Branches(zb.unsqueeze(1), (~b.finished(zb, open, hold, settled)).long(), labels,
                    open=None if open is None else open.unsqueeze(1))


def base_labels(sel: Tensor, forced: Tensor) -> Tensor:
    """int8 route codes [..., L]: ``forced`` where forced, ``base`` where selected, else none."""
    return torch.where(forced, FORCED, torch.where(sel, BASE, NONE)).to(torch.int8)
