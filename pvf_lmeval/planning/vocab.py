"""Planning-vocabulary artifacts: load them, pick one for a model, resolve them to token ids.

An artifact is a JSON file under ``vocab_artifacts/`` (SPEC "Planning vocabulary")::

    {"format_version": 1, "kind": "calibrated" | "hand-written" | "heuristic" | "online",
     "model_family": "llada" | "dream" | ... (models.formats.MODEL_FAMILIES),
     "task_family": "math-word" | "knowledge" | "code" | "math",
     "model": "...", "tokenizer": {"name": "...", "vocab_hash": "sha256:..." | null},
     "tokens": [{"id": 17, "string": "ĠStep", ...statistics...}, ...],
     "rejected_near": [...], "observed": [...], ...}

``tokens`` is the planning vocabulary; ``rejected_near`` (calibrated) and ``observed`` (online)
hold statistics of tokens that are not in it, for audit and for seeding ``vocab=online``.
Heuristic artifacts (uncalibrated, built from token classes, for models not yet calibrated) have
no tokenizer hash and ``id: null``: they always resolve by string.

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

from ..files.atomic import write_json
from ..files.reads import UnreadableFile, read_json
from ..decoding.plan_vocab import capitalised_ids  # noqa: F401  (rules=reference, switch 2)
from ..files.paths import user_vocab_dir, vocab_artifacts_dir
from ..models.formats import MODEL_FAMILIES

log = logging.getLogger("pvf_lmeval")

FORMAT_VERSION = 1
KINDS = ("calibrated", "hand-written", "heuristic", "online")
TASK_FAMILIES = ("math-word", "knowledge", "code", "math")
#: better kinds first: ``vocab=auto`` prefers a calibrated artifact over a hand-written one.
KIND_RANK = {k: i for i, k in enumerate(KINDS)}


#: the largest artifact read (the bundled ones are a few KiB; a calibration's tens of KiB)
MAX_ARTIFACT_BYTES = 16 << 20


def tokenizer_hash(tokenizer) -> str:
    """sha256 over the tokenizer's (token, id) pairs, independent of file layout."""
    items = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    return "sha256:" + hashlib.sha256(json.dumps(items, ensure_ascii=False).encode()).hexdigest()


def load_artifact(path: str | Path) -> dict:
    """Read and check an artifact; one-line errors name the file and the problem."""
    path = Path(path)
    try:      # a regular file of bounded size: a FIFO or a link to /dev/zero is refused at once
        data = read_json(path, MAX_ARTIFACT_BYTES, "artifact")
    except UnreadableFile as exc:
        raise ValueError(f"vocab artifact {path}: unreadable ({exc.reason})") from None
    if not isinstance(data, dict) or data.get("format_version") != FORMAT_VERSION:
        got = data.get("format_version") if isinstance(data, dict) else None
        raise ValueError(f"vocab artifact {path}: format_version={got!r}, expected {FORMAT_VERSION}")
    for key, allowed in (("kind", KINDS), ("model_family", MODEL_FAMILIES), ("task_family", TASK_FAMILIES)):
        if data.get(key) not in allowed:
            raise ValueError(f"vocab artifact {path}: {key}={data.get(key)!r} is not one of {', '.join(allowed)}")
    for key in ("tokens", "rejected_near", "observed"):
        recs = data.get(key, [])
        if not isinstance(recs, list) or not all(isinstance(t, dict) and isinstance(t.get("string"), str)
                                                 for t in recs):
            raise ValueError(f"vocab artifact {path}: {key!r} must be a list of {{id, string, ...}} records")
    if "tokens" not in data:
        raise ValueError(f"vocab artifact {path}: 'tokens' must be a list of {{id, string, ...}} records")
    for key in ("tokens", "rejected_near", "observed"):
        bad = next((t["id"] for t in data.get(key, []) if t.get("id") is not None
                    and (not isinstance(t["id"], int) or isinstance(t["id"], bool) or t["id"] < 0)),
                   None)
        if bad is not None:
            raise ValueError(f"vocab artifact {path}: {key!r} holds id {bad!r}; ids are "
                             f"non-negative integers or null")
    if not isinstance(data.get("tokenizer", {}), dict):
        raise ValueError(f"vocab artifact {path}: 'tokenizer' must be an object "
                         f"{{name, vocab_hash}}")
    for key in ("model", "model_weights"):
        if data.get(key) is not None and not isinstance(data[key], str):
            raise ValueError(f"vocab artifact {path}: {key!r} must be a string")
    data["_path"] = str(path)
    return data


