"""MBPP as LLaDA's EVAL.md rows ran it: on OpenCompass (``mbpp_gen_830460``, ML-GSAI/LLaDA @
b7e6c35), ``mbpp_llada_oc`` (LLaDA-8B-Instruct, LLaDA 1.5: the exemplars as chat turns) and
``mbpp_llada_oc_base`` (LLaDA-8B-Base: plain text, stop at "[DONE]"); on lm-eval 0.4.8
(``eval_llada_lm_eval.sh``), ``mbpp_llada`` (LLaDA-8B-Base: 0.4.8's ``mbpp`` prompt, its
``code_eval`` pass@1: the answer as it is, then the first three asserts, 3 s).

- data: lm-eval's ``mbpp`` set (``google-research-datasets/mbpp``, ``full``, its ``test``
  split: task ids 11-510, the problems OpenCompass's ``MBPPDataset`` takes as lines 11-510 of
  its ``mbpp.jsonl``);
- prompt: OpenCompass's three fixed exemplars and question (``llada_oc_samples.json``, read from
  the config), each exemplar's question and answer as its template renders them: for the
  Instruct model user and assistant turns (``--apply_chat_template``; the chat template strips
  each turn, and the final "[BEGIN]\\n" answer prefix is not rendered), for the Base model the
  turns joined by newlines, ending in "[BEGIN]\\n";
- scoring: OpenCompass's ``MBPPEvaluator._process_answer``
  (:func:`pvf_lmeval.lmeval.published_answers.oc_mbpp_program`), then the problem's
  ``test_list`` asserts against the program's top-level names in :mod:`pvf_lmeval.sandbox`
  (``check_asserts``); as OpenCompass, ``test_setup_code`` and ``challenge_test_list`` are not
  run. pass@1 and the sandbox's verdicts (``unchecked``: the asserts needed a value that
  cannot cross as plain data), then the decoding costs.
"""

from __future__ import annotations

import json
from pathlib import Path

from pvf_lmeval.humaneval.scoring import VERDICT, generations, score_jobs
from pvf_lmeval.lmeval.task_metrics import metric_list

HERE = Path(__file__).resolve().parent
OC = json.loads((HERE / "llada_oc_samples.json").read_text())
LMEVAL048 = json.loads((HERE / "lmeval048_samples.json").read_text())
#: CPU seconds per process: MBPPEvaluator's limit (``execution(programs, i, 10)`` runs the
#: program under a 9 s timer, ``timeout - 1``); the whole check's wall-clock limit is 2 * 9 + 5 s
TIMEOUT = 9.0


def llada_oc_samples() -> list[dict]:
    """The three exemplars (``fewshot_config.samples``), as docs that carry their text."""
    return [dict(pair) for pair in OC["exemplars"]]


def _question(doc: dict) -> str:
    """OpenCompass's question turn: an exemplar's own text, else the template on the problem's
    ``text`` and its ``test_list`` joined by newlines (``MBPPDataset``)."""
    if "human" in doc:
        return doc["human"]
    return OC["question"].replace("{text}", doc["text"]).replace(
        "{test_list}", "\n".join(doc["test_list"]))


def doc_to_text_llada_oc(doc: dict) -> str:
    """``mbpp_llada_oc``'s user turn."""
    return _question(doc)


def doc_to_text_llada_oc_base(doc: dict) -> str:
    """``mbpp_llada_oc_base``: the question, then (a problem, not an exemplar) a newline and
    the answer prefix "[BEGIN]\\n", as ``LMTemplateParser`` joins the turns."""
    return _question(doc) if "human" in doc else _question(doc) + "\n" + OC["answer_prefix"]


def doc_to_target(doc: dict) -> str:
    """An exemplar's answer turn; a problem's asserts (what lm-eval logs as its target)."""
    return doc["bot"] if "bot" in doc else "\n".join(doc["test_list"])


def check_jobs(doc: dict, programs) -> list[dict]:
    """:func:`pvf_lmeval.sandbox.check_candidates` jobs: each program against the problem's
    asserts, no setup code (OpenCompass runs ``test_list`` alone)."""
    return [dict(program=p, asserts=list(doc["test_list"])) for p in programs]


def score(doc: dict, results: list, *, timeout: float = TIMEOUT, workers: int | None = None) -> dict:
    """``process_results``: costs, then pass@1 of :func:`oc_mbpp_program` of each sample."""
    from pvf_lmeval.lmeval.published_answers import oc_mbpp_program

    gens = generations(results)
    return score_jobs(gens, check_jobs(doc, [oc_mbpp_program(str(g)) for g in gens]), [1],
                      timeout=timeout, workers=workers)


def process_results(doc: dict, results: list) -> dict:
    return score(doc, results)


def lmeval048_samples() -> list[dict]:
    """``mbpp_llada``'s exemplars: lm-eval 0.4.8's ``list_fewshot_samples`` (``is_fewshot``
    makes ``doc_to_target`` their code and "[DONE]")."""
    return [dict(sample) for sample in LMEVAL048["samples"]]


#: lm-eval 0.4.8's code_eval limit (``timeout=3.0`` s of wall time), as CPU seconds per process
LMEVAL048_TIMEOUT = 3.0


def process_results_lmeval048(doc: dict, results: list, *, workers: int | None = None) -> dict:
    """``mbpp_llada``: code_eval's program is the answer (cut at "[DONE]") followed by
    ``doc_to_target``, the first three ``test_list`` asserts; here the answer runs in the
    sandbox and those asserts in its checker."""
    gens = generations(results)
    jobs = [dict(program=str(g), asserts=list(doc["test_list"][:3])) for g in gens]
    return score_jobs(gens, jobs, [1], timeout=LMEVAL048_TIMEOUT, workers=workers)


#: pass@1 and the verdicts, then the decoding costs
METRICS = metric_list("pass@1", VERDICT)
