"""lm-eval's ``--use_cache`` with pvf-dlm: one decoding per cache, answers read as data only.

lm-eval's ``CachingLM`` keys an answer by its request alone (``hash_args``: the request type,
context and generation kwargs), never by the model args, the weights or the task's name, and
stores it pickled in an SQLite file (``SqliteDict``). A cache file may come from anyone (a
colleague, a shared disk, a downloaded results bundle), so pvf-dlm reads nothing of it with
``pickle``:

- its own records (the decoding identity, the seeds of answers that drew, the decoding of each
  task answered) are JSON text in a table of their own (:data:`TABLE`), read with plain SQL;
- every answer row lm-eval reads back is decoded by :func:`read_answer`, an unpickler that builds
  strings, numbers, tuples, lists, dicts and :class:`GenerationText` and nothing else (no other
  class or function is ever looked up), then checks the answer's shape; anything else is a
  one-line error naming the file.

When ``CachingLM`` hands the database to the model (``set_cache_hook``, before any request),
:meth:`ResponseCache.claim` records the run's decoding identity in an empty database, accepts one
that holds the same, and refuses any other in one line naming what differs. The identity holds
what changes an answer and is known before the first request: the run identity of the report
(model, dtype, decoder and every parameter it reads, vocabulary, truncation, ...; without device
and batch size), ``mc_num``, the weights fingerprint and the tokenizer hash. Two things an answer
depends on are known only per request, so they are recorded as answers are made and checked on
every later claim:

- the seed, only for answers that drew with it (sampled generations, ``explore``'s pick, the
  likelihoods' Monte Carlo masks): a greedy cache serves a run of any ``--seed``;
- each task's decoding (the run's parameters under the task's preset): a cache whose ``arith``
  answers were decoded with ``preset=none`` refuses a run that decodes ``arith`` with its preset.

Answers read back count in the run's totals with the costs of the run that made them
(``from_cache``).
"""

from __future__ import annotations

import io
import json
import math
import pickle
import sqlite3
from typing import Callable

from .generation import GenerationText
from ..one_line import exit_in_one_line
from .stats import MEAN_KEYS

#: pvf-dlm's table in lm-eval's cache file: ``name`` -> JSON ``value``
TABLE = "pvf_dlm"
#: the identity record's name; seeds are ``seed.<kind>``, tasks ``task.<name>``
IDENTITY = "identity"
SEED_KINDS = ("generation", "likelihood")
#: where pvf-lmeval 0.x before this table stored its identity: a pickled row of lm-eval's own
#: table, which is never read (reading it is unpickling it)
PICKLED_IDENTITY_KEY = "pvf-dlm/decoding-identity"
#: where a run computed, which the report's identity holds but a cache may differ in: answers
#: from a CPU run serve a GPU run, whatever the batch size; the seed is recorded per answer kind
NOT_CACHE_IDENTITY = ("device", "batch_size", "seed")
#: the largest record read (an identity is about 1 KiB)
MAX_RECORD_CHARS = 1 << 20
#: how deep and how many values an answer row may hold (an answer is a string with a flat dict
#: of statistics, or a (float, bool) pair): a row built to make the check itself explode fails
MAX_ANSWER_DEPTH = 4
MAX_ANSWER_VALUES = 10_000
ADVICE = "one cache serves one decoding: pass another --use_cache path, or remove that file"


class UntrustedCacheRow(ValueError):
    """An answer row that is not what pvf-dlm or lm-eval writes."""


class _AnswerUnpickler(pickle.Unpickler):
    """Builds the values an answer is made of and refuses every class or function but
    :class:`GenerationText` (strings, numbers, tuples, lists, dicts, True/False/None need no
    look-up)."""

    def find_class(self, module, name):
        if (module, name) == (GenerationText.__module__, GenerationText.__qualname__):
            return GenerationText
        raise UntrustedCacheRow(f"it names {module}.{name}")

    def persistent_load(self, pid):
        raise UntrustedCacheRow("it holds a persistent reference")


