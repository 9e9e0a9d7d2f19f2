"""Tensor helpers shared by the decoders: stats from logits, ranking, selection rules, seeds.

Conventions: every per-position tensor here is indexed by *generation position* (0..L-1, the
prompt excluded) along its last dimension, so one mask/where/sort over ``[..., L]`` handles the
working set without Python loops. Probabilities are plain softmax probabilities in [0, 1].
"""

from __future__ import annotations

import contextlib
import hashlib
from dataclasses import dataclass, field

import torch
from torch import Tensor

from ..tensors.fixed_order import fixed_sum
from .rules import rules_for

# Route codes (int8 in tensors); index into ROUTE_NAMES for the public label.
NONE, BASE, PLAN, AR, FORCED, EXPLORE = 0, 1, 2, 3, 4, 5
ROUTE_NAMES = (None, "base", "plan", "ar", "forced", "explore")


@dataclass
class Stats:
    """Per-position statistics of states from model calls, batched over any leading dims.

    tok:  [..., L] long   top-1 token (Gumbel-max sample when temperature > 0); mask id outside
                          the positions the state's call covered.
    conf: [..., L] float  softmax probability of ``tok`` under the raw logits; 0 outside.
    pmax: [..., L] float  max_w P(w | z) (equals ``conf`` at temperature 0); 0 outside.
    pcur: [..., L] float  probability of the token the state already holds at that position
                          (0 where it holds the mask); used by ``plan_self_check``.
    ent:  [..., L] float  entropy (nats) of the softmax over the raw logits (mask excluded); 0
                          outside. Only computed when the step asked for it (verification with
                          entropies: online vocabulary, calibration), else None.

    A call covers, per request, the generation positions from the earliest active block of its
    rows to the end of the block after the latest one (active + next block of every row); on a
    block-diffusion model, to the end of the latest one unless the step reveals next blocks.
    """

    tok: Tensor
    conf: Tensor
    pmax: Tensor
    pcur: Tensor
    ent: Tensor | None = None

    def pick(self, index: Tensor) -> "Stats":
        """Stats [R, L] of row ``index[r]`` of each request from stats [R, M, L] (new tensors,
        not views: a compiled round's inputs are then alike in every round)."""
        r = torch.arange(index.shape[0], device=index.device)
        return Stats(*(None if t is None else t[r, index]
                       for t in (self.tok, self.conf, self.pmax, self.pcur, self.ent)))

    def row(self, j: int) -> "Stats":
        """Stats [R, L] of row ``j`` of every request from stats [R, M, L] (views)."""
        return Stats(*(None if t is None else t[:, j]
                       for t in (self.tok, self.conf, self.pmax, self.pcur, self.ent)))

    def select(self, keep: Tensor) -> "Stats":
        """The requests ``keep`` (index tensor along dim 0)."""
        return Stats(*(None if t is None else t.index_select(0, keep)
                       for t in (self.tok, self.conf, self.pmax, self.pcur, self.ent)))


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
        memo = {k: _take(v, keep) for k, v in self.memo.items()}
        return Branches(*(_take(v, keep) for v in (self.rows, self.n, self.labels)),
                        entropy=self.entropy, memo=memo, cover=_take(self.cover, keep),
                        unmade=_take(self.unmade, keep))


