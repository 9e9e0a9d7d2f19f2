"""Checkpoint folders edited for one test: a copy of a fixture with some JSON file changed.

`edit_json` rewrites one JSON file in place (keys set, or removed with `DROP`) and returns what
it wrote; `edit_config` does so for a folder's config.json; `edited_copy` copies a folder and
edits its config.json; `strip_added_token` removes a special token from a tokenizer's files
(tokenizer.json's added tokens and tokenizer_config.json's `mask_token`).
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

DROP = object()     # as a value: remove the key


def edit_json(path: Path, changes: dict) -> dict:
    """Set each key of `changes` in the JSON object at `path` (DROP removes it); returns it."""
    data = json.loads(path.read_text())
    for key, value in changes.items():
        if value is DROP:
            data.pop(key, None)
        else:
            data[key] = value
    path.write_text(json.dumps(data))
    return data


def edit_config(folder: Path, **changes) -> dict:
    """`edit_json` on the folder's config.json."""
    return edit_json(folder / "config.json", changes)


def edited_copy(src: Path, dst: Path, **changes) -> Path:
    """A copy of the checkpoint folder `src` at `dst`, its config.json edited as `edit_config`."""
    shutil.copytree(src, dst)
    edit_config(dst, **changes)
    return dst


def strip_added_token(folder: Path, content: str) -> None:
    """Remove the added token `content` from tokenizer.json and `mask_token` from
    tokenizer_config.json: a tokenizer that names no mask."""
    tokenizer = json.loads((folder / "tokenizer.json").read_text())
    tokenizer["added_tokens"] = [t for t in tokenizer["added_tokens"] if t["content"] != content]
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer))
    edit_json(folder / "tokenizer_config.json", {"mask_token": DROP})
