"""``pvf_lmeval.tensors.uploads.upload``: host values onto the device, without a stream
synchronisation on CUDA (``tests/test_host_reads.py`` checks that the loop uses it)."""

from __future__ import annotations

import torch

from pvf_lmeval.tensors.uploads import upload


def test_values_dtype_device():
    t = upload([[1, 2, 3], [4, 5, 6]], "cpu")
    assert t.dtype == torch.long and t.device.type == "cpu"
    assert t.tolist() == [[1, 2, 3], [4, 5, 6]]
    f = upload([0.5, 2], torch.device("cpu"), dtype=torch.float32)
    assert f.dtype == torch.float32 and f.tolist() == [0.5, 2.0]
    assert upload([], "cpu").shape == (0,)


def test_cuda_copy_is_pinned_and_asynchronous(monkeypatch):
    """On CUDA the values are staged in page-locked memory and copied with ``non_blocking``
    (a pageable copy synchronises the stream first). Checked without a GPU by recording the
    two calls; ``bench/host_ops.py --device cuda`` counts the real synchronisations."""
    calls = []

    def pin_memory(self):
        calls.append(("pin", self.device.type, self.tolist()))
        return self

    def to(self, device, non_blocking=False):
        calls.append(("to", str(device), non_blocking))
        return self

    monkeypatch.setattr(torch.Tensor, "pin_memory", pin_memory)
    monkeypatch.setattr(torch.Tensor, "to", to)
    upload([7, 8], "cuda:0")
    assert calls == [("pin", "cpu", [7, 8]), ("to", "cuda:0", True)]
    calls.clear()
    upload([7, 8], "cpu")
    assert calls == [("to", "cpu", True)]
