"""Small host values (indices, lengths, flags) onto the device without waiting for the device.

``torch.tensor(values, device="cuda")`` copies from pageable host memory, and CUDA synchronises
the stream before such a copy: the host then waits for every kernel already queued (a whole
model call, when the copy comes after one) before it can queue anything else. A decode round
builds a handful of such index tensors; each blocking copy would be a second read of the
device per round and would stop the host from queuing the next kernels while the GPU works.

:func:`upload` stages the values in page-locked memory (PyTorch's caching host allocator,
which keeps the block until the copy has run) and queues an asynchronous copy on the current
stream: kernels queued after it see the values, and the host goes on at once. On the CPU it is
``torch.tensor(values, dtype=dtype)``.
"""

from __future__ import annotations

import torch
from torch import Tensor


def upload(values, device: torch.device | str, dtype: torch.dtype = torch.long) -> Tensor:
    """``values`` (a list of numbers, or nested lists of equal lengths) as a ``dtype`` tensor
    on ``device``, queued without a stream synchronisation on CUDA."""
    host = torch.tensor(values, dtype=dtype, device="cpu")
    if torch.device(device).type == "cuda":
        host = host.pin_memory()
    return host.to(device, non_blocking=True)
