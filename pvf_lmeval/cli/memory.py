"""``pvf-dlm memory pretrained=PATH,tensor_parallel_size=N,batch_size=B,gen_length=L``: the
weights and KV cache each rank holds, from ``config.json`` and the safetensors headers alone
(``models.footprint``; no weight is read).

Keys (``--model_args`` spelling): ``pretrained`` (a checkpoint folder or a bundled name),
``tensor_parallel_size`` (alias ``tp_size``, default 1), ``parallel_layers`` (all | experts),
``dtype`` (auto = bfloat16, as on a GPU; float32; float16), ``batch_size`` (requests decoded
together, default 1), ``gen_length`` and ``prompt_length`` (the KV cache's tokens per request,
default 0 each, at most the decoders' 2^24 positions; on a uniform-state model the cache holds
the context of the last canvas, ``prompt_length + gen_length - canvas_length``, and
``gen_length`` is a multiple of the canvas: ``footprint.kv_tokens``).

The folder passes the loader's checks (its config against its safetensors headers) and the
layout ``Shard.plan``'s (at most as many ranks as the model can split) before anything is
counted; every failure is one line.
"""

from __future__ import annotations

from pathlib import Path

from ..models.parallel import LAYERS

KEYS = ("pretrained", "tensor_parallel_size", "tp_size", "parallel_layers", "dtype",
        "batch_size", "gen_length", "prompt_length")
DTYPES = ("auto", "bfloat16", "float16", "float32")
GB = 1e9


class MemoryArgError(ValueError):
    """A bad ``pvf-dlm memory`` argument (a one-line message)."""


def _count(name: str, value: str, low: int) -> int:
    if not value.strip().isdigit() or int(value) < low:
        kind = "a positive integer" if low else "an integer >= 0"
        raise MemoryArgError(f"{name}={value!r} must be {kind}")
    return int(value)


def _positions(name: str, value: str) -> int:
    """A token count: an integer from 0 to the decoders' cap on positions."""
    from ..decoding.param_spec import POSITIONS

    n = _count(name, value, 0)
    if n > POSITIONS.limit:
        raise MemoryArgError(f"{name}={value!r} must be at most {POSITIONS.limit}{POSITIONS.why}")
    return n


def parse(text: str) -> dict:
    """``key=value,...`` -> the checked arguments of :func:`report`."""
    args = {}
    for item in filter(None, (s.strip() for s in text.split(","))):
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or key not in KEYS:
            raise MemoryArgError(f"{item!r}: expected key=value with a key among "
                                 f"{', '.join(KEYS)}")
        args["tensor_parallel_size" if key == "tp_size" else key] = value.strip()
    if "pretrained" not in args:
        raise MemoryArgError("pretrained=PATH is required (a checkpoint folder)")
    dtype = args.get("dtype", "auto")
    if dtype not in DTYPES:
        raise MemoryArgError(f"dtype={dtype!r} must be one of {', '.join(DTYPES)}")
    layers = args.get("parallel_layers", "all")
    if layers not in LAYERS:
        raise MemoryArgError(f"parallel_layers={layers!r} must be one of {', '.join(LAYERS)}")
    return {"pretrained": args["pretrained"],
            "size": _count("tensor_parallel_size", args.get("tensor_parallel_size", "1"), 1),
            "layers": layers, "dtype": "bfloat16" if dtype == "auto" else dtype,
            "batch_size": _count("batch_size", args.get("batch_size", "1"), 1),
            "gen_length": _positions("gen_length", args.get("gen_length", "0")),
            "prompt_length": _positions("prompt_length", args.get("prompt_length", "0"))}


def _folder(name: str) -> Path:
    from ..models.loader import BUNDLED, FIXTURES_DIR

    if name in BUNDLED:
        return FIXTURES_DIR / name
    path = Path(name).expanduser()
    if not (path / "config.json").is_file():
        raise MemoryArgError(f"pretrained={name!r}: not a checkpoint folder with a config.json "
                             f"(pvf-dlm memory reads local folders only)")
    return path


def _uncached(tokens: int, prompt: int, gen: int) -> str:
    """The positions the cache does not cover, in words (a uniform-state model's last canvas)."""
    return f" - the last canvas {prompt + gen - tokens}" if tokens < prompt + gen else ""


def report(args: dict) -> str:
    """The table ``pvf-dlm memory`` prints."""
    import torch

    from ..models.footprint import footprint

    folder = _folder(args["pretrained"])
    prompt, gen = args["prompt_length"], args["gen_length"]
    fp = footprint(folder, args["size"], args["layers"], getattr(torch, args["dtype"]),
                   args["batch_size"], prompt, gen)
    rows = [("routed experts", fp.experts), ("other weights", fp.other),
            ("weights", fp.weights), ("KV cache", fp.kv_cache),
            ("total", fp.weights + fp.kv_cache)]
    lines = [f"pvf-dlm memory: {folder} ({fp.model_type}), tensor_parallel_size={fp.size}, "
             f"parallel_layers={fp.layers}, {args['dtype']}",
             *(f"note: {n}" for n in fp.notes),
             f"{'per rank':<16}{'GB':>9}{'bytes':>16}"]
    lines += [f"  {name:<14}{value / GB:>9.2f}{value:>16}" for name, value in rows]
    lines += [f"KV cache: batch_size={args['batch_size']} x {fp.kv_tokens} tokens (prompt_length "
              f"{prompt} + gen_length {gen}{_uncached(fp.kv_tokens, prompt, gen)}): "
              f"{fp.kv_covers}; activations are not included",
              f"whole model: {fp.whole / GB:.2f} GB of weights"]
    return "\n".join(lines) + "\n"
