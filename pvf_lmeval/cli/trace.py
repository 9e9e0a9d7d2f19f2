"""``pvf-trace``: render decoding traces as the paper's case-study figure does.

    lm_eval --model pvf-dlm --model_args pretrained=tiny-llada,decoder=pvf,trace=pvf.jsonl ...
    lm_eval --model pvf-dlm --model_args pretrained=tiny-llada,decoder=threshold,trace=thr.jsonl ...
    pvf-trace thr.jsonl pvf.jsonl --html out.html       # side by side, step slider
    pvf-trace pvf.jsonl --ansi --limit 3                 # text, coloured on a terminal

Trace files are JSONL, one record per request (written by the adapter's ``trace=PATH`` model arg,
which a run empties first unless ``trace_append=true``, or by :func:`pvf_lmeval.lmeval.trace_records.trace_record` from a ``decode(..., trace=True)`` result)::

    request      "task/doc_id/idx"
    decoder      decoder name;  model: the ``pretrained`` it ran with
    prompt_ids   prompt token ids;  prompt_text: the last characters of the decoded prompt
    tokens       the gen_length generated ids;  routes: per position base|plan|ar|forced|explore|null
    pieces       decoded text of each generated position up to the last one the decoder
                 committed itself (the early-stop fill after it is not spelled out)
    nfe, gen_tokens, gen_length, block_length, n_steps
    steps        per step: step, committed [[pos, route], ...], nfe (so far), branch_rows,
                 made_call, route (tried), candidates, verified, early_stop_at (positions are
                 generation positions, 0 = first generated token)

No logits are stored: a record is a few kilobytes. Records without ``pieces`` are rendered with
the tokenizer of ``--tokenizer`` (or the record's ``model``) when it loads, else as ``<id>``.

Records of the same request (same key and prompt) from any of the given files are shown side by
side with their step counts; one slider per request replays the canvas filling in, step by step.
The HTML page is self-contained (inline CSS and JS, no network). Every record field in it is
HTML-escaped; terminal output has escape sequences and control characters removed. A torn last
line (a run killed mid-record) is reported and skipped.
"""

from __future__ import annotations

import argparse
import html
import json
import os
import re
import sys
from collections import Counter
from pathlib import Path

from ..files import atomic
from ..lmeval.trace_records import shown_length, token_pieces

#: route -> (label, CSS background, ANSI SGR background). None = early-stop fill.
ROUTE_STYLE = {
    "base": ("high-confidence (base)", "#ffffff", ""),
    "plan": ("planning", "#ffe45c", "48;5;227"),
    "ar": ("AR fallback", "#ffb3c7", "48;5;218"),
    "forced": ("forced (most confident)", "#bcd7ff", "48;5;153"),
    "explore": ("explore", "#b9f0b0", "48;5;157"),
    None: ("early-stop fill", "#e6e6e6", "2"),
}
ROUTE_ORDER = ("base", "plan", "ar", "forced", "explore", None)


def _route_class(route) -> str:
    return f"r-{route or 'fill'}"


# ------------------------------------------------------------------ reading records


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _record_problem(rec) -> str | None:
    """Why ``rec`` is not a renderable trace record (None when it is)."""
    if not isinstance(rec, dict) or "tokens" not in rec or "routes" not in rec:
        return "not a pvf trace record (needs tokens, routes)"
    tokens, routes = rec["tokens"], rec["routes"]
    if not isinstance(tokens, list) or not all(_is_int(t) for t in tokens):
        return "tokens must be a list of token ids"
    if not isinstance(routes, list) or len(routes) != len(tokens) or \
            not all(isinstance(r, (str, type(None))) and r in ROUTE_STYLE for r in routes):
        return (f"routes must list one of {', '.join(r for r in ROUTE_ORDER if r)} or null per "
                f"token")
    pieces = rec.get("pieces")
    if pieces is not None and (not isinstance(pieces, list) or len(pieces) > len(tokens)
                               or not all(isinstance(p, str) for p in pieces)):
        return "pieces must be a list of strings, at most one per token"
    steps = rec.get("steps")
    if steps is not None and (not isinstance(steps, list) or not all(isinstance(s, dict)
                                                                      for s in steps)):
        return "steps must be a list of objects"
    for s in steps or ():
        committed = s.get("committed", [])
        if not isinstance(committed, list) or not all(
                isinstance(c, list) and len(c) == 2 and _is_int(c[0]) for c in committed):
            return "a step's committed must be a list of [position, route] pairs"
        if s.get("early_stop_at") is not None and not _is_int(s["early_stop_at"]):
            return "a step's early_stop_at must be a position"
    if rec.get("n_steps") is not None and not _is_int(rec["n_steps"]):
        return "n_steps must be an integer"
    return None


