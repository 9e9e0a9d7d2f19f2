"""``pvf``: Plan-Verify-Fill (SPEC "PVF step"), every live request of a batch at once.

Per step, from the stats of ``y`` on the working set W_t:

1. base: ``S_base`` = threshold set of W_t (forced top-1 if empty); ``z_base``. If ``z_base`` is
   finished (no mask / early stop) it is committed with no call.
2. planning candidates: W_t \\ S_base with ŷ in the planning vocabulary and
   plan_lo <= p < plan_hi, top ``width`` by p (ties by index).
3. planning route (candidates exist): one call on [z_base, z_plan_1..K]; branch j is verified
   as in :mod:`.verify` (and, with ``plan_self_check``, its candidate keeps p >= plan_lo at its
   own position). The verified branch with the largest C_total (sum of max prob over W_t
   positions still masked in it; ties → the earlier branch) is committed, else z_base. No AR
   attempt in that step.
4. AR fallback (no candidates): the leftmost min(width, eligible) positions of W_t \\ S_base
   with p >= ar_lo; nested branches z_ar_0..z_ar_K in one call; fill r is verified iff the argmax
   at i_r under z_ar_{r-1} equals ŷ_{i_r}; commit z_ar_{k*} (k* = longest verified prefix).
5. otherwise a single-row call on [z_base].

Every request has width + 1 row slots; its route decides how many it sends. Routes switched off
by ``routes``: ``plan`` (never AR), ``ar`` (never planning), ``none``. Labels: base / forced /
plan / ar.

``rules=reference`` (:mod:`.rules`, switches 3-8) changes the step where the authors' code
differs: no forced token in the base set (it is forced only when nothing else is committed);
impact set and C_total over every position of W_t masked before the base commit, an empty
impact set passing; a top-probability self-check of every candidate; a failed planning step
continues with AR fills from its base row in the next round (which skips planning); and a round
whose AR verifies nothing (or whose forced token is decided after the call) is followed by a
fresh call on the committed state, as the reference discards those results. Per-request modes
carry these decisions from one round to the next; the loop keeps them (``start``,
``Choice.state``). The paper's step calls these rules as named hooks (:class:`ReferenceRounds`,
one block at the end of this module), so the step reads as the paper.

Online vocabulary (:mod:`pvf_lmeval.planning.online`): candidates are the eligible in-band
positions plus up to ``explore`` slots of explorable ones (which also fill slots the eligible
ones leave unused); every tried candidate's outcome (non-vacuous, A, VIG from the entropies of
the same call) goes in ``Choice.record``, which the loop queues for the vocabulary's next update,
never applied inside the request.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import Tensor

from .param_spec import ROWS, Param, at_most, less
from .select import first_true, rank_desc, static_select, threshold_select
from .shared_params import REVEAL_NEXT, THRESHOLD
from .stats import Stats
from .step import AR, BASE, FORCED, PLAN, Branches, Choice, Outcomes, Step, base_labels
from .verify import rows_of, verify_plans

# Per-request modes between rounds (``rules=reference`` only; always NORMAL under the paper's).
NORMAL = 0
FRESH = 1          # make a fresh call on the committed state, commit nothing (switch 7)
AR_NEXT = 2        # planning failed last round: AR from the base row's stats, no planning (6)
AR_NEXT_EMPTY = 3  # ... and that round committed nothing (the forced token is still owed, 3)


@dataclass
class BaseRound:
    """A PVF round before its route, per request: ``W`` [R, L] its working set, ``zb`` [R, L]
    its base row z_base and ``labels`` [R, L] the route codes of its commits, ``band`` and
    ``elig`` [R, L] the in-band planning positions and the AR-eligible ones; once the routes are
    counted, ``finished`` [R] (z_base is finished: no call) and ``unmade`` [R] (calls counted
    without being made, ``rules=reference``; None under the paper's rules)."""

    W: Tensor
    zb: Tensor
    labels: Tensor
    band: Tensor
    elig: Tensor
    finished: Tensor | None = None
    unmade: Tensor | None = None


def _at(x: Tensor, pos: Tensor) -> Tensor:
    """x [R, (K,) L] at positions pos [R, K] → [R, K]."""
    if x.dim() == 2:
        return x.gather(1, pos)
    return x.gather(2, pos.unsqueeze(-1)).squeeze(-1)


def _probability(name: str, default: float, meaning: str) -> Param:
    return Param(name, float, default, meaning, bounds="[0, 1]", preset=True)


class PVFDecoder(Step):
    name = "pvf"
    summary = "Plan-Verify-Fill: plans on planning-vocabulary tokens, verifies branches, AR fallback"
    uses_vocab = True
    reads = (THRESHOLD,
             _probability("plan_lo", 0.2, "low end of the planning band"),
             _probability("plan_hi", 0.65, "high end of the planning band"),
             _probability("ar_lo", 0.1, "AR-fallback confidence floor"),
             Param("width", int, 3, "branch width K", bounds=">= 1", cap=ROWS, preset=True),
             REVEAL_NEXT,
             Param("routes", str, "plan+ar", "which routes run",
                   choices=("plan+ar", "plan", "ar", "none")),
             Param("plan_self_check", bool, False, "check that a candidate keeps p >= plan_lo "
                   "in its own branch"))
    checks = (less("plan_lo", "plan_hi"), at_most("plan_hi", "threshold"))

    @staticmethod
    def rows_per_call(params) -> int:
        return params.width + 1

    def __init__(self, params):
        super().__init__(params)
        self.use_plan = params.routes in ("plan+ar", "plan")
        self.use_ar = params.routes in ("plan+ar", "ar")

    def start(self, b) -> dict | None:
        """Under rules other than the paper's, each request's mode between rounds (``mode``
        [n], NORMAL at first) and the previous round's W_t and S_base (``prev_W``,
        ``prev_sel`` [n, L], which an AR_NEXT round reads)."""
        if self.rules.name == "paper":
            return None
        prev = torch.zeros((b.n, b.L), dtype=torch.bool, device=b.device)
        return dict(mode=torch.zeros(b.n, dtype=torch.long, device=b.device), prev_W=prev,
                    prev_sel=torch.zeros_like(prev))

    def _candidates(self, b, st: Stats, band: Tensor) -> tuple[Tensor, Tensor]:
        """Planning candidates [R, L] among the in-band positions and their count [R]."""
        vocab, K = b.vocab, self.p.width
        slots = getattr(vocab, "explore_slots", 0) if vocab is not None else 0
        cand = band & b.in_vocab(st.tok)
        n_cand = cand.sum(-1)
        if slots > 0:
            expl = band & vocab.explorable_mask(st.tok)
            n_x = expl.sum(-1)
            k_x = n_x.clamp(max=slots)                                  # reserved exploration
            k_e = torch.minimum(n_cand, K - k_x)
            k_x = torch.minimum(n_x, K - k_e)                           # ... also fills unused
            mixed = (static_select(st.conf, cand, k_e[:, None])
                     | static_select(st.conf, expl, k_x[:, None]))
            cand = torch.where((k_x > 0)[:, None], mixed, cand)
            n_cand = torch.where(k_x > 0, k_e + k_x, n_cand)
        return cand, n_cand

    def branches(self, b, y: Tensor, st: Stats, state: dict | None = None,
                 draws=None) -> Branches:
        ref = None if state is None else ReferenceRounds(self, b)   # rules other than the paper's
        base, sel = self.base_round(b, y, st, b.working_set(y, self.reveal))
        if ref is not None:
            base, marks = ref.routes(state, y, st, base)
        cand, k_plan, k_ar = self.route_sizes(b, st, base)
        if ref is None:
            base = replace(base, finished=b.finished(base.zb))
        else:
            base, marks = ref.without_route(y, st, sel, base, k_plan, k_ar, marks)
        br = self.route_rows(b, st, base, cand, k_plan, k_ar)
        if ref is not None:
            br.memo["ref"] = replace(marks, state=state, sel=sel)
            br.cover = ref.cover(base.W)
        return br

    def base_round(self, b, y: Tensor, st: Stats, W: Tensor) -> tuple[BaseRound, Tensor]:
        """Step 1 and the routes' positions on the working set ``W`` [R, L]: the round's
        :class:`BaseRound` (z_base, its labels, the in-band and AR-eligible positions) and the
        base set S_base [R, L]."""
        p = self.p
        sel, forced = threshold_select(st.conf, W, p.threshold,
                                       force=not self.rules.force_after_routes)
        zb = torch.where(sel, st.tok, y)
        rest = W & ~sel
        none = torch.zeros_like(rest)
        band = rest & (st.conf >= p.plan_lo) & (st.conf < p.plan_hi) if self.use_plan else none
        elig = rest & (st.conf >= p.ar_lo) if self.use_ar else none
        return BaseRound(W, zb, base_labels(sel, forced), band, elig), sel

    def route_sizes(self, b, st: Stats, base: BaseRound) -> tuple[Tensor, Tensor, Tensor]:
        """(candidates [R, L], planning branches k_plan [R], AR fills k_ar [R]) of a round."""
        K = self.p.width
        cand, n_cand = self._candidates(b, st, base.band)
        return cand, n_cand.clamp(max=K), base.elig.sum(-1).clamp(max=K)

    def route_rows(self, b, st: Stats, base: BaseRound, cand: Tensor, k_plan: Tensor,
                   k_ar: Tensor) -> Branches:
        """Steps 3 and 4: each request's rows (planning when it has candidates, else AR fills,
        else z_base alone; none once ``base.finished``) and what ``choose`` reads of them."""
        K, L = self.p.width, b.L
        W, zb, labels, elig, fin = base.W, base.zb, base.labels, base.elig, base.finished
        plan = ~fin & (k_plan > 0)
        ar = ~fin & ~plan & (k_ar > 0)
        j = torch.arange(K + 1, device=zb.device)
        # planning rows: [z_base, z_plan_1..K], branch j writes the candidate of rank j-1
        rank = rank_desc(st.conf, cand)
        own = (rank.unsqueeze(1) == (j[1:] - 1)[:, None]) & (j[1:, None] <= k_plan[:, None, None])
        plan_rows = torch.where(own, st.tok.unsqueeze(1), zb.unsqueeze(1))          # [R, K, L]
        # AR rows: z_ar_0..z_ar_K, row i fills the i leftmost eligible positions
        order = torch.where(elig, elig.long().cumsum(-1) - 1, torch.full_like(rank, L))
        fill = order.unsqueeze(1) < torch.minimum(j, k_ar[:, None]).unsqueeze(-1)
        ar_rows = torch.where(fill, st.tok.unsqueeze(1), zb.unsqueeze(1))           # [R, K+1, L]
        rows = torch.where(plan[:, None, None], torch.cat([zb.unsqueeze(1), plan_rows], 1),
                           ar_rows)
        n = torch.where(plan, k_plan + 1, torch.where(ar, k_ar + 1, torch.ones_like(k_ar)))
        n = torch.where(fin, torch.zeros_like(n), n)
        memo = dict(W=W, zb=zb, own=own, order=order, plan=plan, ar=ar, k_plan=k_plan, k_ar=k_ar)
        return Branches(rows, n, labels,
                        entropy=b.vocab is not None and getattr(b.vocab, "learning", False),
                        memo=memo, unmade=base.unmade)

    def choose(self, b, y: Tensor, st: Stats, br: Branches, out: Stats) -> Choice:
        p, K = self.p, self.p.width
        m = br.memo
        W, zb, own, order, plan, ar = m["W"], m["zb"], m["own"], m["order"], m["plan"], m["ar"]
        k_plan, k_ar = m["k_plan"], m["k_ar"]
        labels = br.labels
        slot = torch.arange(K, device=zb.device)

        rules = self.rules
        # 3. planning route: verify, then the best verified branch by C_total
        masked_b = W & (zb == b.mask_id)
        verdict = verify_plans(out.row(0), rows_of(out, 1), own, masked_b, p.threshold,
                               impact_over=W if rules.impact_includes_committed else None,
                               reach=b.reach(own), rowsum=b.rowsum)
        tried = plan[:, None] & (slot <= k_plan[:, None] - 1)                    # [R, K]
        pos = first_true(own).clamp(max=b.L - 1)                                 # [R, K]
        # the online vocabulary's outcomes of this round's candidates (the loop records them)
        record = (Outcomes(_at(st.tok, pos), verdict.nonvacuous, verdict.passed, verdict.vig,
                           tried) if br.entropy else None)
        ok = verdict.passed & tried
        if rules.self_check_max_prob:
            ok &= _at(out.pmax[:, 1:], pos) >= p.plan_lo
        elif p.plan_self_check:
            ok &= _at(out.pcur[:, 1:], pos) >= p.plan_lo
        if rules.c_total_over_step_masks:
            live = W.unsqueeze(1).expand_as(br.rows)                             # [R, K+1, L]
        else:
            live = W.unsqueeze(1) & (br.rows == b.mask_id)
        c_total = b.rowsum(torch.where(live, out.pmax, torch.zeros_like(out.pmax)))
        score = torch.where(ok, c_total[:, 1:], torch.full_like(c_total[:, 1:], float("-inf")))
        best = first_true(score == score.max(-1, keepdim=True).values)          # tie: earlier
        any_ok = ok.any(-1)
        won = own.gather(1, best.view(-1, 1, 1).expand(-1, 1, b.L)).squeeze(1) & any_ok[:, None]
        plan_labels = torch.where(won, torch.full_like(labels, PLAN), labels)

        # 4. AR route: fill r verified iff the argmax at i_r under z_ar_{r-1} equals ŷ_{i_r}
        pos_ar = first_true(order.unsqueeze(1) == slot[:, None]).clamp(max=b.L - 1)  # [R, K]
        ver = (_at(out.tok[:, :K], pos_ar) == _at(st.tok, pos_ar)) & (slot < k_ar[:, None])
        kstar = torch.cumprod(ver.long(), -1).sum(-1)
        ar_labels = torch.where(order < kstar[:, None], torch.full_like(labels, AR), labels)

        pick = torch.where(plan, torch.where(any_ok, best + 1, torch.zeros_like(best)),
                           torch.where(ar, kstar, torch.zeros_like(kstar)))
        labels = torch.where(plan[:, None], plan_labels, torch.where(ar[:, None], ar_labels,
                                                                     labels))
        tally = {"plan_tried": torch.where(plan, k_plan, torch.zeros_like(k_plan)),
                 "plan_passed": torch.where(plan, ok.sum(-1), torch.zeros_like(k_plan))}
        choice = Choice(pick, labels, tally, record=record,
                        memo=dict(pos=pos, ok=ok, c_total=c_total, any_ok=any_ok, pos_ar=pos_ar,
                                  ver=ver, kstar=kstar))
        if "ref" in m:
            choice = ReferenceRounds(self, b).after_choice(m, choice)
        return choice

    def info(self, r: int, made_call: bool, br: Branches, choice: Choice) -> dict:
        m, c = br.memo, choice.memo
        if "ref" in m and int(m["ref"].mode[r]) == FRESH:
            return {"route": "fresh"}
        if bool(m["plan"][r]):
            k = int(m["k_plan"][r])
            return {"route": "plan" if bool(c["any_ok"][r]) else "base",
                    "candidates": c["pos"][r, :k].tolist(), "verified": c["ok"][r, :k].tolist(),
                    "c_total": c["c_total"][r, 1:k + 1].tolist()}
        if bool(m["ar"][r]):
            k = int(m["k_ar"][r])
            return {"route": "ar" if int(c["kstar"][r]) else "base",
                    "candidates": c["pos_ar"][r, :k].tolist(), "verified": c["ver"][r, :k].tolist()}
        return {"route": "base"}


# ---------------------------------------------------------------- rules=reference, one block
#
# The published code's rounds where they differ from the paper (docs/reference-differences.md,
# switches 3, 6, 7 and 9 of :mod:`.rules`), as hooks the paper's step above calls at three
# named points: ``routes`` (which routes a request's mode allows, and the AR fills that follow
# a failed plan), ``without_route`` (what a request with no route sends, and the call it counts
# without making), ``after_choice`` (the forced token owed after the routes, the positions
# masked again or rewritten, and the request's next state). The state that outlives a round
# (each request's mode, the previous round's W_t and S_base) is the loop's (``PVFDecoder.start``,
# ``Choice.state``), never the step's.


@dataclass
class Marks:
    """What the ``rules=reference`` hooks of one round hand each other, per request: its
    ``mode`` [R], whether its round is an AR_NEXT one (``arn`` [R]), the positions its AR_NEXT
    fills mask again and rewrite (``remask``, ``rewrite`` [R, L]); then the most confident
    position of W_t (``top`` [R, L], :meth:`ReferenceRounds.without_route`), and the step's
    ``state`` and base set ``sel`` [R, L] (kept in the branches' memo for ``choose``)."""

    mode: Tensor
    arn: Tensor
    remask: Tensor
    rewrite: Tensor
    top: Tensor | None = None
    state: dict | None = None
    sel: Tensor | None = None


class ReferenceRounds:
    """The ``rules=reference`` hooks of one round of ``step`` on the requests of ``b``."""

    def __init__(self, step: PVFDecoder, b):
        self.p, self.rules, self.use_ar, self.b = step.p, step.rules, step.use_ar, b

    def routes(self, state: dict, y: Tensor, st: Stats, base: BaseRound
               ) -> tuple[BaseRound, Marks]:
        """The routes of each request's mode: no planning unless NORMAL, no AR fills in a FRESH
        round, and an AR_NEXT round's fills (:meth:`_ar_next`). Returns the round's base so
        changed, and the marks of the later hooks."""
        mode = state["mode"]
        arn = (mode == AR_NEXT) | (mode == AR_NEXT_EMPTY)
        base = replace(base, band=base.band & (mode == NORMAL)[:, None],   # no planning
                       elig=base.elig & (mode != FRESH)[:, None])
        base, remask, rewrite = self._ar_next(state, y, st, arn, base)
        return base, Marks(mode, arn, remask, rewrite)

    def _ar_next(self, state: dict, y: Tensor, st: Stats, arn: Tensor, base: BaseRound
                 ) -> tuple[BaseRound, Tensor, Tensor]:
        """Switch 6: the AR fills that follow a failed planning round, as the reference builds
        them inside that step. ``st`` are the base row's stats; the step's working set W' and
        base set S' are those of the failed round (``state``'s ``prev_W`` and ``prev_sel``).
        High-confidence positions H = W' with top probability >= tau under the base row; the
        rows hold H (the base set keeps its tokens); fills are the leftmost positions of W'
        minus H with p >= ar_lo, which can be base-set positions (the reference then re-fills
        them); only H inside the failed round's active block is committed, with the base row's
        tokens (also where the base set had put its own), the rest of H is masked again. Returns
        the base with those rows for the AR_NEXT requests (``arn``), unchanged for the others,
        and the positions to mask again and to rewrite."""
        b = self.b
        pW, psel = state["prev_W"], state["prev_sel"]
        hc = pW & (st.pmax >= self.p.threshold)
        block = b.blk == (first_true(pW) // b.B)[:, None]
        keep = hc & ~psel & (y == b.mask_id)
        zb_ar = torch.where(keep, st.tok, y)
        remask = keep & ~block & arn[:, None]
        # the reference commits H inside the block with the base row's prediction, which
        # overwrites base-set tokens there (the rows still carry the base set's own tokens)
        rewrite = hc & psel & block & arn[:, None]
        labels = base.labels
        lab_ar = torch.where(keep & block, torch.full_like(labels, BASE), torch.zeros_like(labels))
        elig_ar = pW & ~hc & (st.conf >= self.p.ar_lo)
        if not self.use_ar:
            elig_ar = torch.zeros_like(elig_ar)
        a = arn[:, None]
        return (replace(base, W=torch.where(a, pW, base.W), zb=torch.where(a, zb_ar, base.zb),
                        labels=torch.where(a, lab_ar, labels),
                        elig=torch.where(a, elig_ar, base.elig)), remask, rewrite)

    def without_route(self, y: Tensor, st: Stats, sel: Tensor, base: BaseRound,
                      k_plan: Tensor, k_ar: Tensor, marks: Marks) -> tuple[BaseRound, Marks]:
        """The row a request sends when it tries no route this round, whether it is finished,
        and the call it counts without making it (switch 9). FRESH: its committed state as it
        is (a fresh call, nothing committed). AR_NEXT with nothing to fill: the reference
        commits no impact set then, only the forced token when the failed planning round
        committed nothing. A normal round without candidates: the base set, or the forced token
        when it is empty (nothing else can be committed). Returns the base with its row,
        ``finished`` and ``unmade`` calls, and the marks with ``top``, the most confident
        position of W_t."""
        b, mode, arn = self.b, marks.mode, marks.arn
        no_route = (k_plan == 0) & (k_ar == 0)
        top = static_select(st.conf, base.W, 1)
        empty = ~sel.any(-1)
        owe = no_route & (((mode == NORMAL) & empty) | (mode == AR_NEXT_EMPTY))
        keep_y = (mode == FRESH) | ((mode != NORMAL) & no_route)
        force = top & owe[:, None]
        zb = torch.where(keep_y[:, None], y, base.zb)
        zb = torch.where(force, st.tok, zb)
        labels = torch.where(keep_y[:, None], torch.zeros_like(base.labels), base.labels)
        labels = torch.where(force, torch.full_like(labels, FORCED), labels)
        unmade = None
        if self.rules.count_unmade_calls:      # switch 9: a call counted, not made
            unmade = (no_route & (arn | base.band.any(-1)) & ~b.finished(zb)).long()
        # switch 6: the fills after a failed plan may re-fill base-set positions, so a state the
        # base set completed still makes the reference's second call when it has fills
        fin = b.finished(zb) & ~(arn & (k_ar > 0))
        return (replace(base, zb=zb, labels=labels, finished=fin, unmade=unmade),
                replace(marks, top=top))

    def cover(self, W: Tensor) -> Tensor:
        """The reference reads stats at positions its rows filled in the step's block: the call
        covers them from W_t's first position on."""
        return first_true(W).clamp(max=self.b.L - 1)

    def after_choice(self, m: dict, choice: Choice) -> Choice:
        """``choice`` (the paper's, from the branches' memo ``m``) with the forced token owed
        after the routes (switch 3; ``extra``), the AR_NEXT round's positions masked again
        (``remask``) or rewritten, and each request's ``state`` for the next round (its mode,
        switches 6 and 7, and this round's W_t and S_base)."""
        ref, plan, ar = m["ref"], m["plan"], m["ar"]
        mode, sel, top = ref.mode, ref.sel, ref.top
        any_ok, kstar, labels = choice.memo["any_ok"], choice.memo["kstar"], choice.labels
        failed_plan = plan & ~any_ok
        failed_ar = ar & (kstar == 0)
        arn = (mode == AR_NEXT) | (mode == AR_NEXT_EMPTY)
        committed = torch.where(arn, (labels == BASE).any(-1), sel.any(-1))
        owed = ~committed & (mode != AR_NEXT)         # nothing committed in this step yet
        ar_next = self.rules.ar_after_failed_plan
        # nothing committed and no later round to commit in: force now (not a row of the call)
        force = (failed_ar if ar_next else failed_ar | failed_plan) & owed
        extra = top & force[:, None]
        labels = torch.where(extra, torch.full_like(labels, FORCED), labels)
        state = dict(ref.state)
        if ar_next:                 # remember this round's W_t and S_base for an AR_NEXT round
            state.update(prev_W=m["W"], prev_sel=sel)
        nxt = torch.full_like(mode, NORMAL)
        if self.rules.ar_after_failed_plan:
            nxt = torch.where(failed_plan, torch.where(sel.any(-1), AR_NEXT, AR_NEXT_EMPTY), nxt)
        if self.rules.fresh_call_after_failed_fill:
            nxt = torch.where(failed_ar, torch.full_like(nxt, FRESH), nxt)
        nxt = torch.where(force, torch.full_like(nxt, FRESH), nxt)   # not a row of the call
        state["mode"] = nxt
        return replace(choice, labels=labels, extra=extra | (ref.rewrite & ar[:, None]),
                       remask=ref.remask & ar[:, None], state=state)