def _take(v, keep: Tensor):
    """Rows ``keep`` of a tensor (dim 0), of each tensor of a tuple; other values as they are."""
    if isinstance(v, Tensor):
        return v.index_select(0, keep)
    if isinstance(v, tuple):
        return tuple(_take(x, keep) for x in v)
    return v


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
    """

    pick: Tensor
    labels: Tensor
    tally: dict = field(default_factory=dict)
    extra: Tensor | None = None
    remask: Tensor | None = None
    memo: dict = field(default_factory=dict)


#: why ``compile_round`` and ``batch_invariant`` are refused together
ROUND_NOT_INVARIANT = ("batch_invariant=true cannot be combined with compile_round=true: "
                       "inductor does not compile the round's fixed-order sums over a dynamic "
                       "canvas; turn one of them off")


def invariant_mode(model, on: bool):
    """The context a batch-invariant call runs in: the model's ``batch_invariant()`` (it raises
    where its kernels cannot run), or nothing when ``on`` is False. A model whose round runs
    compiled (``compile_round``) is refused with a one-line ValueError."""
    if not on:
        return contextlib.nullcontext()
    if getattr(model, "compile_round", None) is not None:
        raise ValueError(ROUND_NOT_INVARIANT)
    enter = getattr(model, "batch_invariant", None)
    if enter is None:
        raise ValueError(f"batch_invariant=true: the model ({type(model).__name__}) has no "
                         "batch-invariant kernels (a loaded pvf_lmeval DiffusionLM has them)")
    return enter()


def mix_seed(seed: int, request_index: int, repeat_index: int) -> int:
    """Deterministic 63-bit seed from (seed, request index, repeat index), process-independent."""
    h = hashlib.blake2b(f"{seed}/{request_index}/{repeat_index}".encode(), digest_size=8)
    return int.from_bytes(h.digest(), "little") & ((1 << 63) - 1)


def gumbel_like(shape: tuple[int, ...], generator: torch.Generator, device) -> Tensor:
    """Standard Gumbel noise of ``shape`` (float32) drawn from ``generator``."""
    u = torch.rand(shape, generator=generator, device=device, dtype=torch.float32)
    return -torch.log(-torch.log(u.clamp_(min=torch.finfo(torch.float32).tiny)))


def stats_from_logits(logits: Tensor, cur: Tensor, mask_id: int, temperature: float = 0.0,
                      noise: Tensor | None = None, *, fixed: bool = False
                      ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(tok, conf, pmax, pcur), each [N, P], from logits [N, P, V] and the rows' tokens [N, P].

    The mask token's logit is set to -inf first. ``noise`` [P, V] or [N, P, V] (Gumbel) is added
    to ``logits / temperature`` for the choice of ``tok`` only; it is shared by every row of a
    request so that branches of one call compare like with like.

    One read of the vocabulary for the maximum and two passes for the normaliser, in place: the
    float32 ``logits`` are overwritten (the decoder owns the tensor the model returns; a copy
    is made only for other dtypes). The normaliser is torch.logsumexp's own arithmetic
    (max-shifted sum of exponentials, bit for bit), reusing the maximum the top-1 needs anyway;
    ``fixed``: the sum of exponentials in :func:`fixed_sum`'s order (batch-invariant decoding).
    """
    lg = logits.float()
    lg[..., mask_id] = float("-inf")
    mx, tok = lg.max(dim=-1)
    if temperature > 0:
        tok = (lg / temperature + noise).argmax(dim=-1)
        at_tok = lg.gather(-1, tok.unsqueeze(-1)).squeeze(-1)
    at_cur = lg.gather(-1, cur.unsqueeze(-1)).squeeze(-1)
    shift = mx.masked_fill(mx.abs() == float("inf"), 0.0)
    ex = lg.sub_(shift.unsqueeze(-1)).exp_()
    lse = (fixed_sum(ex) if fixed else ex.sum(dim=-1)).log_().add_(shift)
    pmax = torch.exp(mx - lse)
    conf = torch.exp(at_tok - lse) if temperature > 0 else pmax
    pcur = torch.exp(at_cur - lse)
    return tok, conf, pmax, pcur


def entropy_from_logits(logits: Tensor, mask_id: int, *, fixed: bool = False) -> Tensor:
    """Entropy [N, P] (nats) of softmax(logits) [N, P, V] with the mask token excluded.

    Ids whose logit is -inf (the mask, undecodable ids) contribute 0. Only the calibration and
    the online vocabulary ask for it, so the default decoding path never pays for it.
    ``fixed``: every sum over the vocabulary in :func:`fixed_sum`'s order (batch-invariant).
    """
    lg = logits.float()
    lg[..., mask_id] = float("-inf")
    if fixed:
        logp = log_softmax_fixed(lg)
    else:
        logp = torch.log_softmax(lg, dim=-1)
    p = logp.exp()
    plogp = p * torch.where(p > 0, logp, torch.zeros_like(logp))
    return -(fixed_sum(plogp) if fixed else plogp.sum(-1))


def log_softmax_fixed(lg: Tensor) -> Tensor:
    """log_softmax over the last dim with the normaliser summed in :func:`fixed_sum`'s order
    (a row's values depend on that row only); -inf logits stay -inf."""
    z = lg - lg.max(dim=-1, keepdim=True).values
    return z - fixed_sum(z.exp()).log().unsqueeze(-1)


def first_true(mask: Tensor) -> Tensor:
    """Index of the first True along the last dim ([...]), or L where there is none."""
    L = mask.shape[-1]
    idx = torch.arange(L, device=mask.device)
    return torch.where(mask, idx, torch.full_like(idx, L)).min(dim=-1).values


def rank_desc(conf: Tensor, members: Tensor) -> Tensor:
    """Rank [..., L] of each member by ``conf`` descending, ties by lower index (0 = best).

    Non-members get rank L (never selected by ``rank < k``).
    """
    L = conf.shape[-1]
    key = torch.where(members, conf, torch.full_like(conf, float("-inf")))
    order = torch.sort(key, dim=-1, descending=True, stable=True).indices
    ar = torch.arange(L, device=conf.device).expand_as(order)
    rank = torch.empty_like(order).scatter_(-1, order, ar)
    return torch.where(members, rank, torch.full_like(rank, L))


