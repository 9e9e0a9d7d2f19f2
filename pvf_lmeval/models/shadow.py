"""Who sees whom in a call with a shadow block (``tensors.shadow.Shadow``, WINO's verification
rows): the network side.

The call's columns are the canvas (``T`` columns, left padding allowed) followed by ``S`` shadow
columns; shadow column ``T + j`` shadows canvas column ``start + j`` and carries its position id.
Canvas queries attend over the canvas keys only, exactly as without a shadow (the shadow keys
are never in their key set). Shadow query ``j`` sees canvas key ``k`` when the canvas query at
``start + j`` would (``k`` is a real token and, with ``block_size``, its block is not after the
query's) and ``k != start + j``, and every shadow key (with ``block_size``: of a block not after
its own). Blocks are ``position id // block_size``, as in :func:`.transformer.block_causal`.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class ShadowMask(NamedTuple):
    """One layer's attention masks in a shadow call: ``canvas``, the additive bias of the canvas
    queries over the canvas keys (what the call without a shadow uses; None: every key), and
    ``shadow`` [N, 1, S, T + S], the additive bias of the ``S`` shadow queries (the last ``S``
    queries of the layer) over the canvas keys followed by the shadow keys."""

    canvas: torch.Tensor | None
    shadow: torch.Tensor


def shadow_columns(start: torch.Tensor, length: int) -> torch.Tensor:
    """[N, S] the canvas columns ``start + j`` the shadow rows stand for."""
    return start[:, None] + torch.arange(length, device=start.device)


def shadow_positions(position_ids: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
    """[N, T + S] position ids of canvas and shadow columns: the canvas's ``position_ids``
    ([N|1, T]) followed by those of the shadowed ``columns`` [N, S]."""
    canvas = position_ids.expand(columns.shape[0], -1)
    return torch.cat([canvas, canvas.gather(1, columns)], dim=1)


def shadow_visible(position_ids: torch.Tensor, columns: torch.Tensor, keep: torch.Tensor | None,
                   block_size: int | None) -> torch.Tensor:
    """[N, S, T + S] boolean: which keys (canvas, then shadow) each shadow query sees (module
    docstring); ``position_ids`` [N, T + S] from :func:`shadow_positions`, ``keep`` [N, T]
    (True: a real canvas token; None: no padding)."""
    n, s = columns.shape
    t = position_ids.shape[1] - s
    key = torch.arange(t + s, device=columns.device)
    visible = key[None, None, :] != columns[:, :, None]
    if keep is not None:
        real = torch.cat([keep, keep.new_ones(n, s)], dim=1)
        visible = visible & real[:, None, :]
    if block_size is not None:
        block = torch.div(position_ids, block_size, rounding_mode="floor")
        visible = visible & (block[:, None, :] <= block[:, t:, None])
    return visible
