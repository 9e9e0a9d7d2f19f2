"""Checks of a checkpoint folder before anything is allocated for it.

:func:`load_model <pvf_lmeval.models.loader.load_model>` reads ``config.json``
(:func:`read_config_file`), the weight files' list (:func:`weight_files`: shards confined to
the folder) and their safetensors headers only (:func:`read_header`: the 8-byte length and the
JSON header, never the tensors), then :func:`check_checkpoint` compares them:

- value ranges of the config (:func:`check_config_values`): token ids are integers inside
  the vocabulary, epsilons positive, finite and below 1, lengths positive and at most
  :data:`MAX_LENGTH`, ``rope_theta`` positive and finite, numbers are numbers;
- the shape the format reads from it (:class:`TransformerConfig`): positive integer sizes,
  heads that divide the width and key/value heads that divide the heads;
- the layer count against the layer indices in the headers' names, before any module is
  built (a config claiming 10**9 layers fails here);
- every parameter of the native network, built on the ``meta`` device (no memory) from that
  shape and named in the format's own names (``from_native``), against the headers: missing,
  unexpected and misshapen weights. This needs no per-family table: a new checkpoint format is
  checked by its own name map.

Each failure is a :class:`~.formats.UnsupportedCheckpoint` with a one-line message naming
the file and the key (or weight) at fault.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import fields
from pathlib import Path

import torch

from ..files.reads import UnreadableFile, read_json
from .formats import CheckpointFormat, UnsupportedCheckpoint
from .formats.base import finite_number
from .transformer import BidirectionalTransformer, TransformerConfig

#: largest config.json / index file read, in bytes (real ones are a few KiB / a few hundred KiB)
MAX_JSON_BYTES = 16 << 20
#: largest safetensors header read, in bytes (an 8B checkpoint's shard: ~30 KiB)
MAX_HEADER_BYTES = 16 << 20
#: longest context a config may claim, in tokens
MAX_LENGTH = 1 << 24
#: the most elements one weight tensor may hold (released checkpoints: under 2^34, a 1T MoE's
#: stacked experts); sizes that multiply past it fail before the network is built on the meta
#: device, where torch's size arithmetic would overflow
MAX_WEIGHT_ELEMENTS = 1 << 48
#: config keys holding a context length
LENGTH_KEYS = ("max_sequence_length", "max_position_embeddings", "seq_length", "n_positions",
               "max_seq_len", "model_max_length")
#: token-id keys that may hold a list of ids
LIST_ID_KEYS = ("eos_token_id",)
#: bytes per element of the safetensors dtypes
DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1,
               "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}
#: the dtypes the network's weights may be stored in (cast to the run's dtype when loaded); an
#: integer tensor would be quantized weights without their scales, which the network cannot use
FLOAT_DTYPES = ("F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2")
_LAYER = re.compile(r"blocks\.(\d+)\.")


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _show(v) -> str:
    text = json.dumps(v) if isinstance(v, (int, float, str, bool, type(None))) else repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def read_json_object(path: Path, what: str) -> dict:
    """A JSON object from ``path`` (at most :data:`MAX_JSON_BYTES`), or a one-line error."""
    try:        # a regular file: a FIFO or a link to /dev/zero is refused, never read
        data = read_json(path, MAX_JSON_BYTES, what)
    except UnreadableFile as exc:
        raise UnsupportedCheckpoint(str(exc)) from None
    if not isinstance(data, dict):
        raise UnsupportedCheckpoint(f"{path}: a {what} must be a JSON object, found "
                                    f"{type(data).__name__}")
    return data


def read_config_file(path: Path) -> dict:
    """``config.json`` as a dict whose ``model_type`` is a string (one-line errors)."""
    config = read_json_object(path, "config")
    if not isinstance(config.get("model_type"), str):
        raise UnsupportedCheckpoint(f"{path}: model_type={_show(config.get('model_type'))} "
                                    f"must be a string")
    return config


def checkpoint_root(folder: Path) -> Path:
    """The folder a checkpoint's files may resolve into: ``folder`` itself, or for a snapshot
    of the Hugging Face cache (``models--owner--name/snapshots/REVISION``, whose files link to
    ``../../blobs/``) the cached repository's folder."""
    root = folder.resolve()
    repo = root.parent.parent
    if root.parent.name == "snapshots" and repo.name.startswith("models--") and (repo / "blobs").is_dir():
        return repo
    return root