def artifact_dirs() -> list[Path]:
    """Where artifacts are looked for, in order: the user's folder (``pvf-calibrate``'s
    default output, :func:`~pvf_lmeval.files.paths.user_vocab_dir`), then the bundled ones."""
    return [user_vocab_dir(), vocab_artifacts_dir()]


def bundled_artifacts() -> list[dict]:
    """Every readable artifact of :func:`artifact_dirs` (the user's first); an unreadable one
    is skipped with a one-line warning naming it."""
    out = []
    for folder in artifact_dirs():
        for p in sorted(folder.glob("*.json")) if folder.is_dir() else ():
            try:
                art = load_artifact(p)
            except ValueError as exc:
                log.warning("vocab=auto: skipped %s", str(exc).removeprefix("vocab artifact "))
                continue
            art["_user"] = folder != vocab_artifacts_dir()
            out.append(art)
    return out


def model_stem(name: str) -> str:
    """'GSAI-ML/LLaDA-8B-Instruct', '/models/LLaDA-8B-Instruct/' -> 'llada-8b-instruct'."""
    return Path(str(name).rstrip("/")).name.lower()


def _match(artifact: dict, model_name: str, tok_hash: str | None) -> tuple[int, str]:
    if tok_hash is not None and artifact.get("tokenizer", {}).get("vocab_hash") == tok_hash:
        return 0, "built with this tokenizer"
    if model_name and model_stem(artifact.get("model", "")) == model_stem(model_name):
        return 1, "built for this model"
    if artifact["kind"] == "heuristic":
        return 2, "generic for the model family"
    return 3, f"built for {artifact.get('model')!r} (another tokenizer), the family's only one"


def pick_artifact(model_family: str, task_family: str, model_name: str = "", tokenizer=None,
                  weights: str | None = None) -> dict | None:
    """The best bundled artifact for a model family and task family, or None.

    Order: built with the running tokenizer (same vocabulary hash), then built for a model of
    the same name, then the family's generic heuristic artifact, then any other of the family;
    within each, calibrated before hand-written before heuristic (online artifacts last), and
    among equals the user's folder (``pvf-calibrate``'s output) before the bundled ones.
    Artifacts that kept no token are skipped, and so, with a warning, are those that record a
    weights fingerprint (``model_weights``) other than ``weights``, the loaded checkpoint's:
    calibrated on other weights of the same tokenizer (a retrained or fine-tuned model).
    The pick's ``_why`` says which rule chose it."""
    fits = [a for a in bundled_artifacts()
            if a["model_family"] == model_family and a["task_family"] == task_family
            and a["kind"] != "online" and a["tokens"]]  # a calibration that kept nothing would switch planning off
    if weights:
        for a in [a for a in fits if a.get("model_weights") not in (None, weights)]:
            log.warning("vocab=auto: skipped %s: calibrated on other weights than the loaded "
                        "checkpoint's (weights fingerprint differs); recalibrate with pvf-calibrate, "
                        "or pass vocab=%s to use it anyway", Path(a["_path"]).name, a["_path"])
            fits.remove(a)
    if not fits:
        return None
    tok_hash = tokenizer_hash(tokenizer) if tokenizer is not None else None
    best = min(fits, key=lambda a: (_match(a, model_name, tok_hash)[0], KIND_RANK[a["kind"]],
                                    not a.get("_user"), a["_path"]))
    best["_why"] = _match(best, model_name, tok_hash)[1]
    return best


