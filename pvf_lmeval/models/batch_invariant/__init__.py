"""Batch-invariant implementations behind ``models/ops.py``: Triton kernels for CUDA (see
:mod:`.custom_ops`: torch custom ops over :mod:`.matmul`, :mod:`.attention`, :mod:`.norm`) and
fixed-shape products in plain torch for the CPU (:mod:`.cpu`).

Importing this package needs neither; :func:`support_error` says where they run without
importing Triton.
"""

from __future__ import annotations

import importlib.util

import torch


def support_error(device, dtype) -> str | None:
    """Why no batch-invariant implementation runs on ``device`` in ``dtype`` (one line naming
    ``batch_invariant``), or None: the CPU in float32 (:mod:`.cpu`), CUDA in bfloat16, float16
    or float32 with Triton."""
    device = torch.device(device)
    if device.type == "cpu":
        if dtype != torch.float32:
            return (f"batch_invariant=true on the CPU covers float32 only (dtype {dtype}); "
                    "pass dtype=float32")
        return None
    if dtype not in (torch.bfloat16, torch.float16, torch.float32):
        return (f"batch_invariant=true: no batch-invariant kernels for dtype {dtype}; allowed "
                "dtypes: bfloat16, float16, float32")
    if device.type != "cuda":
        return (f"batch_invariant=true runs on CUDA devices and the CPU only (device {device})")
    if importlib.util.find_spec("triton") is None:
        return ("batch_invariant=true needs Triton (CUDA builds of torch bring it; "
                "pip install triton)")
    return None


def batch_invariant_ops(device="cuda"):
    """The batch-invariant implementation for ``device``: the CPU's plain-torch one
    (:data:`.cpu.CPU_INVARIANT`) or the Triton kernels' (:class:`.custom_ops.BatchInvariantOps`,
    imports Triton)."""
    if torch.device(device).type == "cpu":
        from .cpu import CPU_INVARIANT
        return CPU_INVARIANT
    from .custom_ops import BATCH_INVARIANT
    return BATCH_INVARIANT
