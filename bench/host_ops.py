"""Host operations per round of the decode loop: how many torch operations are dispatched
outside ``model.logits`` per round, per decoder x cache x batch size (tiny fixture, held-out
`arith` items). A count, not a time: it does not depend on the machine's load, and it grows
with the batch only where the host does work per request (one operation per request per round
would add R - 1 operations at batch R). The column "of them in the round's programs" counts
those made by the round's ``settle`` and ``prepare`` (``pvf_lmeval/decoding/round.py``), which
``compile_round=true`` runs as two compiled programs instead: a few fused kernels each.

With ``--device cuda``, the table adds the synchronisations CUDA reports per round
(``torch.cuda.set_sync_debug_mode``, model calls included): each is a wait of the host for the
queued kernels. The loop's own are one read per round plus two per batch (the first call's
layout and the finished outputs) and no blocking upload (``tests/test_host_reads.py`` pins both
on the CPU); ``decode_batch`` adds one copy per prompt and two synchronisations that time each
batch, before and after its rounds.

    python bench/host_ops.py --fixtures tiny-llada --limit 32
"""

from __future__ import annotations

import argparse
import warnings

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from benchlib import decode_batch
from benchlib import rounds as round_mod
from benchlib import load_model

import benchlib
from e2e import RoundCounter, params_for


class OpCounter(TorchDispatchMode):
    """Counts dispatched aten operations while ``counting`` is True (``n``), and those of them
    made inside the round's ``settle``/``prepare`` (``in_round``: what ``compile_round`` runs as
    two compiled programs; round 0's ``prepare``, which always runs eager, included)."""

    def __init__(self):
        super().__init__()
        self.n = self.in_round = 0
        self.counting = True
        self.round = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += self.counting
        self.in_round += self.counting and self.round
        return func(*args, **(kwargs or {}))


def count_round(counter: OpCounter):
    """Make the loop's eager ``settle``/``prepare`` tell ``counter`` when they run."""
    for name in ("settle", "prepare"):
        def flagged(*a, _fn=getattr(round_mod, name), **k):
            counter.round = True
            try:
                return _fn(*a, **k)
            finally:
                counter.round = False
        setattr(round_mod, name, flagged)


class Uncounted:
    """A model whose ``logits`` calls are not counted by ``counter``."""

    def __init__(self, model, counter: OpCounter):
        self.model, self.counter = model, counter

    def __getattr__(self, name):
        return getattr(self.model, name)

    def logits(self, *a, **k):
        self.counter.counting = False
        try:
            return self.model.logits(*a, **k)
        finally:
            self.counter.counting = True


class CudaSyncs:
    """Counts the synchronisations CUDA reports while active (``set_sync_debug_mode("warn")``);
    a no-op count of 0 on other devices."""

    def __init__(self, device: str):
        self.on = device.startswith("cuda")
        self.n = 0

    def __enter__(self):
        if self.on:
            self._w = warnings.catch_warnings(record=True)
            self._log = self._w.__enter__()
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
        return self

    def __exit__(self, *exc):
        if self.on:
            torch.cuda.set_sync_debug_mode("default")
            self.n = sum("synchroniz" in str(w.message) for w in self._log)
            self._w.__exit__(*exc)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    benchlib.add_arguments(ap, fixtures_default=["tiny-llada"], limit_default=32)
    ap.add_argument("--decoders", nargs="+", default=["threshold", "pvf"])
    ap.add_argument("--caches", nargs="+", default=["none", "dual"])
    ap.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 4, 16])
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    docs = benchlib.held_out(args.limit)
    cuda = args.device.startswith("cuda")
    print("| fixture | decoder | cache | batch | batches | rounds | operations outside the model "
          "per round | vs batch 1 | of them in the round's programs |"
          + (" CUDA syncs per round |" if cuda else "")
          + "\n|---|---|---|---|---|---|---|---|---|" + ("---|" if cuda else ""))
    for name in args.fixtures:
        base = load_model(name, device=args.device)
        prompts = benchlib.prompt_ids(base.tokenizer, docs)
        counter = OpCounter()
        count_round(counter)
        model = Uncounted(base, counter)
        for dec in args.decoders:
            for cache in args.caches:
                params = params_for(dec, cache, args, base, {})
                first = None
                for bs in args.batch_sizes:
                    counter.n = counter.in_round = 0
                    cuda_syncs, batches = CudaSyncs(args.device), 0
                    with RoundCounter() as rc, counter, cuda_syncs:
                        for a in range(0, len(prompts), bs):
                            decode_batch(model, prompts[a:a + bs], params=params,
                                         request_indices=list(range(a, a + len(prompts[a:a + bs]))))
                            batches += 1
                    per = counter.n / rc.n
                    first = first or per
                    row = (f"| {name} | {dec} | {cache} | {bs} | {batches} | {rc.n} | {per:.1f} | "
                           f"{per / first:.2f}x | {counter.in_round / rc.n:.1f} |")
                    if cuda:
                        row += f" {cuda_syncs.n / rc.n:.2f} |"
                    print(row, flush=True)


if __name__ == "__main__":
    main()
