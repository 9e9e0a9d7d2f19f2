"""Batched decoding (``batch_size > 1``): several requests decoded together, one model call per
round carrying the branch rows of every request still decoding.

Each request keeps its own state, working set, stopping, randomness and KV cache: it runs the
ordinary loop (``loop.run_loop``) in a worker thread of its own, and its ``Ctx.forward`` hands its
rows to the batcher instead of calling the model. The threads never run concurrently: the
batcher passes a baton from request to request in a fixed order, so a round is "every live
request runs until it asks for its next call (or finishes)", then one pooled model call serves
them all. Everything a request does therefore happens in the same order as when it is decoded
alone, and batching changes no output and no per-request NFE (a request's NFE counts the calls
in which it had rows).

Prompts are left-padded to a common length with a pad id distinct from the mask id; the
attention mask hides the padding from every query and rotary positions ignore it. With KV
caches, the rows of requests whose call is full and those whose call is cached go to two
physical model calls of the same round (each request still counts one). A batch of one request
is exactly ``run_loop``.

Wall time: every request of a batch is charged an equal share of the batch's wall time, so that
``tps`` (a ratio of sums) is the batch's throughput.
"""

from __future__ import annotations

import dataclasses
import threading
import time

import torch
from torch import Tensor

from .loop import DecodeResult, _sync, run_loop


class _Aborted(BaseException):
    """Unwinds a worker thread when another request of the batch failed."""


def pad_id_of(model) -> int:
    """The model's pad id (else its first end-of-text id); never the mask id."""
    pad = getattr(model, "pad_id", None)
    if pad is None:
        pad = model.eos_ids[0]
    if int(pad) == int(model.mask_id):
        raise ValueError(f"pad id {pad} equals the mask id: batching needs a pad id distinct "
                         "from the mask id")
    return int(pad)


class _Handle:
    """A request's seat in the batch: its left padding and its way to the pooled call."""

    def __init__(self, batcher: "_Batcher", slot: int, pad: int, width: int, device):
        self.batcher, self.slot, self.pad = batcher, slot, pad
        self.mask = (torch.arange(width, device=device) >= pad).to(torch.long)   # [T]

    def call(self, ctx, rows: Tensor, positions: Tensor) -> Tensor:
        return self.batcher.submit(self.slot, ctx, rows, positions)


class _Batcher:
    def __init__(self, model, n: int):
        self.model = model
        self.wake = [threading.Semaphore(0) for _ in range(n)]
        self.back = threading.Semaphore(0)
        self.subs: dict[int, tuple] = {}
        self.out: dict[int, Tensor] = {}
        self.abort = False
        self.calls = 0          # physical model calls
        self.rounds = 0

    # ------------------------------------------------------------ worker side

    def submit(self, slot: int, ctx, rows: Tensor, positions: Tensor) -> Tensor:
        self.subs[slot] = (ctx, rows, positions)
        self.back.release()
        self.wake[slot].acquire()
        if self.abort:
            raise _Aborted()
        return self.out.pop(slot)

    # ------------------------------------------------------------ main side

    def execute(self, handles: list[_Handle]) -> None:
        """One round: the pooled call(s) for every submitted request, in slot order."""
        subs = sorted(self.subs.items())
        self.subs.clear()
        self.rounds += 1
        full = [s for s in subs if s[1][0].cache is None or s[1][0].cache.span is None]
        cached = [s for s in subs if not (s[1][0].cache is None or s[1][0].cache.span is None)]
        for group in (full, cached):
            if group:
                self._call(group, handles)

    def _call(self, group: list, handles: list[_Handle]) -> None:
        ns = [rows.shape[0] for _, (_, rows, _) in group]
        tokens = torch.cat([rows for _, (_, rows, _) in group])
        if len(group) == 1:
            positions = group[0][1][2]
        else:
            P = max(pos.shape[0] for _, (_, _, pos) in group)
            positions = torch.cat([
                torch.cat([pos, pos[-1:].expand(P - pos.shape[0])]).unsqueeze(0).expand(n, P)
                for n, (_, (_, _, pos)) in zip(ns, group)])
        attention_mask = None
        if any(handles[s].pad for s, _ in group):
            attention_mask = torch.cat([handles[s].mask.unsqueeze(0).expand(n, -1)
                                        for n, (s, _) in zip(ns, group)])
        cache = None
        if any(ctx.cache is not None for _, (ctx, _, _) in group):
            cache = [(ctx.cache, n) for n, (_, (ctx, _, _)) in zip(ns, group)]
        logits = self.model.logits(tokens, positions, attention_mask=attention_mask, cache=cache)
        self.calls += 1
        a = 0
        for n, (s, (_, _, pos)) in zip(ns, group):
            self.out[s] = logits[a:a + n, :pos.shape[0]]
            a += n


