"""What the tiny-fixture benchmarks share: the held-out `arith` (or `arith_var`) items, their
prompts (the task's ``doc_to_text``), the task's answer extraction, and the arguments that select
them."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ARITH = REPO / "tasks" / "arith"
#: the offline tasks of the tiny fixtures: folder and generation length (the YAML's max_gen_toks)
TASKS = {"arith": (ARITH, 96), "arith_var": (REPO / "tasks" / "arith_var", 256)}
FIXTURES = ("tiny-llada", "tiny-dream")


def add_arguments(ap, *, fixtures_default=list(FIXTURES), fixtures_help=None, limit_default=None,
                  limit_help="first N held-out items (default: all)", task_option=False) -> None:
    """``--fixtures``, ``--limit``, ``--gen-length`` (96) and ``--block-length`` (32); with
    ``task_option``, also ``--task`` (arith, arith_var), and ``--gen-length`` defaults to the
    task's (call ``task_gen_length(args)`` after parsing)."""
    ap.add_argument("--fixtures", nargs="+", default=fixtures_default, help=fixtures_help)
    ap.add_argument("--limit", type=int, default=limit_default, help=limit_help)
    if task_option:
        ap.add_argument("--task", choices=list(TASKS), default="arith")
        ap.add_argument("--gen-length", type=int, default=None, help="default: the task's (96, 256)")
    else:
        ap.add_argument("--gen-length", type=int, default=96)
    ap.add_argument("--block-length", type=int, default=32)


def task_gen_length(args) -> None:
    """Fills ``args.gen_length`` with the task's generation length when it was not given."""
    if args.gen_length is None:
        args.gen_length = TASKS[args.task][1]


def held_out(limit: int | None = None, task: str = "arith") -> list[dict]:
    """The first ``limit`` (all when None) held-out items of ``task``: question, answer, target."""
    with open(TASKS[task][0] / "data" / "test.jsonl") as f:
        docs = [json.loads(line) for line in f]
    return docs[:limit] if limit else docs


def prompt_ids(tokenizer, docs: list[dict]) -> list[list[int]]:
    """Token ids of each item's prompt, as the `arith` tasks render it (no chat template)."""
    return [tokenizer.encode(f"Question: {d['question']}\nAnswer:", add_special_tokens=False)
            for d in docs]


def extract_answer(task: str = "arith"):
    """The task's answer extraction (``tasks/<task>/utils.py``), loaded from its file."""
    spec = importlib.util.spec_from_file_location(f"{task}_utils", TASKS[task][0] / "utils.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.extract_answer
