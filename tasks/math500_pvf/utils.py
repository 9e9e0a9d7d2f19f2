"""MATH-500 with decoding-cost metrics: the counterpart of lm-eval's ``minerva_math500``.

Prompt (``Problem:\\n...\\n\\nSolution:``), the four Minerva exemplars, the ``Problem:`` stop and
the scoring are those of the built-in (lm-eval 0.4.13 ``minerva_math/utils.py``, reproduced
here because that module refuses to import without ``lm-eval[math]``):

* ``exact_match``: the text after ``Final Answer: The final answer is``, normalized as in
  Lewkowycz et al. (2022, appendix D) and compared with the normalized ``\\boxed{}`` answer of the
  reference solution (sympy ``parse_latex`` equivalence when ``antlr4-python3-runtime==4.11`` is
  installed, string equality of the normalized answers otherwise);
* ``math_verify``: the ``math_verify`` package's verdict; NaN when it is not installed
  (``pip install "lm-eval[math]"``).

The chat variant asks for ``\\boxed{}`` and takes the last boxed expression, falling back to the
Minerva phrase. Costs come from the raw generation's ``.meta`` (SPEC "Statistics").

Data: the hub (``HuggingFaceH4/MATH-500``) when online; offline (``HF_DATASETS_OFFLINE=1``) or
on a hub failure the local copy written by ``pvf-data fetch``.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import threading
from pathlib import Path

from pvf_lmeval.lmeval.published_answers import last_boxed_only_string
from pvf_lmeval.lmeval.task_loading import quiet_custom_dataset_notice
from pvf_lmeval.lmeval.task_metrics import cost_metrics, metric_list

quiet_custom_dataset_notice(Path(__file__).resolve().parent)  # our data loaders take no --metadata

log = logging.getLogger("pvf_lmeval.tasks")

HUB_PATH, HUB_NAME = "HuggingFaceH4/MATH-500", "default"
NAN = float("nan")
INVALID_ANSWER = "[invalidanswer]"


# ----------------------------------------------------------------------------- data


def _offline() -> bool:
    return any(os.environ.get(k, "").strip().lower() in ("1", "true", "yes", "on")
               for k in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"))


LOCAL_NAME = "math500"


def local_file(name: str = LOCAL_NAME) -> Path:
    """The ``pvf-data fetch`` copy of dataset ``name`` (SHA-256 checked); FileNotFoundError if absent."""
    try:
        from pvf_lmeval.data import dataset_file
    except ImportError:  # pragma: no cover  (an install without pvf_lmeval.data)
        raise FileNotFoundError(f"no local copy of {name}: pvf_lmeval.data is unavailable") from None
    return Path(dataset_file(name))


def load_math500(**kwargs):
    """Hub ``HuggingFaceH4/MATH-500`` when online; the local copy when offline
    (``HF_DATASETS_OFFLINE=1`` / ``HF_HUB_OFFLINE=1``) or when the hub fails."""
    import datasets

    if not _offline():
        try:
            return datasets.load_dataset(HUB_PATH, HUB_NAME)
        except Exception as exc:  # noqa: BLE001  (any hub failure: fall back to the local copy)
            try:
                path = local_file()
            except FileNotFoundError:
                raise exc from None
            log.warning("math500: hub load failed (%s); using the pvf-data local copy", exc)
            return datasets.load_dataset("json", data_files={"test": str(path)})
    return datasets.load_dataset("json", data_files={"test": str(local_file())})


#: the seven subjects of the hub's MATH (EleutherAI/hendrycks_math configs)
MATH_SUBJECTS = ("algebra", "counting_and_probability", "geometry", "intermediate_algebra",
                 "number_theory", "prealgebra", "precalculus")


def load_math_test(**kwargs):
    """The 5,000 MATH test problems (problem, level, type, solution): the ``pvf-data fetch``
    copy when there is one, else the hub's seven ``EleutherAI/hendrycks_math`` subjects
    concatenated; offline without the copy, the copy's FileNotFoundError."""
    import datasets

    try:
        path = local_file("math_test")
    except FileNotFoundError:
        if _offline():
            raise
        return datasets.DatasetDict({"test": datasets.concatenate_datasets([
            datasets.load_dataset("EleutherAI/hendrycks_math", s, split="test")
            for s in MATH_SUBJECTS])})
    return datasets.load_dataset("json", data_files={"test": str(path)})