def read_answer(blob) -> object:
    """The answer an lm-eval cache row holds (``SqliteDict``'s ``decode``), built without running
    anything: a ``GenerationText`` or string, a float, or a (float, bool) pair. Anything else
    raises :class:`UntrustedCacheRow` saying what the row holds."""
    try:
        value = _AnswerUnpickler(io.BytesIO(bytes(blob))).load()
    except UntrustedCacheRow:
        raise
    except Exception as exc:   # truncated or garbled bytes: pickle's errors are many kinds
        raise UntrustedCacheRow(f"it is not a readable answer ({type(exc).__name__})") from None
    _check_answer(value)
    return value


def _check_answer(value) -> None:
    budget = [MAX_ANSWER_VALUES]

    def plain(v, depth: int) -> None:
        budget[0] -= 1
        if budget[0] < 0 or depth > MAX_ANSWER_DEPTH:
            raise UntrustedCacheRow("it is nested deeper or holds more values than an answer")
        if v is None or isinstance(v, (bool, int, float, str)):
            return
        if isinstance(v, (list, tuple)):
            for x in v:
                plain(x, depth + 1)
            return
        if isinstance(v, dict) and type(v) is dict:
            for k, x in v.items():
                if not isinstance(k, str):
                    raise UntrustedCacheRow("a statistics key is not a string")
                plain(x, depth + 1)
            return
        raise UntrustedCacheRow(f"it holds a {type(v).__name__}")

    if isinstance(value, GenerationText):
        meta = getattr(value, "meta", None)
        if type(meta) is not dict or not (value.task is None or type(value.task) is str):
            raise UntrustedCacheRow("its statistics are not a dict with a task name")
        plain(meta, 1)
        for k in MEAN_KEYS:
            v = meta.get(k)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise UntrustedCacheRow(f"its statistic {k} is {v!r}, not a finite count")
        return
    if type(value) in (str, float, int):
        return
    if (type(value) is tuple and len(value) == 2 and type(value[0]) in (float, int)
            and type(value[1]) is bool):
        return
    raise UntrustedCacheRow(f"it holds a {type(value).__name__}, not an answer")


