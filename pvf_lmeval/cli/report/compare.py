"""Entries into a table: duplicates, rows (one per run identity), columns (one per task variant)
and the comparisons with the ``static`` and ``threshold`` runs of the same budget.

A cell's derived values (the paper's bracketed numbers):

* ``acc_delta_static`` (points) and ``acc_delta_se``: change from the static run, with the
  standard error of a difference of two independent means;
* ``nfe_speedup_static`` / ``_threshold``: ``NFE_ref / NFE``;
* ``tps_speedup_static`` / ``_threshold``: ``TPS / TPS_ref``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ...decoding.registry import DECODER_NAMES, REFERENCE_DECODERS
from ...lmeval import identity as ident
from .runs import Entry

#: table order of the decoders this package ships; other model types sort after them
DECODER_ORDER = list(DECODER_NAMES)
REFERENCES = REFERENCE_DECODERS


@dataclass
class Column:
    """One task variant: a task with its version, few-shot count and generation length."""

    key: str
    task: str
    identity: dict
    name: str = ""                # the task, plus what tells it from its other variants


@dataclass
class Row:
    """One run identity (without its task parts) and its entry per column."""

    identity: dict
    entries: dict = field(default_factory=dict)       # column key -> Entry
    cells: dict = field(default_factory=dict)         # column key -> derived values
    label_keys: tuple = ()                            # the settings that tell it from other rows
    label: str = "-"                                  # ... as k=v

    @property
    def model(self) -> str:
        return str(self.identity.get("model"))

    @property
    def decoder(self) -> str:
        return str(self.identity.get("decoder"))

    @property
    def threshold(self) -> float | None:
        """The threshold this row's decoder read (None: it reads none)."""
        return self.identity.get("threshold")


@dataclass
class Table:
    rows: list[Row]
    columns: list[Column]
    notes: list[str]              # duplicates dropped, said out loud
    common: str = "-"             # settings every row shares
    per_decoder: dict = field(default_factory=dict)   # decoder -> settings all its rows share
    #: the results of each identity that more than one results file holds (the gate refuses them)
    duplicates: list = field(default_factory=list)


def drop_duplicates(entries: list[Entry]) -> tuple[list[Entry], list[str], list[list[Entry]]]:
    """One entry per identity: the newest (by the date the run's file states, so a leaderboard
    only; the gate refuses duplicates); a note for each dropped one, and every group of
    entries of one identity (the kept one last)."""
    newest: dict[str, Entry] = {}
    dropped: dict[str, list[Entry]] = {}
    for e in sorted(entries, key=lambda e: (e.date, str(e.path))):
        k = ident.key_of(e.identity)
        if k in newest:
            dropped.setdefault(k, []).append(newest[k])
        newest[k] = e
    notes = []
    for k, old in dropped.items():
        e = newest[k]
        notes.append(f"{len(old) + 1} runs of {describe(e.identity)}: kept the newest ({e.path}), "
                     f"ignored {', '.join(str(o.path) for o in old)}")
    return list(newest.values()), notes, [old + [newest[k]] for k, old in dropped.items()]


def describe(identity: dict) -> str:
    """One line naming an identity: model, decoder, threshold, task, settings."""
    rest = [k for k in identity if k not in ("model", "decoder", "task")]
    return (f"{identity.get('model')} {identity.get('decoder')} / {identity.get('task', '-')} "
            f"[{ident.label(identity, rest)}]")


def _row_order(row: Row):
    dec = DECODER_ORDER.index(row.decoder) if row.decoder in DECODER_ORDER else len(DECODER_ORDER)
    thr = -(row.threshold if isinstance(row.threshold, (int, float)) else 2.0)
    return (row.model, dec, row.decoder, thr, row.label)


def _varying(idents: list[dict], skip) -> set[str]:
    """Keys whose value differs between the identities that have them."""
    values: dict[str, set] = {}
    for d in idents:
        for k, v in d.items():
            values.setdefault(k, set()).add(ident.fmt_value(v))
    return {k for k, vs in values.items() if len(vs) > 1 and k not in skip}


def _shared(idents: list[dict], skip) -> dict:
    """Keys every identity has with the same value."""
    if not idents:
        return {}
    out = {k: v for k, v in idents[0].items() if k not in skip}
    for d in idents[1:]:
        out = {k: v for k, v in out.items() if k in d and d[k] == v}
    return out