def resolves_inside(folder: Path, path: Path) -> bool:
    """Whether ``path`` (symbolic links resolved) lies in :func:`checkpoint_root` of ``folder``."""
    root, target = checkpoint_root(folder), path.resolve()
    return target == root or root in target.parents


def _inside(folder: Path, name, index: Path) -> Path:
    """``folder / name`` when that stays inside ``folder`` (symbolic links resolved; see
    :func:`checkpoint_root` for the hub cache's layout)."""
    if not isinstance(name, str) or not name or "\0" in name:
        raise UnsupportedCheckpoint(f"{index}: weight_map names shard {_show(name)}, not a file "
                                    f"name")
    rel = Path(name)
    if rel.is_absolute() or ".." in rel.parts:
        raise UnsupportedCheckpoint(f"{index}: weight_map names shard {name!r} outside the "
                                    f"checkpoint folder (absolute or '..'); shards must be "
                                    f"files of {folder}")
    if not resolves_inside(folder, folder / rel):
        raise UnsupportedCheckpoint(f"{index}: shard {name!r} resolves to {(folder / rel).resolve()}, "
                                    f"outside the checkpoint folder {folder.resolve()} (a symbolic "
                                    f"link)")
    return folder / rel


def weight_files(folder: Path) -> list[Path]:
    """The folder's weight files: the shards of ``model.safetensors.index.json``, each inside
    the folder (no absolute path, no ``..``, no link leading out), or ``model.safetensors``."""
    index = folder / "model.safetensors.index.json"
    if index.exists():
        weight_map = read_json_object(index, "weight index").get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise UnsupportedCheckpoint(f"{index}: weight_map must be a non-empty object of "
                                        f"weight name -> shard file")
        shards: dict = {}        # each shard checked once: a 100B checkpoint names it 24k times
        for name in weight_map.values():
            if not (isinstance(name, str) and name in shards):
                shards[name] = _inside(folder, name, index)
        return sorted(set(shards.values()))
    single = folder / "model.safetensors"
    if single.exists():
        _inside(folder, single.name, single)
        return [single]
    raise UnsupportedCheckpoint(f"{folder}: no model.safetensors or model.safetensors.index.json")


