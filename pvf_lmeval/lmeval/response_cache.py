"""lm-eval's ``--use_cache`` with pvf-dlm: one decoding per cache, and the costs of its answers.

lm-eval's ``CachingLM`` keys an answer by its request alone (``hash_args``: the request type,
context and generation kwargs), never by the model args, so a cache written under one decoder
would answer a run of another with the first one's texts and costs, under the second one's name.
When ``CachingLM`` hands its SQLite database to the model (``set_cache_hook``, before any
request), pvf-dlm :func:`claim`\\s it: an empty database gets the run's decoding identity
recorded under :data:`IDENTITY_KEY`; one that holds another identity, or answers without one
(another model type, an older pvf-dlm), is refused in one line naming what differs.

An answer read back is the pickled ``GenerationText`` with its statistics and task:
:func:`count_reads` hands each one to the run's totals, so a run answered from the cache
reports the costs of the run that made the answers (and counts them as ``from_cache``).
"""

from __future__ import annotations

from typing import Callable

from .generation import GenerationText

#: the database key of the identity record (lm-eval's own keys are SHA-256 hex digests)
IDENTITY_KEY = "pvf-dlm/decoding-identity"
#: where a run computed, which the report's identity holds but a cache may differ in: answers
#: from a CPU run serve a GPU run, whatever the batch size
NOT_CACHE_IDENTITY = ("device", "batch_size")


def cache_identity(info: dict, mc_num: int) -> dict:
    """The decoding identity of a run described by ``info`` (``config.pvf`` without totals): the
    report's run identity (model, dtype, decoder and every parameter it reads, seed included,
    planning vocabulary, truncation, ``batch_invariant``; docs/reports.md) without the device
    and batch size, plus ``mc_num`` (the draws of likelihood tasks)."""
    from ..cli.report.identity import run_identity   # pvf-report's package: only when caching

    ident = run_identity({"config": {"model": "pvf-dlm", "pvf": info}})
    for key in NOT_CACHE_IDENTITY:
        ident.pop(key, None)
    ident["mc_num"] = int(mc_num)
    return ident


def claim(db, identity: dict) -> None:
    """Record ``identity`` in the empty database ``db`` (a ``SqliteDict``), accept one that
    holds the same, and refuse any other with a one-line ``ValueError``."""
    held = db.get(IDENTITY_KEY)
    where = f"--use_cache {db.filename}"
    advice = "one cache serves one decoding: pass another --use_cache path, or remove that file"
    if held is None:
        if len(db):
            raise ValueError(f"pvf-dlm: {where} holds answers without a pvf-dlm decoding identity "
                             f"(another model type, or an older pvf-lmeval); {advice}")
        db[IDENTITY_KEY] = identity
        return
    if held != identity:
        from ..cli.report.identity import differences

        raise ValueError(f"pvf-dlm: {where} holds the answers of another decoding "
                         f"({'; '.join(differences(held, identity))}: cached -> this run); {advice}")


def count_reads(db, record: Callable[[GenerationText], None]) -> None:
    """Make every answer ``db`` reads back that carries a task go to ``record`` (the database's
    ``decode`` is the per-instance hook ``SqliteDict`` offers for reading values)."""
    decode = db.decode

    def read(blob):
        value = decode(blob)
        if isinstance(value, GenerationText) and value.task is not None:
            record(value)
        return value

    db.decode = read