def process_results_llada_oc(doc: dict, results: list) -> dict:
    """``math_llada_oc``: OpenCompass's ``math_postprocess_v2`` and
    ``MATHEvaluator(version='v2').is_equiv`` against the solution's boxed answer."""
    from pvf_lmeval.lmeval import published_answers as pa

    generation = results[0]
    right = pa.oc_math_equal(pa.oc_math_prediction(str(generation)), pa.oc_math_boxed(doc["solution"]))
    out = {"exact_match": float(right)}
    out.update(cost_metrics(generation))
    return out


def process_results_pvf_paper(doc: dict, results: list) -> dict:
    """``math_pvf_paper``: the PVF authors' ``check_single_MATH`` (boxed answers, then their
    final-answer fallback) against the solution."""
    from pvf_lmeval.lmeval import published_answers as pa

    generation = results[0]
    out = {"exact_match": float(pa.pvf_math_correct(str(generation), doc["solution"]))}
    out.update(cost_metrics(generation))
    return out


#: OpenCompass's four Base-model exemplars (``math_gen_a58d9d.py``), braces doubled as its
#: template leaves them
LLADA_OC_BASE_SAMPLES = json.loads((Path(__file__).resolve().parent
                                    / "llada_oc_base_samples.json").read_text())


def llada_oc_base_samples() -> list[dict]:
    return [dict(s) for s in LLADA_OC_BASE_SAMPLES]


def _scoring_needs(task: str, packages: tuple[str, ...], metrics: str) -> None:
    """Warn once, when the task is built (before any decoding), that ``metrics`` will be NaN
    without ``packages``."""
    import importlib.util

    missing = [p for p in packages if importlib.util.find_spec(p) is None]
    if missing:
        _warn_once(task, f"{task}: {', '.join(missing)} not installed; {metrics} NaN "
                   "(pip install \"lm-eval[math]\")")
    _antlr_pin(task)


#: lm-eval[math]'s pin; sympy's ``parse_latex`` and math_verify's latex2sympy2 parse with it,
#: and 4.13 parses some answers differently (the verdicts then differ from the published ones)
ANTLR_PIN = "4.11"


def _antlr_pin(task: str) -> None:
    """Warn once, when the task is built, that an installed antlr4 runtime other than
    ``ANTLR_PIN`` may change LaTeX verdicts; nothing when it is absent (the missing-package
    warnings say that)."""
    import importlib.metadata

    try:
        got = importlib.metadata.version("antlr4-python3-runtime")
    except importlib.metadata.PackageNotFoundError:
        return
    if got.split(".")[:2] != ANTLR_PIN.split("."):
        _warn_once(f"antlr4 {task}", f"{task}: antlr4-python3-runtime is {got}, not {ANTLR_PIN} "
                   "(lm-eval[math]'s pin); some LaTeX answers parse differently and their scores "
                   f"differ from the published scorers' (pip install antlr4-python3-runtime=={ANTLR_PIN})")


def process_docs_llada_oc_base(dataset):
    """``math_llada_oc_base``: the documents as they are; warns when ``math_verify`` is missing."""
    _scoring_needs("math_llada_oc_base", ("math_verify", "latex2sympy2_extended"), "exact_match is")
    return dataset


def process_results_llada_oc_base(doc: dict, results: list) -> dict:
    """``math_llada_oc_base``: OpenCompass's ``MATHVerifyEvaluator`` against the solution's boxed
    answer (``extract_boxed_answer``, as ``MATHDataset`` stores it); NaN without math_verify."""
    from pvf_lmeval.lmeval import published_answers as pa

    generation = results[0]
    right = pa.oc_math_verify_correct(str(generation), pa.oc_math_boxed(doc["solution"]))
    out = {"exact_match": NAN if right is None else float(right)}
    out.update(cost_metrics(generation))
    return out


def list_fewshot_samples_lmeval048() -> list[dict]:
    """lm-eval 0.4.8's four Minerva exemplars: the same, with its typos (a ``}`` after the first
    problem; one backslash for ``\\\\`` before the line breaks of the ``align*`` blocks)."""
    out = []
    for i, sample in enumerate(list_fewshot_samples()):
        sample = {k: v.replace("\\\\\n", "\\\n") for k, v in sample.items()}
        if i == 0:
            sample["problem"] += "}"
        out.append(sample)
    return out


