"""Train a tiny diffusion LM fixture (``tiny-llada`` or ``tiny-dream``) on the synthetic arith tasks.

LLaDA's SFT objective: per example t ~ U(0, 1), each answer-area token is masked with probability
t, cross-entropy on the masked tokens weighted by 1/t, normalised by the answer-area length; the
prompt is never masked. The answer area is the task's generation length (``ANSWER_LEN``: 96 for
`arith`, 256 for `arith_var`): the solution, an end-of-turn token in chat format, then end-of-text
padding, as in LLaDA's SFT. A share of the prompts is wrapped in the fixture's chat template so
that ``--apply_chat_template`` works too. ``--var-share`` mixes the two tasks: each batch is drawn
from one task (so that its answer areas have one length), `arith_var` with that probability.

From scratch the tokenizer is a byte-level BPE trained on a fixed corpus of both tasks
(``tokenizers_build.fixture_corpus``), or the one of ``--tokenizer-from``; ``--init-from``
continues a checkpoint and keeps its tokenizer. Runs on any device (``--device``, CUDA when
present); ``--time-budget S`` times a few steps there and sets ``--steps`` so that the steps end
S seconds after the start (the value lands in training.json). Training items are drawn fresh up
to ``POOL`` per task, then cycled.

    python scripts/tiny_fixtures/train.py --family llada --out pvf_lmeval/fixtures/tiny-llada
    python scripts/tiny_fixtures/train.py --family dream --steps 20 --out /tmp/smoke   # smoke run

Seeded: the same arguments give the same checkpoint (on the same torch build, device and thread
count).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent.parent))

import arith_var_data  # noqa: E402
from arith_data import SPLITS, make_split  # noqa: E402
from tokenizers_build import DREAM_SPECIALS, LLADA_SPECIALS, fixture_corpus, train_bpe, write_tokenizer  # noqa: E402

from pvf_lmeval.models.formats import DREAM, LLADA  # noqa: E402
from pvf_lmeval.models.loader import save_checkpoint  # noqa: E402
from pvf_lmeval.models.transformer import BidirectionalTransformer, TransformerConfig  # noqa: E402

ANSWER_LEN = {"arith": 96, "arith_var": 256}
CHAT_SHARE = 0.3
# Training items per task at most; a longer run cycles through them again, reshuffled.
# Drawing fresh items for every step of a long GPU run would cost minutes of host time.
POOL = 60_000


def raw_prompt(q: str) -> str:
    return f"Question: {q}\nAnswer:"


def chat_prompt(q: str, family: str) -> str:
    # Must equal the fixture's chat template applied to [{"role": "user", "content": raw_prompt(q)}];
    # checked against the template once at start-up.
    content = raw_prompt(q).strip()
    if family == "llada":
        return (f"<|startoftext|><|start_header_id|>user<|end_header_id|>\n\n{content}<|eot_id|>"
                "<|start_header_id|>assistant<|end_header_id|>\n\n")
    return ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
            f"<|im_start|>user\n{content}<|im_end|>\n<|im_start|>assistant\n")


def encode_items(tok, items, family, ids, rng, answer_len):
    """[(prompt_ids, answer_area_ids)] with the answer area padded to ``answer_len``."""
    eos = ids["<|endoftext|>"]
    eot = ids["<|eot_id|>" if family == "llada" else "<|im_end|>"]
    chat = [rng.random() < CHAT_SHARE for _ in items]
    prompts = tok.encode_batch([chat_prompt(it["question"], family) if c else raw_prompt(it["question"])
                                for it, c in zip(items, chat)])
    answers = tok.encode_batch([it["answer"] if c else " " + it["answer"] for it, c in zip(items, chat)])
    out, too_long = [], 0
    for p, a, c in zip(prompts, answers, chat):
        a = a.ids + ([eot] if c else [])
        if len(a) > answer_len:
            too_long += 1
            continue
        out.append((p.ids, a + [eos] * (answer_len - len(a))))
    return out, too_long


def var_training_items(seed, count, exclude, tok):
    """``count`` arith_var training items with answers of MIN_TOKENS..MAX_TOKENS tokens under
    ``tok``: unfiltered draws filtered in one batched encode (the task data's per-item filter
    keeps the same distribution, but is too slow for a pool of this size). A draw that keeps
    too few is redone larger (the same seed, so the items kept before stay first)."""
    lo, hi = arith_var_data.MIN_TOKENS, arith_var_data.MAX_TOKENS
    n = int(count * 1.5) + 100
    while True:
        items = arith_var_data.make_split(seed, n, exclude)
        lens = [len(e.ids) for e in tok.encode_batch([" " + it["answer"] for it in items])]
        kept = [it for it, k in zip(items, lens) if lo <= k <= hi]
        if len(kept) >= count:
            return kept[:count]
        if n > 20 * count:
            raise SystemExit(f"train.py: only {len(kept)} of {n} arith_var answers are {lo}-{hi} "
                             f"tokens under this tokenizer; need {count}")
        n *= 2


def batch_tensors(rows, pad_id):
    """Left-pad prompts; returns tokens [N, T], attention mask [N, T], answer start column."""
    plen = max(len(p) for p, _ in rows)
    answer_len = len(rows[0][1])
    tokens = torch.full((len(rows), plen + answer_len), pad_id, dtype=torch.long)
    mask = torch.zeros_like(tokens)
    for r, (p, a) in enumerate(rows):
        tokens[r, plen - len(p):plen] = torch.tensor(p)
        tokens[r, plen:] = torch.tensor(a)
        mask[r, plen - len(p):] = 1
    return tokens, mask, plen


def diffusion_loss(net, tokens, attn, start, mask_id, gen, shift=0):
    """``shift`` = 1 for Dream-layout checkpoints: the output at i-1 predicts position i."""
    n = tokens.shape[0]
    # Drawn on the host generator, so that a run is the same on every device.
    t = (torch.rand(n, 1, generator=gen) * (1 - 1e-3) + 1e-3).to(tokens.device)
    masked = torch.zeros_like(tokens, dtype=torch.bool)
    masked[:, start:] = torch.rand(n, tokens.shape[1] - start, generator=gen).to(tokens.device) < t
    noisy = tokens.masked_fill(masked, mask_id)
    hidden = net.hidden(noisy, attn)
    rows, cols = masked.nonzero(as_tuple=True)
    logits = net.head(hidden[rows, cols - shift])
    ce = F.cross_entropy(logits, tokens[masked], reduction="none")
    weight = (1.0 / t).expand_as(masked)[masked]
    return (ce * weight).sum() / (n * (tokens.shape[1] - start))


@torch.no_grad()
def quick_eval(net, rows, targets, tok, mask_id, eos_ids, pad_id, block=32, tau=0.9, shift=0):
    """Batched threshold decoding (blocks of ``block``) -> exact match on the #### number and the
    batch's model calls."""
    answer_len = len(rows[0][1])
    tokens, attn, plen = batch_tensors([(p, [mask_id] * answer_len) for p, _ in rows], pad_id)
    device = next(net.parameters()).device
    tokens, attn = tokens.to(device), attn.to(device)
    calls = 0
    for b0 in range(plen, plen + answer_len, block):
        while True:
            still = tokens[:, b0:b0 + block] == mask_id
            if not still.any():
                break
            probs = net(tokens, attn)[:, b0 - shift:b0 + block - shift].float().softmax(-1)
            probs[..., mask_id] = 0
            conf, top = probs.max(-1)
            calls += 1
            conf = conf.masked_fill(~still, -1)
            pick = (conf >= tau) | (conf == conf.max(-1, keepdim=True).values)
            pick &= still
            tokens[:, b0:b0 + block] = torch.where(pick, top, tokens[:, b0:b0 + block])
    correct = 0
    for r in range(len(rows)):
        ids = tokens[r, plen:].tolist()
        cut = next((i for i, x in enumerate(ids) if x in eos_ids), len(ids))
        text = tok.decode(ids[:cut])
        got = text.rsplit("####", 1)[-1].strip() if "####" in text else None
        correct += got == targets[r]
    return correct / len(rows), calls


