"""Planning-vocabulary artifacts: load them, pick one for a model, resolve them to token ids.

An artifact is a JSON file under ``vocab_artifacts/`` (SPEC "Planning vocabulary")::

    {"format_version": 1, "kind": "calibrated" | "hand-written" | "heuristic",
     "model_family": "llada" | "dream", "task_family": "math-word" | "knowledge" | "code" | "math",
     "model": "...", "tokenizer": {"name": "...", "vocab_hash": "sha256:..."},
     "tokens": [{"id": 17, "string": "ĠStep", ...statistics...}, ...], ...}

Resolution against the running tokenizer: by id when the tokenizer's vocabulary hash matches,
else by token string (with a warning listing what did not resolve). An artifact for another model
family is an error unless ``force=True``.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any, Iterable

from .paths import vocab_artifacts_dir

log = logging.getLogger("pvf_lmeval")

FORMAT_VERSION = 1
KINDS = ("calibrated", "hand-written", "heuristic")
TASK_FAMILIES = ("math-word", "knowledge", "code", "math")
MODEL_FAMILIES = ("llada", "dream")
#: better kinds first: ``vocab=auto`` prefers a calibrated artifact over a hand-written one.
KIND_RANK = {k: i for i, k in enumerate(KINDS)}


def tokenizer_hash(tokenizer) -> str:
    """sha256 over the tokenizer's (token, id) pairs, independent of file layout."""
    items = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    return "sha256:" + hashlib.sha256(json.dumps(items, ensure_ascii=False).encode()).hexdigest()


def load_artifact(path: str | Path) -> dict:
    """Read and check an artifact; one-line errors name the file and the problem."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"vocab artifact {path}: unreadable ({type(exc).__name__}: {exc})") from None
    if not isinstance(data, dict) or data.get("format_version") != FORMAT_VERSION:
        got = data.get("format_version") if isinstance(data, dict) else None
        raise ValueError(f"vocab artifact {path}: format_version={got!r}, expected {FORMAT_VERSION}")
    for key, allowed in (("kind", KINDS), ("model_family", MODEL_FAMILIES), ("task_family", TASK_FAMILIES)):
        if data.get(key) not in allowed:
            raise ValueError(f"vocab artifact {path}: {key}={data.get(key)!r} is not one of {', '.join(allowed)}")
    if not isinstance(data.get("tokens"), list) or not all(isinstance(t, dict) and "string" in t for t in data["tokens"]):
        raise ValueError(f"vocab artifact {path}: 'tokens' must be a list of {{id, string, ...}} records")
    data["_path"] = str(path)
    return data


def bundled_artifacts() -> list[dict]:
    return [load_artifact(p) for p in sorted(vocab_artifacts_dir().glob("*.json"))]


def pick_artifact(model_family: str, task_family: str, model_name: str = "") -> dict | None:
    """The best bundled artifact for a model family and task family: calibrated before
    hand-written before heuristic, an artifact built on this very model first."""
    fits = [a for a in bundled_artifacts()
            if a["model_family"] == model_family and a["task_family"] == task_family]
    if not fits:
        return None
    return min(fits, key=lambda a: (a.get("model") != model_name, KIND_RANK[a["kind"]], a["_path"]))


def resolve_artifact(artifact: dict, tokenizer, model_family: str, *, force: bool = False) -> tuple[int, ...]:
    """Token ids of an artifact under ``tokenizer``."""
    where = artifact.get("_path", "artifact")
    if artifact["model_family"] != model_family and not force:
        raise ValueError(f"vocab artifact {where} is for model family {artifact['model_family']!r}, "
                         f"the loaded model is {model_family!r} (pass force to use it anyway)")
    same = artifact.get("tokenizer", {}).get("vocab_hash") == tokenizer_hash(tokenizer)
    if same:
        return tuple(sorted({int(t["id"]) for t in artifact["tokens"]}))
    return resolve_strings([t["string"] for t in artifact["tokens"]], tokenizer, where=where)


def resolve_strings(strings: Iterable[str], tokenizer, *, where: str = "vocab") -> tuple[int, ...]:
    """Ids of token strings (the tokenizer's own spelling, e.g. 'ĠStep'); warns about misses and
    fails when nothing resolves."""
    vocab = tokenizer.get_vocab()
    strings = list(strings)
    ids = {vocab[s] for s in strings if s in vocab}
    missing = [s for s in strings if s not in vocab]
    if not ids:
        raise ValueError(f"{where}: none of its {len(strings)} tokens exist in this tokenizer "
                         f"(e.g. {strings[:3]})")
    if missing:
        log.warning("%s: %d of %d tokens are not in this tokenizer and were skipped: %s",
                    where, len(missing), len(strings), missing[:20])
    return tuple(sorted(ids))


def resolve_vocab(spec: Any, *, tokenizer, model_family: str, model_name: str = "",
                  task_family: str | None = None, force: bool = False) -> tuple[tuple[int, ...] | None, str]:
    """Turn a ``vocab`` argument into (token ids or None, a description of the source).

    ``spec``: ``"auto"`` (best bundled artifact for the model and task family), ``"none"``
    (planning off), a path to an artifact, a bundled artifact's file stem, or (from Python) a
    collection of token ids or token strings.
    """
    if spec is None or spec == "none":
        return None, "none"
    if isinstance(spec, str):
        if spec == "auto":
            family = task_family or "math-word"
            art = pick_artifact(model_family, family, model_name)
            if art is None:
                raise ValueError(f"vocab=auto: no bundled planning vocabulary for model family "
                                 f"{model_family!r} and task family {family!r}; pass vocab=PATH or vocab=none")
            return resolve_artifact(art, tokenizer, model_family, force=force), f"auto:{art['_path']}"
        path = Path(spec).expanduser()
        if not path.exists():
            stem = vocab_artifacts_dir() / f"{spec}.json"
            if not stem.exists():
                names = sorted(p.stem for p in vocab_artifacts_dir().glob("*.json"))
                raise ValueError(f"vocab={spec!r} is not auto, none, an artifact path, or a bundled "
                                 f"artifact ({', '.join(names) or 'none bundled'})")
            path = stem
        return resolve_artifact(load_artifact(path), tokenizer, model_family, force=force), str(path)
    items = list(spec)
    if all(isinstance(t, int) and not isinstance(t, bool) for t in items):
        size = len(tokenizer)
        bad = [t for t in items if not 0 <= t < size]
        if bad:
            raise ValueError(f"vocab: token ids {bad[:5]} are outside this tokenizer (size {size})")
        return tuple(sorted(set(items))), "ids"
    if all(isinstance(t, str) for t in items):
        unknown = [t for t in items if t not in tokenizer.get_vocab()]
        if unknown:
            raise ValueError(f"vocab: tokens {unknown[:5]} are not in this tokenizer "
                             "(give the tokenizer's own spelling, e.g. 'ĠStep')")
        return resolve_strings(items, tokenizer, where="vocab"), "strings"
    raise ValueError("vocab: a collection must hold only token ids (int) or only token strings (str)")
