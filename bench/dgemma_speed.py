"""DiffusionGemma at its published shape, random weights: the time of one denoising call (the
model: context + canvas, with self-conditioning) and of one sampler round of ``decoder=renoise``
(the call, the sample over the vocabulary, the entropy-bound acceptance, the re-noise draws and
the loop around them), at batch 1 and 16.

    python bench/dgemma_speed.py --device cuda                 # 26B-A4B as published, bfloat16
    python bench/dgemma_speed.py --device cpu --reduce 32      # every width divided (the --tiny run)
    python bench/dgemma_speed.py --device cpu --reduce 32 --cache-prefix   # also cache=prefix

The shape is google/diffusiongemma-26B-A4B-it's config.json (:data:`PUBLISHED`: 30 layers of 5
sliding-window then 1 global attention, 128 experts of 704 with top 8 beside a dense MLP of 2112,
hidden 2816, vocabulary 262144, canvas 256), read by the package's own DiffusionGemma format;
``--reduce K`` divides the vocabulary, widths, expert count and canvas by K and keeps one
period of the layer pattern (5 sliding + 1 global). Weights: seeded normal(0, 0.02), norms 1
(benchlib.random_split_model). Prints one JSON line per batch size: ms per call (mean of
``--calls`` after one warm-up), ms per sampler round (a decode of one canvas, ``--steps``
denoising rounds, divided by its rounds), the sampler's share of the round, and the peak memory;
with ``--cache-prefix`` also the round with ``cache=prefix`` (the context's keys computed by the
canvas's first call, every further call computing the canvas only) and its speed-up.
A batch size that does not fit prints its out-of-memory error and the next one runs.
"""

from __future__ import annotations

import argparse
import copy
import json
import time

import torch
from benchlib import (DIFFUSION_GEMMA, DiffusionLM, decode_batch, peak_mib, random_split_model,
                      reset_peak, sync)

