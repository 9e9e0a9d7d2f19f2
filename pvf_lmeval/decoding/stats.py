"""Per-position statistics of model calls: what every decoder step reads of the logits.

:class:`Stats` holds them, batched over requests and rows, indexed by *generation position*
(0..L-1, the prompt excluded) along the last dimension; :func:`stats_from_logits` computes them
from a call's logits in one pass over the vocabulary, and :func:`entropy_from_logits` the
entropies that verification with an online vocabulary (or calibration) also needs.
Probabilities are plain softmax probabilities in [0, 1].
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ..tensors.fixed_order import fixed_sum


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
                          outside. Only computed when the step asked for it (``Branches.entropy``:
                          verification with entropies, the entropy bound), else None.
    pback: [..., L] float probability, under the call's *shadow* row of that position, of the
                          token the state holds there (WINO's verification; 0 where the state
                          holds the mask or no shadow row covered it). Only computed when the
                          step asked for a shadow (``Branches.shadow``), else None.
    extra: {name: [..., L]} per-position values the step's call hook computed
                          (``Step.call_hook``: :class:`.hooks.HookOut`'s ``extra``; 0 outside the
                          call), else None.

    Probabilities are float32, float64 under ``rules=reference`` switch ``softmax64`` (for the
    decoders that apply it).

    A call covers, per request, the generation positions from the earliest active block of its
    rows to the end of the block after the latest one (active + next block of every row); on a
    block-diffusion model, to the end of the latest one unless the step reveals next blocks.
    """

    tok: Tensor
    conf: Tensor
    pmax: Tensor
    pcur: Tensor
    ent: Tensor | None = None
    pback: Tensor | None = None
    extra: dict | None = None

    def _map(self, fn) -> "Stats":
        """Stats with ``fn`` applied to every tensor (``extra``'s included)."""
        return Stats(*(None if t is None else fn(t)
                       for t in (self.tok, self.conf, self.pmax, self.pcur, self.ent, self.pback)),
                     extra=None if self.extra is None else {k: fn(v) for k, v in self.extra.items()})

    def pick(self, index: Tensor) -> "Stats":
        """Stats [R, L] of row ``index[r]`` of each request from stats [R, M, L] (new tensors,
        not views: a compiled round's inputs are then alike in every round)."""
        r = torch.arange(index.shape[0], device=index.device)
        return self._map(lambda t: t[r, index])

    def row(self, j: int) -> "Stats":
        """Stats [R, L] of row ``j`` of every request from stats [R, M, L] (views)."""
        return self._map(lambda t: t[:, j])

    def select(self, keep: Tensor) -> "Stats":
        """The requests ``keep`` (index tensor along dim 0)."""
        return self._map(lambda t: t.index_select(0, keep))


def sampling_scores(lg: Tensor, temperature: float, top_k: int | None = None,
                    top_p: float | None = None, *, fixed: bool = False) -> Tensor:
    """``lg / temperature`` [..., V] with the tokens outside transformers' sampling filters at
    -inf, in its order (``TemperatureLogitsWarper``, ``TopKLogitsWarper``,
    ``TopPLogitsWarper``): ``top_k`` keeps the scores at least the k-th largest; ``top_p`` keeps
    the smallest set of the most probable tokens whose probability reaches ``top_p`` (a token
    goes when the tokens before it in descending order hold ``top_p`` already; the most probable
    always stays). Gumbel-max over the result samples the renormalised filtered distribution
    exactly; every operation is per row, so a row's filter never depends on its batch
    (``fixed``: the normaliser in :func:`fixed_sum`'s order)."""
    z = lg / temperature
    if top_k is not None and top_k < z.shape[-1]:
        kth = z.topk(top_k, dim=-1).values[..., -1:]
        z = z.masked_fill(z < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        ordered, order = z.sort(dim=-1, descending=True, stable=True)
        ex = (ordered - ordered[..., :1]).exp()
        total = fixed_sum(ex) if fixed else ex.sum(dim=-1)
        before = (ex / total.unsqueeze(-1)).cumsum(dim=-1) - ex / total.unsqueeze(-1)
        drop = torch.zeros_like(before, dtype=torch.bool).scatter_(-1, order, before >= top_p)
        z = z.masked_fill(drop, float("-inf"))
    return z


def stats_from_logits(logits: Tensor, cur: Tensor, mask_id: int | None, temperature: float = 0.0,
                      noise: Tensor | None = None, *, fixed: bool = False,
                      top_k: int | None = None, top_p: float | None = None,
                      float64: bool = False) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(tok, conf, pmax, pcur), each [N, P], from logits [N, P, V] and the rows' tokens [N, P].

    The mask token's logit is set to -inf first (``mask_id`` None: no token is suppressed, the
    mask id may be the argmax: ``rules=reference`` switch ``argmax_over_mask``, and uniform-state
    models, which have no mask). ``noise`` [P, V] or [N, P, V] (Gumbel) is added
    to ``logits / temperature``, filtered by ``top_k`` / ``top_p`` (:func:`sampling_scores`), for
    the choice of ``tok`` only; it is shared by every row of a request so that branches of one
    call compare like with like. At temperature 0 ``tok`` is the argmax, which every filter
    keeps: the filters change nothing there.

    One read of the vocabulary for the maximum and two passes for the normaliser, in place: the
    float32 ``logits`` are overwritten (the decoder owns the tensor the model returns; a copy
    is made only for other dtypes). The normaliser is torch.logsumexp's own arithmetic
    (max-shifted sum of exponentials, bit for bit), reusing the maximum the top-1 needs anyway;
    ``fixed``: the sum of exponentials in :func:`fixed_sum`'s order (batch-invariant decoding).
    ``float64``: the softmax in float64 (``rules=reference`` switch ``softmax64``), the
    probabilities returned in float64.
    """
    lg = logits.double() if float64 else logits.float()
    if mask_id is not None:
        lg[..., mask_id] = float("-inf")
    mx, tok = lg.max(dim=-1)
    if temperature > 0:
        tok = (sampling_scores(lg, temperature, top_k, top_p, fixed=fixed) + noise).argmax(dim=-1)
        at_tok = lg.gather(-1, tok.unsqueeze(-1)).squeeze(-1)
    at_cur = lg.gather(-1, cur.unsqueeze(-1)).squeeze(-1)
    shift = mx.masked_fill(mx.abs() == float("inf"), 0.0)
    ex = lg.sub_(shift.unsqueeze(-1)).exp_()
    lse = (fixed_sum(ex) if fixed else ex.sum(dim=-1)).log_().add_(shift)
    pmax = torch.exp(mx - lse)
    conf = torch.exp(at_tok - lse) if temperature > 0 else pmax
    pcur = torch.exp(at_cur - lse)
    return tok, conf, pmax, pcur



def entropy_from_logits(logits: Tensor, mask_id: int | None, *, fixed: bool = False) -> Tensor:
    """Entropy [N, P] (nats) of softmax(logits) [N, P, V] with the mask token excluded (``mask_id``
    None: no token excluded).

    Ids whose logit is -inf (the mask, undecodable ids) contribute 0. Only the calibration and
    the online vocabulary ask for it, so the default decoding path never pays for it.
    ``fixed``: every sum over the vocabulary in :func:`fixed_sum`'s order (batch-invariant).
    """
    lg = logits.float()
    if mask_id is not None:
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
