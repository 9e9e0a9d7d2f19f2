"""``pvf-calibrate``: build a planning-vocabulary artifact from unlabeled prompts.

The command line over :mod:`pvf_lmeval.planning.calibrate` (the calibration itself lives there).
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import signal
import sys
from pathlib import Path

import torch

from ..planning.calibrate import (CalibConfig, CalibrationError, _write_json, build_artifact,
                                  config_hash, fingerprint, load_prompts, run_calibration)
from ..planning.vocab import TASK_FAMILIES, tokenizer_hash


def _band(text: str) -> tuple[float, float]:
    try:
        lo, hi = (float(x) for x in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--band {text!r} must be lo:hi") from None
    if not 0 <= lo < hi <= 1:
        raise argparse.ArgumentTypeError(f"--band {text!r} must satisfy 0 <= lo < hi <= 1")
    return lo, hi


def default_out(model: str, family: str) -> Path:
    """``<user folder>/<model>.<family>.calibrated.json``: never inside the installed package,
    whose artifacts are read-only data."""
    from ..files.paths import user_vocab_dir

    stem = Path(model.rstrip("/")).name.lower()
    return user_vocab_dir() / f"{stem}.{family}.calibrated.json"


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="pvf-calibrate", description="Calibrate a PVF planning vocabulary on unlabeled prompts "
        "(threshold decoding; A and VIG of every in-band candidate; per-token filters).")
    ap.add_argument("--model", required=True, help="checkpoint folder, hub id, tiny-llada or tiny-dream")
    ap.add_argument("--data", required=True,
                    help="FILE.jsonl or TASK (a pvf-lmeval task with data/calibration.jsonl, or an "
                         "lm-eval task: its train/validation split)")
    ap.add_argument("--family", required=True, help=f"task family: {', '.join(TASK_FAMILIES)}")
    ap.add_argument("--out", type=Path, default=None,
                    help="artifact path (default: <model>.<family>.calibrated.json in "
                         "$PVF_LMEVAL_HOME/vocab, else $XDG_CACHE_HOME/pvf_lmeval/vocab, else "
                         "~/.cache/pvf_lmeval/vocab; vocab=auto looks there too, before the "
                         "bundled artifacts)")
    ap.add_argument("--limit", type=int, default=None, help="first N prompts only")
    ap.add_argument("--template", default=None, help="Python format string over a record's fields")
    ap.add_argument("--prompt-field", default=None, help="record field holding the prompt")
    ap.add_argument("--apply-chat-template", action="store_true",
                    help="wrap each prompt as a user turn of the tokenizer's chat template")
    ap.add_argument("--gen-length", type=int, default=256)
    ap.add_argument("--block-length", type=int, default=None,
                    help="block size B (default: a block-diffusion model's block size, else 32)")
    ap.add_argument("--threshold", type=float, default=0.9, help="tau_high of the base rule")
    ap.add_argument("--band", type=_band, default=(0.15, 0.25), help="calibration band lo:hi")
    ap.add_argument("--reveal-next", type=int, default=0, help="N_s for the working set")
    ap.add_argument("--no-early-stop", action="store_true")
    ap.add_argument("--width", type=int, default=16,
                    help="rows per physical model call, across the batch (more rows: more calls)")
    ap.add_argument("--batch-size", type=int, default=1,
                    help="prompts decoded together (on a GPU 16-64, with --width 64 or more)")
    ap.add_argument("--min-n", type=int, default=50)
    ap.add_argument("--min-m", type=int, default=20)
    ap.add_argument("--rho-ver", type=float, default=0.9, help="minimum pass rate r_v")
    ap.add_argument("--gamma-vig", type=float, default=0.03, help="minimum mean VIG_v")
    ap.add_argument("--device", default=None)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    ap.add_argument("--save-every", type=int, default=20, help="prompts between partial saves")
    ap.add_argument("--restart", action="store_true", help="ignore an existing partial state")
    ap.add_argument("--no-progress", action="store_true")
    return ap


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser().parse_args(argv)
    previous = signal.getsignal(signal.SIGTERM)

    def on_term(signum, frame):     # a batch scheduler's preemption: save, like Ctrl-C
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    try:
        return _main(args, argv)
    except (CalibrationError, ValueError) as exc:
        print(f"pvf-calibrate: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("pvf-calibrate: interrupted; partial statistics saved, run the same command to "
              "continue", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)


def _main(args, argv) -> int:
    if args.family not in TASK_FAMILIES:
        raise CalibrationError(f"--family {args.family!r} is not one of {', '.join(TASK_FAMILIES)}")
    for name in ("width", "batch_size", "save_every", "gen_length", "block_length", "min_n",
                 "min_m"):
        value = getattr(args, name)
        if value is not None and value < (0 if name.startswith("min") else 1):
            raise CalibrationError(f"--{name.replace('_', '-')}={value} is out of range")
    if args.threads:
        torch.set_num_threads(args.threads)
    prompts, data_desc = load_prompts(args.data, template=args.template,
                                      prompt_field=args.prompt_field)
    if args.limit is not None:
        prompts = prompts[: args.limit]
        data_desc["limit"] = args.limit
    out = args.out or default_out(args.model, args.family)
    # checked now with what the model cannot change: without --block-length, gen_length stands
    # for the one block until the model gives its own
    cfg = CalibConfig(gen_length=args.gen_length,
                      block_length=args.block_length or args.gen_length,
                      threshold=args.threshold, band=tuple(args.band),
                      reveal_next=args.reveal_next, early_stop=not args.no_early_stop,
                      width=args.width, min_n=args.min_n, min_m=args.min_m,
                      rho_ver=args.rho_ver, gamma_vig=args.gamma_vig)

    from ..decoding.blocks import block_size_of
    from ..models import load_model

    model = load_model(args.model, device=args.device, dtype=args.dtype)
    if args.block_length is None:     # a block-diffusion model's own, else the default
        cfg = dataclasses.replace(cfg, block_length=block_size_of(model) or CalibConfig.block_length)
    tok = model.tokenizer
    if args.apply_chat_template:
        if not getattr(tok, "chat_template", None):
            raise CalibrationError(f"--apply-chat-template: the tokenizer of {args.model!r} has none")
        from ..models.chat_render import RENDERER      # time, memory and output limits

        try:
            prompts = [RENDERER.render(tok, [{"role": "user", "content": p}],
                                       add_generation_prompt=True, continue_final_message=False,
                                       where=repr(args.model)) for p in prompts]
        except ValueError as exc:
            raise CalibrationError(str(exc).removeprefix("pvf-dlm: ")) from None
    ids = [tok.encode(p, add_special_tokens=False) for p in prompts]
    too_long = [i for i, p in enumerate(ids) if len(p) + cfg.gen_length > model.max_length]
    if too_long:
        raise CalibrationError(f"calibration data {data_desc.get('path', args.data)}: prompt "
                               f"{too_long[0] + 1} + gen_length={cfg.gen_length} exceeds the "
                               f"model's context of {model.max_length} tokens")
    model_desc = {"name": args.model, "config_hash": config_hash(model),
                  "tokenizer": tokenizer_hash(tok),
                  "weights": getattr(model, "weights_fingerprint", None)}
    fp = fingerprint(model_desc, data_desc, len(ids), cfg, args.apply_chat_template,
                     args.batch_size)
    out.parent.mkdir(parents=True, exist_ok=True)
    state = out.with_name(out.name + ".partial")
    if args.restart and state.exists():
        state.unlink()
    elif state.exists():
        print(f"pvf-calibrate: resuming from {state}", file=sys.stderr)
    tally, finished, spent = run_calibration(model, ids, cfg, state_path=state, fp=fp,
                                             save_every=args.save_every,
                                             progress=not args.no_progress,
                                             batch_size=args.batch_size)
    command = "pvf-calibrate " + " ".join(shlex.quote(a) for a in argv)
    art = build_artifact(tally, cfg, tokenizer=tok, model_family=model.family,
                         task_family=args.family, model_name=args.model,
                         model_config_hash=model_desc["config_hash"], data_desc=data_desc,
                         model_weights=model_desc["weights"],
                         n_prompts=len(ids), chat=args.apply_chat_template, runtime_s=spent,
                         command=command)
    _write_json(out, art)
    if state.exists():
        state.unlink()
    print(f"pvf-calibrate: {out}: kept {len(art['tokens'])} of {art['calibration']['tokens_seen']} "
          f"tokens ({int(tally.counters['events'])} events, {len(ids)} prompts, {spent:.0f} s)",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
