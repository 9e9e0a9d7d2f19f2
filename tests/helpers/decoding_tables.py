"""Test models for the decoders: hand-written probability tables and a random-ish oracle.

Both implement the decoding model protocol (``mask_id``, ``eos_ids``, ``logits``) and record
every call (rows, requested positions) so tests can pin NFE and branch rows exactly.
"""

from __future__ import annotations

import hashlib
import math
from typing import Callable

import torch

V = 64          # vocabulary size
MASK = 63       # mask id
EOS = 2         # end-of-text id
FILL = 5        # default low-confidence top token
P0 = 3          # prompt length used by the tests
PROMPT = [40, 41, 42]

Dist = "tuple[int, float] | dict[int, float]"


def dist_logits(d, vocab: int = V, mask_id: int = MASK) -> torch.Tensor:
    """Log-probabilities [V] of a distribution spec.

    ``(tok, p)``: probability p on tok, the rest spread evenly over the other non-mask ids.
    ``{tok: p, ...}``: those probabilities, the rest spread evenly over the remaining ids.
    The mask id always gets probability 0 (logit -inf).
    """
    if isinstance(d, tuple):
        d = {d[0]: d[1]}
    probs = torch.zeros(vocab, dtype=torch.float64)
    for t, p in d.items():
        probs[t] = p
    rest = [i for i in range(vocab) if i != mask_id and i not in d]
    left = max(0.0, 1.0 - sum(d.values()))
    probs[rest] = left / len(rest)
    out = torch.log(probs)
    out[mask_id] = -math.inf
    return out.float()


def dist_entropy(d, vocab: int = V) -> float:
    """Entropy in nats of a distribution spec (see :func:`dist_logits`), from its definition
    -sum p log p: the named probabilities plus the remainder spread evenly over the other
    non-mask ids."""
    if isinstance(d, tuple):
        d = {d[0]: d[1]}
    rest = vocab - 1 - len(d)
    left = max(0.0, 1.0 - sum(d.values()))
    h = -sum(p * math.log(p) for p in d.values() if p > 0)
    return h - left * math.log(left / rest) if left > 0 else h


class NoCapitals:
    """A tokenizer for table models: no token's text is capitalised, so ``rules=reference``
    (switch 2, capitalised planning tokens) adds nothing to the planning vocabulary."""

    all_special_ids: list = []

    def __init__(self, size: int):
        self.size = size

    def __len__(self) -> int:
        return self.size

    def decode(self, ids) -> str:
        return "x"


class TableModel:
    """Model whose distributions are a function of the generation region's state.

    ``table(gen) -> {gen_pos: dist}``: ``gen`` is the list of generation-region tokens, ``None``
    where masked; positions it does not mention get ``default``. Records ``calls`` as
    ``(rows, (first_gen_pos, last_gen_pos + 1))`` and the canvases of every call in ``canvases``.
    ``tables`` ({prompt tuple: table}, for batches of several prompts of ``prompt_len`` tokens):
    each row reads the table of its own prompt; a batched call may then give every row its own
    positions ([N, P]). A decoder that stops committing would call a table model forever: past
    ``max_calls`` calls the model raises, so such a test fails at once instead of hanging.
    """

    def __init__(self, table: Callable[[list], dict] | None, *, prompt_len: int = P0,
                 default=(FILL, 0.05), eos_ids=(EOS,), vocab: int = V, mask_id: int = MASK,
                 max_calls: int = 100, tables: dict | None = None):
        self.table = table
        self.tables = None if tables is None else {tuple(k): t for k, t in tables.items()}
        self.P0 = prompt_len
        self.default = default
        self.mask_id = mask_id
        self.eos_ids = tuple(eos_ids)
        self.vocab = vocab
        self.calls: list[tuple[int, tuple[int, int]]] = []
        self.canvases: list[list[list]] = []
        self.tokenizer = NoCapitals(vocab)
        self.max_calls = max_calls

    @property
    def nfe(self) -> int:
        return len(self.calls)

    @property
    def rows(self) -> int:
        return sum(n for n, _ in self.calls)

    def logits(self, tokens, positions, *, attention_mask=None, cache=None):
        assert tokens.dtype == torch.long and tokens.dim() == 2
        assert cache is None and attention_mask is None
        if len(self.calls) >= self.max_calls:
            raise RuntimeError(f"table model called max_calls={self.max_calls} "
                               "times: decoding does not finish")
        N = tokens.shape[0]
        pos = positions.tolist() if positions.dim() == 2 else [positions.tolist()] * N
        out = torch.empty(N, len(pos[0]), self.vocab)
        seen = []
        for n, row in enumerate(tokens.tolist()):
            gen = [None if t == self.mask_id else t for t in row[self.P0:]]
            seen.append(gen)
            table = self.table if self.tables is None else self.tables[tuple(row[:self.P0])]
            tab = table(gen)
            for j, p in enumerate(pos[n]):
                out[n, j] = dist_logits(tab.get(p - self.P0, self.default), self.vocab,
                                        self.mask_id)
        every = [p for row_pos in pos for p in row_pos]
        self.calls.append((N, (min(every) - self.P0, max(every) + 1 - self.P0)))
        self.canvases.append(seen)
        return out


