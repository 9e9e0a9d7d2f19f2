"""Accuracy-cost plots (the paper's Pareto figure): one panel per task column, one colour per
decoder (the same in every plot), every run a point with ± one standard error, the Pareto front
of each curve a line, points labelled with the threshold the decoder read."""

from __future__ import annotations

import math
import textwrap
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from ...lmeval import identity as ident
from .compare import Table
from .runs import UsageError

#: KIND -> (cell key, axis label, higher is better)
PLOTS = {"accuracy-nfe": ("nfe", "NFE (mean model calls per request)", False),
         "accuracy-tps": ("tps", "tokens per second", True),
         "accuracy-tpf": ("tpf", "tokens per forward", True)}
DECODER_COLORS = {"static": "#7f7f7f", "threshold": "#1f77b4", "freedave": "#2ca02c",
                  "pvf": "#d62728", "explore": "#9467bd"}
OTHER_COLORS = ["#ff7f0e", "#8c564b", "#e377c2", "#bcbd22", "#17becf"]
MARKERS = ["o", "s", "^", "D", "v", "P", "X"]
#: where a threshold label may go relative to its point (points), tried in this order
LABEL_OFFSETS = [(4, 4), (4, -11), (-4, 4), (-4, -11), (6, 13), (6, -20), (-6, 13), (-6, -20),
                 (12, -3), (-12, -3), (4, 22), (4, -29)]
DPI = 130


def _decoder_rank(decoder: str) -> int:
    order = list(DECODER_COLORS)
    return order.index(decoder) if decoder in order else len(order)


def decoder_color(decoder: str) -> str:
    """The decoder's colour: fixed for the shipped decoders, stable by name for others."""
    if decoder in DECODER_COLORS:
        return DECODER_COLORS[decoder]
    return OTHER_COLORS[zlib.crc32(decoder.encode()) % len(OTHER_COLORS)]


@dataclass
class PlotInfo:
    """What was drawn (for checks): the file, its size in pixels, the error bars, and each
    threshold label's text with its box in pixels (x0, y0, x1, y1)."""

    path: Path
    size: tuple[int, int]
    errorbars: int = 0
    labels: list = field(default_factory=list)


def pareto(points, higher_x_better: bool):
    """Non-dominated (x, acc, ...) points, sorted by x."""
    pts = sorted(points, key=lambda p: (p[0], -p[1]))
    if higher_x_better:
        pts = pts[::-1]
    front, best = [], -math.inf
    for p in pts:
        if p[1] > best:
            front.append(p)
            best = p[1]
    return sorted(front, key=lambda p: p[0])


def check_kind(kind: str) -> None:
    if kind not in PLOTS:
        raise UsageError(f"--plot {kind!r}: KIND must be one of {', '.join(PLOTS)}")


def _place_labels(fig, ax, labels, points) -> list:
    """Annotate each (x, y, text, colour) at the first offset whose box overlaps neither a label
    placed before nor a point; returns (text, box) pairs."""
    renderer = fig.canvas.get_renderer()
    to_px = ax.transData.transform
    r = 4.0   # marker radius in pixels, about
    taken = [(px - r, py - r, px + r, py + r) for px, py in (to_px(p) for p in points)]
    out = []
    for x, y, text, color in labels:
        first = None
        for dx, dy in LABEL_OFFSETS:
            ann = ax.annotate(text, (x, y), textcoords="offset points", xytext=(dx, dy),
                              ha="left" if dx >= 0 else "right", fontsize=7, color=color)
            bb = ann.get_window_extent(renderer)
            box = (bb.x0, bb.y0, bb.x1, bb.y1)
            if not any(_overlap(box, t) for t in taken):
                break
            if first is None:
                first = (dx, dy)
            ann.remove()
        else:   # nowhere free: the first place, overlapping
            dx, dy = first
            ann = ax.annotate(text, (x, y), textcoords="offset points", xytext=(dx, dy),
                              ha="left" if dx >= 0 else "right", fontsize=7, color=color)
            bb = ann.get_window_extent(renderer)
            box = (bb.x0, bb.y0, bb.x1, bb.y1)
        taken.append(box)
        out.append((text, box))
    return out


