"""Small real networks for the KV-cache and batching tests (the native transformer)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from pvf_lmeval.models.diffusion_lm import DiffusionLM
from pvf_lmeval.models.transformer import BidirectionalTransformer, TransformerConfig

ARITH = Path(__file__).resolve().parents[2] / "tasks" / "arith" / "data" / "test.jsonl"


def dream_like(seed: int = 0, vocab: int = 48) -> DiffusionLM:
    """A random Dream-style network: shifted logits, GQA, q/k/v bias, a head wider than the
    decodable ids. Weights are scaled up so that its distributions are peaked (some positions
    clear the 0.9 threshold)."""
    cfg = TransformerConfig(vocab_size=vocab + 2, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2,
                            ffn_hidden=64, qkv_bias=True, rope_theta=1e6)
    net = BidirectionalTransformer(cfg)
    net.init_weights(seed)
    with torch.no_grad():
        for name, p in net.named_parameters():
            if p.dim() > 1:
                p.mul_(12.0 if name == "lm_head.weight" else 4.0)
    return DiffusionLM(net, mask_id=vocab - 1, eos_ids=(2,), pad_id=3, logit_shift=1,
                       decodable=vocab - 1, family="dream", name="dream-like")


def arith_prompts(tokenizer, n: int) -> tuple[list[list[int]], list[dict]]:
    docs = [json.loads(line) for line in ARITH.read_text().splitlines()[:n]]
    return ([tokenizer.encode(f"Question: {d['question']}\nAnswer:", add_special_tokens=False)
             for d in docs], docs)


def random_prompts(n: int, vocab: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(4, vocab - 2, (int(k),), generator=g).tolist()
            for k in torch.randint(3, 12, (n,), generator=g)]
