"""IFEval as OpenCompass ran it for LLaDA 1.5's row (ML-GSAI/LLaDA @ b7e6c35,
``configs/datasets/IFEval/IFEval_gen_353ae7.py``, ``datasets/IFEval/ifeval.py``): the item's
prompt as the one user turn, no stop string; scored by ``IFEvaluator``'s four figures,
strict and loose, per prompt and per instruction, on lm-eval's IFEval checkers
(``published_answers.oc_ifeval_follows``). Needs ``pip install "lm-eval[ifeval]"``.
"""

from __future__ import annotations

from pvf_lmeval.lmeval import published_answers as pa
from pvf_lmeval.lmeval.task_metrics import cost_metrics, mean_of_concatenated, metric_list
from pvf_lmeval.one_line import exit_in_one_line


def process_docs_llada_oc(dataset):
    """``ifeval_llada_oc``: the items as they are; stops before any decoding, in one line,
    when lm-eval's IFEval checkers cannot be imported. Importing them fetches nltk's
    ``punkt_tab`` when it is missing, as lm-eval's own ``ifeval`` task does."""
    missing = pa.ifeval_missing()
    if missing:
        error = ImportError(f"ifeval_llada_oc: {', '.join(missing)} not installed; its scoring "
                            "needs them (pip install \"lm-eval[ifeval]\")")
        exit_in_one_line(error)
        raise error
    from lm_eval.tasks.ifeval import instructions_registry  # noqa: F401
    return dataset


def process_results_llada_oc(doc: dict, results: list) -> dict:
    """``IFEvaluator.score`` per item: whether all instructions are followed (prompt level) and
    each instruction's verdict (instruction level, aggregated over all instructions), strict
    and loose."""
    generation = results[0]
    strict = pa.oc_ifeval_follows(doc, str(generation), loose=False)
    loose = pa.oc_ifeval_follows(doc, str(generation), loose=True)
    out = {"prompt_level_strict_acc": float(all(strict)), "inst_level_strict_acc": strict,
           "prompt_level_loose_acc": float(all(loose)), "inst_level_loose_acc": loose}
    out.update(cost_metrics(generation))
    return out


def _per_instruction(name: str) -> dict:
    return {"metric": name, "aggregation": mean_of_concatenated, "higher_is_better": True}


#: ifeval_llada_oc's metric_list: IFEvaluator's four figures in its order, then the costs
LLADA_OC_METRICS = metric_list("prompt_level_strict_acc", _per_instruction("inst_level_strict_acc"),
                               "prompt_level_loose_acc", _per_instruction("inst_level_loose_acc"))
