"""Batch-invariant kernels (Triton) behind ``models/ops.py``: see :mod:`.ops`.

Importing this package needs Triton; :func:`support_error` says where the kernels run without
importing them.
"""

from __future__ import annotations

import importlib.util
import os

import torch


def support_error(device, dtype) -> str | None:
    """Why the batch-invariant kernels cannot run on ``device`` in ``dtype`` (one line naming
    ``batch_invariant``), or None: CUDA in bfloat16, float16 or float32 with Triton; the CPU
    only under Triton's interpreter (``TRITON_INTERPRET=1``, tests)."""
    device = torch.device(device)
    if dtype not in (torch.bfloat16, torch.float16, torch.float32):
        return (f"batch_invariant=true: no batch-invariant kernels for dtype {dtype}; allowed "
                "dtypes: bfloat16, float16, float32")
    if device.type != "cuda" and not (device.type == "cpu"
                                      and os.environ.get("TRITON_INTERPRET") == "1"):
        return (f"batch_invariant=true runs on CUDA devices only (device {device}); the CPU runs "
                "its kernels only under Triton's interpreter (TRITON_INTERPRET=1, for tests)")
    if importlib.util.find_spec("triton") is None:
        return ("batch_invariant=true needs Triton (CUDA builds of torch bring it; "
                "pip install triton)")
    return None


def batch_invariant_ops():
    """The :class:`.ops.BatchInvariantOps` instance (imports Triton)."""
    from .ops import BATCH_INVARIANT
    return BATCH_INVARIANT