def _overlap(a, b) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def plot(table: Table, kind: str, out: str, log_x: bool = False) -> PlotInfo:
    check_kind(kind)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
    except ImportError:
        raise UsageError("--plot needs matplotlib: pip install 'pvf-lmeval[plot]'") from None
    xkey, xlabel, higher = PLOTS[kind]
    rows, cols = table.rows, table.columns
    models = sorted({r.model for r in rows})
    ncols = max(1, len(cols))
    fig, axes = plt.subplots(1, ncols, figsize=(max(6.0, 4.8 * ncols), 4.4), squeeze=False,
                             dpi=DPI)
    info = PlotInfo(Path(out), (0, 0))
    pending = []   # (ax, labels, points) placed once the layout is final
    for ax, col in zip(axes[0], cols or [None]):
        curves: dict = {}
        for row in rows:
            e = row.entries.get(col.key) if col is not None else None
            x = getattr(e, xkey, None) if e is not None else None
            if e is None or e.acc is None or x is None or (log_x and x <= 0):
                continue
            rest = {k: row.identity[k] for k in row.label_keys}
            name = row.decoder + (f" [{ident.label(rest, rest)}]" if rest else "")
            if len(models) > 1:
                name = f"{row.model}: {name}"
            curves.setdefault((row.decoder, name), []).append((x, e.acc, e.acc_se, row.threshold))
        labels, points = [], []
        per_decoder: dict = {}
        for (decoder, name), pts in sorted(curves.items(), key=lambda kv: (_decoder_rank(kv[0][0]), kv[0])):
            color = decoder_color(decoder)
            marker = MARKERS[per_decoder.get(decoder, 0) % len(MARKERS)]
            per_decoder[decoder] = per_decoder.get(decoder, 0) + 1
            pts.sort(key=lambda p: (p[0], p[1]))
            ax.errorbar([p[0] for p in pts], [p[1] for p in pts],
                        yerr=[p[2] or 0.0 for p in pts], fmt=marker, color=color, alpha=0.45,
                        ecolor=color, elinewidth=1, capsize=2, markersize=5)
            info.errorbars += sum(p[2] is not None for p in pts)
            front = pareto(pts, higher)
            ax.plot([p[0] for p in front], [p[1] for p in front], "-" + marker, color=color,
                    label=name, markersize=5)
            points += [(p[0], p[1]) for p in pts]
            labels += [(p[0], p[1], f"{p[3]:g}", color) for p in pts if p[3] is not None]
        if log_x:
            ax.set_xscale("log")
            # plain numbers at 1-2-5 steps: 10^x labels of the default overlap on a short range
            ax.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
            ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_title(col.name if col is not None else "(no tasks)")
        ax.set_xlabel(xlabel + (" (log scale)" if log_x else ""))
        ax.set_ylabel("accuracy (%)")
        ax.grid(alpha=0.3, which="both" if log_x else "major")
        if curves:
            ax.legend(fontsize=7)
        else:
            ax.text(0.5, 0.5, f"no runs with accuracy and {xkey}", ha="center", va="center",
                    transform=ax.transAxes)
        pending.append((ax, labels, points))
    title = (f"accuracy vs {xkey.upper()}: lines are each decoder's Pareto front, points are runs "
             "(± one standard error) labelled with the threshold the decoder read")
    sub = " ".join(([models[0]] if len(models) == 1 else [])
                   + ([table.common] if table.common != "-" else []))
    width = int(fig.get_figwidth() * 15)      # characters of 8-point text across the figure
    fig.suptitle("\n".join(textwrap.wrap(title, width) + textwrap.wrap(sub, width)), fontsize=8)
    fig.tight_layout()
    fig.canvas.draw()
    for ax, labels, points in pending:
        info.labels += _place_labels(fig, ax, labels, points)
    info.path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(info.path, dpi=DPI)
    w, h = fig.get_size_inches()
    info.size = (round(w * DPI), round(h * DPI))
    plt.close(fig)
    return info
