"""Who sees whom in a network whose last ``canvas_length`` columns are a canvas (DiffusionGemma).

DiffusionGemma runs one stack of layers in two roles: a causal encoder over the context (the
prompt and the canvases committed so far) whose keys and values a bidirectional decoder over
the canvas attends to. One call over ``tokens`` = context + canvas computes both: the context
rows attend as the encoder does and the canvas rows as the decoder does, so the keys the canvas
reads are the encoder's.

Per kind of layer (the allowed pairs, query row q, key column k):

- context rows: causal (``k <= q``); on a sliding-window layer also ``pos[q] - pos[k] < window``
  (the encoder's window: ``window`` keys, the query's own included);
- canvas rows: every canvas column, and the context columns, but on a sliding-window layer only
  those with ``pos[k] > pos[canvas start] - window``, the same for every canvas row: the keys
  the canvas's first position ``s`` would see through the window (``s - pos[k] < window``),
  which among the context (``pos[k] <= s - 1``) are ``s - window + 1 .. s - 1``, the last
  ``window - 1`` context positions (what transformers' dynamic cache keeps of a sliding layer:
  ``DynamicSlidingWindowLayer`` holds its last ``sliding_window - 1`` keys; the decoder attends
  to them and the canvas without any further mask). A context cache therefore keeps those
  ``window - 1`` positions of a sliding-window layer and every position of a global one
  (``decoding.cache.ContextKV``).

Padding (``keep``) is applied by the caller. Position ids count real tokens, so a left-padded
row sees the same tokens as the row alone.
"""

from __future__ import annotations

import torch


def split_attention(position_ids: torch.Tensor, n_context: int,
                    window: int | None = None) -> torch.Tensor:
    """[N|1, T, T] boolean (query, key) for ``position_ids`` [N|1, T] whose first ``n_context``
    columns are the context and the rest the canvas; ``window``: a sliding-window layer's."""
    t = position_ids.shape[-1]
    col = torch.arange(t, device=position_ids.device)
    canvas = col >= n_context                                             # [T]
    allowed = (col[None, :] <= col[:, None]) | canvas[:, None]            # [T, T]
    if window is None:
        return allowed[None]
    pos = position_ids
    near = pos[:, None, :] > pos[:, :, None] - window                     # [N|1, T, T]
    start = pos[:, n_context:n_context + 1]                               # [N|1, 1]
    recent = (pos > start - window)[:, None, :] | canvas[None, None, :]   # [N|1, 1, T]
    return allowed & torch.where(canvas[None, :, None], recent, near)


def cached_canvas_keys(key_pos: torch.Tensor, key_keep: torch.Tensor, start: torch.Tensor,
                       canvas: int, window: int | None = None) -> torch.Tensor:
    """[N, 1, canvas, W + canvas] boolean (query, key) of a call that reads the context's keys
    from a cache: ``W`` cached context columns at position ids ``key_pos`` [N, W], real where
    ``key_keep`` [N, W] (the canvas starts at position id ``start`` [N]), then the canvas's own
    keys. The canvas rows see what :func:`split_attention`'s canvas rows see: on a
    sliding-window layer the cached columns at position ids ``start - window + 1 .. start - 1``,
    all of them when ``W`` is those ``window - 1`` columns. One row per query, as in the full
    call (the batch-invariant kernels then take the same per-query path)."""
    n = key_keep.shape[0]
    seen = key_keep
    if window is not None:
        seen = seen & (key_pos > start[:, None] - window)
    own = torch.ones(n, canvas, dtype=torch.bool, device=seen.device)
    return torch.cat([seen, own], dim=-1)[:, None, None].expand(n, 1, canvas, -1)
