"""Load Hugging Face checkpoint folders (or the bundled tiny fixtures) into a ``DiffusionLM``.

``load_model("tiny-llada")``, ``load_model("/path/to/LLaDA-8B-Instruct")`` or, when the hub is
reachable, ``load_model("GSAI-ML/LLaDA-8B-Instruct")``. The real remote code is never run: the
weights are mapped onto the native network by the checkpoint format.
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path

import torch

from ..files import atomic
from .formats import CheckpointFormat, UnsupportedCheckpoint, format_for
from .batch_invariant import support_error
from .diffusion_lm import DiffusionLM
from .parallel import Shard
from .transformer import BidirectionalTransformer, TransformerConfig
from .validation import (check_checkpoint, check_token_ids, read_config_file,
                         weight_files)

log = logging.getLogger("pvf_lmeval")

FIXTURES_DIR = Path(__file__).resolve().parent.parent / "fixtures"
BUNDLED = ("tiny-llada", "tiny-dream")
#: tokens that end an answer besides the tokenizer's end of text: LLaDA's and Qwen's end of turn,
#: and DiffuCoder's ``<|dlm_pad|>`` (it fills the canvas after its answer; its reference decoding
#: cuts the text there)
END_OF_TURN_TOKENS = ("<|eot_id|>", "<|im_end|>", "<|dlm_pad|>")
#: mask tokens by name, for folders whose config.json has no mask id: LLaDA-MoE's and LLaDA 2.x's,
#: Dream's, Fast-dLLM v2's
MASK_TOKENS = ("<|mdm_mask|>", "<|mask|>", "|<MASK>|")
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
#: what a hub download fetches: configs, weights, tokenizer data; never the repository's code
HUB_PATTERNS = ("*.json", "*.safetensors", "*.txt", "*.model", "*.tiktoken", "*.jinja")
#: what a download for ``tokenizer=`` fetches: the tokenizer files only
TOKENIZER_PATTERNS = ("*.json", "*.txt", "*.model", "*.tiktoken", "*.jinja")


def resolve_device(device) -> torch.device:
    """``None``/"auto" -> CUDA when present, else CPU; anything else must be usable here."""
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={device!r} was asked for, but torch sees no CUDA GPU; use device=cpu")
    return dev


def resolve_dtype(dtype, device: torch.device) -> torch.dtype:
    """"auto" = bfloat16 on CUDA, float32 elsewhere."""
    if dtype in (None, "auto"):
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"dtype={dtype!r} is not one of auto, {', '.join(DTYPES)}")
    return DTYPES[dtype]


def _first_line(exc: BaseException) -> str:
    text = str(exc)
    return text.splitlines()[0] if text.strip() else type(exc).__name__


def looks_local(name: str) -> bool:
    """Whether ``name`` is written as a local path: absolute, ``~``, ``.``/``..`` first, or
    relative with a separator whose first component is an existing folder here (a missing
    ``checkpoints/llada-ft`` beside an existing ``checkpoints/`` is a typo, not a hub id)."""
    if name.startswith(("/", "~", "./", "../")) or name in (".", "..") or os.sep != "/" and \
            name.startswith(os.sep):
        return True
    parts = name.replace(os.sep, "/").split("/")
    return len(parts) > 1 and Path(parts[0]).is_dir()


#: the longest ``pretrained`` accepted (PATH_MAX of Linux; hub ids are far shorter)
MAX_NAME = 4096


def is_hub_id(name: str) -> bool:
    """Whether :func:`checkpoint_folder` would look ``name`` up on the hub (owner/name, not a
    bundled name, an existing folder or a name written as a local path)."""
    try:
        exists = Path(name).expanduser().exists()
    except (OSError, ValueError):
        return False
    return name not in BUNDLED and not exists and not looks_local(name) and name.count("/") == 1


def checkpoint_folder(name_or_path: str, patterns=HUB_PATTERNS, revision: str | None = None,
                      what: str = "pretrained") -> Path:
    """The local folder for a bundled name, a path, or a hub id (downloaded when the hub allows;
    ``patterns``: the files a download fetches; ``revision``: the hub's branch, tag or commit,
    None for its default, unused for a folder as in transformers). A name written as a local
    path (see :func:`looks_local`) that does not exist is an error naming it, never a download.
    ``what``: the model arg named in errors."""
    if name_or_path in BUNDLED:
        return FIXTURES_DIR / name_or_path
    if len(name_or_path) > MAX_NAME or "\0" in name_or_path:
        raise ValueError(f"{what}={name_or_path[:60]!r}... ({len(name_or_path)} characters) is "
                         f"not a checkpoint folder, hub id or bundled model name (at most "
                         f"{MAX_NAME} characters, no NUL)")
    path = Path(name_or_path).expanduser()
    try:
        is_dir, exists = path.is_dir(), path.exists()
    except OSError as exc:        # a component longer than the file system allows, ...
        raise ValueError(f"{what}={name_or_path!r}: not a usable path "
                         f"({exc.strerror or exc})") from None
    if is_dir:
        return path
    bundled = f"bundled models: {', '.join(BUNDLED)}"
    if exists:
        raise ValueError(f"{what}={name_or_path!r} is a file, not a checkpoint folder "
                         f"({bundled})")
    if looks_local(name_or_path):
        raise ValueError(f"{what}={name_or_path!r}: no such checkpoint folder (written as a "
                         f"local path, so it is not looked up on the hub; {bundled})")
    if name_or_path.count("/") != 1:
        raise ValueError(
            f"{what}={name_or_path!r} is neither a checkpoint folder, a hub id (owner/name), "
            f"nor a bundled model ({', '.join(BUNDLED)})"
        )
    at = "" if revision is None else f" at revision {revision!r}"
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(
            name_or_path,
            revision=revision,
            allow_patterns=list(patterns),
        ))
    except Exception as exc:  # offline, unknown repo, gated: say which and why in one line
        raise ValueError(f"{what}={name_or_path!r}: could not fetch from the hub{at} "
                         f"({type(exc).__name__}: {_first_line(exc)})") from None


def _weight_files(folder: Path) -> list[Path]:
    """The folder's weight files, shards confined to it (see ``validation.weight_files``)."""
    return weight_files(folder)


