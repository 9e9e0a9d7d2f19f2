"""Write the hand-written planning vocabularies of the tiny fixtures (task family math-word).

Structure tokens of the arith solutions: step markers, the equation's operators, the clause
words that open each step and the final-answer marker; and the sentence openings of the
arith_var templates. Chosen by hand, not calibrated: the
artifact says so (kind "hand-written"); ``pvf-calibrate`` builds the measured ones.

    python scripts/make_handwritten_vocab.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from pvf_lmeval.models.loader import checkpoint_folder, load_tokenizer  # noqa: E402
from pvf_lmeval.planning.vocab import FORMAT_VERSION, tokenizer_hash  # noqa: E402

TOKENS = ["Step", "ĠStep", ":", ",", "Ġso", "So", "Ġ=", "Ġ+", "Ġ-", "Ċ", "####", ".",
          "Ġstarts", "Ġwith", "Ġhas", "ĠHe", "ĠShe", "Ġaway", "Ġfrom",
          # the sentence openings of arith_var's templates (after a newline, or the answer's
          # leading space)
          "Next", "When", "With", "We", "Then", "Now", "The", "In", "That", "Let",
          "ĠAt", "ĠFirst", "ĠThe"]
FIXTURES = {"tiny-llada": "llada", "tiny-dream": "dream"}


def main() -> None:
    for name, family in FIXTURES.items():
        tok = load_tokenizer(checkpoint_folder(name))
        vocab = tok.get_vocab()
        missing = [t for t in TOKENS if t not in vocab]
        if missing:
            raise SystemExit(f"{name}: tokens not in the tokenizer: {missing}")
        artifact = {
            "format_version": FORMAT_VERSION,
            "kind": "hand-written",
            "model_family": family,
            "task_family": "math-word",
            "model": name,
            "tokenizer": {"name": name, "vocab_hash": tokenizer_hash(tok), "size": len(tok)},
            "built_by": "scripts/make_handwritten_vocab.py",
            "note": "hand-written structure tokens of the arith and arith_var solutions; not calibrated",
            "tokens": [{"id": vocab[t], "string": t} for t in TOKENS],
        }
        out = REPO / "vocab_artifacts" / f"{name}.math-word.hand-written.json"
        out.write_text(json.dumps(artifact, indent=1, ensure_ascii=False) + "\n")
        print(f"{out.relative_to(REPO)}: {len(TOKENS)} tokens")


if __name__ == "__main__":
    main()