def load_records(paths, warn=None) -> list[dict]:
    """Every record of the given JSONL files, each tagged with its ``_file``.

    A last line that is not complete JSON (a run killed while writing it) is skipped and
    reported through ``warn`` (default: a line on stderr); any other bad line is an error."""
    warn = warn or (lambda msg: print(msg, file=sys.stderr))
    out = []
    for path in paths:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read().split("\n")
        last = max((n for n, line in enumerate(lines, 1) if line.strip()), default=0)
        for n, line in enumerate(lines, 1):
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except (ValueError, RecursionError) as exc:
                msg = getattr(exc, "msg", type(exc).__name__)
                if n == last:
                    warn(f"pvf-trace: {path}:{n}: torn last record skipped (incomplete JSON: "
                         f"{msg}); the other records are shown")
                    continue
                raise ValueError(f"{path}:{n}: not a JSON record ({msg})") from None
            problem = _record_problem(rec)
            if problem:
                raise ValueError(f"{path}:{n}: {problem}")
            rec["_file"] = str(path)
            out.append(rec)
    return out


def token_steps(rec: dict) -> list[int | None]:
    """1-based step at which each generated position was filled (None: never, e.g. no steps)."""
    L = len(rec["tokens"])
    step_of: list[int | None] = [None] * L
    for n, s in enumerate(rec.get("steps") or [], 1):
        for pos, _route in s.get("committed", []):
            if 0 <= pos < L:
                step_of[pos] = n
        e = s.get("early_stop_at")
        if e is not None:
            for pos in range(e + 1, L):
                if rec["routes"][pos] is None:
                    step_of[pos] = n
    return step_of


def n_steps(rec: dict) -> int:
    if rec.get("steps") is not None:
        return len(rec["steps"])
    return int(rec.get("n_steps") or 0)


def route_counts(rec: dict) -> Counter:
    """Tokens per route (None = early-stop fill) over all generated positions."""
    return Counter(rec["routes"])


def _pieces(rec: dict, tokenizers: dict, tokenizer_name: str | None) -> list[str]:
    n = shown_length(rec["routes"])
    if rec.get("pieces") is not None:
        pieces = list(rec["pieces"])
        return pieces + [f"<{t}>" for t in rec["tokens"][len(pieces):n]]
    name = tokenizer_name or rec.get("model")
    tok = None
    if name:
        if name not in tokenizers:
            try:
                from ..models.loader import checkpoint_folder, load_tokenizer
                from ..models.tokenizer_files import HUB_PATTERNS

                tokenizers[name] = load_tokenizer(checkpoint_folder(name, HUB_PATTERNS))
            except Exception as exc:
                why = str(exc).splitlines()[0] if str(exc).strip() else type(exc).__name__
                print(f"pvf-trace: no tokenizer for {terminal_safe(str(name))!r} "
                      f"({terminal_safe(why)}); showing ids", file=sys.stderr)
                tokenizers[name] = None
        tok = tokenizers[name]
    if tok is None:
        return [f"<{t}>" for t in rec["tokens"][:n]]
    return token_pieces(rec["tokens"][:n], tok)


def group_records(records: list[dict]) -> list[list[dict]]:
    """Records of the same request (key and prompt), in first-seen order."""
    groups: dict[tuple, list[dict]] = {}
    for rec in records:
        key = (rec.get("request"), tuple(rec.get("prompt_ids") or ()))
        groups.setdefault(key, []).append(rec)
    return list(groups.values())


# ------------------------------------------------------------------ ANSI

