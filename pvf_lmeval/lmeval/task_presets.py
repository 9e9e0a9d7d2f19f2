"""The PVF preset each bundled task runs with when ``preset`` is not given.

``decoder=pvf`` on ``arith_var`` then decodes as the documented figures were made
(``preset=arith``), with no extra argument. The table is keyed by the task name lm-eval gives
each request, not written into the task YAMLs' ``generation_kwargs``: other models
(``--model hf``) pass those to ``generate`` and would fail on an unknown ``preset``.
Precedence: the ``preset`` model arg, then a ``preset`` in the request's generation kwargs
(a task's YAML or ``--gen_kwargs``), then this table; ``preset=none`` turns presets off.

The built-in tasks that a bundled task replicates prompt for prompt (its YAML's first line names
them: ``gsm8k_pvf`` is lm-eval's ``gsm8k`` plus cost metrics) run with the same preset. They
decode alike, and they must: lm-eval's ``--use_cache`` keys an answer by the prompt and the
generation kwargs, not by the task's name, so the two tasks read each other's answers.
"""

from __future__ import annotations

#: task name -> preset (``decoding.params.PRESETS``)
TASK_PRESETS = {
    "arith": "arith",
    "arith_var": "arith",
    "gsm8k_pvf": "gsm8k",
    "gsm8k_pvf_chat": "gsm8k",
    "gsm8k_cot_pvf": "gsm8k",
    "gsm8k_cot_pvf_chat": "gsm8k",
    "math500_pvf": "math",
    "math500_pvf_chat": "math",
    "mmlu_pro_pvf": "mmlu_pro",
    "mmlu_pro_pvf_chat": "mmlu_pro",
    "humaneval_pvf": "humaneval",
    "humaneval_pvf_chat": "humaneval",
    "humaneval_pvf_sampled": "humaneval",
    "humaneval_instruct_pvf": "humaneval",
    # the published settings' tasks (lmeval/published.py)
    "gsm8k_llada_oc": "gsm8k",
    "gsm8k_pvf_paper": "gsm8k",
    "humaneval_llada_oc": "humaneval",
    "humaneval_fastdllm": "humaneval",
    "math_llada_oc": "math",
    "humaneval_pvf_paper": "humaneval",
    "gsm8k_llada_oc_base": "gsm8k",
    "humaneval_llada_oc_base": "humaneval",
    "math_llada_oc_base": "math",
    "minerva_math_llada": "math",
    "math_pvf_paper": "math",
    "mmlu_pro_pvf_paper": "mmlu_pro",
    "mmlu_pro_llada_oc": "mmlu_pro",
    # multiple-choice knowledge questions answered in text: MMLU-Pro's family (knowledge)
    "arc_challenge_llada_oc": "mmlu_pro",
    "mmlu_llada_oc": "mmlu_pro",
    "hellaswag_llada_oc": "mmlu_pro",
    "gpqa_diamond_llada_oc": "mmlu_pro",
    # free prose under instructions: the knowledge family's (prose, its planning band)
    "ifeval_llada_oc": "mmlu_pro",
    # chain-of-thought reasoning to a short answer: GSM8K's family (math-word)
    "bbh_llada_oc_base": "gsm8k",
    **{f"bbh_llada_{subtask}": "gsm8k" for subtask in (     # the bbh_llada group's subtasks
        "boolean_expressions", "causal_judgement", "date_understanding", "disambiguation_qa",
        "dyck_languages", "formal_fallacies", "geometric_shapes", "hyperbaton",
        "logical_deduction_five_objects", "logical_deduction_seven_objects",
        "logical_deduction_three_objects", "movie_recommendation", "multistep_arithmetic_two",
        "navigate", "object_counting", "penguins_in_a_table", "reasoning_about_colored_objects",
        "ruin_names", "salient_translation_error_detection", "snarks", "sports_understanding",
        "temporal_sequences", "tracking_shuffled_objects_five_objects",
        "tracking_shuffled_objects_seven_objects", "tracking_shuffled_objects_three_objects",
        "web_of_lies", "word_sorting")},
    # the published MBPP settings' tasks: code
    "mbpp_llada_oc": "humaneval",
    "mbpp_llada_oc_base": "humaneval",
    "mbpp_llada": "humaneval",
    # lm-eval's built-ins that the bundled tasks above replicate
    "gsm8k": "gsm8k",
    "gsm8k_cot": "gsm8k",
    "minerva_math500": "math",
    "humaneval": "humaneval",
    "humaneval_instruct": "humaneval",
    "mbpp": "humaneval",
    **{f"mmlu_pro_{category}": "mmlu_pro" for category in (
        "biology", "business", "chemistry", "computer_science", "economics", "engineering",
        "health", "history", "law", "math", "other", "philosophy", "physics", "psychology")},
}


def task_preset(task: str | None) -> str | None:
    """The preset of a bundled task (lm-eval's task name), None for any other task."""
    return TASK_PRESETS.get(task or "")
