"""The table models the reference decoders' outputs in ``tests/data/reference_decoders/`` were
computed on (``table0``, ``table1``, ``table2``), rebuilt from their published description
(tests/data/reference_decoders/README.md) as models of the decoding protocol, and the
per-case result files there read as records.

A row's logits depend on its absolute position, its own token and the tokens at the positions
before and after it and at position 0 *as the row sees them*: a masked token, a position outside
the tokens given, or one the row cannot attend to (block-causal attention, ``block_size``) is
seen as nothing (index V). Tables are drawn, in this order, with float32 ``torch.randn`` from
``torch.Generator().manual_seed(seed)``: T0 [256, V], T_self, T_left, T_right, T_first
[V + 1, V]; ``logits = sharp * (T0[pos] + 0.6 T_self[own] + T_left[left] + T_right[right]
+ 0.5 T_first[first])`` with the mask id's entry set to -4 before the scaling (the float32
operations in that order). Positions count from a row's first real token (left padding,
``attention_mask``, is skipped). A WINO shadow row (``shadow``) sees the canvas but the column it
shadows, plus the shadow's masks: its own token is nothing and its neighbours are the canvas's.
``shift=True`` (a Dream-style family, as Fast-dLLM v2 reads its logits) gives position j the row
of position j - 1.
"""

from __future__ import annotations

import contextlib
import re
from pathlib import Path

import torch

V, MASK, EOS, MAX_POS, SHARP = 12, 11, 10, 256, 2.0
DATA = Path(__file__).resolve().parent.parent / "data" / "reference_decoders"


class ReferenceTable:
    """``table<seed>`` of the reference harnesses; ``block_size``: block-causal attention over
    absolute blocks of that size (the harness's aligned geometry), None: bidirectional. Counts
    its calls; past ``max_calls`` it raises, so that a decoder that stops making progress fails
    a test instead of hanging it."""

    mask_id = MASK
    eos_ids = (EOS,)
    pad_id = EOS
    tokenizer = None

    def __init__(self, seed: int, block_size: int | None = None, *, shift: bool = False,
                 max_calls: int = 500):
        g = torch.Generator().manual_seed(seed)
        self.T0 = torch.randn(MAX_POS, V, generator=g)
        self.T_self, self.T_left, self.T_right, self.T_first = (
            torch.randn(V + 1, V, generator=g) for _ in range(4))
        self.block_size = block_size
        self.shift = shift
        self.calls = 0
        self.max_calls = max_calls

    def batch_invariant(self):
        """Every row's logits are gathers and sums of its own table rows: the same whatever
        the batch, with nothing to switch."""
        return contextlib.nullcontext()

    def logits(self, tokens, positions, *, attention_mask=None, cache=None, shadow=None):
        assert cache is None
        if self.calls >= self.max_calls:
            raise RuntimeError(f"table model called max_calls={self.max_calls} times: "
                               "decoding does not finish")
        self.calls += 1
        N, T = tokens.shape
        pad = (torch.zeros(N, dtype=torch.long) if attention_mask is None
               else (attention_mask == 0).sum(-1))
        cols = positions.expand(N, -1) if positions.dim() == 1 else positions       # [N, P]
        seen = torch.where(tokens == MASK, V, tokens)
        padded = torch.cat([seen, torch.full((N, 1), V)], 1)                       # T: nothing
        out = self._rows(padded, pad, cols, own_hidden=False)
        if shadow is not None:
            sh = shadow.start[:, None] + torch.arange(shadow.length)                # [N, S]
            out = torch.cat([out, self._rows(padded, pad, sh, own_hidden=True)], 1)
        return out

    def _rows(self, padded, pad, cols, *, own_hidden):
        """Logits [N, P, V] of the rows at canvas columns ``cols`` [N, P]."""
        T = padded.shape[1] - 1
        if self.shift:
            cols = torch.maximum(cols - 1, pad[:, None])
        pos = cols - pad[:, None]

        def at(c):
            ok = (c >= pad[:, None]) & (c < T)
            if self.block_size is not None:
                ok &= (c - pad[:, None]) // self.block_size <= pos // self.block_size
            return padded.gather(1, torch.where(ok, c, T))

        own = torch.full_like(cols, V) if own_hidden else at(cols)
        row = (self.T0[pos] + 0.6 * self.T_self[own] + self.T_left[at(cols - 1)]
               + self.T_right[at(cols + 1)] + 0.5 * self.T_first[at(pad[:, None].expand_as(cols))])
        row[..., MASK] = -4.0
        return SHARP * row


def table_prompts(n: int = 8) -> list[list[int]]:
    """The table cases' prompts: row i = case i."""
    g = torch.Generator().manual_seed(1000)
    return torch.randint(0, EOS, (n, 5), generator=g).tolist()


def reference_cases(name: str) -> list[dict]:
    """The cases of ``tests/data/reference_decoders/<name>.txt``, one per line: ``case``, ``nfe``
    and the run's other counts (ints, by name), and ``tokens`` (a list of ids)."""
    out = []
    for line in (DATA / f"{name}.txt").read_text().splitlines():
        head, toks = line.split(" tokens=")
        rec = {k: int(v) for k, v in re.findall(r"(\w+)=(\S+)", head)}
        rec["tokens"] = [int(t) for t in toks.split()]
        out.append(rec)
    return out


def tiny_dream_as_fast_dllm(folder: Path) -> Path:
    """tiny-dream's weights and tokenizer as a Fast-dLLM v2 folder (``Fast_dLLM_Qwen``, blocks of
    32): the network the Fast-dLLM v2 reference ran (Qwen2 under its block-causal mask)."""
    import json
    import shutil
    src = Path(__file__).resolve().parents[2] / "pvf_lmeval" / "fixtures" / "tiny-dream"
    folder.mkdir(parents=True, exist_ok=True)
    cfg = json.loads((src / "config.json").read_text())
    cfg.update(architectures=["Fast_dLLM_QwenForCausalLM"], model_type="Fast_dLLM_Qwen",
               bd_size=32)
    (folder / "config.json").write_text(json.dumps(cfg))
    for name in ("model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(src / name, folder / name)
    return folder
