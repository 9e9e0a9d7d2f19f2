"""Whole-result comparison of decode results: every dataclass field but the timing ones.

Batch-size invariance means more than equal tokens: NFE, branch rows, routes, the planning
tally and the trace records of a request must not depend on which requests share its batch.
Comparing ``dataclasses.fields`` (not a hand-picked tuple) makes a field added to
``DecodeResult`` part of every such test automatically.

Trace records hold discrete facts (committed positions, routes, candidates, verdicts, NFE,
rows), compared exactly here, and float32 values computed from the logits (``c_total``, a sum of
probabilities), which a batched forward reproduces only to the last bits unless decoding is
batch-invariant (``batch_invariant=true``): :func:`outcome` compares them with ``floats=True``
only, and :func:`trace_floats` lists them (tests/test_batch_trace_floats.py).
"""

from __future__ import annotations

import dataclasses

#: fields that measure time, not the decoding outcome
TIMING_FIELDS = frozenset({"wall_s"})


def _without_floats(value):
    """``value`` (a trace record or part of one) with every float replaced by the marker
    ``"float"``: what is left is discrete and must match exactly."""
    if isinstance(value, float):
        return "float"
    if isinstance(value, dict):
        return {k: _without_floats(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_without_floats(v) for v in value]
    return value


def _floats(value) -> list[float]:
    if isinstance(value, float):
        return [value]
    if isinstance(value, dict):
        return [x for v in value.values() for x in _floats(v)]
    if isinstance(value, (list, tuple)):
        return [x for v in value for x in _floats(v)]
    return []


def outcome(result, *, floats: bool = False) -> dict:
    """Every field of a decode result except :data:`TIMING_FIELDS`, by name; the trace records'
    float values (see the module docstring) stand as the marker ``"float"`` unless ``floats``."""
    out = {f.name: getattr(result, f.name) for f in dataclasses.fields(result)
           if f.name not in TIMING_FIELDS}
    if out.get("steps") is not None and not floats:
        out["steps"] = _without_floats(out["steps"])
    return out


def trace_floats(result) -> list[float]:
    """The float values of a decode result's trace records, in record order."""
    return _floats(result.steps or [])


def _first_difference(got: dict, want: dict) -> str:
    for name in want:
        if got[name] == want[name]:
            continue
        if name == "steps" and got[name] is not None and want[name] is not None:
            for t, (g, w) in enumerate(zip(got[name], want[name])):
                if g != w:
                    return f"steps[{t}]: {g!r} != {w!r}"
            return f"steps: {len(got[name])} records != {len(want[name])}"
        return f"{name}: {got[name]!r} != {want[name]!r}"
    return ""


def assert_same_outcomes(got: list, want: list, context=None, *, floats: bool = False) -> None:
    """Results ``got`` equal ``want`` request by request in every non-timing field (``floats``:
    the trace records' float values too, bit for bit); the message names the first request and
    field that differ."""
    assert len(got) == len(want), (context, len(got), len(want))
    for i, (g, w) in enumerate(zip(got, want)):
        og, ow = outcome(g, floats=floats), outcome(w, floats=floats)
        assert og == ow, f"{context}: request {i}: {_first_difference(og, ow)}"