def process_docs_lmeval048(dataset):
    """``minerva_math_llada``: ``answer`` is lm-eval 0.4.8's normalised boxed answer of the
    solution; warns when its scoring packages are missing."""
    _scoring_needs("minerva_math_llada", ("sympy", "antlr4", "math_verify"),
                   "exact_match and math_verify are")

    def _process_doc(doc: dict) -> dict:
        boxed = last_boxed_only_string(doc["solution"])
        answer = INVALID_ANSWER if boxed is None else normalize_final_answer(remove_boxed(boxed),
                                                                             legacy=True)
        return {"problem": doc["problem"], "solution": doc["solution"], "answer": answer}

    return dataset.map(_process_doc)


def process_results_lmeval048(doc: dict, results: list) -> dict:
    """``minerva_math_llada``: lm-eval 0.4.8's ``process_results``: ``exact_match`` the Minerva
    phrase's answer, normalised as 0.4.8 did, sympy-equivalent to ``answer`` (NaN without sympy
    and antlr4); ``math_verify`` ``verify(parse(answer), parse(output))``."""
    generation = results[0]
    text = str(generation)
    answer = normalize_final_answer(get_unnormalized_answer(text), legacy=True)
    exact = float(is_equiv(answer, doc["answer"], legacy=True)) if _parse_latex(warn=False) else NAN
    out = {"exact_match": exact, "math_verify": math_verify(doc["answer"], text)}
    out.update(cost_metrics(generation))
    return out


def process_docs(dataset):
    """As the built-in: ``answer`` becomes the normalized ``\\boxed{}`` answer of the solution."""
    _antlr_pin("math500_pvf")
    def _process_doc(doc: dict) -> dict:
        return {"problem": doc["problem"], "solution": doc["solution"],
                "answer": reference_answer(doc["solution"])}

    return dataset.map(_process_doc)


def reference_answer(solution: str) -> str:
    boxed = last_boxed_only_string(solution)
    return normalize_final_answer(remove_boxed(boxed)) if boxed else INVALID_ANSWER


def doc_to_text(doc: dict) -> str:
    return "Problem:" + "\n" + doc["problem"] + "\n\n" + "Solution:"


def doc_to_text_chat(doc: dict) -> str:
    return ("Solve the following math problem. Please reason step by step, and put your final "
            "answer within \\boxed{}.\n\nProblem:\n" + doc["problem"])


def list_fewshot_samples() -> list[dict]:
    """The built-in's four Minerva exemplars."""
    return [
        {
            "problem": "Find the domain of the expression  $\\frac{\\sqrt{x-2}}{\\sqrt{5-x}}$.",
            "solution": "The expressions inside each square root must be non-negative. Therefore, $x-2 \\ge 0$, so $x\\ge2$, and $5 - x \\ge 0$, so $x \\le 5$. Also, the denominator cannot be equal to zero, so $5-x>0$, which gives $x<5$. Therefore, the domain of the expression is $\\boxed{[2,5)}$.\nFinal Answer: The final answer is $[2,5)$. I hope it is correct.",
            "few_shot": "1",
        },
        {
            "problem": "If $\\det \\mathbf{A} = 2$ and $\\det \\mathbf{B} = 12,$ then find $\\det (\\mathbf{A} \\mathbf{B}).$",
            "solution": "We have that $\\det (\\mathbf{A} \\mathbf{B}) = (\\det \\mathbf{A})(\\det \\mathbf{B}) = (2)(12) = \\boxed{24}.$\nFinal Answer: The final answer is $24$. I hope it is correct.",
            "few_shot": "1",
        },
        {
            "problem": "Terrell usually lifts two 20-pound weights 12 times. If he uses two 15-pound weights instead, how many times must Terrell lift them in order to lift the same total weight?",
            "solution": "If Terrell lifts two 20-pound weights 12 times, he lifts a total of $2\\cdot 12\\cdot20=480$ pounds of weight.  If he lifts two 15-pound weights instead for $n$ times, he will lift a total of $2\\cdot15\\cdot n=30n$ pounds of weight.  Equating this to 480 pounds, we can solve for $n$:\n\\begin{align*}\n30n&=480\\\\\n\\Rightarrow\\qquad n&=480/30=\\boxed{16}\n\\end{align*}\nFinal Answer: The final answer is $16$. I hope it is correct.",
            "few_shot": "1",
        },
        {
            "problem": "If the system of equations\n\n\\begin{align*}\n6x-4y&=a,\\\\\n6y-9x &=b.\n\\end{align*}has a solution $(x, y)$ where $x$ and $y$ are both nonzero,\nfind $\\frac{a}{b},$ assuming $b$ is nonzero.",
            "solution": "If we multiply the first equation by $-\\frac{3}{2}$, we obtain\n\n$$6y-9x=-\\frac{3}{2}a.$$Since we also know that $6y-9x=b$, we have\n\n$$-\\frac{3}{2}a=b\\Rightarrow\\frac{a}{b}=\\boxed{-\\frac{2}{3}}.$$\nFinal Answer: The final answer is $-\\frac{2}{3}$. I hope it is correct.",
            "few_shot": "1",
        },
    ]


