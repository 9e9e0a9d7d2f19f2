"""Tensor and expert parallel: per-call time of 1 process against N ranks, and the bytes each
rank hands to collectives per call, on random weights of a published shape.

    python bench/parallel.py                                # llada2-mini / 8, CPU, 2 ranks
    python bench/parallel.py --device cuda --reduce 1       # two ranks on one GPU (gloo)
    python bench/parallel.py --device cuda --flash-shard    # one EP-8 shard of LLaDA2.0-flash

Each rank is a spawned process on one gloo group (two ranks share one GPU when ``--device
cuda``: NCCL refuses two ranks on one device; gloo's collectives go through host memory). A
call is the full forward of ``--rows`` rows of a ``--canvas`` canvas with the LM head on the
last ``--gen`` positions (the decode loop's first call of a block). Per layout (``parallel_layers``
experts and all) it prints the median wall time per call on rank 0, its ratio to one process in
the same run, the payload bytes each rank hands to collectives per call (an all-reduce moves
about 2 (N - 1) / N of it over a ring), and how the logits compare with one process's (experts:
bit for bit is the claim; all: the largest difference relative to the row's largest logit).

``--flash-shard``: rank 0 of an expert-parallel 8 layout of LLaDA2.0-flash (32 of 256 experts
per layer, attention replicated, bfloat16, about 31 GB), alone: its collectives run locally
(``Comm.local_only``: same shapes, no communication), so the time per call is the rank's compute
only; nothing here measures an interconnect.
"""

from __future__ import annotations

import argparse
import os
import queue
import socket
import statistics
import sys
import time

import torch
import torch.multiprocessing as mp

import benchlib
from benchlib import SHAPES, random_split_model, sync


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def reduced_shape(shape: str, k: int):
    from moe_speed import reduced

    cfg, _ = SHAPES[shape]
    return reduced(cfg, k)


def inputs(cfg, rows: int, canvas: int, gen: int, device):
    gen_ = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, cfg.vocab_size - 3, (rows, canvas), generator=gen_)
    tokens[:, canvas - gen:] = cfg.vocab_size - 1                     # masked answer
    return tokens.to(device), torch.arange(canvas - gen, canvas, device=device)


def time_calls(model, tokens, positions, calls: int, device) -> tuple[list[float], int, torch.Tensor]:
    """(seconds per call, payload bytes handed to collectives per call, the first logits)."""
    first = model.logits(tokens, positions)          # warm-up, and the logits compared
    sync(device)
    sent0 = model.comm.sent if model.comm is not None else 0
    times = []
    for _ in range(calls):
        t = time.perf_counter()
        model.logits(tokens, positions)
        sync(device)
        times.append(time.perf_counter() - t)
    sent = (model.comm.sent - sent0) // calls if model.comm is not None else 0
    return times, sent, first.float().cpu()


def _rank(rank: int, world: int, port: int, args, cfg, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world))
    import torch.distributed as dist

    from benchlib import Comm, Shard

    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo")
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    comm = Comm(dist.group.WORLD, world, rank)
    out = {}
    for layers in args.layers:
        shard = Shard.plan(cfg, world, rank, layers)
        model = random_split_model(cfg, device, dtype, shard, comm)
        tokens, positions = inputs(cfg, args.rows, args.canvas, args.gen, device)
        times, sent, first = time_calls(model, tokens, positions, args.calls, device)
        out[layers] = (times, sent, first.numpy())     # plain data through the queue
        del model
    results.put((rank, out))
    dist.barrier()
    dist.destroy_process_group()


