"""Data parallel x tensor parallel: the run's processes as lm-eval and the model see them.

    torchrun --nproc_per_node W -m lm_eval --model pvf-dlm \\
        --model_args pretrained=...,tensor_parallel_size=N ...

The launcher's W processes (torchrun, or ``accelerate launch``, which starts them the same way)
form a 2-D ``torch.distributed`` device mesh (dp, mp) of W / N model copies of N ranks each, on
one process group (NCCL on CUDA, gloo on the CPU); the ranks of a copy are consecutive global
ranks, so a copy sits on one node. lm-eval sees the data-parallel rank and size: each copy gets
every dp-th document, every rank of a copy gets the same documents and runs the same decode loop
on them, and only the network's layers exchange partial results (``models/parallel.py``). Only
mp rank 0 writes files (traces, online vocabularies); lm-eval writes its results where
``rank == 0`` and ``LOCAL_RANK == 0``: one process.

Free of lm-eval, so that ``model_args`` can name these keys without importing it.
"""

from __future__ import annotations

import os
import sys
import zlib
from dataclasses import dataclass

from ..models.parallel import LAYERS  # noqa: F401  (the values of parallel_layers)

#: model args of other lm-eval backends that split a model over GPUs, and what they mean there
HABITS = {
    "parallelize": "HFLM's parallelize=True",
    "device_map": "HFLM's device_map",
    "device_map_option": "HFLM's device_map_option",
    "max_memory_per_gpu": "HFLM's max_memory_per_gpu",
    "max_cpu_memory": "HFLM's max_cpu_memory",
    "offload_folder": "HFLM's offload_folder",
    "tp_plan": "HFLM's tp_plan",
    "enable_expert_parallel": "vLLM's enable_expert_parallel",
    "ep_size": "SGLang's ep_size",
}
#: accepted spellings of the parallel keys (SGLang's and dInfer's)
ALIASES = {"tp_size": "tensor_parallel_size", "dp_size": "data_parallel_size"}
#: the keys this module reads from the model args
KEYS = ("tensor_parallel_size", "data_parallel_size", "parallel_layers", *ALIASES)
#: the environment variable that turns on the per-call check across the ranks (1, true)
CHECK_RANKS = "PVF_CHECK_RANKS"


def habit_error(key: str) -> str | None:
    """The one-line answer to a model arg of another backend's way of splitting a model."""
    if key not in HABITS:
        return None
    return (f"pvf-dlm: {key} is {HABITS[key]}; did you mean tensor_parallel_size=N? pvf-dlm "
            f"splits a model over N processes per copy: torchrun --nproc_per_node N -m lm_eval "
            f"--model pvf-dlm --model_args ...,tensor_parallel_size=N (the routed experts always "
            f"split over the same N ranks)")


@dataclass(frozen=True)
class ParallelArgs:
    """The parallel model args, checked against the launch they fit (``settings.parse_parallel``):
    ``tp`` ranks per model copy, ``dp`` copies, ``world`` = dp x tp processes, the ``layers``
    split, and ``check_ranks`` (the per-call check across ranks, :data:`CHECK_RANKS`)."""

    tp: int = 1
    dp: int = 1
    world: int = 1
    layers: str = "all"
    check_ranks: bool = False


