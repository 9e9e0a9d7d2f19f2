"""Synthetic GSM8K-style word problems for the tiny fixtures (the offline `arith` task).

Each item: a multi-step story about one person's collection (2-3 additions/subtractions; every
quantity stays within 1..MAX_VALUE and every amount within 1..MAX_AMOUNT, so the sums are facts a
0.9M-parameter model can learn on a CPU) and a structured step-by-step solution ending ``#### <number>``, the GSM8K
answer format. Answers run about 40-80 tokens under the fixtures' tokenizer, so that blocks and
multi-step decoding matter. Seeds keep the train / test / calibration splits disjoint by
construction: an item's question text is its key, and later splits drop keys already used.

    python scripts/tiny_fixtures/arith_data.py --out tasks/arith/data
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

NAMES = ["Tom", "Ann", "Ben", "Mia", "Sam", "Lily", "Max", "Zoe", "Leo", "Ava", "Noah", "Emma"]
ITEMS = ["apples", "books", "coins", "pens", "cards", "eggs", "marbles", "stickers", "cookies",
         "shells", "stamps", "toys"]
# (question phrase, solution phrase, sign); {n} = amount, {o} = another person.
GAINS = [
    ("buys {n} more {item}", "buys {n} more", 1),
    ("finds {n} {item}", "finds {n}", 1),
    ("gets {n} {item} from {o}", "gets {n} from {o}", 1),
    ("wins {n} {item}", "wins {n}", 1),
]
LOSSES = [
    ("gives {n} {item} to {o}", "gives away {n}", -1),
    ("loses {n} {item}", "loses {n}", -1),
    ("sells {n} {item}", "sells {n}", -1),
    ("uses {n} {item}", "uses {n}", -1),
]
LINKS = ["Then", "Next", "After that", "Later"]
MAX_VALUE = 9
MAX_AMOUNT = 5


def make_item(rng: random.Random) -> dict:
    name = rng.choice(NAMES)
    other = rng.choice([n for n in NAMES if n != name])
    item = rng.choice(ITEMS)
    pronoun = "She" if name in {"Ann", "Mia", "Lily", "Zoe", "Ava", "Emma"} else "He"
    value = rng.randint(2, 8)
    n_ops = rng.choice([2, 2, 3, 3])
    sentences = [f"{name} has {value} {item}."]
    steps = [f"Step 1: {name} starts with {value} {item}."]
    for k in range(n_ops):
        can_gain, can_lose = value < MAX_VALUE, value > 1
        if can_gain and (not can_lose or rng.random() < 0.5):
            q, s, sign = rng.choice(GAINS)
            amount = rng.randint(1, min(MAX_AMOUNT, MAX_VALUE - value))
        else:
            q, s, sign = rng.choice(LOSSES)
            amount = rng.randint(1, min(MAX_AMOUNT, value - 1))
        new = value + sign * amount
        link = "" if k == 0 else rng.choice(LINKS) + " "
        subj = pronoun if k == 0 else pronoun.lower()
        sentences.append(f"{link}{subj} {q.format(n=amount, item=item, o=other)}.")
        op = "+" if sign > 0 else "-"
        steps.append(f"Step {k + 2}: {pronoun} {s.format(n=amount, o=other)}, so {value} {op} {amount} = {new}.")
        value = new
    question = " ".join(sentences) + f" How many {item} does {name} have now?"
    answer = "\n".join(steps) + f"\nSo {name} has {value} {item}.\n#### {value}"
    return {"question": question, "answer": answer, "target": str(value)}


def unique_items(make, seed: int, count: int, exclude: set[str], keep=None) -> list[dict]:
    """``count`` items from ``make(rng)`` (seeded by ``seed``) whose questions are new: not in
    ``exclude`` and not repeated; ``keep(item) -> bool``, when given, drops items it rejects."""
    rng = random.Random(seed)
    out, seen = [], set(exclude)
    while len(out) < count:
        item = make(rng)
        if item["question"] in seen or (keep is not None and not keep(item)):
            continue
        seen.add(item["question"])
        out.append(item)
    return out


def make_split(seed: int, count: int, exclude: set[str]) -> list[dict]:
    return unique_items(make_item, seed, count, exclude)


SPLITS = {"test": (1001, 1000), "calibration": (2002, 400), "train": (3003, 200_000)}


def write_splits(out: Path, splits: dict, train: int, make, describe=lambda rows: "") -> None:
    """Writes ``out/<split>.jsonl`` for each split of ``splits`` ({name: (seed, count)}), in
    order, each split's questions unseen by the earlier ones; ``make(seed, count, exclude)``
    draws a split, the train split gets ``train`` items (0: skipped), ``describe(rows)`` adds
    to the printed line."""
    out.mkdir(parents=True, exist_ok=True)
    used: set[str] = set()
    for split, (seed, count) in splits.items():
        if split == "train":
            count = train
            if not count:
                continue
        rows = make(seed, count, used)
        used.update(r["question"] for r in rows)
        with open(out / f"{split}.jsonl", "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
        print(f"{split}: {len(rows)} items{describe(rows)} -> {out / f'{split}.jsonl'}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--train", type=int, default=SPLITS["train"][1], help="training items (0 = skip)")
    args = ap.parse_args(argv)
    write_splits(args.out, SPLITS, args.train, make_split)


if __name__ == "__main__":
    main()
