"""What the ranks of ``tests/test_parallel.py`` run (``helpers.ranks.RankPool`` jobs), and the
same computations for the one-process reference.

Each rank keeps the models it loaded (per folder and layout) for the jobs that follow; a job
returns plain data (tensors, decode results).
"""

from __future__ import annotations

import ctypes
import os

import torch

from pvf_lmeval.decoding import decode_batch
from pvf_lmeval.models import load_model
from pvf_lmeval.tensors.shadow import Shadow

_MODELS: dict = {}


def comm():
    """The tensor-parallel group of every rank of the pool."""
    import torch.distributed as dist

    from pvf_lmeval.models.parallel import Comm

    return Comm(dist.group.WORLD, dist.get_world_size(), dist.get_rank())


def model(folder: str, layers: str | None):
    """The model of ``folder``: split over the pool's ranks (``layers``), or whole (None)."""
    key = (folder, layers)
    if key not in _MODELS:
        if layers is None:
            m = load_model(folder, device="cpu", dtype="float32")
        else:
            m = load_model(folder, device="cpu", dtype="float32", comm=comm(),
                           parallel_layers=layers)
            m.check_ranks = True
        _MODELS[key] = m
    return _MODELS[key]


def calls(vocab: int, canvas: int = 40, rows: int = 3, seed: int = 0) -> list[tuple]:
    """Model calls of every kind but cached ones: (tokens, positions, attention mask) with
    positions [P] and [N, P], with and without left padding."""
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab - 1, (rows, canvas), generator=gen)
    mask = torch.ones(rows, canvas, dtype=torch.long)
    mask[1, :5] = 0
    per_row = torch.stack([torch.randperm(canvas, generator=gen)[:6] for _ in range(rows)])
    return [(tokens, torch.arange(canvas // 2, canvas), None),
            (tokens, per_row, None), (tokens, torch.arange(canvas), mask)]


def logits(folder: str, layers: str | None, shadow: bool = False) -> list[torch.Tensor]:
    """The logits of every call of :func:`calls`; with ``shadow``, each call with a shadow of
    8 rows at columns 20, 24 and 16 of its three rows."""
    m = model(folder, layers)
    extra = {"shadow": Shadow(torch.tensor([20, 24, 16]), 8)} if shadow else {}
    return [m.logits(t, p, attention_mask=a, **extra) for t, p, a in calls(m.vocab_size)]


def decodes(folder: str, layers: str | None, cases: list[tuple[str, dict]],
            prompts: list[list[int]], batch_sizes=(len,)) -> list[list]:
    """Per case (decoder, parameters): every prompt's decode result, in batches of each of
    ``batch_sizes`` (an int, or ``len``: all prompts in one batch), one list per batch size."""
    m = model(folder, layers)
    out = []
    for decoder, kw in cases:
        for bs in batch_sizes:
            size = bs(prompts) if callable(bs) else bs
            got = []
            for a in range(0, len(prompts), size):
                got += decode_batch(m, prompts[a:a + size], decoder,
                                    request_indices=list(range(a, min(a + size, len(prompts)))),
                                    **kw)
            out.append(got)
    return out


def parameters(folder: str, layers: str | None, names) -> dict[str, torch.Tensor]:
    """The named parameters of the model as this process holds them."""
    state = model(folder, layers).net.state_dict()
    return {n: state[n] for n in names}


def probe_alone(folder: str, layers: str) -> tuple[bool, bool]:
    """batch_size=auto's probe on rank 0 only (rank 1 computes nothing: a collective would wait
    for ever), then the ranks' agreement on rank 0 fitting and rank 1 not."""
    import torch.distributed as dist

    from pvf_lmeval.lmeval.auto_batch import on_every_rank, probe

    m = model(folder, layers)
    alone = probe(m, 3, 40, 20) if dist.get_rank() == 0 else True
    return alone, on_every_rank(m.comm, dist.get_rank() == 0, "cpu")


def row_split_product(n: int, k: int, m: int) -> torch.Tensor:
    """``parallel.row_parallel`` of a seeded x [n, k] and weight [m, k] with a bias: this rank
    multiplies its span of k, the ranks' partials are summed, the bias added once."""
    import torch.distributed as dist

    from pvf_lmeval.models.parallel import row_parallel, span

    gen = torch.Generator().manual_seed(7)
    x, w, b = (torch.randn(n, k, generator=gen), torch.randn(m, k, generator=gen),
               torch.randn(m, generator=gen))
    lo, hi = span(k, dist.get_world_size(), dist.get_rank())
    return row_parallel(x[:, lo:hi], w[:, lo:hi], b, comm())


def compare_values(per_rank: list) -> str:
    """``Ranks.same_on_every_rank`` of this rank's entry of ``per_rank``."""
    import torch.distributed as dist

    from pvf_lmeval.lmeval.parallel import ParallelArgs, Ranks

    ranks = Ranks(ParallelArgs(tp=2, world=2), "cpu")
    ranks.comm = comm()
    try:
        ranks.same_on_every_rank("the committed tokens", per_rank[dist.get_rank()])
    except Exception as exc:          # noqa: BLE001  (the message is what the test checks)
        return f"{type(exc).__name__}: {exc}"
    return "same"


def diverge(folder: str, layers: str, what: str = "tokens") -> str:
    """Rank 1 calls the model with other tokens than rank 0 (``what="shadow"``: the same tokens
    with a shadow of other start columns): the call check must stop both."""
    import torch.distributed as dist

    m = model(folder, layers)
    tokens, positions, _ = calls(m.vocab_size)[0]
    other = dist.get_rank() == 1
    extra = {}
    if what == "shadow":
        extra["shadow"] = Shadow(torch.tensor([20, 24 + other, 16]), 8)
    elif other:
        tokens = tokens.clone()
        tokens[0, 0] += 1
    try:
        m.logits(tokens, positions, **extra)
    except Exception as exc:          # noqa: BLE001  (the message is what the test checks)
        return f"{type(exc).__name__}: {exc}"
    return "no error"


def peak_while_loading(folder: str, layers: str | None) -> dict:
    """Bytes: the process's peak resident memory while loading ``folder`` above what it held
    before (Linux: freed memory handed back by ``malloc_trim``, then VmHWM reset through
    /proc/self/clear_refs), and the bytes of the weights it then holds."""
    _MODELS.clear()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = _status("VmRSS")
    m = model(folder, layers)
    peak = _status("VmHWM")
    held = sum(t.numel() * t.element_size() for t in m.net.state_dict().values())
    _MODELS.clear()
    return {"peak": peak - before, "held": held}


def _status(field: str) -> int:
    with open(f"/proc/{os.getpid()}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)



def canvas_logits(folder: str, layers: str | None) -> torch.Tensor:
    """Logits of a uniform-state model (DiffusionGemma: context + canvas, the canvas its last
    ``canvas_length`` columns) with a left-padded context and self-conditioning."""
    m = model(folder, layers)
    c = m.canvas_length
    gen = torch.Generator().manual_seed(4)
    tokens = torch.randint(4, m.vocab_size, (3, 9 + c), generator=gen)
    mask = torch.ones_like(tokens)
    mask[1, :4] = 0
    sc = 3 * torch.randn(3, c, m.vocab_size, generator=gen)
    return m.logits(tokens, torch.arange(9, 9 + c), attention_mask=mask, self_conditioning=sc)