SLIDING, FULL = "sliding_attention", "full_attention"
#: google/diffusiongemma-26B-A4B-it's config.json (the keys that shape the network)
PUBLISHED = {
    "architectures": ["DiffusionGemmaForBlockDiffusion"], "model_type": "diffusion_gemma",
    "canvas_length": 256, "eos_token_id": [1, 106], "tie_word_embeddings": True,
    "text_config": {
        "model_type": "diffusion_gemma_text", "vocab_size": 262144, "hidden_size": 2816,
        "intermediate_size": 2112, "num_hidden_layers": 30, "num_attention_heads": 16,
        "num_key_value_heads": 8, "head_dim": 256, "global_head_dim": 512,
        "num_global_key_value_heads": 2, "num_experts": 128, "top_k_experts": 8,
        "moe_intermediate_size": 704, "sliding_window": 1024, "max_position_embeddings": 262144,
        "layer_types": ([SLIDING] * 5 + [FULL]) * 5, "hidden_activation": "gelu_pytorch_tanh",
        "rms_norm_eps": 1e-06, "final_logit_softcapping": 30.0,
        "rope_parameters": {
            FULL: {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0,
                   "rope_type": "proportional"},
            SLIDING: {"rope_theta": 10000.0, "rope_type": "default"}},
        "use_bidirectional_attention": "vision", "attention_bias": False,
        "pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 2, "tie_word_embeddings": True},
}


def shape(reduce: int) -> dict:
    """The published config.json, or with its sizes divided by ``reduce`` (module docstring)."""
    cfg = copy.deepcopy(PUBLISHED)
    if reduce == 1:
        return cfg
    t = cfg["text_config"]
    for key in ("vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size",
                "num_experts"):
        t[key] = max(t[key] // reduce, 8)
    t.update(num_hidden_layers=6, layer_types=[SLIDING] * 5 + [FULL],
             top_k_experts=min(t["top_k_experts"], t["num_experts"]),
             head_dim=max(t["head_dim"] // reduce, 16),
             global_head_dim=max(t["global_head_dim"] // reduce, 32),
             num_attention_heads=4, num_key_value_heads=2, num_global_key_value_heads=1,
             sliding_window=max(t["sliding_window"] // reduce, 4))
    cfg["canvas_length"] = max(cfg["canvas_length"] // reduce, 8)
    return cfg


def random_dgemma(cfg: dict, device, dtype) -> DiffusionLM:
    """The network of config.json ``cfg`` with seeded random weights, as a uniform-state model."""
    net = random_split_model(DIFFUSION_GEMMA.read_config(cfg), device, dtype).net
    return DiffusionLM(net, mask_id=None, eos_ids=(1, 106), pad_id=0, logit_shift=0,
                       decodable=net.cfg.vocab_size, family="diffusion_gemma",
                       name="random diffusiongemma")


def per_call(model, batch: int, prompt: int, calls: int, device) -> float:
    """ms of one denoising call at ``batch`` rows (context ``prompt`` + the canvas, with a
    self-conditioning input), the mean of ``calls`` after one warm-up."""
    c, v = model.canvas_length, model.vocab_size
    g = torch.Generator(device=device).manual_seed(0)
    tokens = torch.randint(3, v, (batch, prompt + c), generator=g, device=device)
    positions = torch.arange(prompt, prompt + c, device=device)
    sc = model.logits(tokens, positions)                      # warm-up, and the carry
    sync(device)
    t0 = time.perf_counter()
    for _ in range(calls):
        out = model.logits(tokens, positions, self_conditioning=sc)
    sync(device)
    del out
    return (time.perf_counter() - t0) / calls * 1e3


def per_round(model, batch: int, prompt: int, steps: int, device, cache: str = "none"
              ) -> tuple[float, int]:
    """(ms per sampler round, rounds) of ``decoder=renoise`` decoding one canvas for ``batch``
    requests, every canvas run for ``steps`` rounds (the stop rule's confidence at 0), with
    KV cache ``cache``."""
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, model.vocab_size, (prompt,), generator=g).tolist()
               for _ in range(batch)]
    kw = dict(gen_length=model.canvas_length, max_denoising_steps=steps,
              confidence_threshold=0.0, cache=cache)
    decode_batch(model, prompts, "renoise", **dict(kw, max_denoising_steps=1))    # warm-up
    sync(device)
    t0 = time.perf_counter()
    out = decode_batch(model, prompts, "renoise", **kw)
    sync(device)
    return (time.perf_counter() - t0) / steps * 1e3, max(r.nfe for r in out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default=None, help="default: bfloat16 on CUDA, float32 on a CPU")
    ap.add_argument("--reduce", type=int, default=1, help="sizes divided by K (1: as published)")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--prompt", type=int, default=256, help="context tokens before the canvas")
    ap.add_argument("--calls", type=int, default=3)
    ap.add_argument("--steps", type=int, default=4, help="sampler rounds timed per batch size")
    ap.add_argument("--cache-prefix", action="store_true",
                    help="also time the sampler round with cache=prefix")
    args = ap.parse_args()
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    t0 = time.perf_counter()
    model = random_dgemma(shape(args.reduce), device, dtype)
    name = "diffusiongemma-26b-a4b" + (f"/{args.reduce}" if args.reduce > 1 else "")
    params = sum(p.numel() for p in model.net.parameters())
    print(json.dumps({"shape": name, "dtype": str(dtype).split(".")[-1], "params": params,
                      "canvas": model.canvas_length, "build_s": round(time.perf_counter() - t0, 1),
                      "device": torch.cuda.get_device_name(device) if device.type == "cuda"
                      else "cpu"}), flush=True)
    for batch in args.batch_sizes:
        reset_peak(device)
        try:
            call_ms = per_call(model, batch, args.prompt, args.calls, device)
            round_ms, rounds = per_round(model, batch, args.prompt, args.steps, device)
            prefix = {}
            if args.cache_prefix:
                ms = per_round(model, batch, args.prompt, args.steps, device, "prefix")[0]
                prefix = {"ms_per_round_prefix": round(ms, 2),
                          "prefix_speedup": round(round_ms / ms, 2)}
        except torch.OutOfMemoryError as e:
            print(json.dumps({"shape": name, "batch": batch,
                              "error": str(e).splitlines()[0]}), flush=True)
            torch.cuda.empty_cache()
            continue
        print(json.dumps({"shape": name, "batch": batch, "prompt": args.prompt,
                          "ms_per_call": round(call_ms, 2), "ms_per_round": round(round_ms, 2),
                          "sampler_share": round(1 - call_ms / round_ms, 3), "rounds": rounds,
                          **prefix,
                          "peak_mib": round(peak_mib(device))}), flush=True)


if __name__ == "__main__":
    main()
