"""Tokenizers of checkpoint folders, built by transformers' own classes, never by folder code.

Real checkpoints point at remote code: Dream's ``tokenizer_config.json`` maps ``AutoTokenizer`` to
``tokenization_dream.DreamTokenizer`` (its folder has ``vocab.json`` + ``merges.txt`` and no
``tokenizer.json``), and both families' ``config.json`` carry ``auto_map``, which makes
transformers ask "Do you wish to run the custom code?" (and wait on a terminal). We never ask and
never import a folder's ``*.py``: the files that only hold data (:data:`DATA_FILES`) are copied to
a private temporary folder, ``auto_map`` is dropped from the copied ``tokenizer_config.json`` and
its ``tokenizer_class`` replaced by a built-in class when it names one transformers does not
have; only that folder, which holds no ``config.json`` and no code, is handed to the class's
``from_pretrained``.

Every file is read as a regular file of at most :data:`MAX_FILE_BYTES` inside the checkpoint
folder, as shards are (``validation.resolves_inside``): a link that leads out of the folder (a
``chat_template.jinja`` pointing at a file elsewhere), a FIFO or a link to ``/dev/zero`` is a
one-line error, never read.

Which class: the folder's ``tokenizer_class`` when transformers has it; else
``PreTrainedTokenizerFast`` when there is a ``tokenizer.json`` (it describes the whole
tokenizer); else the checkpoint format's fallback (Dream: ``Qwen2Tokenizer``, the byte-level BPE
that DreamTokenizer is); else a one-line error.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from ..files.reads import UnreadableFile, read_bytes

#: tokenizer files that hold data only (copied); anything else in a folder is never read
DATA_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
              "added_tokens.json", "vocab.json", "merges.txt", "chat_template.jinja",
              "chat_template.json")
GENERIC_FAST = "PreTrainedTokenizerFast"
#: what a hub download fetches when only the tokenizer is needed (``pvf-trace``): no weights
HUB_PATTERNS = DATA_FILES
#: the largest tokenizer file read (the largest vocabularies' tokenizer.json are tens of MiB)
MAX_FILE_BYTES = 256 << 20
#: the largest tokenizer_config.json read (chat templates included, they are a few KiB)
MAX_CONFIG_BYTES = 16 << 20


class TokenizerFilesError(ValueError):
    """The folder's tokenizer files are missing, incomplete or unreadable (one line)."""


def tokenizer_layout(folder: Path) -> str:
    """``"tokenizer.json"`` or ``"vocab.json+merges.txt"``; a one-line error naming what is missing."""
    has = {name: os.path.lexists(folder / name) for name in ("tokenizer.json", "vocab.json", "merges.txt")}
    if has["tokenizer.json"]:
        return "tokenizer.json"
    if has["vocab.json"] and has["merges.txt"]:
        return "vocab.json+merges.txt"
    if has["vocab.json"] or has["merges.txt"]:
        present, absent = ("vocab.json", "merges.txt") if has["vocab.json"] else ("merges.txt", "vocab.json")
        raise TokenizerFilesError(f"{folder}: tokenizer is incomplete: {present} is there but "
                                  f"{absent} is missing, and there is no tokenizer.json (a byte-level BPE needs both "
                                  f"files)")
    raise TokenizerFilesError(f"{folder}: no tokenizer files: needs tokenizer.json, or vocab.json "
                              f"+ merges.txt (with tokenizer_config.json for the special tokens)")


def _builtin(name) -> bool:
    """Whether ``name`` is a tokenizer class that transformers itself provides."""
    if not isinstance(name, str) or not name.isidentifier():
        return False
    import transformers
    from transformers import PreTrainedTokenizerBase

    try:
        obj = getattr(transformers, name, None)
    except Exception:   # a lazily imported class whose optional dependency is missing
        return False
    return isinstance(obj, type) and issubclass(obj, PreTrainedTokenizerBase)


def _read(folder: Path, name: str, limit: int = MAX_FILE_BYTES) -> bytes:
    """The bytes of tokenizer file ``name``: inside the checkpoint folder, a regular file of at
    most ``limit`` bytes (module docstring)."""
    from .validation import resolves_inside

    path = folder / name
    if not resolves_inside(folder, path):
        raise TokenizerFilesError(f"{path}: resolves to {path.resolve()}, outside the checkpoint "
                                  f"folder {folder.resolve()} (a symbolic link); tokenizer files "
                                  f"must be files of the folder")
    try:
        return read_bytes(path, limit, "tokenizer file")
    except UnreadableFile as exc:
        raise TokenizerFilesError(str(exc)) from None


def _read_json(folder: Path, name: str) -> dict:
    path = folder / name
    raw = _read(folder, name, MAX_CONFIG_BYTES)
    try:
        data = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError) as exc:     # JSON and UTF-8 errors, nesting too deep
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise TokenizerFilesError(f"{path}: not readable JSON ({why})") from None
    if not isinstance(data, dict):
        raise TokenizerFilesError(f"{path}: expected a JSON object, found {type(data).__name__}")
    return data


def tokenizer_class_for(folder: Path, tok_config: dict, fallback: str | None) -> str:
    """The built-in class name that reads ``folder``'s tokenizer (see the module docstring)."""
    named = tok_config.get("tokenizer_class")
    if _builtin(named):
        return named
    if tokenizer_layout(folder) == "tokenizer.json":
        return GENERIC_FAST
    if fallback is not None:
        return fallback
    raise TokenizerFilesError(
        f"{folder / 'tokenizer_config.json'}: tokenizer_class={named!r} is not a transformers "
        f"class and the folder has no tokenizer.json; remote tokenizer code is never run")


def load_tokenizer(folder: Path, fallback: str | None = None):
    """The tokenizer of checkpoint ``folder``, built without running or importing its code."""
    import transformers
    from transformers.utils import logging as hf_logging

    folder = Path(folder)
    tokenizer_layout(folder)
    present = [name for name in DATA_FILES if os.path.lexists(folder / name)]
    tok_config = _read_json(folder, "tokenizer_config.json") if "tokenizer_config.json" in present else {}
    cls_name = tokenizer_class_for(folder, tok_config, fallback)
    tok_config.pop("auto_map", None)
    tok_config["tokenizer_class"] = cls_name
    previous = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()       # transformers' notices about unknown model types
    try:
        with tempfile.TemporaryDirectory(prefix="pvf_tokenizer_") as stage:
            for name in present:
                if name != "tokenizer_config.json":
                    (Path(stage) / name).write_bytes(_read(folder, name))
            (Path(stage) / "tokenizer_config.json").write_text(json.dumps(tok_config))
            cls = getattr(transformers, cls_name)
            try:
                return cls.from_pretrained(stage, local_files_only=True, trust_remote_code=False)
            except Exception as exc:
                first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                raise TokenizerFilesError(f"{folder}: the tokenizer files could not be read by "
                                          f"{cls_name} ({first})") from None
    finally:
        hf_logging.set_verbosity(previous)