#: terminal escape sequences (CSI in its ESC and C1 forms, OSC/DCS/APC/PM/SOS strings, two-byte
#: ESC sequences) and
#: the control characters left: C0 but newline and tab, DEL, C1
_ESCAPES = re.compile(r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]?|\x1b[\]PX^_][^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"
                      r"|\x1b[ -~]?|[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def terminal_safe(text: str) -> str:
    """``text`` without terminal control: escape sequences and control characters removed
    (newline and tab kept), so model output cannot retitle, clear or recolour a terminal."""
    return _ESCAPES.sub("", text)


def _step_note(rec: dict, step: int | None) -> str:
    if step is None or not rec.get("steps"):
        return ""
    s = rec["steps"][step - 1]
    note = f"step {step} · NFE {s.get('nfe')}"
    if s.get("route"):
        note += f" · tried {s['route']}"
    if s.get("candidates") is not None:
        note += f" · candidates {s['candidates']} verified {s.get('verified')}"
    return note


#: how plain text (no colour) marks the routes: the base route is unmarked
PLAIN_MARK = {"plan": "plan", "ar": "ar", "forced": "forced", "explore": "explore"}


def _header(rec: dict, counts: Counter) -> str:
    """``request · decoder: N model calls (NFE) in S decode steps · committed tokens by route``."""
    routes = ", ".join(f"{ROUTE_STYLE[r][0] if r else 'early-stop fill'} {counts[r]}"
                       for r in ROUTE_ORDER if counts[r])
    return terminal_safe(f"== {rec.get('request')} · {rec.get('decoder')}: {rec.get('nfe')} model "
                         f"calls (NFE) in {n_steps(rec)} decode steps · tokens by route: {routes}")


def _plain_text(pieces: list[str], routes: list) -> str:
    """Pieces with each run of one non-base route wrapped as ``{route: ...}``."""
    out, k = [], 0
    while k < len(pieces):
        route = routes[k]
        j = k
        while j < len(pieces) and routes[j] == route:
            j += 1
        text = "".join(pieces[k:j])
        out.append(f"{{{PLAIN_MARK[route]}:{text}}}" if route in PLAIN_MARK else text)
        k = j
    return "".join(out)


def render_ansi(groups: list[list[dict]], tokenizer: str | None = None, color: bool = True) -> str:
    """Text of every record, tokens coloured by route (``color``) or marked ``{route: ...}``;
    each record under a header with its model calls, decode steps and tokens per route."""
    tokenizers: dict = {}
    if color:
        legend = "routes: " + "  ".join(
            f"\x1b[{ROUTE_STYLE[r][2]}m {ROUTE_STYLE[r][0]} \x1b[0m" if ROUTE_STYLE[r][2]
            else f"{ROUTE_STYLE[r][0]}: no colour" for r in ROUTE_ORDER)
    else:
        legend = ("routes: high-confidence (base) unmarked, " + ", ".join(
            f"{{{m}:...}} {ROUTE_STYLE[r][0]}" for r, m in PLAIN_MARK.items()))
    out = [legend, "NFE counts model calls, the first one included; a decode step that commits "
                   "without a new call adds none, so NFE and steps can differ."]
    for group in groups:
        for rec in group:
            out.append("")
            out.append(_header(rec, route_counts(rec)))
            pieces = [terminal_safe(p) for p in _pieces(rec, tokenizers, tokenizer)]
            routes = rec["routes"][:len(pieces)]
            if color:
                text = "".join(f"\x1b[{ROUTE_STYLE[r][2]}m{p}\x1b[0m" if ROUTE_STYLE[r][2] else p
                               for p, r in zip(pieces, routes))
            else:
                text = _plain_text(pieces, routes)
            fill = len(rec["tokens"]) - len(pieces)
            if fill:
                text += f" [+{fill} end-of-text fill]"
            out.append(text)
    return "\n".join(out) + "\n"


# ------------------------------------------------------------------ HTML

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:1.2em;color:#222}
h1{font-size:1.3em;margin:.2em 0}
.chip{display:inline-block;padding:1px 6px;margin-right:6px;border:1px solid #bbb;border-radius:3px}
section.group{border-top:1px solid #ccc;margin-top:1.2em;padding-top:.6em}
section.group h2{font-size:1.05em;margin:.2em 0;font-family:ui-monospace,monospace}
.prompt{color:#666;font-family:ui-monospace,monospace;white-space:pre-wrap;font-size:.85em;
  max-height:6em;overflow:auto;background:#fafafa;padding:4px;border-left:3px solid #ddd}
.controls{margin:.5em 0}
.controls input.slider{width:50%;vertical-align:middle}
.panels{display:flex;gap:14px;align-items:flex-start;flex-wrap:wrap}
.panel{flex:1 1 0;min-width:320px;border:1px solid #bbb;border-radius:4px}
.panel h3{font-size:.95em;margin:0;padding:4px 8px;background:#f0f0f0;border-bottom:1px solid #bbb}
.panel .counts{font-size:.8em;padding:2px 8px;color:#444}
.canvas{font-family:ui-monospace,SFMono-Regular,Menlo,monospace;font-size:.9em;line-height:1.7;
  white-space:pre-wrap;padding:6px 8px;word-break:break-word}
.tok{border-radius:2px;padding:1px 0;box-shadow:inset 0 0 0 1px rgba(0,0,0,.08)}
.r-base{background:#ffffff}
.r-plan{background:#ffe45c}
.r-ar{background:#ffb3c7}
.r-forced{background:#bcd7ff}
.r-explore{background:#b9f0b0}
.r-fill{background:#e6e6e6;color:#888}
.tok.masked{background:#d0d0d0 !important;color:transparent !important}
.fillnote{color:#888;font-style:italic}
"""

JS = """
(function(){
  function update(group){
    var s = parseInt(group.querySelector('input.slider').value, 10);
    group.querySelectorAll('.canvas .tok').forEach(function(t){
      var st = parseInt(t.getAttribute('data-step'), 10);
      t.classList.toggle('masked', !(st <= s));
    });
    group.querySelectorAll('.panel').forEach(function(p){
      var n = parseInt(p.getAttribute('data-steps'), 10);
      p.querySelector('.stepnow').textContent = Math.min(s, n);
      var shown = {};
      p.querySelectorAll('.canvas .tok').forEach(function(t){
        if (t.classList.contains('masked')) return;
        var r = t.getAttribute('data-route');
        shown[r] = (shown[r] || 0) + 1;
      });
      p.querySelectorAll('.counts .cnt').forEach(function(c){
        var r = c.getAttribute('data-route');
        // early-stop fill is not spelled out token by token: it counts once its step is reached
        c.textContent = r === 'fill' ? (s >= parseInt(c.getAttribute('data-step'), 10) ? c.getAttribute('data-total') : 0)
                                     : (shown[r] || 0);
      });
    });
    group.querySelector('.stepval').textContent = s;
  }
  document.querySelectorAll('section.group').forEach(function(group){
    var slider = group.querySelector('input.slider');
    slider.addEventListener('input', function(){ update(group); });
    var btn = group.querySelector('button.play'), timer = null;
    btn.addEventListener('click', function(){
      if (timer){ clearInterval(timer); timer = null; btn.textContent = 'play'; return; }
      if (parseInt(slider.value,10) >= parseInt(slider.max,10)) slider.value = 0;
      btn.textContent = 'pause';
      timer = setInterval(function(){
        var v = parseInt(slider.value,10) + 1;
        slider.value = v; update(group);
        if (v >= parseInt(slider.max,10)){ clearInterval(timer); timer = null; btn.textContent = 'play'; }
      }, 120);
    });
    update(group);
  });
})();
"""


def _esc(text: str) -> str:
    """Model text as HTML text (newlines marked); quotes escaped too: safe in attributes."""
    return html.escape(str(text).replace("\n", "\u21b5\n"), quote=True)


def _h(value) -> str:
    """Any record field as HTML text or attribute value."""
    return html.escape(str(value), quote=True)


def _panel(rec: dict, tokenizers: dict, tokenizer: str | None) -> str:
    pieces = _pieces(rec, tokenizers, tokenizer)
    steps_of = token_steps(rec)
    total = n_steps(rec)
    counts = route_counts(rec)
    spans = []
    for pos, (piece, route) in enumerate(zip(pieces, rec["routes"])):
        step = steps_of[pos]
        step_attr = step if step is not None else 0
        note = _step_note(rec, step) or "step ?"
        title = f"position {pos} · {ROUTE_STYLE[route][0]} · {note}"
        spans.append(f'<span class="tok {_route_class(route)}" data-pos="{pos}" '
                     f'data-step="{step_attr}" data-route="{route or "fill"}" '
                     f'title="{html.escape(title)}">{_esc(piece)}</span>')
    fill = len(rec["tokens"]) - len(pieces)
    if fill:
        spans.append(f'<span class="fillnote"> [+{fill} end-of-text fill]</span>')
    # counts up to the slider's step (the script recounts them; written here for the last step)
    fill_step = max((st for st, r in zip(steps_of, rec["routes"]) if r is None and st is not None),
                    default=total)
    count_txt = " · ".join(
        f'<span class="chip {_route_class(r)}">{html.escape(ROUTE_STYLE[r][0])}</span> '
        f'<span class="cnt" data-route="{r or "fill"}"'
        + (f' data-step="{fill_step}" data-total="{counts[r]}"' if r is None else "")
        + f">{counts[r]}</span>" for r in ROUTE_ORDER if counts[r])
    src = html.escape(Path(rec.get("_file", "")).name)
    return (f'<div class="panel" data-decoder="{_h(rec.get("decoder"))}" '
            f'data-steps="{_h(total)}" data-nfe="{_h(rec.get("nfe"))}">'
            f'<h3>{_h(rec.get("decoder"))} — <b class="nsteps">{_h(total)}</b> steps · '
            f'NFE {_h(rec.get("nfe"))} · step <span class="stepnow">{_h(total)}</span> '
            f'<small>({src})</small></h3>'
            f'<div class="counts">{count_txt}</div>'
            f'<div class="canvas">{"".join(spans)}</div></div>')


def render_html(groups: list[list[dict]], tokenizer: str | None = None,
                title: str = "pvf-trace") -> str:
    tokenizers: dict = {}
    legend = "".join(f'<span class="chip {_route_class(r)}">{html.escape(ROUTE_STYLE[r][0])}</span>'
                     for r in ROUTE_ORDER)
    sections = []
    for g, group in enumerate(groups):
        max_steps = max(n_steps(r) for r in group)
        prompt = group[0].get("prompt_text")
        prompt_html = f'<div class="prompt">{_h(prompt)}</div>' if prompt else ""
        panels = "".join(_panel(r, tokenizers, tokenizer) for r in group)
        sections.append(
            f'<section class="group" data-group="{g}">'
            f'<h2>{_h(group[0].get("request"))}</h2>{prompt_html}'
            f'<div class="controls"><label>step <input type="range" class="slider" min="0" '
            f'max="{max_steps}" value="{max_steps}" step="1"></label> '
            f'<span class="stepval">{max_steps}</span> / {max_steps} '
            f'<button class="play" type="button">play</button></div>'
            f'<div class="panels">{panels}</div></section>')
    return (f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<title>{html.escape(title)}</title><style>{CSS}</style></head><body>'
            f'<h1>{html.escape(title)}</h1><div class="legend">{legend} '
            f'<small>hover a token for its step; drag the slider to replay the canvas</small></div>'
            f'{"".join(sections)}<script>{JS}</script></body></html>\n')


# ------------------------------------------------------------------ CLI


def use_color(choice: str, stream) -> bool:
    """``--color``: always, never, or auto = a terminal and no ``NO_COLOR`` (no-color.org)."""
    if choice != "auto":
        return choice == "always"
    return bool(getattr(stream, "isatty", lambda: False)()) and not os.environ.get("NO_COLOR")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="pvf-trace",
        description="Render pvf-dlm decoding traces (trace=PATH JSONL): tokens coloured by the "
                    "route that committed them, records of the same request side by side.")
    ap.add_argument("traces", nargs="+", help="trace JSONL files (one record per request)")
    ap.add_argument("--html", metavar="OUT", help="write a self-contained HTML page")
    ap.add_argument("--ansi", action="store_true",
                    help="print the text with its routes (default without --html)")
    ap.add_argument("--color", choices=["auto", "always", "never"], default="auto",
                    help="colour the routes: auto (default) = only on a terminal and without "
                         "NO_COLOR; never marks routes as {route:...}")
    ap.add_argument("--no-color", dest="color", action="store_const", const="never",
                    help="same as --color=never")
    ap.add_argument("--request", metavar="SUBSTR", help="only requests whose key contains SUBSTR")
    ap.add_argument("--decoder", action="append", help="only these decoders (repeatable)")
    ap.add_argument("--limit", type=int, default=50, help="at most this many requests (default 50; 0 = all)")
    ap.add_argument("--tokenizer", help="tokenizer (pretrained name/folder) for records without pieces")
    args = ap.parse_args(argv)
    try:
        records = load_records(args.traces)
    except (OSError, ValueError) as exc:
        print(f"pvf-trace: {exc}", file=sys.stderr)
        return 2
    if args.request:
        records = [r for r in records if args.request in str(r.get("request"))]
    if args.decoder:
        records = [r for r in records if r.get("decoder") in args.decoder]
    groups = group_records(records)
    if 0 < args.limit < len(groups):
        print(f"pvf-trace: showing the first {args.limit} of {len(groups)} requests (--limit)",
              file=sys.stderr)
        groups = groups[: args.limit]
    if not groups:
        print("pvf-trace: no matching records", file=sys.stderr)
        return 1
    if args.html:
        atomic.write_text(args.html, render_html(groups, args.tokenizer))
        n = sum(len(g) for g in groups)
        print(f"pvf-trace: wrote {args.html} ({len(groups)} requests, {n} traces)")
    if args.ansi or not args.html:
        sys.stdout.write(render_ansi(groups, args.tokenizer, color=use_color(args.color, sys.stdout)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
