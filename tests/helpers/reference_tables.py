"""The table models the reference harnesses ran (tests/data/reference50/README.md), in the decoding
model protocol, and the reference outputs recorded from them.

``ReferenceTable(seed)`` rebuilds the harness's ``TableModel(TableSpec(seed))`` from its
description: V = 12, mask id 11, end-of-text 10; tables drawn as float32 ``torch.randn`` from
``torch.Generator().manual_seed(seed)`` in the order T0 [256, V], T_self, T_left, T_right,
T_first [V + 1, V] (index V: a masked or unseen position); the logits of a row at position
``pos`` holding ``own`` are ``2 * (T0[pos] + 0.6 T_self[own] + T_left[seen(pos - 1)] +
T_right[seen(pos + 1)] + 0.5 T_first[seen(0)])`` with the mask id's column -4 before scaling.
``seen(k)`` is the token at k when the row sees k (bidirectional: every position of the
sequence; ``block_size``: blocks up to the row's own) and it is not the mask, else V.
``shift=True`` (a Dream-style family: Fast-dLLM v2 shifts its logits by one) gives position j
the row of j - 1. Left padding (``attention_mask``) is dropped, so a request reads the same
logits alone or batched.
"""

from __future__ import annotations

from pathlib import Path

import torch

from .decoding_tables import NoCapitals

DATA = Path(__file__).resolve().parent.parent / "data" / "reference50"
VOCAB, MASK_ID, EOS_ID = 12, 11, 10


class ReferenceTable:
    """See the module docstring. ``calls`` counts the model calls."""

    def __init__(self, seed: int, *, block_size: int | None = None, shift: bool = False):
        g = torch.Generator().manual_seed(seed)
        V = VOCAB
        self.T0 = torch.randn(256, V, generator=g)
        self.Tself, self.Tleft, self.Tright, self.Tfirst = (
            torch.randn(V + 1, V, generator=g) for _ in range(4))
        self.block_size = block_size
        self.shift = shift
        self.mask_id, self.eos_ids, self.pad_id, self.vocab = MASK_ID, (EOS_ID,), EOS_ID, V
        self.tokenizer = NoCapitals(V)
        self.calls = 0

    def _row(self, seq: list[int], r: int) -> torch.Tensor:
        V, B = self.vocab, self.block_size

        def seen(k: int) -> int:
            if k < 0 or k >= len(seq) or (B is not None and k // B > r // B):
                return V
            return V if seq[k] == self.mask_id else seq[k]

        own = V if seq[r] == self.mask_id else seq[r]
        row = (self.T0[r] + 0.6 * self.Tself[own] + self.Tleft[seen(r - 1)]
               + self.Tright[seen(r + 1)] + 0.5 * self.Tfirst[seen(0)])
        row[self.mask_id] = -4.0
        return 2.0 * row

    def logits(self, tokens, positions, *, attention_mask=None, cache=None):
        assert cache is None
        self.calls += 1
        N, T = tokens.shape
        pos = positions if positions.dim() == 2 else positions.expand(N, -1)
        out = torch.empty(N, pos.shape[1], self.vocab)
        for n in range(N):
            pad = 0 if attention_mask is None else int((attention_mask[n] == 0).sum())
            seq = tokens[n, pad:].tolist()
            for j, c in enumerate(pos[n].tolist()):
                q = c - pad
                out[n, j] = self._row(seq, max(q - 1, 0) if self.shift else q)
        return out


def table_prompts(n: int) -> list[list[int]]:
    """The harness's prompts: ``torch.randint(0, 10, (n, 5))`` from ``manual_seed(1000)``."""
    g = torch.Generator().manual_seed(1000)
    return torch.randint(0, EOS_ID, (n, 5), generator=g).tolist()


def reference_cases(name: str) -> list[dict]:
    """The cases of ``tests/data/reference50/<name>.txt``: per line ``case``, ``nfe``, the other
    counts, and ``tokens`` (a list of ids)."""
    cases = []
    for line in (DATA / f"{name}.txt").read_text().splitlines():
        head, toks = line.split(" tokens=")
        rec = dict(kv.split("=") for kv in head.split())
        rec = {k: int(v) for k, v in rec.items()}
        rec["tokens"] = [int(t) for t in toks.split()]
        cases.append(rec)
    return cases


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
