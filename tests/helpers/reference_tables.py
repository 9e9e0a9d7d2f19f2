"""The seeded table model of the reference runs (tests/data/decoders50/README.md) in the decoding
model protocol, and the reference result files read as records.

``TableModel(seed)``: vocabulary 12 (ids 0..11), mask 11, end-of-text 10. Five float32 tables
drawn in this order with ``torch.randn`` from ``torch.Generator().manual_seed(seed)``: ``T0``
[256, V], ``T_self``, ``T_left``, ``T_right``, ``T_first`` [V + 1, V] (index V: a mask, or
nothing seen). The logits of a row at position ``pos`` (prompt position 0 is the first real
token) are::

    2 * (T0[pos] + 0.6 T_self[own] + T_left[seen(pos - 1)] + T_right[seen(pos + 1)]
         + 0.5 T_first[seen(0)])        with the mask id's column -4 before the factor 2

``own`` the row's token (V for the mask); ``seen(p)`` the token at position p if the row sees
a key there that is not the mask, else V. A canvas row sees every canvas column (a
block-diffusion table, ``block_size``: the columns of its block and earlier ones); a WINO
shadow row sees the canvas but its own column, plus the shadow's masks, so it reads its
neighbours from the canvas and has ``own`` = V.
"""

from __future__ import annotations

import contextlib
import re
from pathlib import Path
from typing import NamedTuple

import torch

DATA = Path(__file__).resolve().parent.parent / "data" / "decoders50"
V, MASK, EOS = 12, 11, 10


class TableModel:
    """The reference runs' table model (module docstring); ``block_size``: block-causal
    attention over absolute blocks of that many positions (None: bidirectional). Counts its
    calls in ``calls`` (rows per call); past ``max_calls`` calls it raises, so that a decoder
    that stops making progress fails a test instead of hanging it."""

    tokenizer = None

    def __init__(self, seed: int, *, block_size: int | None = None, max_calls: int = 200):
        g = torch.Generator().manual_seed(seed)
        self.T0 = torch.randn(256, V, generator=g)
        self.T_self, self.T_left, self.T_right, self.T_first = (
            torch.randn(V + 1, V, generator=g) for _ in range(4))
        self.mask_id, self.eos_ids, self.pad_id = MASK, (EOS,), EOS
        self.block_size = block_size
        self.calls: list[int] = []
        self.max_calls = max_calls

    def batch_invariant(self):
        """Every row's logits are gathers and sums of its own table rows: the same whatever
        the batch, with nothing to switch."""
        return contextlib.nullcontext()

    def logits(self, tokens, positions, *, attention_mask=None, cache=None, shadow=None):
        assert cache is None
        if len(self.calls) >= self.max_calls:
            raise RuntimeError(f"table model called max_calls={self.max_calls} times: "
                               "decoding does not finish")
        N, T = tokens.shape
        pad = (torch.zeros(N, dtype=torch.long) if attention_mask is None
               else (attention_mask == 0).sum(-1))
        cols = positions.expand(N, -1) if positions.dim() == 1 else positions      # [N, P]
        padded = torch.cat([tokens, torch.full((N, 1), MASK)], 1)    # column T: nothing there
        out = self._rows(padded, pad, cols, own_masked=False)
        if shadow is not None:
            sh = shadow.start[:, None] + torch.arange(shadow.length)                # [N, S]
            out = torch.cat([out, self._rows(padded, pad, sh, own_masked=True)], 1)
        self.calls.append(N)
        return out

    def _rows(self, padded, pad, cols, *, own_masked):
        """Logits [N, P, V] of the rows at canvas columns ``cols`` [N, P]."""
        T = padded.shape[1] - 1
        pos = cols - pad[:, None]

        def seen(c, visible):
            ok = visible & (c >= pad[:, None]) & (c < T)
            t = padded.gather(1, torch.where(ok, c, T))
            return torch.where(t == MASK, V, t)

        right_visible = torch.ones_like(cols, dtype=torch.bool)
        if self.block_size is not None:
            right_visible = (pos + 1) // self.block_size <= pos // self.block_size
        always = torch.ones_like(right_visible)
        own = torch.full_like(cols, V) if own_masked else seen(cols, always)
        left = seen(cols - 1, always)
        right = seen(cols + 1, right_visible)
        first = seen(pad[:, None].expand_as(cols), always)
        row = (self.T0[pos] + 0.6 * self.T_self[own] + self.T_left[left] + self.T_right[right]
               + 0.5 * self.T_first[first])
        row[..., MASK] = -4.0
        return 2.0 * row


def table_prompts(n: int = 8) -> list[list[int]]:
    """The table cases' prompts: row i = case i."""
    g = torch.Generator().manual_seed(1000)
    return torch.randint(0, EOS, (n, 5), generator=g).tolist()


class Case(NamedTuple):
    """One line of a reference result file."""

    case: int
    nfe: int
    commits: int
    remasks: int
    edits: int
    tokens: list[int]


def reference_cases(name: str) -> list[Case]:
    """The cases of ``tests/data/decoders50/<name>.txt``."""
    out = []
    for line in (DATA / f"{name}.txt").read_text().splitlines():
        head, toks = line.split(" tokens=")
        kv = dict(re.findall(r"(\w+)=(\S+)", head))
        out.append(Case(int(kv["case"]), int(kv["nfe"]), int(kv["commits"]),
                        int(kv["remasks"]), int(kv["edits"]), [int(t) for t in toks.split()]))
    return out