def read_header(file: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """``{tensor name: (dtype, shape)}`` from a safetensors file's header; no tensor is read.

    The header's length must fit :data:`MAX_HEADER_BYTES` and the file; each entry needs a
    known dtype, a shape of non-negative integers and data offsets inside the file that match
    that shape."""
    if not file.is_file():
        raise UnsupportedCheckpoint(f"{file}: weight file is missing (listed in "
                                    f"model.safetensors.index.json)")
    size = file.stat().st_size
    with open(file, "rb") as f:
        raw = f.read(8)
        if len(raw) < 8:
            raise UnsupportedCheckpoint(f"{file}: not a readable safetensors file ({size} bytes, "
                                        f"shorter than its header's length field); re-download it")
        n = int.from_bytes(raw, "little")
        if n > MAX_HEADER_BYTES or 8 + n > size:
            raise UnsupportedCheckpoint(f"{file}: not a readable safetensors file (header length "
                                        f"{n} exceeds the file's {size} bytes or "
                                        f"{MAX_HEADER_BYTES}); re-download it")
        text = f.read(n)
    try:
        header = json.loads(text.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise UnsupportedCheckpoint(f"{file}: not a readable safetensors file (header is not "
                                    f"JSON: {exc}); re-download it") from None
    if not isinstance(header, dict):
        raise UnsupportedCheckpoint(f"{file}: not a readable safetensors file (header is not a "
                                    f"JSON object); re-download it")
    data_bytes = size - 8 - n
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (start, end) = entry["dtype"], entry["shape"], entry["data_offsets"]
            ok = (dtype in DTYPE_BYTES and isinstance(shape, list) and all(_is_int(d) and d >= 0
                                                                             for d in shape)
                  and _is_int(start) and _is_int(end) and 0 <= start <= end <= data_bytes
                  and end - start == math.prod(shape) * DTYPE_BYTES[dtype])
        except (KeyError, TypeError, ValueError):
            ok = False
        if not ok:
            raise UnsupportedCheckpoint(f"{file}: header entry {name!r} is not a valid tensor "
                                        f"(dtype, shape and data offsets inside the file); "
                                        f"re-download it")
        out[name] = (dtype, tuple(shape))
    return out


#: words in the config keys a shape field is read from, whatever the format calls them, and
#: words that rule a key out: only used to name the key in an error
_FIELD_WORDS = {
    "vocab_size": (("vocab", "embedding"), ()),
    "d_model": (("d_model", "hidden_size", "n_embd", "dim", "width"), ("head", "intermediate")),
    "n_layers": (("layer",), ()),
    "n_heads": (("head",), ("kv", "key_value", "dim")),
    "n_kv_heads": (("kv_head", "key_value", "query_attention"), ()),
    "ffn_hidden": (("mlp", "intermediate", "ffn"), ()),
    "norm_eps": (("eps",), ()),
    "rope_theta": (("theta",), ()),
    "max_seq_len": (LENGTH_KEYS, ()),
    "head_size": (("head_dim",), ()),
    "block_size": (("block", "bd_size"), ()),
    "canvas_length": (("canvas",), ()),
    "sliding_window": (("window",), ()),
    "global_head_dim": (("head_dim",), ()),
    "n_experts": (("experts",), ("per_tok", "shared")),
    "expert_hidden": (("intermediate",), ("dense", "shared")),
    "top_k": (("per_tok",), ()),
    "n_groups": (("group",), ("topk",)),
    "topk_groups": (("topk_group",), ()),
}


def _keys_of(config: dict, value, field: str) -> str:
    """The config keys ``field``'s ``value`` was read from, to name in an error: the keys
    holding that value, narrowed by the field's usual key words; ``field`` when none holds it."""
    keys = [k for k, v in config.items() if type(v) is type(value) and v == value]
    words, unwords = _FIELD_WORDS.get(field, ((), ()))
    named = [k for k in keys if any(w in k for w in words) and not any(w in k for w in unwords)]
    keys = named or keys
    return "/".join(keys) if keys else field


def check_config_values(config: dict, where: str) -> None:
    """Generic value ranges of config keys, whichever format they belong to (vocabulary-free
    part: token ids are checked by :func:`check_token_ids`). A key may be a path into a nested
    object (``text_config.eos_token_id``): its last name says what it holds."""
    for key, value in config.items():
        name = key.rpartition(".")[2]
        if key.endswith("_eps") or key.endswith("epsilon"):
            if not finite_number(value) or not 0 < value < 1:
                raise UnsupportedCheckpoint(f"{where}: {key}={_show(value)} must be a finite "
                                            f"number between 0 and 1 (exclusive)")
        elif name in LENGTH_KEYS:
            if not _is_int(value) or not 1 <= value <= MAX_LENGTH:
                raise UnsupportedCheckpoint(f"{where}: {key}={_show(value)} must be an integer "
                                            f"from 1 to {MAX_LENGTH}")
        elif name == "rope_theta":
            if not finite_number(value) or value <= 0:
                raise UnsupportedCheckpoint(f"{where}: {key}={_show(value)} must be a positive "
                                            f"finite number")
        elif key.endswith("_token_id") and value is not None:
            several = name in LIST_ID_KEYS and isinstance(value, list)
            ids = value if several else [value]
            if not ids or not all(_is_int(i) and i >= 0 for i in ids):
                also = " (or a list of them)" if name in LIST_ID_KEYS else ""
                raise UnsupportedCheckpoint(f"{where}: {key}={_show(value)} must be a "
                                            f"non-negative integer token id{also}")


def _check_fields(obj, config: dict, where: str, zero_ok: tuple[str, ...] = ()) -> None:
    """Every integer field of the dataclass ``obj`` (a ``TransformerConfig`` or its
    ``MoEConfig``) a positive integer, every float field a positive finite number; an optional
    one may be None, a field of ``zero_ok`` may be 0."""
    for f in fields(obj):
        value = getattr(obj, f.name)
        kind, _, optional = str(f.type).partition(" | ")
        if (optional == "None" and value is None) or (f.name in zero_ok and value == 0
                                                      and _is_int(value)):
            continue
        key = _keys_of(config, value, f.name)
        if kind == "int":
            if not _is_int(value) or value < 1:
                raise UnsupportedCheckpoint(f"{where}: {key}={_show(value)} ({f.name}) must be a "
                                            f"positive integer")
        elif kind == "float":
            if not finite_number(value) or value <= 0:
                raise UnsupportedCheckpoint(f"{where}: {key}={_show(value)} ({f.name}) must be a "
                                            f"positive finite number")


def _check_products(cfg: TransformerConfig, config: dict, where: str) -> None:
    """The sizes of each kind of weight multiply to at most :data:`MAX_WEIGHT_ELEMENTS`."""
    d = (cfg.d_model, _keys_of(config, cfg.d_model, "d_model"))
    heads = (cfg.n_heads, _keys_of(config, cfg.n_heads, "n_heads"))
    head = (cfg.head_dim, _keys_of(config, cfg.head_size, "head_size") if cfg.head_size
            else f"{d[1]}/{heads[1]}")
    products = [[(cfg.vocab_size, _keys_of(config, cfg.vocab_size, "vocab_size")), d],
                [heads, head, d]]
    g = cfg.global_attention
    if g is not None:
        products.append([heads, (g.head_dim, _keys_of(config, g.head_dim, "global_head_dim")),
                         d])
    if cfg.has_dense_layer:
        products.append([(cfg.ffn_hidden, _keys_of(config, cfg.ffn_hidden, "ffn_hidden")), d])
    m = cfg.moe
    if m is not None:
        products += [[(m.n_experts, _keys_of(config, m.n_experts, "n_experts")),
                      (m.expert_hidden, _keys_of(config, m.expert_hidden, "expert_hidden")), d],
                     [(m.shared_hidden, _keys_of(config, m.shared_hidden, "shared_hidden")), d]]
    for factors in products:
        n = math.prod(size for size, _ in factors)
        if n > MAX_WEIGHT_ELEMENTS:
            names = " x ".join(name for _, name in factors)
            raise UnsupportedCheckpoint(f"{where}: {names} = {n} exceeds 2^48 elements, more than "
                                        f"one weight tensor may hold")


def check_shape(cfg: TransformerConfig, config: dict, where: str) -> None:
    """The network shape read from the config: positive integer sizes (``ffn_hidden`` may be 0
    when every layer is routed, a shared expert's width 0 when there is none), finite positive
    floats, the routed experts' counts and the global layers' attention likewise, a block, a
    canvas and a sliding window no longer than the longest context, products of sizes within
    :data:`MAX_WEIGHT_ELEMENTS`, heads dividing the width, key/value heads dividing the heads,
    an even head width."""
    _check_fields(cfg, config, where, zero_ok=() if cfg.has_dense_layer else ("ffn_hidden",))
    for part in (cfg.moe, cfg.global_attention):
        if part is not None:
            _check_fields(part, config, where, zero_ok=("shared_hidden",))
    for name, value in (("max_seq_len", cfg.max_seq_len), ("block_size", cfg.block_size),
                        ("canvas_length", cfg.canvas_length),
                        ("sliding_window", cfg.sliding_window)):
        if value is not None and value > MAX_LENGTH:
            raise UnsupportedCheckpoint(f"{where}: {_keys_of(config, value, name)}={value} "
                                        f"exceeds {MAX_LENGTH} tokens")
    _check_products(cfg, config, where)
    if cfg.d_model % cfg.n_heads:
        raise UnsupportedCheckpoint(
            f"{where}: {_keys_of(config, cfg.n_heads, 'n_heads')}={cfg.n_heads} attention heads "
            f"do not divide the width {_keys_of(config, cfg.d_model, 'd_model')}={cfg.d_model}")
    if cfg.n_kv_heads > cfg.n_heads or cfg.n_heads % cfg.n_kv_heads:
        raise UnsupportedCheckpoint(
            f"{where}: {_keys_of(config, cfg.n_kv_heads, 'n_kv_heads')}={cfg.n_kv_heads} "
            f"key/value heads do not divide the {cfg.n_heads} attention heads")
    if cfg.head_dim % 2:
        width = (f"{_keys_of(config, cfg.head_size, 'head_size')}={cfg.head_size} (head width)"
                 if cfg.head_size else f"head width {cfg.d_model}/{cfg.n_heads} = {cfg.head_dim}")
        raise UnsupportedCheckpoint(f"{where}: {width} is odd; rotary embeddings need it even")


def check_token_ids(ids: dict, vocab_size: int, where: str) -> None:
    """``{name: id or ids}`` (the special ids in use) inside ``[0, vocab_size)``."""
    for name, value in ids.items():
        for i in (value if isinstance(value, (list, tuple)) else [value]):
            if i is None:
                continue
            if not _is_int(i) or not 0 <= i < vocab_size:
                raise UnsupportedCheckpoint(f"{where}: {name}={_show(value)} is outside the "
                                            f"model's vocabulary of {vocab_size} embeddings "
                                            f"(ids 0..{vocab_size - 1})")


def _layer_indices(native_names) -> set[int]:
    return {int(m.group(1)) for n in native_names if (m := _LAYER.match(n))}


def check_checkpoint(folder: Path, config: dict, fmt: CheckpointFormat,
                     cfg: TransformerConfig) -> list[Path]:
    """Everything of the module docstring; returns the weight files (headers read, valid)."""
    where = str(folder / "config.json")
    values = fmt.values(config)          # a nested text_config read as one flat dict
    check_config_values(values, where)
    check_shape(cfg, values, where)
    for key in ("mask_token_id", "eos_token_id", "pad_token_id", "bos_token_id"):
        if key in values:
            check_token_ids({key: values[key]}, cfg.vocab_size, where)
    files = weight_files(folder)
    # (native parameter, expert index or None) -> file, name, shape: an expert's tensor fills
    # one slice of a parameter stacked over experts
    found: dict[tuple[str, int | None], tuple[Path, str, tuple[int, ...]]] = {}
    tied = fmt.ties_head(config)
    for file in files:
        for name, (dtype, shape) in read_header(file).items():
            slot = fmt.slot(name)
            if slot is None:
                if name.endswith("rotary_emb.inv_freq") or fmt.ignores(name):
                    continue
                raise UnsupportedCheckpoint(f"{file}: unexpected weight {name!r} for "
                                            f"model_type={fmt.model_type}")
            if dtype not in FLOAT_DTYPES:
                raise UnsupportedCheckpoint(f"{file}: weight {name!r} is stored as {dtype}; the "
                                            f"network takes floating-point weights "
                                            f"({', '.join(FLOAT_DTYPES)}), not quantized ones")
            if slot[0] == "lm_head.weight" and tied:
                raise UnsupportedCheckpoint(
                    f"{file}: has a separate head weight {name!r} but config.json says "
                    f"{fmt.tie_flag}={'true' if fmt.tie_flag in config else 'absent (true)'}; "
                    f"set {fmt.tie_flag} to false")
            if slot in found:
                raise UnsupportedCheckpoint(f"{file}: weight {name!r} is also in "
                                            f"{found[slot][0]}")
            found[slot] = (file, name, shape)
    layers = _layer_indices(native for native, _ in found)
    consecutive = not layers or max(layers) == len(layers) - 1
    if len(layers) != cfg.n_layers or not consecutive:   # never range(n_layers): it may be 10**9
        key = _keys_of(config, cfg.n_layers, "n_layers")
        held = f"layers {min(layers)}..{max(layers)}" if layers else "no layer"
        gaps = "" if consecutive else " (not consecutive from 0)"
        raise UnsupportedCheckpoint(f"{where}: {key}={cfg.n_layers} but the weights hold "
                                    f"{held} ({len(layers)} layers{gaps})")
    experts_held: dict[str, set[int]] = {}
    for native, e in found:
        if e is not None:
            experts_held.setdefault(native, set()).add(e)
    with torch.device("meta"):
        net = BidirectionalTransformer(cfg)
    expected: dict[tuple[str, int | None], tuple[int, ...]] = {}
    for native, param in net.state_dict().items():
        shape = tuple(param.shape)
        if not fmt.stacked(native):
            expected[(native, None)] = shape
            continue
        held = experts_held.get(native, set())
        if len(held) != shape[0]:        # before iterating over experts: it may be 10**9
            if len(held) < shape[0] <= len(held) + 64:
                lacking = sorted(set(range(shape[0])) - held)
                raise UnsupportedCheckpoint(f"{folder}: the checkpoint lacks expert(s) {lacking} of "
                                            f"{fmt.checkpoint_name(native, lacking[0])!r}")
            raise UnsupportedCheckpoint(f"{where}: {shape[0]} experts, but the weights hold "
                                        f"{len(held)} for {native!r}")
        expected.update({(native, e): shape[1:] for e in range(shape[0])})
    if tied:
        expected.pop(("lm_head.weight", None), None)
    for slot, shape in expected.items():
        if slot not in found:
            raise UnsupportedCheckpoint(f"{folder}: the weights lack "
                                        f"{fmt.checkpoint_name(*slot)!r}, which {where} "
                                        f"implies (shape {list(shape)})")
        file, name, got = found[slot]
        if got != shape:
            raise UnsupportedCheckpoint(f"{file}: weight {name!r} has shape {list(got)}, but "
                                        f"{where} implies {list(shape)}")
    extra = sorted(set(found) - set(expected), key=str)
    if extra:
        file, name, _ = found[extra[0]]
        raise UnsupportedCheckpoint(f"{file}: weight {name!r} is not part of the network "
                                    f"{where} describes")
    return files

