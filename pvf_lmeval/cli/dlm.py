"""``pvf-dlm``: what the ``--model pvf-dlm`` plugin accepts, printed from the code.

    pvf-dlm args [--markdown]   every --model_args key: default, allowed values, meaning
    pvf-dlm decoders            the decoders and the parameters each reads
    pvf-dlm presets             the PVF presets, their values and the bundled tasks that use them
    pvf-dlm vocab               the bundled planning-vocabulary artifacts (names for vocab=)
    pvf-dlm models              the model families and how a checkpoint folder is recognised
    pvf-dlm published [NAME]    the published settings (LLaDA, Fast-dLLM, the PVF paper); with
                                NAME, the lm_eval command that runs it (--markdown: the table
                                of docs/benchmarks.md)
    pvf-dlm memory ARGS         weights and KV cache per rank, from config.json and the
                                safetensors headers (ARGS: pretrained=PATH,tensor_parallel_size=N,
                                batch_size=B,gen_length=L; see cli/memory.py)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _columns(rows: list[tuple[str, ...]], header: tuple[str, ...]) -> str:
    """Rows as left-aligned columns (the last one unpadded), under ``header``."""
    rows = [header] + rows
    widths = [max(len(r[i]) for r in rows) for i in range(len(header) - 1)]
    return "\n".join("  ".join([c.ljust(w) for c, w in zip(r, widths)] + [r[-1]]).rstrip()
                     for r in rows) + "\n"


def args_text(markdown: bool = False) -> str:
    from ..lmeval.model_args import ALL_ARGS, markdown_table

    if markdown:
        return markdown_table()
    return _columns([(a.name, a.default, a.allowed, a.meaning) for a in ALL_ARGS],
                    ("key", "default", "allowed", "meaning"))


def decoders_text() -> str:
    from ..decoding.param_spec import reads_of
    from ..decoding.registry import DECODERS

    rows = []
    for name, cls in DECODERS.items():
        reads = [r.param.name + (f" (with {r.condition})" if r.when else "")
                 for r in reads_of(cls.reads)]
        if cls.uses_vocab:
            reads.append("vocab")
        rows.append((name, cls.summary, ", ".join(reads) or "-"))
    return _columns(rows, ("decoder", "what it does", "its own parameters"))


def presets_text() -> str:
    from ..decoding.params import PRESETS, preset_defaults
    from ..lmeval.task_presets import TASK_PRESETS

    keys = ("plan_lo", "plan_hi", "ar_lo", "width", "reveal_next")
    rows = [("none", "-", *(str(preset_defaults(None)[k]) for k in keys), "-")]
    for name, family in PRESETS.items():
        values = preset_defaults(name)
        tasks = ", ".join(t for t, p in TASK_PRESETS.items() if p == name) or "-"
        rows.append((name, family, *(str(values[k]) for k in keys), tasks))
    return _columns(rows, ("preset", "task family", *keys, "bundled tasks that use it"))


def vocab_text() -> str:
    from ..planning.vocab import bundled_artifacts

    rows = [(Path(a["_path"]).stem, a["kind"], a["model_family"], a["task_family"],
             str(len(a.get("tokens") or ())), str(a.get("model") or "-"))
            for a in bundled_artifacts()]
    return _columns(rows, ("name (vocab=NAME)", "kind", "model family", "task family", "tokens",
                           "made for"))


def models_text() -> str:
    from ..models.formats import FORMATS, REFUSED
    from ..models.loader import MASK_TOKENS

    rows = []
    for f in FORMATS.values():
        mask = dict(f.generate_defaults).get("mask_token_id")
        mask = "none" if not f.masked else "-" if mask is None else str(mask)
        rows.append((f.title, f.model_type, f.family, ", ".join(f.architectures) or "-",
                     f.attention, "yes" if f.logit_shift else "no", mask))
    table = _columns(rows, ("family", "model_type", "model_family", "or architectures",
                            "attention", "shifted logits", "default mask id"))
    uniform = ", ".join(f.title for f in FORMATS.values() if not f.masked)
    refused = "".join(f"  {t}: {why}\n" for t, why in REFUSED.items())
    return (table + "\nconfig.json is read by its model_type, else by the first class in "
            "architectures listed above; model_type llada with num_experts is LLaDA-MoE (its "
            "released folders say llada).\nmodel_family is the key of planning-vocabulary "
            "artifacts (pvf-calibrate writes it; vocab=auto picks by it).\nThe mask id is "
            "config.json's mask_token_id, else the "
            f"tokenizer's {' / '.join(MASK_TOKENS)}, else the default above.\n"
            f"Uniform-state (no mask token; its canvas starts as random tokens): {uniform}; "
            "decoder=renoise decodes it, and the decoders that fill masked positions refuse it "
            "in one line.\n"
            + (f"Refused with one line:\n{refused}" if refused else ""))


def published_text(name: str | None, markdown: bool = False) -> str:
    from ..lmeval.published import markdown_table, published, published_rows

    if name is not None:
        return published(name).command() + "\n"
    if markdown:
        return markdown_table()
    return _columns([(r.name, r.figure, r.setting) for r in published_rows().values()],
                    ("name", "published figure", "setting"))


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="pvf-dlm", description="What lm_eval --model pvf-dlm accepts, printed from the code.")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    a = sub.add_parser("args", help="every --model_args key: default, allowed values, meaning")
    a.add_argument("--markdown", action="store_true", help="as the README's markdown table")
    sub.add_parser("decoders", help="the decoders and the parameters each reads")
    sub.add_parser("presets", help="the PVF presets and the bundled tasks that use them")
    sub.add_parser("vocab", help="the bundled planning-vocabulary artifacts (names for vocab=)")
    sub.add_parser("models", help="the model families and how a checkpoint folder is recognised")
    pub = sub.add_parser("published", help="the published settings, or the lm_eval command "
                                           "of one")
    pub.add_argument("name", nargs="?", metavar="NAME", help="a published setting")
    pub.add_argument("--markdown", action="store_true",
                     help="as the table of docs/benchmarks.md")
    m = sub.add_parser("memory", help="weights and KV cache per rank, from config.json and the "
                                      "safetensors headers (no weight is read)")
    m.add_argument("spec", metavar="ARGS",
                   help="pretrained=PATH,tensor_parallel_size=N,batch_size=B,gen_length=L"
                        "[,prompt_length=P,dtype=auto|bfloat16|float16|float32,"
                        "parallel_layers=all|experts]")
    return p


def main(argv: list[str] | None = None) -> int:
    """Console script ``pvf-dlm``."""
    ns = parser().parse_args(argv)
    if ns.command == "memory":
        from . import memory

        try:
            text = memory.report(memory.parse(ns.spec))
        except ValueError as error:          # the argument or the folder, in one line
            print(f"pvf-dlm memory: {' '.join(str(error).split())}", file=sys.stderr)
            return 2
        sys.stdout.write(text)
        return 0
    if ns.command == "published":
        try:
            text = published_text(ns.name, ns.markdown)
        except ValueError as error:
            print(f"pvf-dlm published: {error}", file=sys.stderr)
            return 2
        sys.stdout.write(text)
        return 0
    text = {"args": lambda: args_text(ns.markdown), "decoders": decoders_text,
            "presets": presets_text, "vocab": vocab_text, "models": models_text}[ns.command]()
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