def time_steps(net, rows, pad_id, mask_id, shift, args, n=25, skip=5) -> float:
    """Seconds per training step of ``net`` on this device (a throwaway copy and optimiser, the
    longest task's first batch; the run's own random streams are not touched)."""
    import copy

    probe = copy.deepcopy(net)
    opt = torch.optim.AdamW(probe.parameters(), lr=1e-4)
    task = "arith_var" if "arith_var" in rows else "arith"
    tokens, attn, start = batch_tensors(rows[task][:args.batch], pad_id)
    tokens, attn = tokens.to(args.device), attn.to(args.device)
    gen = torch.Generator().manual_seed(12345)
    sync = torch.cuda.synchronize if tokens.is_cuda else (lambda: None)
    for i in range(n):
        if i == skip:
            sync()
            t0 = time.perf_counter()
        loss = diffusion_loss(probe, tokens, attn, start, mask_id, gen, shift)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(probe.parameters(), 1.0)
        opt.step()
        batch_tensors(rows[task][:args.batch], pad_id)     # the host work of a real step
    sync()
    return (time.perf_counter() - t0) / (n - skip)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="train.py", description=__doc__.splitlines()[0])
    ap.add_argument("--family", choices=["llada", "dream"], required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--d-model", type=int, default=128,
                    help="width of a model trained from scratch (MLP 3x; the bundled fixtures: 128)")
    ap.add_argument("--layers", type=int, default=4, help="layers of a model trained from scratch")
    ap.add_argument("--heads", type=int, default=4,
                    help="attention heads (even; Dream-layout models get half as many KV heads)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--eval-items", type=int, default=200)
    ap.add_argument("--eval-every", type=int, default=500,
                    help="steps between held-out checks (0 = only at the end)")
    ap.add_argument("--check-items", type=int, default=100,
                    help="held-out items per task in each periodic check")
    ap.add_argument("--init-from", type=Path, default=None,
                    help="continue from this fixture folder (a further training stage with fresh data); "
                         "its tokenizer is kept")
    ap.add_argument("--data-seed", type=int, default=None,
                    help="seed of the training items (default: --seed); use a new one per stage")
    ap.add_argument("--var-share", type=float, default=0.0,
                    help="probability that a batch is drawn from arith_var instead of arith")
    ap.add_argument("--tokenizer-from", type=Path, default=None,
                    help="take tokenizer.json from this folder instead of training the BPE (with "
                         "from-scratch weights); its BPE must be the fixtures' one")
    ap.add_argument("--time-budget", type=float, default=None,
                    help="wall seconds from the start of the script to the end of the training "
                         "steps: times a few steps on this device and sets --steps to fit what is "
                         "left after data preparation (recorded in training.json; rerun with that "
                         "--steps to reproduce the run)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                    help="torch device to train on (default: cuda when available, else cpu)")
    args = ap.parse_args(argv)
    started = time.time()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)

    if not 0.0 <= args.var_share <= 1.0:
        ap.error(f"--var-share must lie in [0, 1], got {args.var_share}")
    if args.heads < 2 or args.heads % 2 or args.d_model < args.heads or args.d_model % args.heads:
        ap.error(f"--heads must be even and divide --d-model, got {args.heads} and {args.d_model}")
    if args.layers < 1:
        ap.error(f"--layers must be at least 1, got {args.layers}")
    if args.init_from is not None and args.tokenizer_from is not None:
        ap.error("--init-from keeps its checkpoint's tokenizer; drop --tokenizer-from")
    # The tokenizer first: arith_var's length filter measures answers with it.
    keep_from = args.init_from or args.tokenizer_from
    if keep_from is not None:
        # Keep the given tokenizer (artifacts key on its ids).
        import shutil

        args.out.mkdir(parents=True, exist_ok=True)
        for name in ("tokenizer.json", "tokenizer_config.json"):
            if (keep_from / name).resolve() != (args.out / name).resolve():
                shutil.copy(keep_from / name, args.out / name)
    else:
        write_tokenizer(train_bpe(fixture_corpus()), args.out, args.family)
    tok = Tokenizer.from_file(str(args.out / "tokenizer.json"))
    ids = {t: tok.token_to_id(t) for t in (LLADA_SPECIALS if args.family == "llada" else DREAM_SPECIALS)}
    assert None not in ids.values(), \
        f"{args.out / 'tokenizer.json'} is not a {args.family} fixture tokenizer: {ids}"

    n_tok = tok.get_vocab_size()
    mask_id = ids["<|mdm_mask|>" if args.family == "llada" else "<|mask|>"]
    eos_ids = (ids["<|endoftext|>"], ids["<|eot_id|>" if args.family == "llada" else "<|im_end|>"])
    pad_id = ids["<|endoftext|>"]

    if args.family == "llada":
        fmt = LLADA
        cfg = TransformerConfig(vocab_size=n_tok, d_model=args.d_model, n_layers=args.layers,
                                n_heads=args.heads, n_kv_heads=args.heads,
                                ffn_hidden=3 * args.d_model, norm_eps=1e-5, rope_theta=500000.0, qkv_bias=False, max_seq_len=512,
                                rope_full_precision=True)
        special = {"mask_token_id": mask_id, "eos_token_id": ids["<|endoftext|>"], "pad_token_id": pad_id}
    else:
        fmt = DREAM
        # The head is wider than the tokenizer, as in Dream-7B: the extra ids are undecodable.
        cfg = TransformerConfig(vocab_size=(n_tok + 63) // 64 * 64 + 64, d_model=args.d_model,
                                n_layers=args.layers, n_heads=args.heads, n_kv_heads=args.heads // 2,
                                ffn_hidden=3 * args.d_model, norm_eps=1e-6, rope_theta=1000000.0,
                                qkv_bias=True, max_seq_len=512)
        special = {"mask_token_id": mask_id, "eos_token_id": ids["<|endoftext|>"], "pad_token_id": pad_id,
                   "bos_token_id": ids["<|beginoftext|>"]}

    init_model = None
    if args.init_from is not None:      # its shape is checked before the data is prepared
        from pvf_lmeval.models import load_model

        init_model = load_model(str(args.init_from), device="cpu", dtype="float32")
        if init_model.net.cfg != cfg:
            c = init_model.net.cfg
            ap.error(f"--init-from {args.init_from} has d_model {c.d_model}, {c.n_layers} layers, "
                     f"{c.n_heads} heads: give the same --d-model/--layers/--heads")

    held_out = set()
    for split in ("test", "calibration"):
        seed, count = SPLITS[split]
        held_out |= {r["question"] for r in make_split(seed, count, held_out)}
    test_items = make_split(SPLITS["test"][0], SPLITS["test"][1], set())[: args.eval_items]
    # Fresh items (no repeats) up to POOL per task: the tiny model must learn to copy and add,
    # not to remember questions. The expected batches per task, plus a margin.
    data_seed = args.seed if args.data_seed is None else args.data_seed
    share = {"arith": 1.0 - args.var_share, "arith_var": args.var_share}
    n_train = {t: min(POOL, max(int(args.steps * args.batch * s * 1.1), 5000)) if s else 0
               for t, s in share.items()}
    if args.time_budget is not None:   # a long run: the full pools (what a large --steps gets)
        n_train = {t: POOL if s else 0 for t, s in share.items()}
    train_items = make_split(SPLITS["train"][0] + data_seed, n_train["arith"], held_out)
    var_test, var_train = [], []
    if args.var_share:
        var_length = arith_var_data.fixture_length(args.out / "tokenizer.json")
        var_held = arith_var_data.held_out_keys(var_length)
        vs = arith_var_data.SPLITS
        var_test = arith_var_data.make_split(vs["test"][0], vs["test"][1], set(), var_length)[: args.eval_items]
        var_train = var_training_items(vs["train"][0] + data_seed, n_train["arith_var"], var_held, tok)
    from transformers import AutoTokenizer

    hf_tok = AutoTokenizer.from_pretrained(str(args.out))
    probe = test_items[0]["question"]
    rendered = hf_tok.apply_chat_template([{"role": "user", "content": raw_prompt(probe)}],
                                          tokenize=False, add_generation_prompt=True)
    assert rendered == chat_prompt(probe, args.family), (rendered, chat_prompt(probe, args.family))
    rows, evals = {}, {}
    for task, items, tests in (("arith", train_items, test_items), ("arith_var", var_train, var_test)):
        if not items:
            continue
        rows[task], too_long = encode_items(tok, items, args.family, ids, rng, ANSWER_LEN[task])
        lens = [sum(1 for x in a if x not in eos_ids) for _, a in rows[task][:2000]]
        print(f"{task} train rows {len(rows[task])} (dropped {too_long} too long); answer tokens "
              f"min {min(lens)} mean {sum(lens) / len(lens):.1f} max {max(lens)}; vocab {n_tok}", flush=True)
        eval_rows, _ = encode_items(tok, tests, args.family, ids, random.Random(1), ANSWER_LEN[task])
        evals[task] = (eval_rows, [it["target"] for it in tests])

    net = BidirectionalTransformer(cfg)
    net.init_weights(args.seed)
    history = []
    if init_model is not None:
        net.load_state_dict(init_model.net.state_dict())
        previous = args.init_from / "training.json"
        if previous.exists():
            old = json.loads(previous.read_text())
            history = old.pop("phases", []) + [old]
    net.to(args.device)
    if args.time_budget is not None:
        step_s = time_steps(net, rows, pad_id, mask_id, fmt.logit_shift, args)
        left = args.time_budget - (time.time() - started)
        args.steps = max(100, int(left / step_s) // 100 * 100)
        print(f"time budget: {left:.0f} s left at {step_s * 1e3:.1f} ms per step: --steps "
              f"{args.steps}", flush=True)
    opt = torch.optim.AdamW(net.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.01)
    warmup = min(100, args.steps // 10 + 1)

    def lr_at(step):
        if step < warmup:
            return args.lr * (step + 1) / warmup
        frac = (step - warmup) / max(1, args.steps - warmup)
        return args.lr * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * frac)))

    gen = torch.Generator().manual_seed(args.seed)
    t0, log = time.time(), []
    order = {task: list(range(len(r))) for task, r in rows.items()}
    for o in order.values():
        rng.shuffle(o)
    cursor = {task: 0 for task in rows}
    for step in range(args.steps):
        task = "arith_var" if rng.random() < args.var_share else "arith"
        if cursor[task] + args.batch > len(order[task]):
            rng.shuffle(order[task])
            cursor[task] = 0
        batch = [rows[task][i] for i in order[task][cursor[task]:cursor[task] + args.batch]]
        cursor[task] += args.batch
        tokens, attn, start = batch_tensors(batch, pad_id)
        tokens, attn = tokens.to(args.device), attn.to(args.device)
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        loss = diffusion_loss(net, tokens, attn, start, mask_id, gen, fmt.logit_shift)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        opt.step()
        if step % 100 == 0 or step == args.steps - 1:
            el = time.time() - t0
            print(f"step {step} loss {loss.item():.4f} lr {lr_at(step):.2e} {el / 60:.1f} min", flush=True)
            log.append({"step": step, "loss": round(loss.item(), 4), "minutes": round(el / 60, 2)})
        if args.eval_every and step and step % args.eval_every == 0:
            net.eval()
            if log[-1]["step"] != step:      # --eval-every need not be a multiple of 100
                log.append({"step": step, "loss": round(loss.item(), 4),
                            "minutes": round((time.time() - t0) / 60, 2)})
            for task, (eval_rows, eval_targets) in evals.items():
                n = args.check_items
                acc, calls = quick_eval(net, eval_rows[:n], eval_targets[:n], tok, mask_id, eos_ids,
                                        pad_id, shift=fmt.logit_shift)
                print(f"step {step} {task} held-out exact match ({len(eval_rows[:n])} items): "
                      f"{acc:.2f}, {calls} batch calls", flush=True)
                log[-1][f"heldout_{n}" if task == "arith" else f"{task}_heldout_{n}"] = acc
            net.train()
            save_checkpoint(net, fmt, args.out, special)    # a usable checkpoint if stopped early

    net.eval()
    save_checkpoint(net, fmt, args.out, special)
    record = {
        "script": "scripts/tiny_fixtures/train.py", "args": {k: str(v) for k, v in vars(args).items()},
        "answer_len": ANSWER_LEN if args.var_share else ANSWER_LEN["arith"], "chat_share": CHAT_SHARE,
        "train_rows": {t: len(r) for t, r in rows.items()}, "device": str(args.device),
        "minutes": round((time.time() - t0) / 60, 2),
    }

    def write_record():
        (args.out / "training.json").write_text(json.dumps(
            {**record, "log": log, "phases": history}, indent=1) + "\n")

    write_record()      # before the final check, which a stopped run may not reach
    for task, (eval_rows, eval_targets) in evals.items():
        acc, _ = quick_eval(net, eval_rows, eval_targets, tok, mask_id, eos_ids, pad_id,
                            shift=fmt.logit_shift)
        print(f"{task} held-out exact match (threshold 0.9, blocks of 32, {len(eval_rows)} items): "
              f"{acc:.3f}", flush=True)
        result = {"heldout_exact_match": acc, "heldout_items": len(eval_rows)}
        if task == "arith":
            record.update(result)
        else:
            record[task] = result
        write_record()


if __name__ == "__main__":
    main()