class RandomModel:
    """Random-ish but deterministic model: logits are a hash of (whole row, position).

    logits = base(seed, position) + jitter * noise(seed, whole row): confidence varies widely
    per position (logit scale in [0.3, 0.3 + sharp]) and every token of the canvas perturbs every
    distribution, so with a small ``jitter`` verifications and drafts often pass and with a large
    one they rarely do; early stops occur unless ``eos_bias`` is very negative.
    """

    def __init__(self, seed: int = 0, *, vocab: int = 24, mask_id: int = 23, eos_ids=(EOS,),
                 eos_bias: float = 0.0, sharp: float = 9.0, jitter: float = 1.0):
        self.seed = seed
        self.vocab = vocab
        self.mask_id = mask_id
        self.eos_ids = tuple(eos_ids)
        self.eos_bias = eos_bias
        self.sharp = sharp
        self.jitter = jitter
        self.calls: list[int] = []
        self.tokenizer = NoCapitals(vocab)

    @property
    def nfe(self) -> int:
        return len(self.calls)

    @staticmethod
    def _gen(key) -> torch.Generator:
        h = hashlib.blake2b(repr(key).encode(), digest_size=8).digest()
        return torch.Generator().manual_seed(int.from_bytes(h, "little") & ((1 << 62) - 1))

    def logits(self, tokens, positions, *, attention_mask=None, cache=None):
        """Like a network that attends only where ``attention_mask`` [N, T] is 1: a row's left
        padding is dropped and its positions counted from its first visible token, so a request
        gets the same logits alone and inside a left-padded batch."""
        assert cache is None
        out = []
        for n, row in enumerate(tokens.tolist()):
            pad = 0 if attention_mask is None else int((attention_mask[n] == 0).sum())
            row = row[pad:]
            T = len(row)
            g = self._gen(("base", self.seed, T))
            scale = 0.3 + torch.rand(T, 1, generator=g) * self.sharp
            base = torch.randn(T, self.vocab, generator=g) * scale
            base[:, self.eos_ids[0]] += self.eos_bias
            noise = torch.randn(T, self.vocab, generator=self._gen((self.seed, row)))
            # a batched call gives each row its own positions [N, P]
            at = (positions if positions.dim() == 1 else positions[n]) - pad
            out.append((base + self.jitter * noise)[at])
        self.calls.append(tokens.shape[0])
        return torch.stack(out)


def filled(gen: list) -> frozenset:
    """Set of filled generation positions of a table-model state."""
    return frozenset(i for i, t in enumerate(gen) if t is not None)


def failed_fill_table(g):
    """A pvf fill whose verification fails once: the empty canvas commits 10 at 0 (base) with
    the fill of 11 at 2 in the band; under that fill position 2 reads 12 (the fill of 11 is not
    verified) and 3 is confident (13); once 3 is filled, the fill of 12 at 2 verifies."""
    f = filled(g)
    if not f:
        return {0: (10, .95), 2: (11, .5)}
    if f == {0}:
        return {2: (12, .5), 3: (13, .95)}
    if f == {0, 3}:
        return {2: (12, .6)}
    return {}


# Two planning candidates in the calibration band [.15, .25), gen_length 4. Empty canvas: the
# base set is {0}; candidates 1 (token 30, p .2) and 2 (token 31, p .18). Under the base commit
# positions 1..3 are confident (S_imp = {1, 2, 3}); branch 30 agrees on {2, 3} (A = 1, entropy
# drops); branch 31 disagrees at 3 (A = 0).
BAND_EMPTY = {0: (10, .95), 1: (30, .2), 2: (31, .18), 3: (11, .5)}
BAND_BASE = {1: (13, .95), 2: (14, .92), 3: (11, .95)}
BAND_PLAN30 = {2: (14, .97), 3: (11, .99)}
BAND_PLAN31 = {1: (13, .95), 3: (12, .95)}


def band_pair_table(g):
    """The table of the two band candidates above (any other state: confident token 12)."""
    f = filled(g)
    return {frozenset(): BAND_EMPTY, frozenset({0}): BAND_BASE, frozenset({0, 1}): BAND_PLAN30,
            frozenset({0, 2}): BAND_PLAN31}.get(f, {i: (12, .95) for i in range(4)})


def run(decoder: str, table, *, model_kw=None, **kw):
    """Decode PROMPT with a TableModel over ``table``; returns (result, model). Traced."""
    from pvf_lmeval.decoding import decode

    m = TableModel(table, **(model_kw or {}))
    kw.setdefault("gen_length", 8)
    kw.setdefault("block_length", kw["gen_length"])
    r = decode(m, PROMPT, decoder, trace=True, **kw)
    assert r.nfe == m.nfe and r.branch_rows == m.rows
    return r, m


class LogitRows:
    """A model with V = 4 (mask id 3, end-of-text 2) whose logits may favour the mask id (for
    ``rules=reference``'s ``argmax_over_mask``), prompts of one token: the logits at generation
    position j are ``rows[j]`` while the whole canvas is masked, else a confident token 0."""

    mask_id, eos_ids, vocab = 3, (2,), 4

    def __init__(self, rows):
        self.rows = torch.tensor(rows, dtype=torch.float32)
        self.calls = 0

    def logits(self, tokens, positions, *, attention_mask=None, cache=None):
        self.calls += 1
        if self.calls > 20:
            raise RuntimeError("called 20 times: decoding does not progress")
        gen = tokens[:, 1:]                                   # a one-token prompt
        out = torch.tensor([9., 0., 0., 0.]).expand(*positions.shape[-1:], 4).clone()
        fresh = (gen == self.mask_id).all(-1)
        out = out.expand(tokens.shape[0], -1, -1).clone()
        out[fresh] = self.rows[positions - 1]
        return out