def ranks_run(args, cfg) -> dict:
    """Rank 0's results per layout, from ``args.ranks`` spawned ranks."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_rank, args=(r, args.ranks, port, args, cfg, results))
             for r in range(args.ranks)]
    for p in procs:
        p.start()
    got = {}
    while len(got) < args.ranks:
        try:
            rank, out = results.get(timeout=5)
            got[rank] = out
        except queue.Empty:
            if any(p.exitcode not in (None, 0) for p in procs):
                sys.exit(f"parallel.py: a rank failed (exit codes {[p.exitcode for p in procs]})")
    for p in procs:
        p.join()
    return got[0]


def compare(layers: str, got: torch.Tensor, want: torch.Tensor) -> str:
    if torch.equal(got, want):
        return "bit for bit"
    row = want.abs().amax(-1, keepdim=True)
    return f"max |diff| / row max {float(((got - want).abs() / row).max()):.1e}"


def flash_shard(args) -> None:
    """Rank 0 of expert parallel 8 on LLaDA2.0-flash, alone, collectives local."""
    import torch.distributed as dist

    from benchlib import Comm, Shard

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0",
                      WORLD_SIZE="1")
    dist.init_process_group("gloo")
    cfg = reduced_shape("llada2-flash", args.reduce)
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    comm = Comm(dist.group.WORLD, 8, 0)
    shard = Shard.plan(cfg, 8, 0, "experts")
    t = time.perf_counter()
    with comm.local_only():
        model = random_split_model(cfg, device, dtype, shard, comm, name="flash EP-8 rank 0")
        held = sum(p.numel() * p.element_size() for p in model.net.parameters())
        tokens, positions = inputs(cfg, args.rows, args.canvas, args.gen, device)
        build = time.perf_counter() - t
        times, _, _ = time_calls(model, tokens, positions, args.calls, device)
    name = "llada2-flash" + (f"/{args.reduce}" if args.reduce > 1 else "")
    print(f"{name}, expert parallel 8, rank 0 alone (collectives local: compute only), "
          f"{args.dtype}, {device}: {held / 1e9:.1f} GB of weights (built in {build:.0f} s); "
          f"{args.rows} rows x canvas {args.canvas}, head on {args.gen}: "
          f"{1000 * statistics.median(times):.1f} ms per call (median of {args.calls}); "
          f"peak {benchlib.peak_mib(device) / 1024:.1f} GiB")
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="llada2-mini", choices=["llada2-mini", "llada-moe-7b-a1b"])
    ap.add_argument("--reduce", type=int, default=None,
                    help="widths, experts, depth divided by K (default 8; --flash-shard: 1)")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--layers", nargs="+", default=["experts", "all"], choices=["experts", "all"])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default=None, help="default: bfloat16 on CUDA, float32 on the CPU")
    ap.add_argument("--rows", type=int, default=4)
    ap.add_argument("--canvas", type=int, default=256)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--calls", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per process (CPU)")
    ap.add_argument("--flash-shard", action="store_true")
    args = ap.parse_args()
    args.dtype = args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32")
    args.reduce = args.reduce or (1 if args.flash_shard else 8)
    if args.flash_shard:
        flash_shard(args)
        return
    torch.set_num_threads(args.threads)
    cfg = reduced_shape(args.shape, args.reduce)
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    one = random_split_model(cfg, device, dtype)
    tokens, positions = inputs(cfg, args.rows, args.canvas, args.gen, device)
    base, _, want = time_calls(one, tokens, positions, args.calls, device)
    del one
    per = ranks_run(args, cfg)
    m = cfg.moe
    print(f"{args.shape}/{args.reduce}: {cfg.n_layers} layers, hidden {cfg.d_model}, "
          f"{cfg.n_heads}/{cfg.n_kv_heads} heads, {m.n_experts} experts of {m.expert_hidden} "
          f"(top {m.top_k}), vocab {cfg.vocab_size}; {args.rows} rows x canvas {args.canvas}, "
          f"head on {args.gen}; {args.dtype}, {device}, {args.threads} thread(s) per process")
    b = statistics.median(base)
    print(f"{'ranks':<6}{'layers':<9}{'ms/call':>9}{'ratio':>8}{'bytes/rank/call':>17}  logits")
    print(f"{1:<6}{'-':<9}{1000 * b:>9.1f}{1.0:>8.2f}{0:>17}  -")
    for layers, (times, sent, got) in per.items():
        t = statistics.median(times)
        got = torch.from_numpy(got)
        print(f"{args.ranks:<6}{layers:<9}{1000 * t:>9.1f}{t / b:>8.2f}{sent:>17}  "
              f"{compare(layers, got, want)}")


if __name__ == "__main__":
    main()
