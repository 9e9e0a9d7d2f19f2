"""What a decoder step is: the contract every decoder implements (:class:`Step`), the branches it
sends to the model each round (:class:`Branches`), the row it commits (:class:`Choice`), and the
route codes that label every committed position.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch
from torch import Tensor

from .param_spec import reads_of
from .rules import rules_for
from .stats import Stats

#: route codes (int8 in tensors); index into ROUTE_NAMES for the public label
NONE, BASE, PLAN, AR, FORCED, EXPLORE = 0, 1, 2, 3, 4, 5
ROUTE_NAMES = (None, "base", "plan", "ar", "forced", "explore")


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
             (``rules=reference``, switch 9); the loop adds them when it reads the round.
    """

    rows: Tensor
    n: Tensor
    labels: Tensor
    entropy: bool = False
    memo: dict = field(default_factory=dict)
    cover: Tensor | None = None
    unmade: Tensor | None = None

    def select(self, keep: Tensor) -> "Branches":
        """The branches of the requests ``keep`` (index tensor along dim 0 of every tensor,
        ``memo``'s included)."""
        return Branches(*(take_rows(v, keep) for v in (self.rows, self.n, self.labels)),
                        entropy=self.entropy, memo=take_rows(self.memo, keep),
                        cover=take_rows(self.cover, keep), unmade=take_rows(self.unmade, keep))


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
    open:   optional [R, L] bool: the positions the committed state still has to decide (None:
            its masked positions). A uniform-state canvas has no mask: its step says which
            positions are not yet committed (docs/decoding.md, "Uniform-state canvases").
    record: what the loop hands to :meth:`Step.record` after the round (outside a compiled
            round's programs): the round's :class:`Outcomes`, or None for nothing to record.
    """

    pick: Tensor
    labels: Tensor
    tally: dict = field(default_factory=dict)
    extra: Tensor | None = None
    remask: Tensor | None = None
    memo: dict = field(default_factory=dict)
    state: dict | None = None
    record: Outcomes | None = None
    open: Tensor | None = None


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
    call (None: no cap). ``uniform_state``: the decoder denoises a uniform-state canvas (a model
    with ``canvas_length`` and no mask token) instead of filling masks; such a step has a
    ``call_hook`` (what a call computes besides the model's logits, see :meth:`.runner.Runner`)
    and draws its randomness through :meth:`draw`.

    A step is pure: ``branches`` and ``choose`` are tensor operations on their arguments only,
    never a host value that changes from round to round (``b.ids`` included) and never a side
    effect, so that a round runs as a compiled program (``compile_round``). What a step needs
    beyond the round's tensors comes from the loop:

    - ``branches(b, y, st, state, draws)`` gets the committed states ``y`` [R, L] of the live
      requests (their numbers: ``b.req`` on the device), their stats [R, L], the step's
      per-request ``state`` (rows of the live requests) and, for a step with ``draws``, the
      round's uniform draws [R, L] (one per generation position, from each request's own
      generator, made by the loop before the step);
    - ``choose(b, y, st, br, out)`` gets the stats [R, M, L] of the rows sent and returns a
      :class:`Choice`: the committed row, the step's next ``state``, and what to ``record``;
    - the loop keeps ``state`` between rounds (:meth:`start` gives its first value: a dict of
      tensors [n, ...] indexed by request, or None) and drops a finished request's rows of it
      as it drops its canvas; it hands ``Choice.record`` to :meth:`record`, outside a compiled
      round's programs (the default: the online vocabulary's queue of planning outcomes).

    ``info(r, made_call, br, choice)`` is the trace record of live request r (trace mode only;
    it may read tensors).

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
    uniform_state = False
    #: ``call_hook(b, logits, cur, k, requests) -> (Stats, carry)`` (uniform-state steps):
    #: the call's stats from its logits [N, C, V] over the canvas, the canvas tokens ``cur``
    #: [N, C], the calls ``k`` [N] the request made on this canvas before, the requests' numbers
    #: (host list, for their generators); ``carry`` [N, C, V] goes to the next call on the same
    #: canvas as ``self_conditioning``. None: the shared statistics pass.
    call_hook = None

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

    def start(self, b) -> dict | None:
        """The step's per-request state before the first round (tensors [n, ...]), or None."""
        return None

    def branches(self, b, y: Tensor, st: Stats, state: dict | None = None,
                 draws: Tensor | None = None) -> Branches:
        raise NotImplementedError

    def draw(self, b, y: Tensor, st: Stats, state: dict | None):
        """The round's random draws, made by the loop before :meth:`branches` from each live
        request's own generator (the committed states ``y``, their stats and the step's
        ``state``, for a step whose draws depend on them): the uniform draws [R, L] of a step
        with ``draws``, else None."""
        return b.rand() if self.draws else None

    def choose(self, b, y: Tensor, st: Stats, br: Branches, out: Stats) -> Choice:
        """Single-row steps: the request commits its one row."""
        return Choice(torch.zeros_like(br.n), br.labels)

    def record(self, b, record: Outcomes) -> None:
        """Keep a round's ``Choice.record`` (called by the loop): the planning outcomes go to the
        online vocabulary's queue."""
        b.vocab.record(record.tok, record.nonvacuous, record.passed, record.vig, record.tried)

    def info(self, r: int, made_call: bool, br: Branches, choice: Choice) -> dict:
        return {"route": "base"}


def single_row(b, zb: Tensor, labels: Tensor) -> Branches:
    """Branches of a step that commits ``zb`` [R, L] with a single-row call (none once finished)."""
    return Branches(zb.unsqueeze(1), (~b.finished(zb)).long(), labels)


def base_labels(sel: Tensor, forced: Tensor) -> Tensor:
    """int8 route codes [..., L]: ``forced`` where forced, ``base`` where selected, else none."""
    return torch.where(forced, FORCED, torch.where(sel, BASE, NONE)).to(torch.int8)
