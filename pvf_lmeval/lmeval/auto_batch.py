"""``batch_size=auto``: the largest number of requests whose canvas fits the device.

As lm-eval's HFLM: start at ``max_batch_size`` (64 unless given) and halve on out-of-memory;
then bisect between the largest batch that fitted and the smallest that did not, so the answer
is the largest that fits, not a power of two below it. A probe is one real forward of the run's
canvas (``rows_per_request`` rows per request: a decoder's branches), made once per canvas
size and cached. On the CPU nothing is probed (host memory swaps long before it runs out): the
batch is ``CPU_AUTO_BATCH``, capped by ``max_batch_size``. Under tensor parallel every rank of a
model copy probes alone and a batch fits when it fits on all of them (:func:`probe`,
:func:`on_every_rank`); the adapter then takes the smallest over all processes.
"""

from __future__ import annotations

import logging
from typing import Callable

from .model_args import AUTO_MAX_BATCH, CPU_AUTO_BATCH, positive_int


def batch_size_arg(batch_size, max_batch_size) -> tuple[int | str, "AutoBatch | None"]:
    """``(batch_size, AutoBatch or None)`` from the model args ``batch_size`` (a positive
    integer, ``auto`` or ``auto:N``) and ``max_batch_size``, as HFLM reads them.

    HFLM's ``max_batch_size`` is the "upper bound for batch size when using automatic batch size
    detection": with a fixed ``batch_size`` it bounds nothing, and lm-eval's CLI passes it
    along with ``--batch_size`` (so ``--batch_size 4 --max_batch_size 8`` is accepted). HFLM's
    ``auto:N`` re-detects the batch size N times over a run, as its sorted requests shorten;
    ``auto`` here probes once per canvas size already, so ``auto:N`` runs as ``auto``, with a
    one-line notice."""
    if max_batch_size is not None:
        max_batch_size = positive_int("max_batch_size", max_batch_size)
    text = str(batch_size).strip().lower()
    if text == "auto" or text.startswith("auto:"):
        if text != "auto":
            schedule = text.split(":", 1)[1]
            try:
                if float(schedule) <= 0:
                    raise ValueError
            except ValueError:
                raise ValueError(f"batch_size={batch_size!r}: auto:N needs a number N > 0 "
                                 "(HFLM's re-detection schedule)") from None
            logging.getLogger("pvf_lmeval").warning(
                f"pvf-dlm: batch_size={batch_size} runs as batch_size=auto (the batch is probed "
                "once per canvas size, which covers HFLM's re-detection schedule)")
        return "auto", AutoBatch(AUTO_MAX_BATCH if max_batch_size is None else max_batch_size)
    return positive_int("batch_size", batch_size), None


def largest_fitting(fits: Callable[[int], bool], limit: int) -> int:
    """The largest ``b`` in ``[1, limit]`` with ``fits(b)``, assuming that a batch fits when a
    larger one does; 1 when none fits (decoding then reports the out-of-memory error)."""
    fail = None
    size = limit
    while size >= 1 and not fits(size):
        fail, size = size, size // 2
    if size < 1:
        return 1
    if fail is None:
        return size
    while fail - size > 1:
        middle = (size + fail) // 2
        if fits(middle):
            size = middle
        else:
            fail = middle
    return size


class AutoBatch:
    """The batch of ``batch_size=auto`` per (canvas tokens, rows per request), probed on first
    need (``sizes`` holds what was picked, as HFLM's ``batch_sizes``)."""

    def __init__(self, limit: int):
        self.limit = limit
        self.sizes: dict[tuple[int, int], int] = {}

    def size(self, model, *, canvas: int, gen_length: int, rows_per_request: int) -> int:
        key = (canvas, rows_per_request)
        if key not in self.sizes:
            self.sizes[key] = self._pick(model, canvas, gen_length, rows_per_request)
        return self.sizes[key]

    def _pick(self, model, canvas: int, gen_length: int, rows_per_request: int) -> int:
        import torch

        if torch.device(model.device).type == "cpu":
            return min(CPU_AUTO_BATCH, self.limit)

        comm = getattr(model, "comm", None)

        def fits(batch: int) -> bool:
            here = probe(model, batch * rows_per_request, canvas, gen_length)
            return here if comm is None else on_every_rank(comm, here, model.device)

        return largest_fitting(fits, self.limit)


def probe(model, rows: int, canvas: int, gen_length: int) -> bool:
    """Whether one forward of ``rows`` rows of a ``canvas`` canvas fits the device. Under
    tensor parallel (``model.comm``) the rank probes alone: its collectives run locally, on
    results of the same shapes (``Comm.local_only``), so a rank out of memory never leaves
    another waiting in a collective."""
    import contextlib

    import torch

    comm = getattr(model, "comm", None)
    tokens = torch.full((rows, canvas), model.mask_id, dtype=torch.long, device=model.device)
    positions = torch.arange(canvas - gen_length, canvas, device=model.device)
    try:
        with torch.inference_mode(), comm.local_only() if comm else contextlib.nullcontext():
            model.logits(tokens, positions)
        return True
    except torch.OutOfMemoryError:
        return False
    finally:
        del tokens
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def on_every_rank(comm, fits: bool, device) -> bool:
    """Whether ``fits`` holds on every rank of the tensor-parallel group ``comm``: every rank
    of a model copy probes the same batches in the same order and takes the same answer."""
    import torch

    return bool(comm.gather(torch.tensor([int(fits)], device=device)).min())