# ----------------------------------------------------------------------------- scoring


def _score(doc: dict, generation, chat: bool) -> dict:
    text = str(generation)
    if chat:
        boxed = last_boxed_only_string(text)
        unnormalized = remove_boxed(boxed) if boxed else get_unnormalized_answer(text)
    else:
        unnormalized = get_unnormalized_answer(text)
    answer = normalize_final_answer(unnormalized)
    out = {"exact_match": float(is_equiv(answer, doc["answer"])),
           "math_verify": math_verify(doc["solution"], text)}
    out.update(cost_metrics(generation))  # read .meta from the raw generation
    return out


def process_results(doc: dict, results: list) -> dict:
    return _score(doc, results[0], chat=False)


def process_results_chat(doc: dict, results: list) -> dict:
    return _score(doc, results[0], chat=True)


_warned: set = set()


def _warn_once(key: str, msg: str) -> None:
    if key not in _warned:
        _warned.add(key)
        log.warning(msg)


def math_verify(gold: str, text: str) -> float:
    """The built-in's ``math_verify`` metric: ``verify(parse(gold), parse(text))`` (0.4.13 parses
    the solution, 0.4.8 the normalised answer); NaN without the ``math_verify`` package."""
    try:
        from math_verify import parse, verify
    except ImportError:
        _warn_once("math_verify", "math500_pvf: math_verify is not installed; the math_verify "
                   "metric is NaN (pip install \"lm-eval[math]\")")
        return NAN
    return float(bool(verify(gold=parse(gold), target=parse(text))))


def remove_boxed(s: str) -> str:
    if s.startswith("\\boxed "):
        return s[len("\\boxed "):]
    for left in ("\\boxed{", "\\fbox{"):
        if s.startswith(left) and s.endswith("}"):
            return s[len(left): -1]
    return s


class _timeout:
    """SIGALRM timeout (main thread only; elsewhere no limit)."""

    def __init__(self, seconds: int = 5):
        self.seconds = seconds
        self.active = threading.current_thread() is threading.main_thread()

    def _handle(self, signum, frame):
        raise TimeoutError("timeout")

    def __enter__(self):
        if self.active:
            signal.signal(signal.SIGALRM, self._handle)
            signal.alarm(self.seconds)

    def __exit__(self, *exc):
        if self.active:
            signal.alarm(0)


def _parse_latex(warn: bool = True):
    try:
        import antlr4  # noqa: F401
        from sympy.parsing.latex import parse_latex
    except ImportError:
        if not warn:
            return None
        _warn_once("antlr4", "math500_pvf: sympy/antlr4-python3-runtime==4.11 unavailable; "
                   "exact_match compares normalized answers as strings (pip install \"lm-eval[math]\")")
        return None
    return parse_latex


def is_equiv(x1: str, x2: str, legacy: bool = False) -> bool:
    """x1 and x2 are normalized LaTeX strings (the built-in's ``is_equiv``). ``legacy``: lm-eval
    0.4.8's, which compares identical strings through sympy too (an unparsable pair is unequal)
    and has no invalid-answer test."""
    if not legacy:
        if isinstance(x1, str) and x1 and x1 == x2:
            return True
        if x1 == INVALID_ANSWER or x2 == INVALID_ANSWER:
            return False
    parse_latex = _parse_latex()
    if parse_latex is None:
        return False
    import sympy

    try:
        with _timeout(seconds=5):
            try:
                parsed_x1 = parse_latex(x1)
                parsed_x2 = parse_latex(x2)
            except Exception:  # noqa: BLE001  (LaTeXParsingError, SympifyError, TypeError)
                return False
            try:
                diff = parsed_x1 - parsed_x2
            except TypeError:
                return False
            try:
                return bool(sympy.simplify(diff) == 0)
            except ValueError:
                return False
    except TimeoutError:
        return False
    except Exception:  # noqa: BLE001
        return False