def resolve_artifact(artifact: dict, tokenizer, model_family: str, *, force: bool = False) -> tuple[int, ...]:
    """Token ids of an artifact under ``tokenizer``."""
    where = artifact.get("_path", "artifact")
    if artifact["model_family"] != model_family and not force:
        raise ValueError(f"vocab artifact {where} is for model family {artifact['model_family']!r}, "
                         f"the loaded model is {model_family!r} (pass force to use it anyway)")
    ids = _ids_by_hash(artifact, tokenizer, artifact["tokens"], where)
    if ids is not None:
        return tuple(sorted(set(ids)))
    return resolve_strings([t["string"] for t in artifact["tokens"]], tokenizer, where=where)


def _ids_by_hash(artifact: dict, tokenizer, records: list[dict], where) -> list[int] | None:
    """The records' ids when the artifact claims ``tokenizer``'s vocab_hash and every record has
    an id (None otherwise: resolve by string). The claim is checked, not trusted: an id outside
    the tokenizer, or one the tokenizer spells otherwise than the record, is an error."""
    h = artifact.get("tokenizer", {}).get("vocab_hash")
    if not (h and h == tokenizer_hash(tokenizer) and all(t.get("id") is not None for t in records)):
        return None
    ids = [int(t["id"]) for t in records]
    outside = [i for i in ids if i >= len(tokenizer)]
    if outside:
        raise ValueError(f"vocab artifact {where}: id {max(outside)} is outside this tokenizer "
                         f"(size {len(tokenizer)}) although its vocab_hash matches")
    for t, spelled in zip(records, tokenizer.convert_ids_to_tokens(ids)):
        if spelled != t["string"]:
            raise ValueError(f"vocab artifact {where}: id {t['id']} is {spelled!r} in this "
                             f"tokenizer, not {t['string']!r} as the artifact says, although its "
                             f"vocab_hash matches")
    return ids


def artifact_statistics(artifact: dict, tokenizer, model_family: str, *, force: bool = False
                        ) -> list[dict]:
    """Every per-token statistics record of an artifact (kept, rejected near the thresholds,
    observed online), each with ``id`` resolved against ``tokenizer`` (by id when the tokenizer
    hash matches, else by string; unresolved strings are skipped with a warning). Used to seed
    ``vocab=online``; an artifact without statistics (hand-written, heuristic) is an error."""
    where = artifact.get("_path", "artifact")
    if artifact["model_family"] != model_family and not force:
        raise ValueError(f"vocab artifact {where} is for model family {artifact['model_family']!r}, "
                         f"the loaded model is {model_family!r} (pass force to use it anyway)")
    recs = [r for key in ("tokens", "rejected_near", "observed") for r in artifact.get(key, [])]
    recs = [r for r in recs if "n" in r]
    if not recs:
        raise ValueError(f"vocab artifact {where}: kind {artifact['kind']!r} has no per-token "
                         "statistics to seed the online vocabulary from")
    ids = _ids_by_hash(artifact, tokenizer, recs, where)
    if ids is not None:
        return [dict(r, id=i) for r, i in zip(recs, ids)]
    vocab = tokenizer.get_vocab()
    missing = [r["string"] for r in recs if r["string"] not in vocab]
    if missing:
        log.warning("%s: %d of %d tokens are not in this tokenizer and were skipped: %s",
                    where, len(missing), len(recs), missing[:20])
    return [dict(r, id=vocab[r["string"]]) for r in recs if r["string"] in vocab]