def _open_safetensors(file: Path):
    """``safe_open`` on ``file``, or a one-line error naming the file and what is wrong with it."""
    from safetensors import safe_open

    if not file.is_file():
        raise UnsupportedCheckpoint(f"{file}: weight file is missing (listed in "
                                    f"model.safetensors.index.json)")
    try:
        return safe_open(str(file), framework="pt", device="cpu")
    except Exception as exc:  # safetensors' own message does not say which file
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise UnsupportedCheckpoint(f"{file}: not a readable safetensors file ({why}); "
                                    f"re-download it") from None


def weights_fingerprint(folder: Path, sample: int = 1 << 20) -> str:
    """A fingerprint of a checkpoint folder's weights: SHA-256 over each weights file's name,
    size and first and last ``sample`` bytes (the whole file when it is no larger than twice
    that). It reads a few MiB of an 8B checkpoint, and any training step changes it (every tensor
    moves); it is not a content hash (files differing only in their middle bytes collide)."""
    h = hashlib.sha256()
    for file in _weight_files(folder):
        size = file.stat().st_size
        h.update(f"{file.name}\0{size}\0".encode())
        with open(file, "rb") as f:
            if size <= 2 * sample:
                h.update(f.read())
            else:
                h.update(f.read(sample))
                f.seek(size - sample)
                h.update(f.read(sample))
    return "sha256:" + h.hexdigest()


