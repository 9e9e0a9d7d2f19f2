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
- ``is_greedy``: one forward on prefix + all-masked continuation; true iff the argmax (mask
  excluded) equals the continuation at every position (the one-step greedy prediction).

Pure torch against the model protocol (``mask_id``, ``logits(tokens, positions)``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ..tensors.fixed_order import fixed_sum
from .batch import mix_seed
from .options import invariant_mode
from .stats import log_softmax_fixed

#: LLaDA's evaluation defaults (``mc_num=128`` draws, 32 per call).
DEFAULT_MC_NUM = 128
DEFAULT_MC_BATCH = 32


@dataclass
class Likelihood:
    """One continuation's score.

    logprob:   the ELBO estimate (mean of ``draws``), a lower bound on log p(target | prefix).
    is_greedy: the one-step greedy prediction equals the target (None when not asked for).
    draws:     [mc_num] per-draw estimates (float64, CPU): their spread is the Monte Carlo noise.
    nfe:       model calls spent.
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


@torch.no_grad()
def greedy_match(model, prefix, target) -> bool:
    """True iff one forward on prefix + T masks predicts ``target`` exactly (argmax, mask excluded)."""
    prefix = torch.as_tensor(prefix, dtype=torch.long).reshape(-1)
    dev = _device(model, prefix)
    prefix, target = prefix.to(dev), _as_ids(target, dev)
    P, T = int(prefix.numel()), int(target.numel())
    row = torch.cat([prefix, torch.full((T,), int(model.mask_id), dtype=torch.long, device=dev)])
    logits = model.logits(row.unsqueeze(0), torch.arange(P, P + T, device=dev),
                          attention_mask=None, cache=None).float()
    logits[..., int(model.mask_id)] = float("-inf")
    return bool((logits[0].argmax(-1).to(dev) == target).all().item())


def loglikelihood(model, prefix, target, *, mc_num: int = DEFAULT_MC_NUM,
                  mc_batch: int = DEFAULT_MC_BATCH, seed: int = 0, request_index: int = 0,
                  greedy: bool = True, batch_invariant: bool = False) -> Likelihood:
    """The ELBO estimate of ``log p(target | prefix)`` and (``greedy``) the one-step greedy check.
    ``batch_invariant``: as in ``decode_batch`` (the model's batch-invariant kernels, fixed-order
    sums)."""
    with invariant_mode(model, batch_invariant):
        draws, nfe = elbo(model, prefix, target, mc_num=mc_num, mc_batch=mc_batch, seed=seed,
                          request_index=request_index, fixed=batch_invariant)
        is_greedy = None
        if greedy:
            is_greedy = greedy_match(model, prefix, target)
            nfe += 1
    return Likelihood(float(draws.mean()), is_greedy, draws, nfe)


def rolling_loglikelihood(model, windows, *, mc_num: int = DEFAULT_MC_NUM,
                          mc_batch: int = DEFAULT_MC_BATCH, seed: int = 0,
                          request_index: int = 0, batch_invariant: bool = False) -> Likelihood:
    """Sum of the ELBO estimates over disjoint ``windows`` [(context_ids, pred_ids), ...].

    Each window's draws are seeded by (``seed``, ``request_index`` + window index). ``draws`` of
    the result are the per-draw sums over windows.
    """
    total = torch.zeros(int(mc_num), dtype=torch.float64)
    nfe = 0
    with invariant_mode(model, batch_invariant):
        for w, (ctx, pred) in enumerate(windows):
            d, n = elbo(model, ctx, pred, mc_num=mc_num, mc_batch=mc_batch, seed=seed,
                        request_index=(int(request_index) + w) & ((1 << 63) - 1),
                        fixed=batch_invariant)
            total += d
            nfe += n
    return Likelihood(float(total.mean()), None, total, nfe)
