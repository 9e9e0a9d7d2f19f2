"""Real processes for the tests of distributed code: a pool of ranks on one gloo process group.

    pool = RankPool(2)                      # 2 spawned processes, gloo, one torch thread each
    per_rank = pool.run(jobs.load, folder)  # the same job on every rank; results in rank order
    pool.close()

A job is a function importable by name (``module.function``, pickled by reference): each rank
runs it with the same arguments, so a job that calls the network's collectives runs them on
every rank, as an SPMD program does. Results come back serialised by ``torch.save`` (tensors
included). The processes start once and serve every job of a test module: starting one costs
seconds on a small machine (importing torch), a job costs what it computes.

A job that raises on a rank fails :meth:`RankPool.run` with that rank's traceback; a rank whose
process ends fails it at once, naming the rank; either leaves the pool closed (the other ranks
may be waiting in a collective), and later jobs fail fast.
"""

from __future__ import annotations

import importlib
import io
import os
import queue
import socket
import time
import traceback

import torch
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_env(rank: int, world: int, port: int) -> dict:
    """The environment torchrun gives rank ``rank`` of ``world`` on one node."""
    return {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
            "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(world),
            "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false"}


def _dumps(value) -> bytes:
    buf = io.BytesIO()
    torch.save(value, buf)
    return buf.getvalue()


def _serve(rank: int, world: int, port: int, jobs, results, join_group: bool) -> None:
    os.environ.update(rank_env(rank, world, port))
    torch.set_num_threads(1)
    if join_group:
        import torch.distributed as dist

        dist.init_process_group("gloo")
    while True:
        job = jobs.get()
        if job is None:         # no teardown: a group's destructor may wait for its peers
            os._exit(0)
        module, name, args = job
        try:
            value = getattr(importlib.import_module(module), name)(*args)
            results.put((rank, True, _dumps(value)))
        except BaseException:           # noqa: BLE001  (reported to the test, with the rank)
            results.put((rank, False, traceback.format_exc()))


class RankFailed(AssertionError):
    """A job raised on a rank, or a rank's process ended."""


class RankPool:
    """``world`` spawned processes on one gloo process group (see the module docstring).
    ``join_group=False``: the processes get torchrun's environment but join no group (a job
    that builds the group itself, as the lm-eval adapter does)."""

    def __init__(self, world: int, join_group: bool = True):
        ctx = mp.get_context("spawn")
        self.world = world
        self.port = free_port()
        self.results = ctx.Queue()
        self.jobs = [ctx.Queue() for _ in range(world)]
        self.procs = [ctx.Process(target=_serve, daemon=True,
                                  args=(r, world, self.port, self.jobs[r], self.results,
                                        join_group))
                      for r in range(world)]
        for p in self.procs:
            p.start()
        self.closed = False

    def run(self, fn, *args, timeout: float = 300.0) -> list:
        """``fn(*args)`` on every rank; its results in rank order."""
        if self.closed:
            raise RankFailed("the rank pool was closed by an earlier failure")
        for q in self.jobs:
            q.put((fn.__module__, fn.__name__, args))
        got: dict[int, object] = {}
        deadline = time.monotonic() + timeout
        while len(got) < self.world:
            try:
                rank, ok, payload = self.results.get(timeout=0.5)
            except queue.Empty:
                dead = [r for r, p in enumerate(self.procs) if not p.is_alive()]
                if dead:
                    self.close()
                    raise RankFailed(f"rank {dead[0]} ended (exit code "
                                     f"{self.procs[dead[0]].exitcode}) during {fn.__name__}")
                if time.monotonic() > deadline:
                    self.close()
                    raise RankFailed(f"{fn.__name__} did not finish on ranks "
                                     f"{sorted(set(range(self.world)) - set(got))} in {timeout} s")
                continue
            if not ok:
                self.close()
                raise RankFailed(f"{fn.__name__} failed on rank {rank}:\n{payload}")
            got[rank] = torch.load(io.BytesIO(payload), weights_only=False)
        return [got[r] for r in range(self.world)]

    def close(self) -> None:
        """Stop the processes (those waiting in a collective are terminated)."""
        self.closed = True
        for q, p in zip(self.jobs, self.procs):
            if p.is_alive():
                q.put(None)
        for p in self.procs:
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)
