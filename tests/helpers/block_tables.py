"""Block-diffusion test models: block-causal attention over hand-written tables, with a KV cache.

A :class:`BlockModel` carries ``block_size`` B. The distribution at position id q comes from
``table(seq)`` where ``seq`` is the request's sequence by position id (prompt and canvas, None
where masked, left padding removed) cut at the end of q's block: q sees its own and earlier
blocks only, as a block-diffusion network's attention mask allows (``causal=False``: the whole
sequence, and no ``block_size``: a bidirectional model over the same table).

KV cache (``cache=prefix|dual``): a full call keeps every row's tokens as its "keys"; a cached
call recomputes its span and reads the kept tokens elsewhere. A kept key is *stale* when the
tokens its position saw at the refresh differ from the ones it sees now; a query that sees a
stale key gets the distribution ``STALE`` instead of the table's, so a cache that is not exact
changes the outcome.
"""

from __future__ import annotations

import hashlib

import torch

from .decoding_tables import EOS, MASK, V, NoCapitals, dist_logits
from pvf_lmeval.models.kv import cache_segments, is_cached_call

PAD = 1
STALE = (9, 0.99)


def filled_from(seq: list, start: int) -> frozenset:
    """Filled position ids >= ``start`` of a visible sequence."""
    return frozenset(i for i in range(start, len(seq)) if seq[i] is not None)


class BlockModel:
    """See the module docstring. Records ``calls`` as (rows, (first position id, end), width of
    the tokens passed) and ``seqs`` (each call's row sequences, None where masked)."""

    def __init__(self, table, *, block_size: int, causal: bool = True, eos_ids=(EOS,),
                 vocab: int = V, mask_id: int = MASK, pad_id: int = PAD, default=(5, 0.05)):
        self.table = table
        self.B = block_size
        self.block_size = block_size if causal else None
        self.causal = causal
        self.mask_id, self.pad_id, self.vocab = mask_id, pad_id, vocab
        self.eos_ids = tuple(eos_ids)
        self.default = default
        self.calls: list[tuple] = []
        self.seqs: list[list[list]] = []
        self._memo: dict = {}
        self.tokenizer = NoCapitals(vocab)      # rules=reference reads token texts

    @property
    def nfe(self) -> int:
        return len(self.calls)

    @property
    def rows(self) -> int:
        return sum(c[0] for c in self.calls)

    def _end(self, q: int, n: int) -> int:
        """End (exclusive) of what position id q sees in a sequence of n."""
        return min(n, (q // self.B + 1) * self.B) if self.causal else n

    def _dist(self, seq: tuple, q: int) -> torch.Tensor:
        key = (seq[:self._end(q, len(seq))], q)
        if key not in self._memo:
            tab = self.table(list(key[0]))
            self._memo[key] = dist_logits(tab.get(q, self.default), self.vocab, self.mask_id)
        return self._memo[key]

    def logits(self, tokens, positions, *, attention_mask=None, cache=None):
        N, T = tokens.shape
        pads = ([0] * N if attention_mask is None
                else (T - attention_mask.sum(-1)).tolist())
        pos = positions if positions.dim() == 2 else positions.expand(N, -1)
        view = cache_segments(cache, N)
        cached = is_cached_call(view)
        seg_of, ref = [], None
        if view is not None:
            for s, k in enumerate(view.rows):
                seg_of += [s] * k
            if cached:
                ref = view.layer_kv()[0][0][:, 0, :, 0].long().tolist()       # [S][T]
            else:
                kept = tokens.float()[:, None, :, None]
                view.keep([(kept, kept.clone())])
        rows = tokens.tolist()
        out = torch.empty(N, pos.shape[1], self.vocab)
        seen = []
        for n in range(N):
            pad = pads[n]
            seq = tuple(None if t == self.mask_id else t for t in rows[n][pad:])
            seen.append(list(seq))
            for j, c in enumerate(pos[n].tolist()):
                q = c - pad
                if cached and self._stale(rows[n], ref[seg_of[n]], view.spans[seg_of[n]],
                                          pad, q):
                    out[n, j] = dist_logits(STALE, self.vocab, self.mask_id)
                else:
                    out[n, j] = self._dist(seq, q)
        p0 = pos[0].tolist()
        self.calls.append((N, (p0[0] - pads[0], p0[-1] + 1 - pads[0]), T))
        self.seqs.append(seen)
        return out

    def _stale(self, row: list, kept: list, span, pad: int, q: int) -> bool:
        """Whether query q sees a kept key (outside ``span``) whose own view changed."""
        s0, s1 = span
        n = len(row) - pad
        for i in range(pad, pad + self._end(q, n)):
            if s0 <= i < s1:
                continue
            e = pad + self._end(i - pad, n)
            if row[pad:e] != kept[pad:e]:
                return True
        return False


def random_table(seed: int, *, vocab: int = V, eos_rate: float = 0.08):
    """A deterministic table: each (visible sequence, position) hashes to a top token and its
    probability, from peaked (0.99) to flat (0.15); end-of-text now and then."""
    levels = (0.15, 0.3, 0.45, 0.6, 0.8, 0.93, 0.97, 0.99)

    def table(seq: list) -> dict:
        out = {}
        base = repr((seed, seq)).encode()
        for q in range(len(seq)):
            h = hashlib.blake2b(base + b"/%d" % q, digest_size=8).digest()
            tok = 10 + h[0] % 40
            if h[1] < 256 * eos_rate:
                tok = EOS
            out[q] = (tok, levels[h[2] % len(levels)])
        return out
    return table