def load_native_state(folder: Path, fmt: CheckpointFormat, config: dict, dtype, device,
                      shard: Shard | None = None) -> dict:
    """Checkpoint tensors renamed to native names, cast and placed; unknown names are an error.

    ``shard`` (``parallel.Shard``; None: one process) says what this rank reads of each tensor: another rank's expert is never read, a split tensor's part is read by
    ``get_slice`` (its bytes only), so no process holds more than its part of the checkpoint.
    The experts of a stacked parameter are copied into it one by one as they are read.

    A tied head (``fmt.tie_flag``, absent = the reference's default) is the embedding; a
    separate head weight next to it would be silently unused by the reference, so it is an error.
    """
    if shard is None:
        shard = Shard.plan(fmt.read_config(config), 1, 0)
    state, experts = {}, {}
    tied = fmt.ties_head(config)
    for file in _weight_files(folder):
        with _open_safetensors(file) as f:
            for name in f.keys():
                found = fmt.slot(name)
                native, expert = found if found is not None else (None, None)
                if native is None:
                    if name.endswith("rotary_emb.inv_freq") or fmt.ignores(name):
                        continue
                    raise UnsupportedCheckpoint(f"{file.name}: unexpected weight {name!r} for model_type={fmt.model_type}")
                if native == "lm_head.weight" and tied:
                    raise UnsupportedCheckpoint(
                        f"{file.name}: has a separate head weight {name!r} but config.json says "
                        f"{fmt.tie_flag}={'true' if fmt.tie_flag in config else 'absent (true)'}; "
                        f"set {fmt.tie_flag} to false")
                part = shard.part(native, expert)
                if part.skip:
                    continue
                try:
                    tensor = part.read(f, name)
                except Exception as exc:
                    raise UnsupportedCheckpoint(f"{file}: tensor {name!r} cannot be read "
                                                f"({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})") from None
                if expert is None:
                    tensor = tensor.to(device=device, dtype=dtype)
                    _check_finite(file, name, tensor)
                    state[native] = tensor
                else:
                    stacked = experts.setdefault(native, _Stacked(shard.experts, tensor, dtype,
                                                                  device))
                    _check_finite(file, name, stacked.put(expert, tensor))
    for native, stacked in experts.items():
        state[native] = stacked.full(native, fmt)
    if tied and "embed.weight" in state:
        head = state["embed.weight"]
        if shard.head and shard.size > 1:      # the embedding is whole; the head is a span
            lo, hi = shard.span(head.shape[0])
            head = head[lo:hi]
        state["lm_head.weight"] = head
    return state


def _check_finite(file: Path, name: str, tensor: torch.Tensor) -> None:
    """A one-line error for a weight holding NaN or infinity, which would decode garbage
    without a word. One min/max pass (NaN propagates through both; float32 on the CPU: about
    0.2 s per 134M elements on two cores, a fifth of the cast itself)."""
    if tensor.numel() == 0:
        return
    lo, hi = torch.aminmax(tensor)
    if not bool(torch.isfinite(lo) & torch.isfinite(hi)):
        bad = (~torch.isfinite(tensor)).nonzero()[0].tolist()
        raise UnsupportedCheckpoint(f"{file}: weight {name!r} holds a non-finite value "
                                    f"({tensor[tuple(bad)].item()} at {bad}); the checkpoint is "
                                    f"damaged")


class _Stacked:
    """A parameter stacked over the experts ``[lo, hi)`` [hi - lo, *expert shape], filled one
    expert at a time (no second copy of the experts while loading)."""

    def __init__(self, experts: tuple[int, int], first: torch.Tensor, dtype, device):
        self.lo, self.hi = experts
        self.data = torch.empty((self.hi - self.lo, *first.shape), dtype=dtype, device=device)
        self.filled: set[int] = set()

    def put(self, expert: int, tensor: torch.Tensor) -> torch.Tensor:
        """Copy ``tensor`` in as expert ``expert``'s slice (cast and placed); that slice."""
        slot = self.data[expert - self.lo]
        slot.copy_(tensor)
        self.filled.add(expert)
        return slot

    def full(self, native: str, fmt: CheckpointFormat) -> torch.Tensor:
        """The parameter; every expert of ``[lo, hi)`` must have been put."""
        missing = [e for e in range(self.lo, self.hi) if e not in self.filled]
        if missing:
            raise UnsupportedCheckpoint(f"checkpoint lacks expert(s) {missing[:5]} for "
                                        f"{native!r} (model_type={fmt.model_type})")
        return self.data


