"""How ``generate_until`` forms its batches: the way lm-eval's HFLM does (its ``Collator``).

Requests are grouped by their decoding parameters (groups in the order of their first request),
and inside a group sorted by prompt length, longest first (ties: the evaluator's order), then
cut into batches of ``batch_size``. Similar lengths share a batch, so little of a batch is left
padding, and the first batch of each group is its widest: an out-of-memory shows there, not
after hours. Decoding is batch-invariant (a request's tokens and NFE do not depend on its
batch), so only the wall time changes; callers put each result back at its request's index.
"""

from __future__ import annotations

from typing import Hashable, Sequence


def batches(keys: Sequence[Hashable], lengths: Sequence[int], batch_size: int) -> list[list[int]]:
    """Indices of the requests (``keys[i]``: request i's decoding parameters, ``lengths[i]``:
    its prompt tokens) in the order they are decoded, as batches of at most ``batch_size``.

    Every index appears exactly once; a batch never mixes keys."""
    if len(keys) != len(lengths):
        raise ValueError(f"keys ({len(keys)}) and lengths ({len(lengths)}) must have one entry "
                         "per request")
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size!r} must be a positive integer")
    groups: dict[Hashable, list[int]] = {}
    for i, k in enumerate(keys):
        groups.setdefault(k, []).append(i)
    out = []
    for members in groups.values():
        members = sorted(members, key=lambda i: -lengths[i])      # stable: ties keep their order
        out += [members[a:a + batch_size] for a in range(0, len(members), batch_size)]
    return out


def padding_share(lengths: Sequence[int], order: list[list[int]]) -> float:
    """Share of the prompt columns of ``order``'s batches that are left padding: every batch
    is as wide as its longest prompt (0.0 for no prompt tokens)."""
    width = sum(max(lengths[i] for i in b) * len(b) for b in order)
    real = sum(lengths[i] for b in order for i in b)
    return (width - real) / width if width else 0.0