class ResponseCache:
    """pvf-dlm's claim on one lm-eval cache database (a ``SqliteDict``); see the module."""

    def __init__(self, db, seed: int, task_decoding: Callable[[str], dict]):
        self.db = db
        self.path = db.filename
        self.seed = int(seed)
        self.task_decoding = task_decoding
        self.where = f"--use_cache {self.path}"
        self._recorded: set[str] = set()

    # ------------------------------------------------------------------ the records, plain SQL

    def records(self) -> dict[str, object]:
        """Every record, parsed (a record that is not bounded JSON is a one-line error); none
        when the file has no pvf-dlm table."""
        with sqlite3.connect(self.path, timeout=60) as conn:
            if not conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?",
                                (TABLE,)).fetchone():
                return {}
            rows = conn.execute(f'SELECT name, length(value), value FROM "{TABLE}"').fetchall()
        out = {}
        for name, size, text in rows:
            if not isinstance(name, str) or not isinstance(text, str) or size > MAX_RECORD_CHARS:
                self._refuse(f"its {TABLE} table holds a record that is not pvf-dlm's")
            try:
                out[name] = json.loads(text)
            except ValueError:
                self._refuse(f"its record {name!r} is not JSON")
        return out

    def _write(self, name: str, value) -> None:
        with sqlite3.connect(self.path, timeout=60) as conn:
            conn.execute(f'CREATE TABLE IF NOT EXISTS "{TABLE}" '
                         "(name TEXT PRIMARY KEY, value TEXT NOT NULL)")
            conn.execute(f'INSERT OR IGNORE INTO "{TABLE}" (name, value) VALUES (?, ?)',
                         (name, json.dumps(value, sort_keys=True)))
        self._recorded.add(name)

    def _refuse(self, why: str, advice: str = ADVICE):
        error = ValueError(f"pvf-dlm: {self.where} {why}; {advice}")
        exit_in_one_line(error)
        raise error

    # ------------------------------------------------------------------ the claim

    @classmethod
    def claim(cls, db, identity: dict, *, seed: int, task_decoding: Callable[[str], dict],
              record: Callable[[GenerationText], None]) -> "ResponseCache":
        """Claim ``db`` for a run of ``identity`` (:func:`cache_identity`) whose draws use
        ``seed`` and whose decoding of a task ``task_decoding(task)`` gives; every answer read
        from it is then built by :func:`read_answer` and, when it carries a task, handed to
        ``record``. A database holding another decoding's answers is a one-line ``ValueError``."""
        self = cls(db, seed, task_decoding)
        self._read_as_data(record)          # before anything of the file is read
        if PICKLED_IDENTITY_KEY in db:      # a key look-up: the row itself is never read
            self._refuse("was written by an older pvf-lmeval, whose identity record is a pickle "
                         "(never read: a pickle can run code)", "remove that file")
        recs = self.records()
        held = recs.get(IDENTITY)
        if held is None:
            if len(db):
                self._refuse("holds answers without a pvf-dlm decoding identity (another model "
                             "type, or an older pvf-lmeval)")
            self._write(IDENTITY, identity)
        elif held != identity:
            self._refuse(f"holds the answers of another decoding ({_differences(held, identity)}"
                         ": cached -> this run)")
        for kind in SEED_KINDS:
            drew = recs.get(f"seed.{kind}")
            if drew is not None and drew != self.seed:
                self._refuse(f"holds {kind} answers drawn with seed {drew} and this run draws "
                             f"with seed {self.seed} (greedy generations do not draw; sampled "
                             "ones and likelihoods do)")
        for name, decoding in sorted(recs.items()):
            if name.startswith("task."):
                task = name[len("task."):]
                mine = task_decoding(task)
                if decoding != mine:
                    self._refuse(f"holds answers of task {task} decoded otherwise "
                                 f"({_differences(decoding, mine)}: cached -> this run)")
        return self

    def _read_as_data(self, record: Callable[[GenerationText], None]) -> None:
        """Make the database decode every value it reads with :func:`read_answer` (``decode`` is
        the per-instance hook ``SqliteDict`` offers) and count the answers that carry a task."""
        def read(blob):
            try:
                value = read_answer(blob)
            except UntrustedCacheRow as exc:
                self._refuse(f"holds an answer row that is not an answer ({exc}); it is not "
                             "read, and the file is not to be trusted", "remove that file")
            if isinstance(value, GenerationText) and value.task is not None:
                record(value)
            return value

        self.db.decode = read

    # ------------------------------------------------------------------ what answers depend on

    def answered(self, task: str, *, drew: bool) -> None:
        """Record that this run wrote a generation answer of ``task`` (decoded as
        ``task_decoding(task)``; ``drew``: with random draws, so the seed matters to it)."""
        name = f"task.{task}"
        if name not in self._recorded:
            self._write(name, self.task_decoding(task))
        if drew:
            self.drew("generation")

    def drew(self, kind: str) -> None:
        """Record that this run wrote ``kind`` answers drawn with its seed."""
        name = f"seed.{kind}"
        if name not in self._recorded:
            self._write(name, self.seed)


def _differences(held, mine: dict) -> str:
    from .identity import differences

    return "; ".join(differences(held, mine)) if isinstance(held, dict) else "not a record"


def cache_identity(info: dict, mc_num: int, *, weights: str | None, tokenizer_hash: str) -> dict:
    """The decoding identity of a run described by ``info`` (``config.pvf`` without totals): the
    report's run identity (docs/reports.md) without the device, the batch size and the seed
    (:data:`NOT_CACHE_IDENTITY`), plus ``mc_num`` (the draws of likelihood tasks) and the
    estimator's other settings where they are not the defaults (``identity.likelihood_choices``),
    the weights fingerprint (``models.loader.weights_fingerprint``; None for a model built in
    memory) and the tokenizer's hash (``planning.vocab.tokenizer_hash``)."""
    from .identity import likelihood_choices, run_identity

    ident = run_identity({"config": {"model": "pvf-dlm", "pvf": info}})
    for key in NOT_CACHE_IDENTITY:
        ident.pop(key, None)
    ident.update(mc_num=int(mc_num), weights=weights, tokenizer_hash=tokenizer_hash,
                 **likelihood_choices(info.get("likelihood")))
    return ident
