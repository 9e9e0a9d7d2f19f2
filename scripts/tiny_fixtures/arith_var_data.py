"""Synthetic word problems with varied solutions (the offline `arith_var` task).

The world of `arith` (one person's collection changes in 3-4 steps; every quantity within
1..MAX_VALUE, every amount within 1..MAX_AMOUNT), but the solution is written the way people
write: each step in one of several templates per operation, each with its own sentence opening;
optional connective and running-count sentences; an independent fact (another person's collection,
which the question does not ask about) placed anywhere in the question and acknowledged at the
start or the end of the solution, or not at all. Answers run 120-250 tokens under the fixtures'
tokenizer and end with ``#### <number>`` (the length filter keeps mostly 4-change items).

The bookkeeping is made learnable for a 1M-parameter model (with 4-6 changes and paraphrased
steps such a model stays at 10-20% after 15,000 steps, skipping changes or running on): every
solution says how many changes there are right after its opening, and every step quotes its
change as the question words it, so the next change is the clause after the last quoted one.

Why: in `arith` every solution token except the digits is fixed by the question, so a model is
sure of every structural token. Here the sentence openings are genuinely open (several are
plausible, and everything after one depends on which was chosen): the regime a planning decoder
is built for. The question alone never determines the wording, so prompts carry only the question.

Seeds keep the splits disjoint: an item's question text is its key, later splits drop keys
already used, and the training stream drops every held-out key.

    python scripts/tiny_fixtures/arith_var_data.py --out tasks/arith_var/data
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

from arith_data import GAINS, ITEMS, LOSSES, MAX_AMOUNT, MAX_VALUE, NAMES, unique_items, write_splits

FEMALE = {"Ann", "Mia", "Lily", "Zoe", "Ava", "Emma"}
LINKS = ["Then", "Next", "After that", "Later"]

# Step templates: {N} name, {P}/{p} pronoun, {q} the change as the question words it (quoted, so
# that the model finds the next change by copying the clause after the last one it quoted), {n}
# amount, {a} before, {b} after, {item}. Every template opens differently.
STEP_GAIN = [
    "Step {k}: {P} {q}, so {a} + {n} = {b}.",
    "Next, {N} {q}. That makes {a} + {n} = {b} {item}.",
    "When {p} {q}, the count goes up by {n}: {a} + {n} = {b}.",
    "We add {n} because {p} {q}. Now {a} + {n} = {b}.",
    "With this change {p} {q}, so {N} has {a} + {n} = {b} {item}.",
]
STEP_LOSS = [
    "Step {k}: {P} {q}, so {a} - {n} = {b}.",
    "Next, {N} {q}. That leaves {a} - {n} = {b} {item}.",
    "When {p} {q}, the count goes down by {n}: {a} - {n} = {b}.",
    "We take away {n} because {p} {q}. Now {a} - {n} = {b}.",
    "With this change {p} {q}, so {N} has {a} - {n} = {b} {item}.",
]
OPENINGS = [
    "{N} starts with {v} {item}.",
    "At the start, {N} has {v} {item}.",
    "First we look at the {item}: {N} has {v}.",
    "The story begins with {v} {item} for {N}.",
]
COUNT = [  # always, after the opening: how many changes there are (when to stop)
    "There are {c} changes to follow.",
    "We follow the {c} changes in order.",
    "The story has {c} changes.",
]
CONNECT = [  # optional, between steps
    "Then the count changes again.",
    "Now look at the next change.",
    "Let us keep going.",
]
TALLY = [  # optional, after a step: restates the running count
    "Now {N} has {b} {item}.",
    "So far that is {b} {item}.",
    "The count is {b} now.",
]
ASIDE = [  # the independent fact: acknowledged at the start, at the end, or not at all
    "We do not need the {oitem} of {O}.",
    "The {ov} {oitem} of {O} do not matter here.",
]
ENDINGS = [
    "So {N} has {v} {item}.",
    "In the end, {N} has {v} {item}.",
    "That leaves {N} with {v} {item}.",
    "The answer is {v} {item}.",
]
MIN_TOKENS, MAX_TOKENS = 120, 250
CHANGES = [3, 4, 4]   # changes per item (drawn uniformly from this list)
P_CONNECT, P_TALLY = 0.7, 0.7   # chance of a connective before a step, of a tally after one


def make_item(rng: random.Random) -> dict:
    name = rng.choice(NAMES)
    other = rng.choice([n for n in NAMES if n != name])
    item = rng.choice(ITEMS)
    oitem = rng.choice([i for i in ITEMS if i != item])
    pronoun = "She" if name in FEMALE else "He"
    value, ovalue = rng.randint(2, 8), rng.randint(2, 9)
    n_ops = rng.choice(CHANGES)
    fill = {"N": name, "P": pronoun, "p": pronoun.lower(), "item": item, "O": other,
            "oitem": oitem, "ov": ovalue, "c": n_ops}
    story = [f"{name} has {value} {item}."]
    lines = [rng.choice(OPENINGS).format(v=value, **fill)]
    lines[0] += " " + rng.choice(COUNT).format(**fill)
    aside = rng.choice(["start", "end", None])
    if aside == "start":
        lines.append(rng.choice(ASIDE).format(**fill))
    for k in range(n_ops):
        can_gain, can_lose = value < MAX_VALUE, value > 1
        if can_gain and (not can_lose or rng.random() < 0.5):
            q, s, sign = rng.choice(GAINS)
            amount = rng.randint(1, min(MAX_AMOUNT, MAX_VALUE - value))
            templates = STEP_GAIN
        else:
            q, s, sign = rng.choice(LOSSES)
            amount = rng.randint(1, min(MAX_AMOUNT, value - 1))
            templates = STEP_LOSS
        new = value + sign * amount
        link = "" if k == 0 else rng.choice(LINKS) + " "
        subj = pronoun if k == 0 else pronoun.lower()
        story.append(f"{link}{subj} {q.format(n=amount, item=item, o=other)}.")
        if k and rng.random() < P_CONNECT:
            lines.append(rng.choice(CONNECT))
        quoted = q.format(n=amount, item=item, o=other)
        lines.append(rng.choice(templates).format(k=k + 1, q=quoted, n=amount, a=value, b=new, **fill))
        if rng.random() < P_TALLY:
            lines[-1] += " " + rng.choice(TALLY).format(b=new, **fill)
        value = new
    if aside == "end":
        lines.append(rng.choice(ASIDE).format(**fill))
    lines.append(rng.choice(ENDINGS).format(v=value, **fill))
    # The independent fact goes anywhere in the story but after the first sentence (so that
    # "He"/"She" still follows the name).
    story.insert(rng.randint(1, len(story)), f"{other} has {ovalue} {oitem}.")
    question = " ".join(story) + f" How many {item} does {name} have now?"
    answer = "\n".join(lines) + f"\n#### {value}"
    return {"question": question, "answer": answer, "target": str(value)}


def make_split(seed: int, count: int, exclude: set[str], length=None) -> list[dict]:
    """``count`` items with unseen questions; ``length(answer) -> tokens`` keeps only answers of
    MIN_TOKENS..MAX_TOKENS tokens (None: keep all)."""
    keep = None if length is None else (lambda it: MIN_TOKENS <= length(it["answer"]) <= MAX_TOKENS)
    return unique_items(make_item, seed, count, exclude, keep)


SPLITS = {"test": (5005, 1000), "calibration": (6006, 400), "train": (7007, 200_000)}


def fixture_length(tokenizer: Path | None = None):
    """Answer length in tokens under ``tokenizer`` (a tokenizer.json; default: the bundled
    tiny-llada one, whose BPE both fixtures share)."""
    from tokenizers import Tokenizer

    here = Path(__file__).resolve().parent.parent.parent
    path = tokenizer or here / "pvf_lmeval" / "fixtures" / "tiny-llada" / "tokenizer.json"
    tok = Tokenizer.from_file(str(path))
    return lambda text: len(tok.encode(" " + text).ids)


def held_out_keys(length) -> set[str]:
    used: set[str] = set()
    for split in ("test", "calibration"):
        seed, count = SPLITS[split]
        used |= {r["question"] for r in make_split(seed, count, used, length)}
    return used


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--train", type=int, default=0, help="also write this many training items")
    ap.add_argument("--tokenizer", type=Path, default=None,
                    help="tokenizer.json that measures answer lengths (default: the bundled one)")
    args = ap.parse_args(argv)
    length = fixture_length(args.tokenizer)

    def describe(rows):
        lens = [length(r["answer"]) for r in rows]
        return f", answer tokens {min(lens)}-{max(lens)} (mean {sum(lens) / len(lens):.0f})"

    write_splits(args.out, SPLITS, args.train,
                 lambda seed, count, used: make_split(seed, count, used, length), describe)


if __name__ == "__main__":
    main()
