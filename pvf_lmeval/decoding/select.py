"""Selection rules over the working set: ranking by confidence, Fast-dLLM's threshold rule,
LLaDA's most-confident-k rule and its per-block schedule. Every function works on ``[..., L]``
tensors (generation positions along the last dimension), any leading dimensions, no Python loop
over positions.
"""

from __future__ import annotations

import torch
from torch import Tensor


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
                     force: bool = True, strict: bool = False) -> tuple[Tensor, Tensor]:
    """Fast-dLLM rule over ``members`` [..., L]: returns (selected, forced) masks.

    Without ``factor``: members with ``conf >= tau`` (``strict``: ``conf > tau``). With ``factor`` f: members whose rank n
    (1-based, conf descending) has ``conf >= 1 - f/(n+1)`` (a prefix of the ranking). If no member
    qualifies, the single most confident member is selected and flagged ``forced`` (``force``
    False: nothing is selected then, the caller forces later).

    ``last_rank_commits_all`` (``rules=reference``, factor rule only): as in Fast-dLLM's code,
    whose top-ranked member always passes, when the first member that fails is the last one in
    the ranking, every member is selected, the failing one included.
    """
    rank = rank_desc(conf, members)
    if factor is None:
        clear = members & ((conf > tau) if strict else (conf >= tau))
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