class Ranks:
    """This process in the run: its data-parallel rank and size (what lm-eval sees), its
    model-parallel group (``comm``: the network's collectives; None with one rank per copy),
    the device, and the gathers lm-eval asks for. One process: rank 0 of 1, no group."""

    def __init__(self, args: ParallelArgs, device=None):
        self.args = args
        self.world = args.world
        self.rank = 0
        self.dp_rank, self.dp_size = 0, 1
        self.mp_rank, self.mp_size = 0, args.tp
        self.mesh = self.dp_group = None
        self.comm = None
        self.device = device

    @classmethod
    def launch(cls, args: ParallelArgs, device=None) -> "Ranks":
        """Join the launcher's process group (created here unless accelerate or the caller
        did) and build the (dp, mp) mesh on it; one process: nothing to join."""
        ranks = cls(args, device)
        if args.world > 1:
            ranks._join(device)
        return ranks

    def _join(self, device) -> None:
        import torch
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh

        from ..models.parallel import Comm

        on_cpu = not torch.cuda.is_available() or str(device or "").startswith("cpu")
        if on_cpu:
            self.device = torch.device("cpu")
        else:
            self.device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
            torch.cuda.set_device(self.device)
        if not dist.is_initialized():
            dist.init_process_group("gloo" if on_cpu else "nccl")
        self.rank = dist.get_rank()
        self.mesh = init_device_mesh(self.device.type, (self.args.dp, self.args.tp),
                                     mesh_dim_names=("dp", "mp"))
        self.dp_group = self.mesh["dp"].get_group()
        self.dp_rank, self.dp_size = self.mesh["dp"].get_local_rank(), self.args.dp
        self.mp_rank = self.mesh["mp"].get_local_rank()
        if self.args.tp > 1:
            self.comm = Comm(self.mesh["mp"].get_group(), self.args.tp, self.mp_rank)
        install_failure_notes(self.rank)

    def info(self, model) -> dict:
        """The layout the run used (the results' ``config.pvf.parallel``)."""
        shard = getattr(model, "shard", None)
        return {"tensor_parallel_size": self.args.tp, "data_parallel_size": self.args.dp,
                "parallel_layers": self.args.layers if self.args.tp > 1 else None,
                "notes": shard.notes() if shard is not None else []}

    @property
    def writes(self) -> bool:
        """Whether this process writes the run's files (mp rank 0 of each copy)."""
        return self.mp_rank == 0

    # ---------------------------------------------------------------- lm-eval's gathers

    def all_gather(self, tensor):
        """lm-eval's ``all_gather``: every model copy's ``tensor`` concatenated along dim 0
        (a 0-d tensor counts as one row), in dp order."""
        import torch
        import torch.distributed as dist

        t = tensor.reshape(1) if tensor.dim() == 0 else tensor.contiguous()
        if self.dp_size == 1:
            return t.clone()
        parts = [torch.empty_like(t) for _ in range(self.dp_size)]
        dist.all_gather(parts, t, group=self.dp_group)
        return torch.cat(parts)

    def gather_object(self, obj) -> list:
        """Every model copy's ``obj``, in dp order, on every process."""
        import torch.distributed as dist

        if self.dp_size == 1:
            return [obj]
        out = [None] * self.dp_size
        dist.all_gather_object(out, obj, group=self.dp_group)
        return out

    def gather_world(self, obj) -> list:
        """Every process's ``obj``, in global rank order."""
        import torch.distributed as dist

        if self.world == 1:
            return [obj]
        out = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def barrier(self) -> None:
        import torch.distributed as dist

        if self.world > 1:
            dist.barrier()

    def same_on_every_rank(self, what: str, values) -> None:
        """Compare a crc of ``values`` (anything with a stable ``repr``) across the ranks of
        this model copy; ranks that differ raise ``models.parallel.RanksDiverged`` naming
        ``what``."""
        import torch

        from ..models.parallel import same_on_every_rank

        if self.comm is not None:
            crc = torch.tensor([zlib.crc32(repr(values).encode())], device=self.device)
            same_on_every_rank(self.comm, crc, what)


# ------------------------------------------------------------------ a rank that fails

FAILED = "pvf_failed/"


def _store():
    import torch.distributed.distributed_c10d as c10d

    try:
        return c10d._get_default_store()
    except Exception:  # no group, or its store is gone with the process that held it
        return None


def _one_line(value: BaseException) -> str:
    text = " ".join(str(value).split()) or type(value).__name__
    return text if text.startswith("pvf-dlm:") else f"{type(value).__name__}: {text}"


def failed_peers(world: int, me: int) -> list[tuple[int, str]]:
    """(rank, its one-line error) of every other rank that left a failure note."""
    store = _store()
    if store is None:
        return []
    found = []
    for r in range(world):
        key = f"{FAILED}{r}"
        try:
            if r != me and store.check([key]):
                found.append((r, store.get(key).decode(errors="replace")))
        except Exception:
            return found
    return found


def install_failure_notes(rank: int) -> None:
    """Chain a ``sys.excepthook`` that makes a failing run end in one line per process:

    - a rank whose error is its own leaves ``pvf_failed/<rank>`` (its one-line error) in the
      process group's store, then reports it as before (one line for a user's mistake, see
      ``one_line.exit_in_one_line``; a traceback otherwise);
    - a rank whose error is a broken collective (another rank's process ended: gloo sees its
      sockets close) names the rank that left a note, in one line, and exits at once (tearing
      down a broken group could wait on the dead peer).
    """
    import torch.distributed as dist

    from ..one_line import one_line_hook

    report = one_line_hook(sys.excepthook)
    world = dist.get_world_size()

    def hook(kind, value, tb):
        if _collective_failure(value):
            peers = failed_peers(world, rank)
            why = (f"rank {peers[0][0]} failed ({peers[0][1]})" if peers else
                   f"another rank went away without a message ({_one_line(value)[:200]})")
            print(f"pvf-dlm: {why}; rank {rank} stops too", file=sys.stderr, flush=True)
            os._exit(1)
        store = _store()
        if store is not None:
            try:
                store.set(f"{FAILED}{rank}", _one_line(value))
            except Exception:   # the store went with a rank that ended first
                pass
        report(kind, value, tb)

    hook.pvf_one_line = True
    sys.excepthook = hook


def _collective_failure(value: BaseException) -> bool:
    """Whether ``value`` is a collective that broke because a peer went away."""
    import torch.distributed as dist

    if isinstance(value, getattr(dist, "DistError", ())):
        return True
    text = str(value)
    return isinstance(value, RuntimeError) and any(
        s in text for s in ("Connection closed by peer", "Connection reset by peer", "gloo",
                            "NCCL", "Broken pipe"))