def find_artifact(spec: str, what: str = "vocab") -> Path:
    """Path of ``spec``: an existing file, or the stem of a bundled artifact (``what`` names the
    argument in the error)."""
    path = Path(spec).expanduser()
    if path.exists():
        return path
    for folder in artifact_dirs():
        stem = folder / f"{spec}.json"
        if stem.exists():
            return stem
    names = sorted({p.stem for d in artifact_dirs() if d.is_dir() for p in d.glob("*.json")})
    kinds = "auto, none, online, " if what == "vocab" else ""
    raise ValueError(f"{what}={spec!r} is not {kinds}an artifact path or a bundled artifact "
                     f"({', '.join(names) or 'none bundled'})")


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
                  task_family: str | None = None, force: bool = False,
                  weights: str | None = None) -> tuple[tuple[int, ...] | None, str]:
    """Turn a ``vocab`` argument into (token ids or None, a description of the source).

    ``spec``: ``"auto"`` (best bundled artifact for the model and task family), ``"none"``
    (planning off), a path to an artifact, a bundled artifact's file stem, or (from Python) a
    collection of token ids or token strings. ``weights``: the loaded checkpoint's
    :func:`~pvf_lmeval.models.loader.weights_fingerprint`, for ``auto``'s pick.
    """
    if spec is None or spec == "none":
        return None, "none"
    if isinstance(spec, str):
        if spec == "auto":
            family = task_family or "math-word"
            art = pick_artifact(model_family, family, model_name, tokenizer, weights)
            if art is None:
                raise ValueError(f"vocab=auto: no bundled planning vocabulary (nor one in "
                                 f"{user_vocab_dir()}) for model family {model_family!r} and task "
                                 f"family {family!r}; pass vocab=PATH or vocab=none")
            ids = resolve_artifact(art, tokenizer, model_family, force=force)
            flag = " — UNCALIBRATED" if art["kind"] == "heuristic" else ""
            log.warning("vocab=auto: picked %s (%s, %s%s; %d tokens)", Path(art["_path"]).name,
                        art["kind"], art["_why"], flag, len(ids))
            return ids, f"auto:{art['_path']}"
        if spec == "online":
            raise ValueError("vocab=online is handled by the adapter (pvf_lmeval.lmeval.lm), not resolve_vocab")
        path = find_artifact(spec)
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


def resolve_vocab_for(model, spec: Any = "auto", *, task_family: str | None = None,
                      force: bool = False) -> tuple[tuple[int, ...] | None, str]:
    """:func:`resolve_vocab` for a loaded model: its tokenizer, family, name and weights
    fingerprint (so that ``auto`` skips an artifact calibrated on other weights)."""
    return resolve_vocab(spec, tokenizer=model.tokenizer, model_family=model.family,
                         model_name=model.name, task_family=task_family, force=force,
                         weights=getattr(model, "weights_fingerprint", None))


def online_artifact(online, tokenizer, *, model_family: str, task_family: str, model_name: str,
                    requests: int = 0) -> dict:
    """An artifact (kind ``online``) of an :class:`~pvf_lmeval.planning.online.OnlineVocab`:
    ``tokens`` = the currently eligible ids, ``observed`` = every other token with events."""
    recs = online.token_stats()
    ids = [r["id"] for r in recs]
    size = len(tokenizer)
    strings = tokenizer.convert_ids_to_tokens([i for i in ids if i < size])
    by_id = dict(zip([i for i in ids if i < size], strings))
    for r in recs:
        r["string"] = by_id.get(r["id"]) or f"<id {r['id']}>"
    return {
        "format_version": FORMAT_VERSION,
        "kind": "online",
        "model_family": model_family,
        "task_family": task_family,
        "model": model_name,
        "tokenizer": {"name": getattr(tokenizer, "name_or_path", "") or model_name,
                      "vocab_hash": tokenizer_hash(tokenizer), "size": size},
        "online": dict(online.settings(), requests=requests, updates=online.updates),
        "note": ("online: statistics learned while decoding (vocab=online); 'tokens' were eligible "
                 "when saved, 'observed' holds every other token tried"),
        "tokens": [r for r in recs if r["eligible"]],
        "observed": [r for r in recs if not r["eligible"]],
    }