def threshold_select(conf: Tensor, members: Tensor, tau: float,
                     factor: float | None = None, *, last_rank_commits_all: bool = False,
                     force: bool = True) -> tuple[Tensor, Tensor]:
    """Fast-dLLM rule over ``members`` [..., L]: returns (selected, forced) masks.

    Without ``factor``: members with ``conf >= tau``. With ``factor`` f: members whose rank n
    (1-based, conf descending) has ``conf >= 1 - f/(n+1)`` (a prefix of the ranking). If no member
    qualifies, the single most confident member is selected and flagged ``forced`` (``force``
    False: nothing is selected then, the caller forces later).

    ``last_rank_commits_all`` (``rules=reference``, factor rule only): as in Fast-dLLM's code,
    whose top-ranked member always passes, when the first member that fails is the last one in
    the ranking, every member is selected, the failing one included.
    """
    rank = rank_desc(conf, members)
    if factor is None:
        clear = members & (conf >= tau)
    else:
        clear = members & (conf >= 1.0 - factor / (rank + 2).to(conf.dtype))
        if last_rank_commits_all:
            n = members.sum(-1, keepdim=True)
            first_fail = clear.sum(-1, keepdim=True).clamp(min=1)      # the top always passes
            clear = clear | (members & (n >= 2) & (first_fail == n - 1))
    top = members & (rank == 0)
    forced = top & ~clear.any(dim=-1, keepdim=True)
    if not force:
        forced = torch.zeros_like(forced)
    return clear | forced, forced


def static_select(conf: Tensor, members: Tensor, k: int | Tensor = 1) -> Tensor:
    """The ``k`` most confident members [..., L] (ties by index)."""
    return members & (rank_desc(conf, members) < k)


class Step:
    """A decoder: how one round builds each request's branch rows and picks the committed one.

    Decoders describe themselves: ``name``; ``uses_vocab`` (reads the planning vocabulary);
    ``reveals`` (honours ``reveal_next``, early cross-block revelation); ``rows_per_call(params)``
    (M, the most rows a request sends in one round). ``max_rows`` caps the rows of one physical
    model call (None: no cap).

    ``branches(b, y, st)`` gets the committed states ``y`` [R, L] of the live requests (their
    numbers: ``b.req`` on the device, ``b.ids`` on the host) and their stats [R, L];
    ``choose(b, y, st, br, out)`` gets the stats [R, M, L] of the rows sent. Both are tensor
    operations only, never a host value that changes from round to round (``b.ids`` included),
    so that a round runs as a compiled program (``compile_round``).
    ``info(r, made_call, br, choice)`` is the trace record of live request r (trace mode only;
    it may read tensors).

    The loop builds a round's branches at the end of the round before, for every request live
    then, so that one host read carries their call layout with that round's stop flags; the
    branches of the requests that finished in that round are then dropped
    (:meth:`Branches.select`). So ``branches`` never reads the host, keeps what ``choose``
    needs in ``memo`` rather than on the step, and changes nothing that a finished request's
    result depends on (calls it counts without making go to ``Branches.unmade``); per-round
    accounting belongs in ``choose``.
    """

    name = ""
    uses_vocab = False
    reveals = False
    max_rows: int | None = None

    @staticmethod
    def rows_per_call(params) -> int:
        return 1

    def __init__(self, params):
        self.p = params
        self.reveal = params.reveal_next if self.reveals else 0
        self.rows = self.rows_per_call(params)
        self.rules = rules_for(params.rules)

    def branches(self, b, y: Tensor, st: Stats) -> Branches:
        raise NotImplementedError

    def choose(self, b, y: Tensor, st: Stats, br: Branches, out: Stats
               ) -> Choice:
        """Single-row steps: the request commits its one row."""
        return Choice(torch.zeros_like(br.n), br.labels)

    def info(self, r: int, made_call: bool, br: Branches, choice: Choice) -> dict:
        return {"route": "base"}


def single_row(b, zb: Tensor, labels: Tensor) -> Branches:
    """Branches of a step that commits ``zb`` [R, L] with a single-row call (none once finished)."""
    return Branches(zb.unsqueeze(1), (~b.finished(zb)).long(), labels)


def base_labels(sel: Tensor, forced: Tensor) -> Tensor:
    """int8 route codes [..., L]: ``forced`` where forced, ``base`` where selected, else none."""
    return torch.where(forced, FORCED, torch.where(sel, BASE, NONE)).to(torch.int8)


def llada_count_tensor(block_masks: int | Tensor, steps_per_block: int, done: Tensor) -> Tensor:
    """Tokens to commit at this step under LLaDA's schedule for one block, elementwise over the
    ``done`` counts: a block of m masks at its start (``block_masks``, an int or a tensor
    broadcasting with ``done``) in s steps (``steps_per_block``) commits m//s + 1 at its first
    m%s steps and m//s at the others; ``done`` (tokens already committed in the
    block) fixes the step."""
    # an int stays on the host: a scalar tensor made from it would be a blocking upload
    q, r = block_masks // steps_per_block, block_masks % steps_per_block
    # the first r steps commit q + 1 each, r * (q + 1) tokens in all (the whole block when
    # m < s: q = 0 is never asked for)
    return torch.where(done < r * (q + 1), q + 1, q).expand_as(done)
