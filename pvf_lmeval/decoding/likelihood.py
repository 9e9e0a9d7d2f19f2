"""Log-likelihood of a continuation under a masked diffusion LM: LLaDA's Monte Carlo ELBO.

A masked diffusion LM has no left-to-right factorisation, so ``log p(target | prefix)`` is
estimated, as LLaDA's own lm-eval harness does (``eval_llada.py``, paper eq. 6), by the lower bound

    log p(x | c) >= E_l [ T/l * sum over the l masked positions i of log p(x_i | c, x_masked) ]

with ``T`` continuation tokens, ``l`` of them masked uniformly at random, the prefix never masked.
One draw d masks ``l_d`` tokens; the estimate is the mean over ``mc_num`` draws. The counts are
stratified as in LLaDA: per stratum of ``b`` draws, ``k`` uniform in 1..T, then
``l_d = round(linspace(k, k + (b-1) T/b, b))`` wrapped into 1..T, so that every mask ratio band is
visited once per stratum. How the draws are made, and how log-probabilities are read, is the
run's :class:`Estimator`:

- ``mc_stratum`` None (the default): the ``mc_num`` draws form one stratum and each draw's
  positions are the ``l_d`` smallest ranks of uniform noise (:func:`mask_draws`). An integer
  ``b``: LLaDA's ``forward_process`` per stratum of ``b`` draws, random call for random call
  (:func:`stratified_draws`; LLaDA stratifies per mini-batch of its ``batch_size``).
- ``mask_logit="excluded"`` (the default): log-probabilities are ``log_softmax`` of the logits with
  the mask token's logit at ``-inf`` (the model never predicts a mask, as in decoding; SPEC
  "Probabilities"); ``"kept"``: over the whole vocabulary, as LLaDA's ``cross_entropy``.
- ``cfg_scale`` > 0 (the decoding parameter, one value for generation and likelihood): LLaDA's
  classifier-free guidance (``get_logits``, ``runner.guided_logits``): one model call on the
  canvases and the same canvases with their prefix masked, combined as
  ``un + (cfg_scale + 1) * (cond - un)`` before the softmax; every call then has twice the rows.

Details decided here:

- All randomness (``k`` and the masked positions) comes from one CPU generator seeded by
  (``seed``, request index, 0) and is drawn for all ``mc_num`` draws up front, so the estimate does
  not depend on ``mc_batch`` (draws per model call), on the device or on the order of requests.
- :func:`elbo` scores one continuation, ``mc_batch`` draws per model call: the reference.
  :func:`elbo_batch` scores many with the same draws and shares the model's work between them:
  a draw is a canvas (prefix, then the target with the draw's positions masked), identical
  canvases are computed once (draws that mask the same positions: every draw of a one-token
  continuation; choices of one question whose draws hide the tokens where they differ, since
  their draws share a seed), and canvases of one length go through the model together,
  ``rows_per_call`` at a time. No row is padded: each canvas's logits are those :func:`elbo`
  computes (bit for bit with ``batch_invariant``; without it the CPU's products may round a row
  differently with the number of rows beside it, at the level of float32 rounding).
- ``is_greedy`` (lm-eval's ``acc`` for ``output_type: loglikelihood`` tasks) is LLaDA's
  ``suffix_greedy_prediction``: on the canvas of the prefix and ``T`` masks, the model commits one
  token per call, at the most confident masked position (the softmax probability of its argmax;
  ties: the lowest position), and ``is_greedy`` is whether the committed tokens are the target.
  It is decided as soon as a committed token differs from the target's (:func:`suffix_greedy`).
  Its first call is the draw that masks every target token: when the draws hold it (every draw
  of a one-token continuation does), :func:`elbo_batch` reads that first step from it, and a
  one-token continuation, or one whose first committed token is wrong, needs no call of its own.

Pure torch against the model protocol (``mask_id``, ``logits(tokens, positions)``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch import Tensor

from ..tensors.fixed_order import fixed_sum
from .batch import mix_seed
from .options import invariant_mode
from .param_spec import Cap, Param
from .params import CFG_SCALE
from .runner import guided_logits
from .stats import log_softmax_fixed

#: LLaDA's evaluation defaults (``mc_num=128`` draws, 32 per call).
DEFAULT_MC_NUM = 128
DEFAULT_MC_BATCH = 32
#: ``mask_logit``: the mask token's logit excluded from the softmax (SPEC), or kept (LLaDA's)
MASK_LOGIT = ("excluded", "kept")
#: the most draws a continuation may take, so that a typo fails in one line, not in the allocator
DRAWS = Cap(1 << 16, " draws")

#: the likelihood parameters (model args of log-likelihood tasks), declared once here: the
#: adapter's settings coerce and check them, ``pvf-dlm args`` lists them
LIKELIHOOD_PARAMS = (
    Param("mc_num", int, DEFAULT_MC_NUM, "log-likelihood tasks: Monte Carlo draws of the ELBO "
          "per continuation", bounds=">= 1", cap=DRAWS, bound_text="a positive integer"),
    Param("mc_batch", int, DEFAULT_MC_BATCH, "log-likelihood tasks: draws per model call "
          "(memory, not the result)", bounds=">= 1", cap=DRAWS, bound_text="a positive integer"),
    Param("mc_stratum", int, None, "log-likelihood tasks: the draws' mask counts stratified "
          "per group of this many draws, each drawn as LLaDA's forward_process (its lm-eval "
          "scripts' batch_size 8: mc_stratum=8)", bounds=">= 1", cap=DRAWS,
          none_means="mc_num (one stratum)", bound_text="a positive integer",
          allowed="a positive integer dividing mc_num"),
    Param("mask_logit", str, "excluded", "log-likelihood tasks: the mask token's logit "
          "excluded from the softmax, or kept (LLaDA's cross_entropy over the whole vocabulary)",
          choices=MASK_LOGIT),
)


@dataclass(frozen=True)
class Estimator:
    """How a continuation's log-likelihood is estimated (see the module): ``mc_num`` draws,
    stratified per ``mc_stratum`` draws (None: all together), log-probabilities under
    ``cfg_scale`` and the ``mask_logit`` rule. Checked on construction (one-line errors)."""

    mc_num: int = DEFAULT_MC_NUM
    mc_stratum: int | None = None
    cfg_scale: float = 0.0
    mask_logit: str = "excluded"

    def __post_init__(self):
        for spec in (*LIKELIHOOD_PARAMS, CFG_SCALE):
            if hasattr(self, spec.name):
                spec.check_cap(getattr(self, spec.name))
                spec.validate(getattr(self, spec.name))
        if self.mc_stratum is not None and self.mc_num % self.mc_stratum:
            raise ValueError(f"mc_stratum={self.mc_stratum} must divide mc_num={self.mc_num} "
                             "(draws are stratified in groups of mc_stratum)")

    @property
    def rows_per_canvas(self) -> int:
        """Model rows per canvas scored: 2 under classifier-free guidance."""
        return 2 if self.cfg_scale > 0 else 1


@dataclass
class Likelihood:
    """One continuation's score.

    logprob:   the ELBO estimate (mean of ``draws``), a lower bound on log p(target | prefix).
    is_greedy: LLaDA's greedy check (module) when the draws decided it, else None.
    draws:     [mc_num] per-draw estimates (float64, CPU): their spread is the Monte Carlo noise.
    nfe:       model calls that computed its canvases (calls may be shared with others).
    canvases:  distinct canvases computed for it (shared ones counted for each continuation).
    rows:      model rows of those canvases (``canvases``, twice under classifier-free guidance).
    greedy_first: the target position the greedy check commits first, when the draws held
               that step and its token is the target's (the check goes on from there).
    """

    logprob: float
    is_greedy: bool | None
    draws: Tensor
    nfe: int
    canvases: int = 0
    rows: int = 0
    greedy_first: int | None = None

    def stats(self) -> dict:
        """Its costs as the run's totals count them: ``nfe`` (model calls), ``branch_rows``
        (their rows), ``canvases``, ``mc_num`` (draws)."""
        return {"nfe": self.nfe, "branch_rows": self.rows, "canvases": self.canvases,
                "mc_num": int(self.draws.numel())}

    @property
    def stderr(self) -> float:
        """Standard error of ``logprob`` (0 with a single draw)."""
        n = self.draws.numel()
        return float(self.draws.std(unbiased=True) / n ** 0.5) if n > 1 else 0.0


def _as_ids(x, device) -> Tensor:
    return torch.as_tensor(x, dtype=torch.long).reshape(-1).to(device)


def _device(model, fallback: Tensor) -> torch.device:
    dev = getattr(model, "device", None)
    return torch.device(dev) if dev is not None else fallback.device


def _check_draws(target_len: int, mc_num: int) -> None:
    if int(target_len) < 1:
        raise ValueError("the continuation has no tokens to score")
    if int(mc_num) < 1:
        raise ValueError(f"mc_num={mc_num!r} must be a positive integer")


def mask_draws(target_len: int, mc_num: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """(masked [mc_num, T] bool, counts [mc_num] long) for ``mc_num`` draws stratified together
    (CPU): ``counts[d]`` in 1..T positions are masked in draw d, chosen uniformly without
    replacement (the ``counts[d]`` smallest ranks of uniform noise)."""
    _check_draws(target_len, mc_num)
    T, n = int(target_len), int(mc_num)
    k = int(torch.randint(1, T + 1, (), generator=generator))
    counts = torch.round(torch.linspace(float(k), k + (n - 1) * (T / n), steps=n,
                                        dtype=torch.float64)).long()
    counts = (counts - 1) % T + 1
    order = torch.rand((n, T), generator=generator).argsort(dim=-1)
    rank = torch.empty_like(order).scatter_(-1, order, torch.arange(T).expand(n, T).contiguous())
    return rank < counts.unsqueeze(1), counts


def stratified_draws(target_len: int, mc_num: int, stratum: int,
                     generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """(masked [mc_num, T] bool, counts [mc_num] long) drawn as LLaDA's ``forward_process``, one
    stratum of ``stratum`` draws after another, random call for random call (CPU): the stratum's
    ``k = randint(1, T + 1)``, its counts ``round(linspace(k, k + (b-1) T/b, b))`` in float32
    wrapped into 1..T, then per draw ``randperm(T)``, position j masked when its value is below
    the draw's count. From a generator in the state of LLaDA's global one, the same masks."""
    _check_draws(target_len, mc_num)
    T, n, b = int(target_len), int(mc_num), int(stratum)
    masked = torch.empty((n, T), dtype=torch.bool)
    counts = torch.empty(n, dtype=torch.long)
    for s in range(0, n, b):
        k = torch.randint(1, T + 1, (), generator=generator)
        x = torch.round(torch.linspace(float(k), k + (b - 1) * (T / b), steps=b)).long()
        counts[s:s + b] = (x - 1) % T + 1
        # one randperm per draw, in LLaDA's order: its draws are a loop, so are these
        for d in range(s, s + b):
            masked[d] = torch.randperm(T, generator=generator) < counts[d]
    return masked, counts


def draws_of(target_len: int, estimator: "Estimator", seed: int,
             key: int) -> tuple[Tensor, Tensor]:
    """The draws of a continuation of ``target_len`` tokens whose seed key is ``key``."""
    g = torch.Generator().manual_seed(mix_seed(int(seed), int(key), 0))
    if estimator.mc_stratum is None:
        return mask_draws(target_len, estimator.mc_num, g)
    return stratified_draws(target_len, estimator.mc_num, estimator.mc_stratum, g)


def log_probs(model, rows: Tensor, positions: Tensor, prefix_lens: Tensor,
              estimator: "Estimator", fixed: bool = False) -> Tensor:
    """log p(token | row) at ``positions`` of every row: [N, len(positions), V] float32.

    ``prefix_lens`` [N]: each row's prefix, masked in the unconditional rows of classifier-free
    guidance (one call on [rows; unconditional rows], LLaDA's ``get_logits``); the mask token's
    logit then follows ``estimator.mask_logit``. ``fixed``: the normaliser summed in a fixed
    order (batch-invariant)."""
    mask_id = int(model.mask_id)
    if estimator.cfg_scale > 0:
        logits = guided_logits(model, rows, positions, None, prefix_lens, mask_id,
                               estimator.cfg_scale)
    else:
        logits = model.logits(rows, positions, attention_mask=None, cache=None).float()
    if estimator.mask_logit == "excluded":
        logits[..., mask_id] = float("-inf")
    return log_softmax_fixed(logits) if fixed else torch.log_softmax(logits, dim=-1)


def _first_step(logp: Tensor, target: Tensor) -> tuple[int, bool]:
    """The greedy check's step on a canvas with every target position masked: (the most
    confident position, whether its argmax is the target's token). ``logp`` [T, V]."""
    conf, tok = logp.max(dim=-1)
    pick = int(conf.argmax())                  # the first of equal maxima: the lowest position
    return pick, bool(tok[pick] == target[pick])


@torch.no_grad()
def elbo(model, prefix, target, *, estimator: Estimator | None = None,
         mc_batch: int = DEFAULT_MC_BATCH, seed: int = 0, request_index: int = 0,
         fixed: bool = False) -> tuple[Tensor, int]:
    """Per-draw ELBO estimates [mc_num] (float64, CPU) of ``target`` after ``prefix``, and the NFE.

    ``prefix`` may be empty; ``target`` must hold at least one token. ``fixed``: every sum in a
    fixed order (batch-invariant: a draw's estimate does not depend on ``mc_batch``).
    """
    est = estimator or Estimator()
    if int(mc_batch) < 1:
        raise ValueError(f"mc_batch={mc_batch!r} must be a positive integer")
    prefix = torch.as_tensor(prefix, dtype=torch.long).reshape(-1)
    dev = _device(model, prefix)
    prefix, target = prefix.to(dev), _as_ids(target, dev)
    P, T = int(prefix.numel()), int(target.numel())
    masked, counts = draws_of(T, est, seed, request_index)
    masked = masked.to(dev)
    seq = torch.cat([prefix, target])
    positions = torch.arange(P, P + T, device=dev)
    out = torch.empty(est.mc_num, dtype=torch.float64)
    nfe = 0
    for a in range(0, est.mc_num, int(mc_batch)):
        m = masked[a:a + int(mc_batch)]
        rows = seq.unsqueeze(0).repeat(m.shape[0], 1)
        rows[:, P:] = torch.where(m, torch.full_like(m, int(model.mask_id), dtype=torch.long),
                                  rows[:, P:])
        logp = log_probs(model, rows, positions, torch.full((m.shape[0],), P), est, fixed)
        idx = target.to(logp.device).expand(m.shape[0], -1).unsqueeze(-1)
        lp = logp.gather(-1, idx).squeeze(-1)
        nfe += 1
        lp = torch.where(m.to(lp.device), lp, torch.zeros_like(lp))
        s = (fixed_sum(lp) if fixed else lp.sum(-1)).double().cpu()
        out[a:a + m.shape[0]] = s * T / counts[a:a + m.shape[0]].double()
    return out, nfe


@dataclass(frozen=True)
class Continuation:
    """One continuation to score: ``prefix`` and ``target`` token ids and ``key``, the request
    index that seeds its draws (choices of one question share it: common random numbers)."""

    prefix: Sequence[int]
    target: Sequence[int]
    key: int


def _canvases(item: Continuation, est: Estimator, seed: int, mask_id: int):
    """(canvases [mc_num, P + T] long, masked [mc_num, T] bool, counts [mc_num]) of ``item``'s
    draws, on the CPU: the rows :func:`elbo` builds."""
    masked, counts = draws_of(len(item.target), est, seed, item.key)
    seq = torch.as_tensor([*item.prefix, *item.target], dtype=torch.long)
    rows = seq.expand(est.mc_num, -1).clone()
    P = len(item.prefix)
    rows[:, P:] = torch.where(masked, torch.full_like(rows[:, P:], int(mask_id)), rows[:, P:])
    return rows, masked, counts


@dataclass
class _Scored:
    """What :func:`elbo_batch` computed for one item."""

    draws: Tensor
    calls: int = 0
    canvases: int = 0
    first: tuple[int, bool] | None = None


@torch.no_grad()
def elbo_batch(model, items: Sequence[Continuation], *, estimator: Estimator | None = None,
               rows_per_call: int = DEFAULT_MC_BATCH, seed: int = 0,
               fixed: bool = False) -> list[_Scored]:
    """Per item: its per-draw ELBO estimates ([mc_num] float64, CPU: those of :func:`elbo`),
    the model calls that computed its canvases, how many distinct canvases it reads, and the
    greedy check's first step when a draw masks its whole target.

    The items' draws are grouped by canvas length; in a group, identical canvases are computed
    once (under classifier-free guidance, identical canvases with the same prefix length), and
    at most ``rows_per_call`` distinct canvases go into one model call (no padding).
    ``fixed``: every sum in a fixed order (batch-invariant)."""
    est = estimator or Estimator()
    if int(rows_per_call) < 1:
        raise ValueError(f"rows_per_call={rows_per_call!r} must be a positive integer")
    if not items:
        return []
    dev = torch.device(getattr(model, "device", None) or "cpu")
    mask_id = int(model.mask_id)
    n = est.mc_num
    drawn = [_canvases(it, est, seed, mask_id) for it in items]
    by_length: dict[int, list[int]] = {}
    for i, it in enumerate(items):
        by_length.setdefault(len(it.prefix) + len(it.target), []).append(i)
    sums = [torch.empty(n, dtype=torch.float64) for _ in items]
    out = [_Scored(s) for s in sums]
    for W, members in by_length.items():
        keys = torch.cat([drawn[i][0] for i in members])
        prefix_lens = torch.tensor([len(items[i].prefix) for i in members]).repeat_interleave(n)
        if est.cfg_scale > 0:        # the unconditional row masks the canvas's own prefix
            keys = torch.cat([keys, prefix_lens.unsqueeze(1)], dim=1)
        distinct, row_of = torch.unique(keys, dim=0, return_inverse=True)
        canvases = distinct[:, :W]
        canvas_prefix = (distinct[:, W] if est.cfg_scale > 0
                         else torch.zeros(distinct.shape[0], dtype=torch.long))
        row_of = row_of.split(n)            # member j's draws -> rows of ``canvases``
        T_max = max(len(items[i].target) for i in members)
        positions = torch.arange(W - T_max, W, device=dev)
        full = []                      # each member's first draw that masks its whole target
        for i in members:
            hit = (drawn[i][2] == len(items[i].target)).nonzero()
            full.append(int(hit[0]) if hit.numel() else None)
        for j, i in enumerate(members):
            out[i].canvases = int(row_of[j].unique().numel())
        for a in range(0, canvases.shape[0], int(rows_per_call)):
            b = min(a + int(rows_per_call), canvases.shape[0])
            logp = log_probs(model, canvases[a:b].to(dev), positions, canvas_prefix[a:b], est,
                             fixed)
            for j, i in enumerate(members):
                draws = ((row_of[j] >= a) & (row_of[j] < b)).nonzero().squeeze(1)
                if draws.numel() == 0:
                    continue
                out[i].calls += 1
                target = torch.as_tensor(items[i].target, dtype=torch.long, device=logp.device)
                T = target.numel()
                lp = logp[(row_of[j][draws] - a).to(logp.device), T_max - T:]
                if full[j] is not None and a <= int(row_of[j][full[j]]) < b:
                    out[i].first = _first_step(logp[int(row_of[j][full[j]]) - a, T_max - T:],
                                               target)
                lp = lp.gather(-1, target.expand(draws.numel(), T).unsqueeze(-1)).squeeze(-1)
                lp = torch.where(drawn[i][1][draws].to(lp.device), lp, torch.zeros_like(lp))
                sums[i][draws] = (fixed_sum(lp) if fixed else lp.sum(-1)).double().cpu()
    for o, it, d in zip(out, items, drawn):
        o.draws = o.draws * len(it.target) / d[2].double()
    return out


def loglikelihoods(model, items: Sequence[Continuation], *, estimator: Estimator | None = None,
                   rows_per_call: int = DEFAULT_MC_BATCH, seed: int = 0,
                   batch_invariant: bool = False) -> list[Likelihood]:
    """The ELBO estimates of several continuations (:func:`elbo_batch`), with ``is_greedy`` where
    the draws decide it. ``batch_invariant``: as in ``decode_batch`` (the model's
    batch-invariant kernels, fixed-order sums)."""
    est = estimator or Estimator()
    with invariant_mode(model, batch_invariant):
        scored = elbo_batch(model, items, estimator=est, rows_per_call=rows_per_call, seed=seed,
                            fixed=batch_invariant)
    out = []
    for s, it in zip(scored, items):
        greedy, first = None, None
        if s.first is not None:
            pick, ok = s.first
            if not ok or len(it.target) == 1:
                greedy = ok
            else:
                first = pick
        out.append(Likelihood(float(s.draws.mean()), greedy, s.draws, s.calls, s.canvases,
                              s.canvases * est.rows_per_canvas, first))
    return out


def loglikelihood(model, prefix, target, *, estimator: Estimator | None = None,
                  mc_batch: int = DEFAULT_MC_BATCH, seed: int = 0, request_index: int = 0,
                  batch_invariant: bool = False) -> Likelihood:
    """The ELBO estimate of ``log p(target | prefix)`` (one continuation of
    :func:`loglikelihoods`)."""
    item = Continuation(list(_as_ids(prefix, "cpu").tolist()), list(_as_ids(target, "cpu").tolist()),
                        int(request_index))
    return loglikelihoods(model, [item], estimator=estimator, rows_per_call=mc_batch, seed=seed,
                          batch_invariant=batch_invariant)[0]


def rolling_loglikelihood(model, windows, *, estimator: Estimator | None = None,
                          mc_batch: int = DEFAULT_MC_BATCH, seed: int = 0,
                          request_index: int = 0, batch_invariant: bool = False) -> Likelihood:
    """Sum of the ELBO estimates over disjoint ``windows`` [(context_ids, pred_ids), ...].

    Each window's draws are seeded by (``seed``, ``request_index`` + window index). ``draws`` of
    the result are the per-draw sums over windows; its costs are the windows' sums.
    """
    est = estimator or Estimator()
    items = [Continuation(list(ctx), list(pred), (int(request_index) + w) & ((1 << 63) - 1))
             for w, (ctx, pred) in enumerate(windows)]
    parts = loglikelihoods(model, items, estimator=est, rows_per_call=mc_batch, seed=seed,
                           batch_invariant=batch_invariant)
    total = torch.zeros(est.mc_num, dtype=torch.float64)
    for r in parts:
        total += r.draws
    return Likelihood(float(total.mean()), None, total, sum(r.nfe for r in parts),
                      sum(r.canvases for r in parts), sum(r.rows for r in parts))


@dataclass(frozen=True)
class GreedyCheck:
    """The outcome of :func:`suffix_greedy` for one continuation: ``value`` (is_greedy), the
    model ``calls`` it took and the ``canvases`` they computed for it."""

    value: bool
    calls: int
    canvases: int


@torch.no_grad()
def suffix_greedy(model, items: Sequence[Continuation], firsts: Sequence[int | None], *,
                  estimator: Estimator | None = None, rows_per_call: int = DEFAULT_MC_BATCH,
                  batch_invariant: bool = False) -> list[GreedyCheck]:
    """lm-eval's ``is_greedy`` of each item as LLaDA's ``suffix_greedy_prediction`` defines it
    (module): one token per call at the most confident masked target position, until a
    committed token differs from the target's (False) or the target is complete (True).
    ``firsts[i]``: a target position already committed with the target's token (the step the
    draws held: :attr:`Likelihood.greedy_first`), else None.

    The items' canvases go through the model by canvas length, at most ``rows_per_call`` per
    call, every undecided item one row per step; the logits follow ``estimator`` (cfg_scale,
    mask_logit), as the estimate's do."""
    est = estimator or Estimator()
    out: list[GreedyCheck | None] = [None] * len(items)
    dev = torch.device(getattr(model, "device", None) or "cpu")
    mask_id = int(model.mask_id)
    by_length: dict[int, list[int]] = {}
    for i, it in enumerate(items):
        by_length.setdefault(len(it.prefix) + len(it.target), []).append(i)
    with invariant_mode(model, batch_invariant):
        for W, members in by_length.items():
            T_max = max(len(items[i].target) for i in members)
            seq = torch.stack([torch.as_tensor([*items[i].prefix, *items[i].target],
                                               dtype=torch.long) for i in members])
            target = seq[:, W - T_max:]
            # target positions of each row still masked ([n, T_max]; a shorter target's leading
            # columns are prefix, never masked)
            start = torch.tensor([W - len(items[i].target) for i in members]) - (W - T_max)
            cols = torch.arange(T_max)
            masked = cols >= start.unsqueeze(1)
            for j, i in enumerate(members):
                if firsts[i] is not None:
                    masked[j, int(start[j]) + int(firsts[i])] = False
            prefix_lens = torch.tensor([len(items[i].prefix) for i in members])
            calls = torch.zeros(len(members), dtype=torch.long)
            alive = masked.any(dim=1)
            result = torch.ones(len(members), dtype=torch.bool)
            positions = torch.arange(W - T_max, W, device=dev)
            while bool(alive.any()):
                rows = alive.nonzero().squeeze(1)
                for a in range(0, rows.numel(), int(rows_per_call)):
                    r = rows[a:a + int(rows_per_call)]
                    canvas = seq[r].clone()
                    canvas[:, W - T_max:] = torch.where(masked[r], mask_id, target[r])
                    logp = log_probs(model, canvas.to(dev), positions, prefix_lens[r], est,
                                     batch_invariant).cpu()
                    conf, tok = logp.max(dim=-1)
                    conf = conf.masked_fill(~masked[r], float("-inf"))
                    pick = conf.argmax(dim=-1)         # the first maximum: the lowest position
                    ok = tok.gather(1, pick.unsqueeze(1)).squeeze(1) == \
                        target[r].gather(1, pick.unsqueeze(1)).squeeze(1)
                    calls[r] += 1
                    masked[r, pick] = False
                    result[r] = ok
                    done = ~ok | ~masked[r].any(dim=1)
                    alive[r[done]] = False
            for j, i in enumerate(members):
                out[i] = GreedyCheck(bool(result[j]), int(calls[j]), int(calls[j]))
    return out
