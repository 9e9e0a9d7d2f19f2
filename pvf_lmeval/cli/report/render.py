"""The leaderboard as text, markdown or CSV."""

from __future__ import annotations

import csv
import io

from .compare import Table

#: (key, header) of each column group's columns in text and markdown
COLUMNS = [
    ("n", "n"),
    ("acc", "acc ± se"),
    ("acc_delta_static", "Δs ± se"),
    ("nfe", "NFE"),
    ("nfe_speedup_static", "NFE×s"),
    ("nfe_speedup_threshold", "NFE×t"),
    ("tpf", "TPF"),
    ("tps", "TPS"),
    ("tps_speedup_static", "TPS×s"),
    ("tps_speedup_threshold", "TPS×t"),
]
#: every value of a column group in CSV (raw numbers, standard errors separate)
CSV_KEYS = ["n", "acc", "acc_se", "acc_metric", "acc_delta_static", "acc_delta_se", "nfe",
            "branch_rows", "nfe_speedup_static", "nfe_speedup_threshold", "tpf", "tps",
            "tps_speedup_static", "tps_speedup_threshold", "edits", "remasks"]
LEAD = ["model", "decoder", "thr", "settings"]
LEGEND = ("n: items; acc: accuracy (%) ± one standard error; Δs: change from the static run "
          "(points) ± the standard error of the difference; NFE: model calls per request; "
          "TPF/TPS: tokens per forward/second; ×s, ×t: speedup over the static / threshold run "
          "of the same model and settings (NFE_ref/NFE, TPS/TPS_ref; \"batch a vs b\": the two "
          "runs' batch sizes differ, so TPS× measures batching too); thr: the threshold "
          "(- where the decoder reads none)")


def values(table: Table, row, col) -> dict:
    """Every value of one cell: the entry's measurements and the derived comparisons."""
    e = row.entries.get(col.key)
    out = dict.fromkeys(CSV_KEYS)
    if e is not None:
        out.update(n=e.n, acc=e.acc, acc_se=e.acc_se, acc_metric=e.acc_metric, nfe=e.nfe,
                   branch_rows=e.branch_rows, tpf=e.tpf, tps=e.tps, edits=e.edits,
                   remasks=e.remasks)
    out.update(row.cells.get(col.key) or {})
    return out


def _pm(v, se, sign: bool) -> str:
    if v is None:
        return ""
    s = f"{v:+.2f}" if sign else f"{v:.2f}"
    return s + (f" ± {se:.2f}" if se is not None else "")


def _fmt(key: str, c: dict) -> str:
    v = c.get(key)
    if key == "acc":
        return _pm(v, c.get("acc_se"), False)
    if key == "acc_delta_static":
        return _pm(v, c.get("acc_delta_se"), True)
    if v is None:
        return ""
    if "speedup" in key:
        batches = c.get(key.replace("tps_speedup", "tps_batches")) if key.startswith("tps") else None
        return f"{v:.2f}x" + (f" (batch {batches[0]} vs {batches[1]})" if batches else "")
    if key == "n":
        return str(v)
    return f"{v:.2f}"


def _threshold(row, dash: str) -> str:
    return dash if row.threshold is None else f"{row.threshold:g}"


def footer(table: Table) -> list[str]:
    """The settings the rows share and what each column is."""
    lines = [f"settings of every row: {table.common}"]
    lines += [f"settings of every {dec} row: {s}" for dec, s in table.per_decoder.items()]
    from ...lmeval.identity import label

    for col in table.columns:
        rest = {k: v for k, v in col.identity.items() if k != "task"}
        lines.append(f"{col.name}: {label(rest, rest)}")
    return lines


def render(table: Table, fmt: str = "text") -> str:
    cols = table.columns
    if fmt == "csv":
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(LEAD + [f"{c.name}:{k}" for c in cols for k in CSV_KEYS])
        for row in table.rows:
            vals = [row.model, row.decoder, _threshold(row, ""), row.label]
            for c in cols:
                v = values(table, row, c)
                vals += ["" if v[k] is None else (f"{v[k]:.6g}" if isinstance(v[k], float) else v[k])
                         for k in CSV_KEYS]
            w.writerow(vals)
        return buf.getvalue()
    body = [[row.model, row.decoder, _threshold(row, "—" if fmt == "markdown" else "-"), row.label]
            + [_fmt(k, values(table, row, c)) for c in cols for k, _ in COLUMNS] for row in table.rows]
    notes = footer(table)
    if fmt == "markdown":
        head = LEAD + [f"{c.name} {h}" for c in cols for _, h in COLUMNS]
        align = ["---"] * len(LEAD) + ["---:"] * (len(head) - len(LEAD))
        lines = ["| " + " | ".join(head) + " |", "|" + "|".join(align) + "|"]
        lines += ["| " + " | ".join(r) + " |" for r in body]
        return "\n".join(lines) + "\n\n" + "".join(f"- {n}\n" for n in notes)
    # text: a task header line spanning each column group
    head = LEAD + [h for _ in cols for _, h in COLUMNS]
    widths = [max(len(head[i]), *(len(r[i]) for r in body)) if body else len(head[i])
              for i in range(len(head))]
    ncol, sep = len(COLUMNS), "  "
    for j, c in enumerate(cols):  # widen a group so that its name fits
        span = slice(len(LEAD) + j * ncol, len(LEAD) + (j + 1) * ncol)
        need = len(c.name) - (sum(widths[span]) + len(sep) * (ncol - 1))
        if need > 0:
            widths[span.stop - 1] += need
    group = [" " * widths[i] for i in range(len(LEAD))]
    for j, c in enumerate(cols):
        width = sum(widths[len(LEAD) + j * ncol: len(LEAD) + (j + 1) * ncol]) + len(sep) * (ncol - 1)
        group.append(c.name.center(width, "-" if len(c.name) + 2 < width else " "))

    def line(vals) -> str:
        return sep.join(v.ljust(widths[i]) if i < len(LEAD) else v.rjust(widths[i])
                        for i, v in enumerate(vals)).rstrip()

    lines = [sep.join(group).rstrip(), line(head)] + [line(r) for r in body]
    return "\n".join(lines) + "\n\n" + "\n".join(notes + [LEGEND]) + "\n"
