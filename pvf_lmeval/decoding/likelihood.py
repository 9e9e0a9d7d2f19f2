"""Log-likelihood of a continuation under a masked diffusion LM: LLaDA's Monte Carlo ELBO.

A masked diffusion LM has no left-to-right factorisation, so ``log p(target | prefix)`` is
estimated, as LLaDA's own lm-eval harness does (``eval_llada.py``, paper eq. 6), by the lower bound

    log p(x | c) >= E_l [ T/l * sum over the l masked positions i of log p(x_i | c, x_masked) ]

with ``T`` continuation tokens, ``l`` of them masked uniformly at random, the prefix never masked.
One draw d masks ``l_d`` tokens; the estimate is the mean over ``mc_num`` draws. The counts are
stratified as in LLaDA: ``k`` uniform in 1..T, then ``l_d = round(linspace(k, k + (n-1) T/n, n))``
wrapped into 1..T, so that every mask ratio band is visited once per ``n`` draws.

Details decided here:

- All randomness (``k`` and the masked positions) comes from one CPU generator seeded by
  (``seed``, request index, 0) and is drawn for all ``mc_num`` draws up front, so the estimate does
  not depend on ``mc_batch`` (draws per model call), on the device or on the order of requests.
- Log-probabilities are ``log_softmax`` of the logits with the mask token's logit at ``-inf`` (the
  model never predicts a mask, as in decoding; see SPEC "Probabilities").
- :func:`elbo` scores one continuation, ``mc_batch`` draws per model call: the reference.
  :func:`elbo_batch` scores many with the same draws and shares the model's work between them:
  a draw is a canvas (prefix, then the target with the draw's positions masked), identical
  canvases are computed once (draws that mask the same positions: every draw of a one-token
  continuation; choices of one question whose draws hide the tokens where they differ, since
  their draws share a seed), and canvases of one length go through the model together,
  ``rows_per_call`` at a time. No row is padded: each canvas's logits are those :func:`elbo`
  computes (bit for bit with ``batch_invariant``; without it the CPU's products may round a row
  differently with the number of rows beside it, at the level of float32 rounding).
- ``is_greedy`` (lm-eval's ``acc`` for ``output_type: loglikelihood`` tasks) is HFLM's: the model's
  greedy generation starts with the continuation. Here the generation is the configured decoder
  at temperature 0 on its configured canvas (``gen_length``, or the continuation's length in
  whole blocks when that is longer): :func:`greedy_matches`, one decode per distinct prefix.

Pure torch against the model protocol (``mask_id``, ``logits(tokens, positions)``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch import Tensor

from ..tensors.fixed_order import fixed_sum
from .api import decode_batch
from .batch import mix_seed
from .options import invariant_mode
from .params import DecodeParams, override
from .stats import log_softmax_fixed

#: LLaDA's evaluation defaults (``mc_num=128`` draws, 32 per call).
DEFAULT_MC_NUM = 128
DEFAULT_MC_BATCH = 32


@dataclass
class Likelihood:
    """One continuation's score.

    logprob:   the ELBO estimate (mean of ``draws``), a lower bound on log p(target | prefix).
    is_greedy: the greedy generation starts with the target (None when not asked for).
    draws:     [mc_num] per-draw estimates (float64, CPU): their spread is the Monte Carlo noise.
    nfe:       model calls that computed its canvases (calls may be shared with others).
    """

    logprob: float
    is_greedy: bool | None
    draws: Tensor
    nfe: int

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


def mask_draws(target_len: int, mc_num: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """(masked [mc_num, T] bool, counts [mc_num] long) for ``mc_num`` stratified draws (CPU).

    ``counts[d]`` in 1..T positions are masked in draw d, chosen uniformly without replacement.
    """
    T, n = int(target_len), int(mc_num)
    if T < 1:
        raise ValueError("the continuation has no tokens to score")
    if n < 1:
        raise ValueError(f"mc_num={mc_num!r} must be a positive integer")
    k = int(torch.randint(1, T + 1, (), generator=generator))
    counts = torch.round(torch.linspace(float(k), k + (n - 1) * (T / n), steps=n,
                                        dtype=torch.float64)).long()
    counts = (counts - 1) % T + 1
    order = torch.rand((n, T), generator=generator).argsort(dim=-1)
    rank = torch.empty_like(order).scatter_(-1, order, torch.arange(T).expand(n, T).contiguous())
    return rank < counts.unsqueeze(1), counts


def _target_logprobs(model, rows: Tensor, positions: Tensor, target: Tensor,
                     fixed: bool = False) -> Tensor:
    """log p(target_i | row) at ``positions`` for every row: [N, T] float32 (``fixed``: the
    normaliser summed in a fixed order, batch-invariant)."""
    logits = model.logits(rows, positions, attention_mask=None, cache=None).float()
    logits[..., int(model.mask_id)] = float("-inf")
    logp = log_softmax_fixed(logits) if fixed else torch.log_softmax(logits, dim=-1)
    return logp.gather(-1, target.to(logp.device).expand(rows.shape[0], -1).unsqueeze(-1)).squeeze(-1)


@torch.no_grad()
def elbo(model, prefix, target, *, mc_num: int = DEFAULT_MC_NUM, mc_batch: int = DEFAULT_MC_BATCH,
         seed: int = 0, request_index: int = 0, fixed: bool = False) -> tuple[Tensor, int]:
    """Per-draw ELBO estimates [mc_num] (float64, CPU) of ``target`` after ``prefix``, and the NFE.

    ``prefix`` may be empty; ``target`` must hold at least one token. ``fixed``: every sum in a
    fixed order (batch-invariant: a draw's estimate does not depend on ``mc_batch``).
    """
    if int(mc_batch) < 1:
        raise ValueError(f"mc_batch={mc_batch!r} must be a positive integer")
    prefix = torch.as_tensor(prefix, dtype=torch.long).reshape(-1)
    dev = _device(model, prefix)
    prefix, target = prefix.to(dev), _as_ids(target, dev)
    P, T = int(prefix.numel()), int(target.numel())
    g = torch.Generator().manual_seed(mix_seed(int(seed), int(request_index), 0))
    masked, counts = mask_draws(T, mc_num, g)
    masked = masked.to(dev)
    seq = torch.cat([prefix, target])
    positions = torch.arange(P, P + T, device=dev)
    out = torch.empty(int(mc_num), dtype=torch.float64)
    nfe = 0
    for a in range(0, int(mc_num), int(mc_batch)):
        m = masked[a:a + int(mc_batch)]
        rows = seq.unsqueeze(0).repeat(m.shape[0], 1)
        rows[:, P:] = torch.where(m, torch.full_like(m, int(model.mask_id), dtype=torch.long),
                                  rows[:, P:])
        lp = _target_logprobs(model, rows, positions, target, fixed)
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


def _canvases(item: Continuation, mc_num: int, seed: int, mask_id: int):
    """(canvases [mc_num, P + T] long, masked [mc_num, T] bool, counts [mc_num]) of ``item``'s
    draws, on the CPU: the rows :func:`elbo` builds."""
    g = torch.Generator().manual_seed(mix_seed(int(seed), int(item.key), 0))
    masked, counts = mask_draws(len(item.target), mc_num, g)
    seq = torch.as_tensor([*item.prefix, *item.target], dtype=torch.long)
    rows = seq.expand(int(mc_num), -1).clone()
    P = len(item.prefix)
    rows[:, P:] = torch.where(masked, torch.full_like(rows[:, P:], int(mask_id)), rows[:, P:])
    return rows, masked, counts


@torch.no_grad()
def elbo_batch(model, items: Sequence[Continuation], *, mc_num: int = DEFAULT_MC_NUM,
               rows_per_call: int = DEFAULT_MC_BATCH, seed: int = 0, fixed: bool = False
               ) -> tuple[list[Tensor], list[int]]:
    """Per-draw ELBO estimates ([mc_num] float64, CPU, one per item: those of :func:`elbo`) and
    the model calls that computed each item's canvases.

    The items' draws are grouped by canvas length; in a group, identical canvases are computed
    once, and at most ``rows_per_call`` distinct canvases go into one model call (no padding).
    ``fixed``: every sum in a fixed order (batch-invariant)."""
    if int(rows_per_call) < 1:
        raise ValueError(f"rows_per_call={rows_per_call!r} must be a positive integer")
    if not items:
        return [], []
    dev = torch.device(getattr(model, "device", None) or "cpu")
    mask_id = int(model.mask_id)
    drawn = [_canvases(it, mc_num, seed, mask_id) for it in items]
    by_length: dict[int, list[int]] = {}
    for i, it in enumerate(items):
        by_length.setdefault(len(it.prefix) + len(it.target), []).append(i)
    sums = [torch.empty(int(mc_num), dtype=torch.float64) for _ in items]
    calls = [0] * len(items)
    for W, members in by_length.items():
        canvases, row_of = torch.unique(torch.cat([drawn[i][0] for i in members]), dim=0,
                                        return_inverse=True)
        row_of = row_of.split(int(mc_num))            # member j's draws -> rows of ``canvases``
        T_max = max(len(items[i].target) for i in members)
        positions = torch.arange(W - T_max, W, device=dev)
        for a in range(0, canvases.shape[0], int(rows_per_call)):
            b = min(a + int(rows_per_call), canvases.shape[0])
            logits = model.logits(canvases[a:b].to(dev), positions, attention_mask=None,
                                  cache=None).float()
            logits[..., mask_id] = float("-inf")
            logp = log_softmax_fixed(logits) if fixed else torch.log_softmax(logits, dim=-1)
            for j, i in enumerate(members):
                draws = ((row_of[j] >= a) & (row_of[j] < b)).nonzero().squeeze(1)
                if draws.numel() == 0:
                    continue
                calls[i] += 1
                target = torch.as_tensor(items[i].target, dtype=torch.long, device=logp.device)
                T = target.numel()
                lp = logp[(row_of[j][draws] - a).to(logp.device), T_max - T:]
                lp = lp.gather(-1, target.expand(draws.numel(), T).unsqueeze(-1)).squeeze(-1)
                lp = torch.where(drawn[i][1][draws].to(lp.device), lp, torch.zeros_like(lp))
                sums[i][draws] = (fixed_sum(lp) if fixed else lp.sum(-1)).double().cpu()
    return [s * len(it.target) / d[2].double() for s, it, d in zip(sums, items, drawn)], calls


def loglikelihoods(model, items: Sequence[Continuation], *, mc_num: int = DEFAULT_MC_NUM,
                   rows_per_call: int = DEFAULT_MC_BATCH, seed: int = 0,
                   batch_invariant: bool = False) -> list[Likelihood]:
    """The ELBO estimates of several continuations (:func:`elbo_batch`); ``is_greedy`` None.
    ``batch_invariant``: as in ``decode_batch`` (the model's batch-invariant kernels,
    fixed-order sums)."""
    with invariant_mode(model, batch_invariant):
        draws, calls = elbo_batch(model, items, mc_num=mc_num, rows_per_call=rows_per_call,
                                  seed=seed, fixed=batch_invariant)
    return [Likelihood(float(d.mean()), None, d, n) for d, n in zip(draws, calls)]


def loglikelihood(model, prefix, target, *, mc_num: int = DEFAULT_MC_NUM,
                  mc_batch: int = DEFAULT_MC_BATCH, seed: int = 0, request_index: int = 0,
                  batch_invariant: bool = False) -> Likelihood:
    """The ELBO estimate of ``log p(target | prefix)`` (one continuation of
    :func:`loglikelihoods`); ``is_greedy`` None."""
    item = Continuation(list(_as_ids(prefix, "cpu").tolist()), list(_as_ids(target, "cpu").tolist()),
                        int(request_index))
    return loglikelihoods(model, [item], mc_num=mc_num, rows_per_call=mc_batch, seed=seed,
                          batch_invariant=batch_invariant)[0]


def rolling_loglikelihood(model, windows, *, mc_num: int = DEFAULT_MC_NUM,
                          mc_batch: int = DEFAULT_MC_BATCH, seed: int = 0,
                          request_index: int = 0, batch_invariant: bool = False) -> Likelihood:
    """Sum of the ELBO estimates over disjoint ``windows`` [(context_ids, pred_ids), ...].

    Each window's draws are seeded by (``seed``, ``request_index`` + window index). ``draws`` of
    the result are the per-draw sums over windows.
    """
    items = [Continuation(list(ctx), list(pred), (int(request_index) + w) & ((1 << 63) - 1))
             for w, (ctx, pred) in enumerate(windows)]
    parts = loglikelihoods(model, items, mc_num=mc_num, rows_per_call=mc_batch, seed=seed,
                           batch_invariant=batch_invariant)
    total = torch.zeros(int(mc_num), dtype=torch.float64)
    for r in parts:
        total += r.draws
    return Likelihood(float(total.mean()), None, total, sum(r.nfe for r in parts))


def greedy_canvas(params: DecodeParams, prefix_len: int, target_len: int,
                  context: int | None = None) -> int:
    """The canvas of the greedy check: ``gen_length``, or the target's length in whole blocks
    when that is longer or when the prefix leaves no room for ``gen_length`` in ``context``."""
    B = params.block_length
    need = -(-int(target_len) // B) * B
    canvas = max(params.gen_length, need)
    if context is not None and prefix_len + canvas > context:
        canvas = need
    return canvas


def greedy_matches(model, prefixes: Sequence[Sequence[int]], targets: Sequence[Sequence[int]],
                   params: DecodeParams, *, keys: Sequence[int], batch_size: int,
                   batch_invariant: bool = False, online=None,
                   context: int | None = None) -> list[bool]:
    """lm-eval's ``is_greedy`` per (prefix, target): whether the decoder of ``params`` at
    temperature 0 generates ``target`` as the first tokens after ``prefix``.

    HFLM's ``is_greedy`` is ``(greedy_tokens == cont_toks).all()``, the argmax at every
    continuation position under teacher forcing: an autoregressive model's greedy generation
    starts with the continuation. A diffusion model's generation is its decoder's, so the check
    runs it: one decode per distinct prefix (the choices of a question share it) on the canvas
    :func:`greedy_canvas` of its longest target (a prefix that leaves no room for it in the
    ``context``, the model's ``max_length`` by default, loses its first tokens, as generation's
    ``truncation=left`` does),
    ``batch_size`` prefixes per batch, seeded by the first of its ``keys`` (the explore decoder
    draws even at temperature 0)."""
    context = getattr(model, "max_length", None) if context is None else context
    canvas: dict[tuple, int] = {}
    key_of: dict[tuple, int] = {}
    for p, t, k in zip(prefixes, targets, keys):
        p = tuple(p)
        canvas[p] = max(canvas.get(p, 0), greedy_canvas(params, len(p), len(t), context))
        key_of.setdefault(p, int(k))
    by_canvas: dict[int, list[tuple]] = {}
    for p, G in canvas.items():
        by_canvas.setdefault(G, []).append(p)
    generated: dict[tuple, list[int]] = {}
    for G, group in by_canvas.items():
        steps = {} if G == params.gen_length or params.steps is None else {"steps": None}
        run = override(params, temperature=0.0, gen_length=G, **steps)
        room = None if context is None else max(context - G, 0)
        for a in range(0, len(group), int(batch_size)):
            chunk = group[a:a + int(batch_size)]
            prompts = [list(p) if room is None or len(p) <= room else list(p[len(p) - room:])
                       for p in chunk]
            outs = decode_batch(model, prompts, params=run,
                                request_indices=[key_of[p] for p in chunk],
                                online=online, batch_invariant=batch_invariant)
            generated.update((p, out.tokens) for p, out in zip(chunk, outs))
    return [generated[tuple(p)][:len(t)] == list(t) for p, t in zip(prefixes, targets)]
