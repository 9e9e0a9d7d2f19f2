"""Will it fit: the bytes a rank holds for a checkpoint folder, from ``config.json`` and the
safetensors headers alone (no tensor is read).

Weights per rank are what the loader reads under the same :class:`.parallel.Shard` plan (each
header's shape through :meth:`Shard.part`), at the dtype the run uses; the KV cache per rank is
``2 (keys, values) x the sum over layers of the rank's key/value heads x their head_dim x the
positions the layer keeps x requests x bytes`` (a request's branches share its cache), the
positions being the prompt and the generation (``cache=prefix|dual``), or on a uniform-state
model (DiffusionGemma) its context, the prompt and every canvas but the last, which
``cache=prefix`` keeps (``decoding.cache.ContextKV``): every position, or on a sliding-window
layer the last ``sliding_window - 1`` (the keys a canvas query sees), as transformers'
``DynamicSlidingWindowLayer`` keeps them between calls. Activations are not estimated.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch

from .parallel import Shard, stacked_experts
from .validation import read_header

_LAYER = re.compile(r"^blocks\.\d+\.")


@dataclass(frozen=True)
class Footprint:
    """Bytes on each rank (the largest rank's, when the ranks differ)."""

    model_type: str
    size: int
    layers: str
    dtype: torch.dtype
    experts: int             # routed experts' weights
    other: int               # every other weight
    kv_cache: int
    kv_tokens: int           # the positions per request the cache covers (:func:`kv_tokens`)
    kv_covers: str           # what ``kv_cache`` counts, in words (:func:`kv_covers`)
    whole: int               # the whole model's weights at ``dtype``
    notes: tuple[str, ...]

    @property
    def weights(self) -> int:
        return self.experts + self.other


def kv_elements(cfg, shard: Shard, tokens: int) -> int:
    """Key (or value) elements one request's cache of ``tokens`` positions holds on ``shard``'s
    rank: per layer its key/value heads (split when attention is) times their width times the
    positions it keeps (every one; on a sliding-window layer at most ``sliding_window - 1``)."""
    def per_layer(i: int) -> int:
        a, window = cfg.attention_of(i), cfg.window_of(i)
        kept = tokens if window is None else min(tokens, window - 1)
        return shard.width(a.n_kv_heads, shard.attention) * a.head_dim * kept
    if cfg.global_layers is None:
        return cfg.n_layers * per_layer(0)
    return sum(per_layer(i) for i in range(cfg.n_layers))


def kv_tokens(cfg, prompt_length: int, gen_length: int) -> int:
    """The positions one request's cache covers when ``gen_length`` tokens follow a prompt of
    ``prompt_length``: all of them, or on a uniform-state network (``canvas_length``) the
    context of its last canvas, ``prompt_length + gen_length - canvas_length`` (the prompt
    alone at ``gen_length`` 0). A uniform-state network decodes whole canvases: another
    ``gen_length`` is a one-line ValueError."""
    canvas = cfg.canvas_length
    if canvas is None:
        return prompt_length + gen_length
    if gen_length % canvas:
        raise ValueError(f"gen_length={gen_length} must be a multiple of the canvas, "
                         f"canvas_length {canvas} (its decoders denoise whole canvases)")
    return prompt_length + max(gen_length - canvas, 0)


def kv_covers(cfg) -> str:
    """What :func:`kv_elements` counts for network ``cfg``, in words."""
    if cfg.canvas_length is None:
        return "every layer's keys and values at every position, as cache=prefix or dual hold them"
    sliding = sum(cfg.window_of(i) is not None for i in range(cfg.n_layers))
    full = cfg.n_layers - sliding
    kept = [f"{full} global layer{'s' * (full > 1)}: every position"] * (full > 0)
    if sliding:
        kept.append(f"{sliding} sliding-window layer{'s' * (sliding > 1)}: the last "
                    f"{cfg.sliding_window - 1}, sliding_window - 1")
    return (f"the context's keys and values (the prompt and every canvas but the last) as "
            f"cache=prefix keeps them, as transformers' DynamicCache holds them between calls "
            f"({'; '.join(kept)})")


def footprint(folder: Path, size: int = 1, layers: str = "all", dtype=torch.bfloat16,
              batch_size: int = 1, prompt_length: int = 0, gen_length: int = 0) -> Footprint:
    """The :class:`Footprint` of ``folder`` split over ``size`` ranks (``layers``: see
    ``parallel``) at ``dtype``, with a KV cache for ``batch_size`` requests of
    ``prompt_length`` prompt and ``gen_length`` generated tokens each (:func:`kv_tokens`).
    The folder passes the loader's own checks first (``read_checkpoint``: the config against
    the safetensors headers), the layout ``Shard.plan``'s; errors are their one-line ones."""
    from .loader import read_checkpoint

    _, fmt, cfg, files = read_checkpoint(folder)
    shards = [Shard.plan(cfg, size, rank, layers) for rank in range(size)]   # checks first
    tokens = kv_tokens(cfg, prompt_length, gen_length)
    width = torch.empty((), dtype=dtype).element_size()
    # (native name with its layer index dropped, expert index or None, shape) -> how many: what
    # a rank reads of a tensor depends on its kind, never on its layer (``Shard.part``), so
    # each rank sums a few kinds, however many layers and ranks there are
    kinds: Counter = Counter()
    for file in files:
        for name, (_, shape) in read_header(file).items():
            found = fmt.slot(name)
            if found is not None:
                native, expert = found
                kinds[(_LAYER.sub("blocks.0.", native), expert, shape)] += 1
    whole = sum(n * math.prod(shape) for (_, _, shape), n in kinds.items()) * width
    per_rank = []
    for shard in shards:
        experts = other = 0
        for (native, expert, shape), n in kinds.items():
            read = shard.part(native, expert).shape(shape)
            if read is None:
                continue
            if expert is not None or stacked_experts(native):
                experts += n * math.prod(read) * width
            else:
                other += n * math.prod(read) * width
        per_rank.append((experts + other, experts, other, shard))
    _, experts, other, shard = max(per_rank, key=lambda r: r[0])
    kv = 2 * kv_elements(cfg, shard, tokens) * batch_size * width
    return Footprint(model_type=fmt.model_type, size=size, layers=layers, dtype=dtype,
                     experts=experts, other=other, kv_cache=kv, kv_tokens=tokens,
                     kv_covers=kv_covers(cfg), whole=whole,
                     notes=tuple(shard.notes()))
