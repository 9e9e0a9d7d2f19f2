"""Speed and memory of the mixture-of-experts families at their real shapes, random weights.

For LLaDA-MoE-7B-A1B, LLaDA2.0-mini and Qwen3-MoE-30B-A3B shapes (bf16 on CUDA, float32 on a CPU): tokens/s and peak
memory of decoding replays (``threshold`` and ``pvf`` call schedules: the calls per 512 tokens of
the PVF paper's Table 1 for LLaDA-8B-Instruct, spread evenly over the blocks; pvf's calls carry
``--pvf-width`` branch rows), cache ``dual`` and ``prefix``, batch 1 and 16 (16 requests in one
call, each with its own cache), and the expert layer's time per call against a dense SwiGLU of
the same active width (``top_k * expert_hidden + shared_hidden``) on the same rows. Random
weights decide nothing, so the schedules are replayed, not decoded; every request is counted as
producing ``--gen-length`` tokens. LLaDA2 runs with its block-causal mask (block 32).

    python bench/moe_speed.py                          # the two LLaDA shapes, on CUDA when present
    python bench/moe_speed.py --shapes qwen3-moe-30b-a3b   # RND1 / SDAR-30B-A3B's network (~61 GB bf16)
    python bench/moe_speed.py --reduce 16 --device cpu # a reduced-shape check on a CPU

Shapes: LLaDA2.0-mini's from its published config.json (hidden 2048, 20 layers, 16 heads, 4
key/value heads of 128, 256 experts of 512, top 8, 1 shared, first layer dense of 5120, 8 groups
keep 4, vocab 157184). LLaDA-MoE-7B-A1B's (hidden 2048, 16 layers, 16 heads, 64 experts of 1024,
top 8, every layer routed) are those a third-party README quotes from its config.json; its vocab
157184 is assumed. Qwen3-MoE-30B-A3B's are RND1's config class values
(hidden 2048, 48 layers, 32 heads, 4 key/value heads of 128, 128 experts of 768, top 8
renormalised, vocab 151936), as RND1-Base-30B-A3B and SDAR-30B-A3B run them; its weights alone
are about 61 GB in bfloat16, so it runs only when named (it is not in the default --shapes).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import torch

from benchlib import MLP, TransformerConfig

import benchlib
from benchlib import PAPER_CALLS_PER_512, KVCache, call_view, peak_mib, random_model, reset_peak, sync

#: the shapes of the mixture-of-experts families (``benchlib.SHAPES``)
SHAPES = ("llada-moe-7b-a1b", "llada2-mini", "qwen3-moe-30b-a3b")
#: what runs without --shapes (the GPU session's budget covers these two)
DEFAULT_SHAPES = SHAPES[:2]


def reduced(cfg: TransformerConfig, k: int) -> TransformerConfig:
    """``cfg`` with widths, vocabulary, expert count and depth divided by ``k`` (a CPU check)."""
    if k == 1:
        return cfg
    m = cfg.moe
    heads = max(2, cfg.n_heads // k)
    kv = max(1, min(heads, cfg.n_kv_heads // k or 1))
    while heads % kv:
        kv -= 1
    groups = max(1, m.n_groups // k) if m.n_groups > 1 else 1
    experts = max(2 * groups * 2, m.n_experts // k)
    experts -= experts % groups
    n_layers = max(2, cfg.n_layers // k)
    moe = dataclasses.replace(
        m, n_experts=experts, top_k=min(m.top_k, experts // 2), expert_hidden=max(8, m.expert_hidden // k),
        shared_hidden=max(8, m.shared_hidden // k) if m.shared_hidden else 0, n_groups=groups,
        topk_groups=max(1, min(m.topk_groups, groups // 2 or 1)),
        layers=None if m.layers is None else m.layers[:n_layers])
    head = (cfg.head_size or cfg.d_model // cfg.n_heads) // max(1, k // 4)
    d_model = max(32, cfg.d_model // k) if cfg.head_size else heads * head
    return dataclasses.replace(
        cfg, vocab_size=cfg.vocab_size // k, d_model=d_model, n_layers=n_layers,
        n_heads=heads, n_kv_heads=kv, ffn_hidden=cfg.ffn_hidden // k,
        head_size=head if cfg.head_size else None,
        rotary_dim=head // 2 if cfg.rotary_dim else None, moe=moe)


def replay(model, calls_per_block: list[list[int]], cache: str, batch: int, prompt_len: int,
           L: int, B: int, device) -> float:
    """Seconds for ``batch`` requests decoded together: per block, a full call then cached calls
    (``calls_per_block[b]`` = the branch widths of block b's calls)."""
    g = torch.Generator().manual_seed(1)
    V = model.vocab_size - 3
    y = torch.cat([torch.randint(4, V, (prompt_len,), generator=g),
                   torch.full((L,), model.mask_id)]).to(device)
    caches = [KVCache(cache, prompt_len=prompt_len, gen_length=L, block_length=B,
                      mask_id=model.mask_id, reveal_next=0, device=device) for _ in range(batch)]
    sync(device)
    t0 = time.perf_counter()
    for b, widths in enumerate(calls_per_block):
        s0 = prompt_len + b * B
        for i, w in enumerate(widths):
            rows = y.unsqueeze(0).expand(batch * w, -1)
            full = i == 0
            if full:
                for c in caches:
                    c.start_full(y[prompt_len:].unsqueeze(0).expand(w, -1))
                hi = min(prompt_len + L, s0 + 2 * B)
            else:
                for c in caches:
                    c.span = (s0, prompt_len + L if cache == "prefix" else s0 + B)
                hi = min(prompt_len + L, s0 + (2 * B if cache == "prefix" else B))
            view = call_view([(c, w) for c in caches], rows.shape[0])
            model.logits(rows, torch.arange(s0, hi, device=device), cache=view)
            if full:
                for c in caches:
                    c.commit(y[prompt_len:])
            k = max(1, B // len(widths))
            y[s0 + i * k: s0 + min(B, (i + 1) * k)] = 7
    sync(device)
    return time.perf_counter() - t0


def schedule(decoder: str, L: int, B: int, pvf_width: int) -> list[list[int]]:
    nb = L // B
    total = max(nb, round(PAPER_CALLS_PER_512[decoder] * L / 512))
    width = pvf_width if decoder == "pvf" else 1
    return [[width] * (total // nb + (1 if b < total % nb else 0)) for b in range(nb)]


def expert_vs_dense(model, rows: int, reps: int, device) -> tuple[float, float]:
    """Median ms per call of the first routed layer's experts and of a dense SwiGLU of the same
    active width, on ``rows`` random rows."""
    layer = next(b.mlp for b in model.net.blocks if hasattr(b.mlp, "router"))
    m = layer.cfg
    active = m.top_k * m.expert_hidden + m.shared_hidden
    cfg = model.net.cfg
    dense = MLP(cfg.d_model, active).to(device=device, dtype=model.dtype)
    x = torch.randn(1, rows, cfg.d_model, device=device, dtype=model.dtype)

    def timed(fn):
        out = []
        with torch.no_grad():
            for _ in range(reps + 1):
                sync(device)
                t0 = time.perf_counter()
                fn(x)
                sync(device)
                out.append(time.perf_counter() - t0)
        return statistics.median(out[1:]) * 1e3
    return timed(layer), timed(dense)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default=",".join(DEFAULT_SHAPES),
                    help=f"comma list of {', '.join(SHAPES)} (default: {', '.join(DEFAULT_SHAPES)})")
    ap.add_argument("--reduce", type=int, default=1, help="divide widths, experts, vocab, depth by this")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--gen-length", type=int, default=256)
    ap.add_argument("--block", type=int, default=32)
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--pvf-width", type=int, default=4)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    for name in args.shapes.split(","):
        if name not in SHAPES:
            raise SystemExit(f"--shapes: {name!r} is not one of {', '.join(SHAPES)}")
        cfg = reduced(benchlib.SHAPES[name][0], args.reduce)
        model = random_model(name, device, dtype, config=cfg)
        print(f"\n## {name}" + (f" (reduced /{args.reduce})" if args.reduce > 1 else "")
              + f" on {device} {dtype}, prompt {args.prompt_len}, gen {args.gen_length}, "
              f"block {args.block}, block-causal {model.block_size is not None}\n")
        print("| decoder | cache | batch | tokens/s | s | peak MiB |\n|---|---|---|---|---|---|")
        for dec in ("threshold", "pvf"):
            sched = schedule(dec, args.gen_length, args.block, args.pvf_width)
            for cache in ("dual", "prefix"):
                for batch in (int(b) for b in args.batches.split(",")):
                    reset_peak(device)
                    s = replay(model, sched, cache, batch, args.prompt_len, args.gen_length,
                               args.block, device)
                    tps = batch * args.gen_length / s
                    print(f"| {dec} | {cache} | {batch} | {tps:.1f} | {s:.2f} | {peak_mib(device):.0f} |")
        for rows in (args.block, 16 * (args.prompt_len + args.gen_length)):
            e, d = expert_vs_dense(model, rows, args.reps, device)
            print(f"\nexpert layer vs dense of the same active width, {rows} rows: "
                  f"{e:.2f} ms vs {d:.2f} ms ({e / d:.2f}x)")
        del model


if __name__ == "__main__":
    main()