def build_table(entries: list[Entry], only_tasks: list[str] | None = None) -> Table:
    """Rows and columns of ``entries`` (duplicates dropped), with the derived cells."""
    from .runs import UsageError

    entries, notes, duplicates = drop_duplicates(entries)
    tasks_seen = sorted({e.task for e in entries})
    if only_tasks:
        missing = [t for t in only_tasks if t not in tasks_seen]
        if missing:
            raise UsageError(f"--tasks: no results for {', '.join(missing)} "
                              f"(have: {', '.join(tasks_seen) or 'none'})")
        entries = [e for e in entries if e.task in only_tasks]
    rows: dict[str, Row] = {}
    columns: dict[str, Column] = {}
    for e in entries:
        run, task = ident.split(e.identity)
        ck = ident.key_of(task)
        columns.setdefault(ck, Column(ck, e.task, task))
        rows.setdefault(ident.key_of(run), Row(run)).entries[ck] = e
    # columns: a task's variants are named by what differs between them
    by_task: dict[str, list[Column]] = {}
    for c in columns.values():
        by_task.setdefault(c.task, []).append(c)
    for task, cols in by_task.items():
        differ = _varying([c.identity for c in cols], {"task"})
        for c in cols:
            c.name = task + (f" [{ident.label(c.identity, differ)}]" if len(cols) > 1 else "")
    order = only_tasks or tasks_seen
    cols = sorted(columns.values(), key=lambda c: (order.index(c.task), c.name))
    # rows: labelled by the settings that vary between the rows that have them
    row_list = list(rows.values())
    idents = [r.identity for r in row_list]
    differ = _varying(idents, ident.COLUMN_KEYS)
    for r in row_list:
        r.label_keys = tuple(sorted(k for k in differ if k in r.identity))
        r.label = ident.label(r.identity, differ)
    row_list.sort(key=_row_order)
    common = _shared(idents, ident.COLUMN_KEYS)
    per_decoder = {}
    for dec in dict.fromkeys(r.decoder for r in row_list):
        mine = _shared([r.identity for r in row_list if r.decoder == dec], ident.COLUMN_KEYS)
        extra = {k: v for k, v in mine.items() if k not in common and k not in differ}
        if extra:
            per_decoder[dec] = ident.label(extra, extra)
    table = Table(row_list, cols, notes, ident.label(common, common), per_decoder, duplicates)
    compute_cells(table)
    return table


def reference(row: Row, rows: list[Row], decoder: str, column: str) -> Row | None:
    """The ``decoder`` row with ``row``'s budget (model, run settings, loop parameters) and a
    result in ``column``; among several, the one with ``row``'s threshold, else 0.9, else the
    first by label."""
    mine = ident.budget(row.identity)
    cands = [r for r in rows if r is not row and r.decoder == decoder and column in r.entries
             and ident.budget(r.identity) == mine]
    want = row.threshold if row.threshold is not None else 0.9
    cands.sort(key=lambda r: (r.threshold != want, r.threshold != 0.9, r.label))
    return cands[0] if cands else None


def compute_cells(table: Table) -> None:
    for row in table.rows:
        for col in table.columns:
            e = row.entries.get(col.key)
            c: dict = {}
            row.cells[col.key] = c
            if e is None:
                continue
            for base in REFERENCES:
                if row.decoder == base:
                    continue
                ref = reference(row, table.rows, base, col.key)
                if ref is None:
                    continue
                r = ref.entries[col.key]
                if base == "static" and e.acc is not None and r.acc is not None:
                    c["acc_delta_static"] = e.acc - r.acc
                    if e.acc_se is not None and r.acc_se is not None:
                        c["acc_delta_se"] = math.hypot(e.acc_se, r.acc_se)
                if e.nfe and r.nfe is not None:
                    c[f"nfe_speedup_{base}"] = r.nfe / e.nfe
                if e.tps is not None and r.tps:
                    c[f"tps_speedup_{base}"] = e.tps / r.tps
                    if (e.batch_size and r.batch_size and e.batch_size != r.batch_size):
                        # a ratio of speeds at different batch sizes measures batching too
                        c[f"tps_batches_{base}"] = (e.batch_size, r.batch_size)