def get_unnormalized_answer(text: str) -> str:
    end_seq = "I hope it is correct."
    text += end_seq
    match = re.search(r"Final Answer: The final answer is(.*?). I hope it is correct.", text)
    return match.group(1).strip() if match else INVALID_ANSWER


SUBSTITUTIONS = [
    ("an ", ""),
    ("a ", ""),
    (".$", "$"),
    ("\\$", ""),
    (r"\ ", ""),
    (" ", ""),
    ("mbox", "text"),
    (",\\text{and}", ","),
    ("\\text{and}", ","),
    ("\\text{m}", "\\text{}"),
]
REMOVED_EXPRESSIONS = [
    "square", "ways", "integers", "dollars", "mph", "inches", "ft", "hours", "km", "units",
    "\\ldots", "sue", "points", "feet", "minutes", "digits", "cents", "degrees", "cm", "gm",
    "pounds", "meters", "meals", "edges", "students", "childrentickets", "multiples",
    "\\text{s}", "\\text{.}", "\\text{\ns}", "\\text{}^2", "\\text{}^3", "\\text{\n}", "\\text{}",
    r"\mathrm{th}", r"^\circ", r"^{\circ}", r"\;", r",\!", "{,}", '"', "\\dots",
]


def normalize_final_answer(final_answer: str, legacy: bool = False) -> str:
    """The built-in's normalization (Lewkowycz et al. 2022, appendix D, as patched in 0.4.13).
    ``legacy``: as lm-eval 0.4.8 wrote it: unit words removed wherever they occur (also inside
    LaTeX commands: ``\\left`` loses its "ft"), ``\\sqrt`` shorthand applied to indexed roots,
    and commas dropped from any string that is digits without them (a tuple ``0,1`` becomes
    ``01``)."""
    final_answer = final_answer.split("=")[-1]
    if not legacy:
        for expr in REMOVED_EXPRESSIONS:
            if expr.isalpha():
                final_answer = re.sub(rf"(?<!\\)\b{expr}\b", "", final_answer)
    for before, after in SUBSTITUTIONS:
        final_answer = final_answer.replace(before, after)
    for expr in REMOVED_EXPRESSIONS:
        if expr.isalpha() and not legacy:
            segments = re.split(r"(\\[a-zA-Z]+)", final_answer)
            for i in range(0, len(segments), 2):
                segments[i] = segments[i].replace(expr, "")
            final_answer = "".join(segments)
        else:
            final_answer = final_answer.replace(expr, "")
    final_answer = re.sub(r"(.*?)(\$)(.*?)(\$)(.*)", "$\\3$", final_answer)
    final_answer = re.sub(r"(\\text\{)(.*?)(\})", "\\2", final_answer)
    final_answer = re.sub(r"(\\textbf\{)(.*?)(\})", "\\2", final_answer)
    final_answer = re.sub(r"(\\overline\{)(.*?)(\})", "\\2", final_answer)
    final_answer = re.sub(r"(\\boxed\{)(.*)(\})", "\\2", final_answer)
    final_answer = re.sub(r"(frac)([^{])(.)", "frac{\\2}{\\3}", final_answer)
    if legacy:
        final_answer = re.sub(r"(sqrt)([^{])", "sqrt{\\2}", final_answer)
    else:
        final_answer = re.sub(r"(sqrt)(\[[^\]]*\])(\w)", "\\1\\2{\\3}", final_answer)
        final_answer = re.sub(r"(sqrt)(?!\[)([^{])", "sqrt{\\2}", final_answer)
    final_answer = final_answer.replace("$", "")
    thousands = (final_answer.replace(",", "").isdigit() if legacy
                 else re.fullmatch(r"-?\d{1,3}(,\d{3})+", final_answer))
    if thousands:
        final_answer = final_answer.replace(",", "")
    return final_answer


#: the YAMLs' metric_list: exact match and math-verify, then the decoding costs
METRICS = metric_list("exact_match", "math_verify")
#: the published settings' task: one accuracy row, then the decoding costs
ONE_METRIC = metric_list("exact_match")
