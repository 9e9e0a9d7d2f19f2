"""Checkpoint folders of published shapes whose safetensors files are headers only: each file's
header is real (names, dtypes, shapes, data offsets), its data a hole (a sparse file: the size
a 100B-parameter checkpoint has, none of the bytes). For what reads headers alone
(``pvf-dlm memory``); reading a tensor would give zeros."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path


#: bytes per element of the dtypes written
WIDTH = {"BF16": 2, "F32": 4}


def shapes_of(weights_fn, cfg: dict) -> dict[str, tuple[int, ...]]:
    """The tensor shapes a folder builder's weight function (``helpers.moe_folders``,
    ``helpers.qwen_folders``, ``helpers.gemma_folders``) gives for ``cfg``: the function runs
    with the random tensors of its module and of the builders it calls (qwen_folders uses
    moe_folders' expert weights) replaced by their shapes (nothing allocated, no random draw)."""
    import sys
    from contextlib import ExitStack
    from unittest import mock

    from helpers import gemma_folders, moe_folders, qwen_folders

    modules = {sys.modules[weights_fn.__module__], moe_folders, qwen_folders, gemma_folders}
    with ExitStack() as stack:
        for module in modules:
            stack.enter_context(mock.patch.object(module, "_random",
                                                  lambda shape, gen, kind: tuple(shape)))
        return weights_fn(cfg, 0)


def write_header_files(folder: Path, shapes: dict[str, tuple[int, ...]], shards: int = 4,
                       dtype: str = "BF16") -> int:
    """``shards`` safetensors files and their index in ``folder``, headers only; returns the
    bytes the tensors would take."""
    names = list(shapes)
    weight_map, total = {}, 0
    for s in range(shards):
        file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        header, offset = {}, 0
        for name in names[s * len(names) // shards:(s + 1) * len(names) // shards]:
            size = math.prod(shapes[name]) * WIDTH[dtype]
            header[name] = {"dtype": dtype, "shape": list(shapes[name]),
                            "data_offsets": [offset, offset + size]}
            offset += size
            weight_map[name] = file
        text = json.dumps(header).encode()
        text += b" " * (-len(text) % 8)
        path = folder / file
        path.write_bytes(len(text).to_bytes(8, "little") + text)
        os.truncate(path, 8 + len(text) + offset)          # a hole: no data written
        total += offset
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": weight_map}))
    return total
