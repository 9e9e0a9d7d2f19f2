"""``Shadow``: the model protocol's request for a shadow copy of each row's current block
(WINO's verification rows), built by the decoding side and read by the model.

``logits(tokens [N, T], positions, ..., shadow=Shadow(start, length))`` appends ``length`` mask
tokens to every row, shadow row ``j`` carrying the position id of canvas column
``start + j``, and returns the canvas rows as without a shadow followed by the ``length`` shadow
rows ([N, P + length, V]). Who sees whom:

- canvas queries never see a shadow key (the canvas rows are those of the call without it);
- shadow query ``j`` sees every canvas key the canvas query at column ``start + j`` sees,
  except that column itself, and every shadow key;
- on a block-causal network the block rule applies on top: a shadow row sits in the block of
  its position id, as the column it shadows.

A shadow row therefore reads the canvas with its own position hidden, plus the block's
``length`` mask tokens: not the same as a plain call with that position masked.
"""

from __future__ import annotations

from typing import NamedTuple

from torch import Tensor


class Shadow(NamedTuple):
    """``start`` [N] integer: per row, the canvas column (an index into the call's ``tokens``,
    as ``positions`` are) of the first shadowed position; ``length``: how many consecutive
    columns are shadowed (the block length, the same for every row)."""

    start: Tensor
    length: int