def save_artifact(data: dict, path: str | Path) -> Path:
    """Write an artifact atomically (fields starting with ``_`` are dropped); its path."""
    clean = {k: v for k, v in data.items() if not k.startswith("_")}
    return write_json(path, clean)


# ---------------------------------------------------------------- a run's planning vocabulary

#: planning-vocabulary model args besides ``vocab`` (``vocab_force``; ``vocab=online`` settings)
VOCAB_ARGS = ("vocab_force", "rho_ver", "gamma_vig", "online_level", "online_explore",
              "online_explore_max", "online_seed", "online_save", "online_frozen", "online_merge")
_ONLINE_KW = ("rho_ver", "gamma_vig", "level", "explore", "explore_max", "frozen")


class RunVocab:
    """The planning vocabulary of an evaluation run (model args ``vocab`` + ``VOCAB_ARGS``).

    ``vocab=online``: an :class:`~pvf_lmeval.planning.online.OnlineVocab` (seeded from
    ``online_seed``), handed to every batch; else a fixed id set resolved from an artifact (or
    given ids/strings), carried by the decoding parameters. Resolved once, on first need
    (:meth:`resolve`). Online lifecycle: :meth:`update` between batches (every rank's records,
    in rank order, with ``online_merge``), :meth:`finish` at the end of a ``generate_until``
    (update, count the requests, save to ``online_save``).
    """

    def __init__(self, spec, cfg: dict):
        """``cfg``: :meth:`settings` of the model args."""
        self.spec = spec
        self.cfg = cfg
        self.ids: tuple[int, ...] | None = None
        self.source = "unused"
        self.online = None
        self.requests = 0
        self.family = "math-word"
        #: fixed vocabularies: task family (None: no preset) -> (ids, source)
        self.by_family: dict = {}

    @staticmethod
    def settings(spec, args: dict) -> dict:
        """Typed vocabulary args (validated before the model loads); online ones need vocab=online."""
        from ..decoding.param_spec import as_bool as _bool, as_float as _float, as_int as _int

        if spec != "online":
            stray = sorted(k for k in args if k != "vocab_force")
            if stray:
                raise ValueError(f"pvf-dlm: {stray[0]} applies only to vocab=online (vocab={spec!r})")
        cfg = {"force": _bool("vocab_force", args.get("vocab_force", False)),
               "rho_ver": _float("rho_ver", args.get("rho_ver", 0.9)),
               "gamma_vig": _float("gamma_vig", args.get("gamma_vig", 0.03)),
               "level": _float("online_level", args.get("online_level", 0.2)),
               "explore": _int("online_explore", args.get("online_explore", 1)),
               "explore_max": _int("online_explore_max", args.get("online_explore_max", 30)),
               "frozen": _bool("online_frozen", args.get("online_frozen", False)),
               "merge": _bool("online_merge", args.get("online_merge", False)),
               "seed": args.get("online_seed") or None, "save": args.get("online_save") or None}
        if spec == "online":
            from .online import OnlineVocab

            OnlineVocab(1, **{k: cfg[k] for k in _ONLINE_KW})   # validates
        return cfg

    def resolve(self, params, *, model, tokenizer, model_name: str):
        """``params`` carrying the fixed vocabulary (unchanged for ``vocab=online``); the first
        call resolves the artifact or builds the online statistics."""
        from ..decoding.params import override
        from ..decoding.rules import rules_for

        capitalised = rules_for(params.rules).capitalised_plan_tokens
        if self.spec == "online" and capitalised:
            raise ValueError("pvf-dlm: rules=reference adds capitalised tokens to a fixed planning "
                             "vocabulary; vocab=online learns its own (use rules=paper or a fixed vocab)")
        if self.source == "unused" and self.spec == "online":
            self.online, self.source = self._make_online(params, model, tokenizer, model_name), "online"
        ids = self.ids
        if self.spec != "online":   # one resolution per task family (tasks carry presets)
            if params.family not in self.by_family:
                self.by_family[params.family] = resolve_vocab(
                    self.spec, tokenizer=tokenizer, model_family=model.family,
                    model_name=model_name, task_family=params.family, force=self.cfg["force"],
                    weights=getattr(model, "weights_fingerprint", None))
                got, source = self.by_family[params.family]
                log.info("pvf-dlm: planning vocabulary %s (%d tokens)", source, len(got or ()))
            ids, source = self.by_family[params.family]
            if self.source == "unused":
                self.ids, self.source = ids, source
        if capitalised:             # rules=reference, switch 2: the authors' code plans on them
            if getattr(self, "_capitalised", None) is None:
                self._capitalised = capitalised_ids(tokenizer)
            ids = tuple(sorted(set(ids or ()) | self._capitalised))
        return override(params, plan_vocab=ids) if ids else params

    def _make_online(self, params, model, tokenizer, model_name: str):
        """The run's OnlineVocab, seeded from ``online_seed`` (artifact path, bundled name, auto)."""
        from .online import OnlineVocab

        cfg = self.cfg
        size = int(getattr(model, "vocab_size", 0) or len(tokenizer))
        online = OnlineVocab(size, device=model.device, **{k: cfg[k] for k in _ONLINE_KW})
        self.family = params.family or "math-word"
        if cfg["seed"]:
            if cfg["seed"] == "auto":
                art = pick_artifact(model.family, self.family, model_name, tokenizer,
                                    getattr(model, "weights_fingerprint", None))
                if art is None or art["kind"] not in ("calibrated", "online"):
                    raise ValueError("online_seed=auto: no bundled calibrated artifact for model "
                                     f"family {model.family!r} and task family {self.family!r}")
            else:
                art = load_artifact(find_artifact(cfg["seed"], what="online_seed"))
            used = online.seed(artifact_statistics(art, tokenizer, model.family,
                                                   force=cfg["force"]))
            log.warning(f"pvf-dlm: vocab=online seeded from {art['_path']} ({used} tokens, "
                        f"{len(online.eligible_ids())} eligible)")
        mode = "frozen" if cfg["frozen"] else "learning"
        log.info("pvf-dlm: vocab=online (%s; %s)", mode, online.settings())
        return online

    def update(self, gather=None) -> None:
        """Fold the pending outcomes in; ``gather`` (all ranks' objects, in rank order) merges
        every rank's when ``online_merge`` is on."""
        if self.online is None:
            return
        if gather is not None and self.cfg["merge"]:
            self.online.apply(gather(self.online.take_pending()))
        else:
            self.online.update()

    def save(self, *, tokenizer, model_family: str, model_name: str, rank: int = 0,
             world_size: int = 1) -> None:
        """Write the online statistics to ``online_save`` (per rank without ``online_merge``)."""
        path = self.cfg["save"]
        if not path or self.online is None:
            return
        if world_size > 1 and not self.cfg["merge"]:
            path = f"{path}.rank{rank}"
        elif rank != 0:
            return
        save_artifact(online_artifact(self.online, tokenizer, model_family=model_family,
                                      task_family=self.family, model_name=model_name,
                                      requests=self.requests), path)

    def info(self) -> dict:
        """What ``get_model_info`` reports: source, size, online settings."""
        sources = {source for _, source in self.by_family.values()}
        out = {"vocab": self.source if len(sources) <= 1 else ", ".join(sorted(sources)),
               "vocab_size": len(self.ids or ()) if self.online is None
               else len(self.online.eligible_ids())}
        if self.online is not None:
            out["online"] = dict(self.online.settings(), updates=self.online.updates)
        return out
