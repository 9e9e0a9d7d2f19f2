"""Write the heuristic (UNCALIBRATED) planning vocabularies of LLaDA-8B-Instruct and Dream-7B-Instruct.

Calibrating the 8B models takes hours on a GPU, so these artifacts are built from token classes
(structure words, punctuation, operators, step markers, code keywords), one per task family, spelled as
byte-level BPE token strings ('Ġ' = leading space, 'Ċ' = newline). They carry no ids and no
tokenizer hash: they always resolve by string against the running tokenizer, and tokens that
do not exist in it are skipped with a warning. Each file records the exact ``pvf-calibrate``
command that produces the real (calibrated) artifact on a GPU.

    python scripts/make_heuristic_vocab.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from pvf_lmeval.planning.vocab import FORMAT_VERSION  # noqa: E402

S = "Ġ"  # byte-level BPE spelling of a leading space

STRUCTURE = [S + w for w in ("the", "The", "a", "an", "of", "to", "and", "is", "are", "in", "for",
                             "that", "this", "This", "we", "We", "it", "with", "as", "by", "be",
                             "has", "have", "then", "Then", "so", "So", "therefore", "Therefore",
                             "thus", "Thus", "each", "which", "from", "on", "at", "first",
                             "also", "Now", "now", "Let", "let", "'s")] + ["The", "So", "Let", "'s"]
PUNCT = [".", ",", ":", ";", "?", "(", ")", S + "(", "Ċ", "ĊĊ", ".Ċ", ".ĊĊ", ":Ċ", ":ĊĊ", "**", S + "**",
         ":**", "-", S + "-"]
OPERATORS = [S + o for o in ("=", "+", "-", "*", "/", "×", "÷")] + ["=", "+", "*", "/", "$", S + "$"]
LATEX = ["\\", S + "\\", "\\(", "\\)", S + "\\(", S + "\\)", "\\[", "\\]", "{", "}", "}{", "^", "_",
         "\\frac", S + "\\frac", "\\cdot", S + "\\cdot", "\\times", S + "\\times", "\\boxed",
         S + "\\boxed", "$$", S + "$$", "\\left", "\\right", S + "\\left", S + "\\right"]
STEPS = ["Step", S + "Step", "First", S + "First", "Next", S + "Next", "Finally", S + "Finally",
         "###", S + "###", "####", S + "####", "Answer", S + "answer", S + "Answer", S + "total",
         S + "Total", S + "step", S + "think"]
CODE_KEYWORDS = [w for k in ("def", "return", "if", "else", "elif", "for", "in", "while", "import",
                             "from", "None", "True", "False", "not", "and", "or", "is", "len",
                             "range", "self", "class", "try", "except", "break", "continue",
                             "pass", "lambda", "with", "as", "yield", "append", "int", "str",
                             "list", "dict")
                 for w in (k, S + k)]
CODE_PUNCT = ["(", ")", "):", "):Ċ", ":Ċ", "[", "]", "]:", "()", "[]", "[i", "])", ")Ċ", "]Ċ", ",",
              S + "=", S + "==", S + "!=", S + "+=", S + "-=", S + "<", S + ">", S + "<=", S + ">=",
              S + "#", "\"\"\"", S + "\"\"\"", "ĠĠĠ", "ĠĠĠĠ", "ĠĠĠĠĠĠĠ", "ĠĠĠĠĠĠĠĠ", "Ċ", "ĊĠĠĠ",
              "ĊĠĠĠĠ", "ĊĊ", ".", "_"]

#: task family -> token classes
FAMILY_CLASSES = {
    "math-word": {"structure words": STRUCTURE, "punctuation": PUNCT, "operators": OPERATORS,
                  "step markers": STEPS},
    "knowledge": {"structure words": STRUCTURE, "punctuation": PUNCT, "step markers": STEPS},
    "code": {"code keywords": CODE_KEYWORDS, "code punctuation and indentation": CODE_PUNCT},
    "math": {"structure words": STRUCTURE, "punctuation": PUNCT, "operators": OPERATORS + LATEX,
             "step markers": STEPS},
}

#: model family -> (hub id, file stem)
MODELS = {
    "llada": ("GSAI-ML/LLaDA-8B-Instruct", "llada-8b-instruct"),
    "dream": ("Dream-org/Dream-v0-Instruct-7B", "dream-v0-instruct-7b"),
}

#: task family -> calibration data of pvf-calibrate (never a task's evaluation split)
CALIBRATION_DATA = {
    "math-word": "gsm8k",              # GSM8K train split
    "knowledge": "mmlu_pro:validation",  # MMLU-Pro's few-shot (validation) split
    "code": "mbpp:train",              # MBPP train split (HumanEval has only its test split)
    "math": "minerva_math",            # MATH train splits of every subject
}


def calibrate_command(hub: str, stem: str, family: str) -> str:
    return (f"pvf-calibrate --model {hub} --data {CALIBRATION_DATA[family]} --family {family} "
            "--apply-chat-template --limit 1000 --gen-length 512 --block-length 64 --width 16 "
            f"--out vocab_artifacts/{stem}.{family}.calibrated.json")


def build(model_family: str, family: str) -> dict:
    hub, stem = MODELS[model_family]
    tokens, seen = [], set()
    for cls, strings in FAMILY_CLASSES[family].items():
        for s in strings:
            if s not in seen:
                seen.add(s)
                tokens.append({"id": None, "string": s, "class": cls})
    return {
        "format_version": FORMAT_VERSION,
        "kind": "heuristic",
        "calibrated": False,
        "model_family": model_family,
        "task_family": family,
        "model": hub,
        "tokenizer": {"name": hub, "vocab_hash": None},
        "built_by": "scripts/make_heuristic_vocab.py",
        "note": ("UNCALIBRATED heuristic vocabulary built from token classes "
                 f"({', '.join(FAMILY_CLASSES[family])}); resolved by string against the running "
                 "tokenizer (missing tokens are skipped with a warning). Replace it with the "
                 "calibrated artifact that calibrate_command produces on a GPU."),
        "calibrate_command": calibrate_command(hub, stem, family),
        "tokens": tokens,
    }


def main() -> None:
    out_dir = REPO / "vocab_artifacts"
    for model_family, (_, stem) in MODELS.items():
        for family in FAMILY_CLASSES:
            art = build(model_family, family)
            out = out_dir / f"{stem}.{family}.heuristic.json"
            out.write_text(json.dumps(art, indent=1, ensure_ascii=False) + "\n")
            print(f"{out.relative_to(REPO)}: {len(art['tokens'])} tokens (uncalibrated)")


if __name__ == "__main__":
    main()