def _special_ids(config: dict, tokenizer, defaults: dict | None = None, masked: bool = True
                 ) -> tuple[int | None, tuple[int, ...], int | None]:
    """(mask id, end ids, pad id) from config.json, then the tokenizer, then ``defaults`` (the
    reference generate's ids, for formats that have them); ``masked=False`` (a uniform-state
    model): no mask id, None."""
    defaults = defaults or {}
    vocab = tokenizer.get_vocab() if tokenizer is not None else {}
    mask_id = _mask_id(config, tokenizer, vocab, defaults) if masked else None
    eos = config.get("eos_token_id")
    if eos is None:
        eos = defaults.get("eos_token_id")
    eos_ids = list(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        eos_ids.append(tokenizer.eos_token_id)
    eos_ids += [vocab[t] for t in END_OF_TURN_TOKENS if t in vocab]
    eos_ids = tuple(dict.fromkeys(int(e) for e in eos_ids))
    pad_id = config.get("pad_token_id")
    if pad_id is None and tokenizer is not None:
        pad_id = tokenizer.pad_token_id
    if pad_id is None and eos_ids:
        pad_id = eos_ids[0]
    return mask_id, eos_ids, pad_id


def _mask_id(config: dict, tokenizer, vocab: dict, defaults: dict) -> int:
    """The mask id of a masked diffusion LM (see :func:`_special_ids`), else a one-line error."""
    mask_id = config.get("mask_token_id")
    if mask_id is None:
        mask_id = next((vocab[t] for t in MASK_TOKENS if t in vocab), None)
    if mask_id is None and tokenizer is not None and getattr(tokenizer, "mask_token_id", None) is not None:
        mask_id = tokenizer.mask_token_id
    if mask_id is None:
        mask_id = defaults.get("mask_token_id")
    if mask_id is None:
        raise UnsupportedCheckpoint(
            "checkpoint has no mask token (no mask_token_id in config.json and none of "
            f"{', '.join(MASK_TOKENS)} in the tokenizer): it is not a masked diffusion LM"
        )
    return int(mask_id)


def check_mask_not_an_end(mask_id: int, eos_ids: tuple[int, ...], tokenizer, where: str) -> None:
    """A mask id that is also an end-of-text id is an error: the decoders never predict the mask
    token, so that end could never be written and the answer would never stop there. The
    message names the tokenizer's own mask token when it has a distinct one."""
    if mask_id is None or mask_id not in eos_ids:
        return
    vocab = tokenizer.get_vocab() if tokenizer is not None else {}
    own = [(t, vocab[t]) for t in MASK_TOKENS if vocab.get(t, mask_id) not in eos_ids]
    hint = (f"; the tokenizer's mask token {own[0][0]} is id {own[0][1]}: set mask_token_id to it "
            "in config.json") if own else ""
    raise UnsupportedCheckpoint(f"{where}: mask_token_id={mask_id} is also an end-of-text id "
                                f"(end ids {list(eos_ids)}): a masked diffusion LM needs a mask "
                                f"token of its own{hint}")


def load_tokenizer(folder: Path, fallback_class: str | None = None):
    """The folder's tokenizer, built by transformers' own classes only (see ``tokenizer_files``)."""
    from .tokenizer_files import load_tokenizer as _load

    return _load(folder, fallback_class)


def read_checkpoint(folder: Path) -> tuple[dict, CheckpointFormat, TransformerConfig, list[Path]]:
    """(config.json, its format, the network it describes, the weight files) of a checkpoint
    folder, after every check of ``validation`` (the config's values and shape against the
    safetensors headers): nothing is allocated and no tensor is read. Errors are one line."""
    config_path = folder / "config.json"
    config = read_config_file(config_path)
    fmt = format_for(config, str(config_path))
    try:
        cfg: TransformerConfig = fmt.read_config(config)
    except UnsupportedCheckpoint:
        raise
    except (TypeError, ValueError, ArithmeticError, AttributeError) as exc:  # wrong JSON types
        raise UnsupportedCheckpoint(f"{config_path}: not a readable {fmt.model_type} config "
                                    f"({type(exc).__name__}: {_first_line(exc)})") from None
    files = check_checkpoint(folder, config, fmt, cfg)      # headers only
    return config, fmt, cfg, files


def load_model(name_or_path: str, device=None, dtype="auto", comm=None,
               parallel_layers: str = "all", *, revision: str | None = None,
               tokenizer: str | None = None, batch_invariant: bool = False) -> DiffusionLM:
    """Load a supported diffusion LM checkpoint folder into the native network.

    ``device``: None/"auto" picks CUDA when present; ``dtype``: "auto" = bfloat16 on CUDA,
    float32 elsewhere. ``comm`` (``parallel.Comm`` of a tensor-parallel group of more than one
    rank): this rank loads its part of the network (``parallel_layers``: all or experts; see
    ``parallel``), after checking that the model can be split so, before any weight is read.
    ``revision``: the hub revision of a hub id (and of ``tokenizer``); ``tokenizer``: another
    folder, hub id or bundled name to read the tokenizer from (its ids must fit the
    checkpoint's embeddings). ``batch_invariant``: the run computes in the batch-invariant
    kernels (``DiffusionLM.batch_invariant``), whose support on the device and dtype is checked
    here, before anything is read. Errors are one line and name the offending field.
    """
    folder = checkpoint_folder(str(name_or_path), revision=revision)
    config_path = folder / "config.json"
    if not config_path.exists():
        raise ValueError(f"pretrained={name_or_path!r}: {folder} has no config.json")
    config, fmt, cfg, _ = read_checkpoint(folder)
    shard = None if comm is None else Shard.plan(cfg, comm.size, comm.rank, parallel_layers)
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    if batch_invariant:     # before the tokenizer and the weights: a one-line error
        err = support_error(dev, dt)
        if err:
            raise ValueError(err)
    tok_folder = folder if tokenizer is None else checkpoint_folder(
        str(tokenizer), TOKENIZER_PATTERNS, revision=revision, what="tokenizer")
    tokenizer = load_tokenizer(tok_folder, fmt.tokenizer_class)
    mask_id, eos_ids, pad_id = _special_ids(fmt.values(config), tokenizer,
                                            dict(fmt.generate_defaults), fmt.masked)
    check_token_ids({"mask_token_id": mask_id, "eos_token_id": list(eos_ids),
                     "pad_token_id": pad_id}, cfg.vocab_size,
                    f"{folder} (config.json and tokenizer)")
    check_mask_not_an_end(mask_id, eos_ids, tokenizer, f"{folder} (config.json and tokenizer)")
    ids = max(tokenizer.get_vocab().values(), default=-1) + 1
    if ids > cfg.vocab_size:
        raise UnsupportedCheckpoint(f"{folder}: the tokenizer's ids run to {ids - 1} but the "
                                    f"embeddings have {cfg.vocab_size} rows: ids from "
                                    f"{cfg.vocab_size} on could not be embedded")

    if shard is not None and comm.rank == 0:
        for note in shard.notes():
            log.warning("pvf-dlm: %s", note)
    with torch.device("meta"):
        net = BidirectionalTransformer(cfg, shard, comm)
    state = load_native_state(folder, fmt, config, dt, dev, shard)
    missing = sorted(set(net.state_dict()) - set(state))
    if missing:
        raise UnsupportedCheckpoint(f"{folder.name}: checkpoint lacks weights for {missing[:3]} ...")
    net.load_state_dict(state, strict=True, assign=True)
    return DiffusionLM(
        net, mask_id=mask_id, eos_ids=eos_ids, pad_id=pad_id, logit_shift=fmt.logit_shift,
        decodable=len(tokenizer), tokenizer=tokenizer, family=fmt.family,
        name=str(name_or_path), config=config, weights_fingerprint=weights_fingerprint(folder),
        shard=shard, comm=comm, invariant_checked=batch_invariant,
    )


def save_checkpoint(net: BidirectionalTransformer, fmt: CheckpointFormat, folder: Path, special: dict) -> None:
    """Write ``net`` as a checkpoint folder in ``fmt``'s own names (config.json + model.safetensors).

    ``special`` holds the config's token-id fields (mask_token_id, eos_token_id, ...).
    """
    from safetensors.torch import save

    folder.mkdir(parents=True, exist_ok=True)
    tensors = {name: t.detach().to("cpu", torch.float32).contiguous()
               for k, v in net.state_dict().items() for name, t in fmt.checkpoint_tensors(k, v)}
    atomic.write_bytes(folder / "model.safetensors", save(tensors, metadata={"format": "pt"}))
    atomic.write_json(folder / "config.json", fmt.write_config(net.cfg, special), indent=2,
                      ensure_ascii=True)