def run_batch(model, prompts: list[Tensor], params, make_decoder, *,
              request_indices: list[int] | None = None, repeat_indices: list[int] | None = None,
              trace: bool = False, online=None) -> list[DecodeResult]:
    """Decode ``prompts`` (1-D long tensors on the model device) together; results in order.

    ``make_decoder(params)`` builds one step object per request.
    """
    n = len(prompts)
    request_indices = list(request_indices) if request_indices is not None else list(range(n))
    repeat_indices = list(repeat_indices) if repeat_indices is not None else [0] * n
    if n == 1:
        return [run_loop(model, prompts[0], params, make_decoder(params),
                         request_index=request_indices[0], repeat_index=repeat_indices[0],
                         trace=trace, online=online)]
    if n == 0:
        return []
    device = prompts[0].device
    width = max(int(p.shape[0]) for p in prompts)
    pads = [width - int(p.shape[0]) for p in prompts]
    pad_id = pad_id_of(model) if any(pads) else 0
    padded = [torch.cat([torch.full((k,), pad_id, dtype=torch.long, device=device), p])
              for k, p in zip(pads, prompts)]
    batcher = _Batcher(model, n)
    handles = [_Handle(batcher, i, pads[i], width + params.gen_length, device) for i in range(n)]
    results: list[DecodeResult | None] = [None] * n
    errors: dict[int, BaseException] = {}
    done = [False] * n

    def work(i: int) -> None:
        try:
            batcher.wake[i].acquire()
            if batcher.abort:
                return
            results[i] = run_loop(model, padded[i], params, make_decoder(params),
                                  request_index=request_indices[i],
                                  repeat_index=repeat_indices[i], trace=trace, online=online,
                                  batch=handles[i])
        except _Aborted:
            pass
        except BaseException as exc:  # re-raised by the main thread
            errors[i] = exc
        finally:
            done[i] = True
            batcher.back.release()

    threads = [threading.Thread(target=work, args=(i,), daemon=True, name=f"pvf-decode-{i}")
               for i in range(n)]
    for t in threads:
        t.start()
    _sync(device)
    t0 = time.perf_counter()
    live = list(range(n))
    try:
        while live:
            for i in live:                  # the baton, in request order
                batcher.wake[i].release()
                batcher.back.acquire()
                if i in errors:
                    raise errors[i]
            live = [i for i in live if not done[i]]
            if live:
                batcher.execute(handles)
    finally:
        if live:
            batcher.abort = True
            for i in live:
                if not done[i]:
                    batcher.wake[i].release()
        for t in threads:
            t.join()
    _sync(device)
    share = (time.perf_counter() - t0) / n
    return [dataclasses.replace(r, wall_s=share) for r in results]


def decode_batch(model, prompts, decoder: str | None = None, *, params=None,
                 request_indices: list[int] | None = None, repeat_indices: list[int] | None = None,
                 trace: bool = False, online=None, preset: str | None = None,
                 **kwargs) -> list[DecodeResult]:
    """Decode several prompts (lists of ids or 1-D tensors) with the same parameters, batched.

    Parameters as in :func:`decode` (``params`` or ``decoder`` + keyword arguments). Outputs and
    per-request NFE equal those of decoding each prompt alone with the same request/repeat
    index (up to floating-point differences of the padded batch shapes).
    """
    from .api import DECODERS, _device
    from .params import params_for_call

    params = params_for_call(decoder, params, preset,
                             **{k: v for k, v in kwargs.items() if v is not None})
    prompts = list(prompts)
    if not prompts:
        return []
    dev = _device(model, prompts[0])
    prompts = [torch.as_tensor(p, dtype=torch.long).to(dev).reshape(-1) for p in prompts]
    return run_batch(model, prompts, params, DECODERS[params.decoder],
                     request_indices=request_indices, repeat_indices=repeat_indices,
                     trace=trace, online=online)
