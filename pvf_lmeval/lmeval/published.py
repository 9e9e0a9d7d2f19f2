"""Published evaluation settings as one command each: LLaDA's EVAL.md, Fast-dLLM's README and
the PVF paper's Table 1.

A row fixes everything its published script fixed: the checkpoint, the task (a bundled task
whose prompt and answer extraction equal the script's: ``tasks/*/``), the few-shot count, the
chat template and how lm-eval renders few-shot turns (``chat``), and the decoding
(``--model_args``). ``pvf-dlm published NAME`` prints its ``lm_eval`` command;
``docs/benchmarks.md`` lists every row beside its published figure.

``chat``: ``none`` (no template), ``single_turn`` (``--apply_chat_template
--fewshot_as_multiturn false``: the whole few-shot prompt in one user turn, as Fast-dLLM wraps
lm-eval's context) or ``multi_turn`` (``--apply_chat_template``: lm-eval 0.4.13's default, each
exemplar a user and an assistant turn, as OpenCompass renders its exemplars). Every generation
row sets ``early_stop=false``: the published loops decode the whole canvas. The likelihood rows
(LLaDA-8B-Base's ppl tasks) run lm-eval's own multiple-choice tasks with the estimator of LLaDA's
``eval_llada.py``: ``mc_num`` draws, stratified per group of its ``--batch_size`` draws,
cross-entropy over the whole vocabulary, classifier-free guidance ``cfg_scale``; their prompts
are lm-eval 0.4.8's (the version the script pins), which 0.4.13's tasks build byte for byte but
GPQA's (its bundled variant ``gpqa_main_n_shot_llada``).
"""

from __future__ import annotations

import dataclasses

LLADA_INSTRUCT = "GSAI-ML/LLaDA-8B-Instruct"
LLADA_BASE = "GSAI-ML/LLaDA-8B-Base"
LLADA_15 = "GSAI-ML/LLaDA-1.5"
DREAM_INSTRUCT = "Dream-org/Dream-v0-Instruct-7B"
CHATS = ("none", "single_turn", "multi_turn")
#: the sources, by the commit the settings were read from
LLADA_EVAL = "LLaDA EVAL.md (ML-GSAI/LLaDA @ b7e6c35)"
LLADA15_EVAL = "LLaDA EVAL.md, LLaDA 1.5's table (ML-GSAI/LLaDA @ b7e6c35)"
FAST_DLLM = "Fast-dLLM README (NVlabs/Fast-dLLM @ 24cc59e)"
PVF_PAPER = "PVF paper, Table 1 (authors' code Joeyetinghan/pvf @ e5224c2)"


@dataclasses.dataclass(frozen=True)
class Published:
    """One published row: ``decoding`` holds the ``--model_args`` decoding keys (strings, as
    lm-eval passes them); ``figure`` the published accuracy as the source prints it."""

    name: str
    source: str
    setting: str
    figure: str
    model: str
    task: str
    num_fewshot: int
    chat: str
    decoding: dict
    #: whether the task is one of pvf-lmeval's (``--include_path``) rather than lm-eval's own
    bundled_task: bool = True
    #: what the command alone does not say: a difference from the published run that remains,
    #: how a task variant removes one, or what its scoring needs installed
    note: str = ""

    def __post_init__(self):
        if self.chat not in CHATS:
            raise ValueError(f"chat={self.chat!r} is not one of {', '.join(CHATS)}")

    @property
    def code(self) -> bool:
        """Whether the task runs model-written code (lm-eval wants --confirm_run_unsafe_code)."""
        return self.task.startswith(("humaneval", "mbpp"))

    def model_args(self) -> str:
        """``--model_args``: the checkpoint, then the decoding keys in table order."""
        return ",".join([f"pretrained={self.model}", *(f"{k}={v}" for k, v in self.decoding.items())])

    def command(self) -> str:
        """The ``lm_eval`` command line that runs the row (``batch_size`` 1, as the scripts)."""
        parts = ["lm_eval --model pvf-dlm", f"--model_args {self.model_args()}",
                 *(['--include_path "$(pvf-tasks-path)"'] if self.bundled_task else []),
                 f"--tasks {self.task}", f"--num_fewshot {self.num_fewshot}", "--batch_size 1"]
        if self.chat != "none":
            parts.append("--apply_chat_template")
        if self.chat == "single_turn":
            parts.append("--fewshot_as_multiturn false")
        if self.code:
            parts.append("--confirm_run_unsafe_code")
        return " ".join(parts)


def _static(gen: int, block: int, **switches) -> dict:
    """LLaDA's ``generate``: low-confidence remasking, one token per step (steps = gen)."""
    return {"decoder": "static", "gen_length": gen, "block_length": block, "steps": gen,
            **{k: str(v).lower() for k, v in switches.items()}, "early_stop": "false"}


def _fast_dllm(gen: int, column: str) -> dict:
    """Fast-dLLM's ``eval_gsm8k.sh`` / ``eval_humaneval.sh`` columns: blocks of 32; baseline
    and +cache run LLaDA's schedule (steps = gen), +parallel commits at confidence 0.9."""
    parallel = column.endswith("parallel")
    out = {"decoder": "threshold" if parallel else "static", "gen_length": gen, "block_length": 32}
    out.update({"threshold": 0.9} if parallel else {"steps": gen})
    cache = {"baseline": "none", "cache": "prefix", "parallel": "none",
             "cache-parallel": "prefix", "dual-parallel": "dual"}[column]
    return {**out, "cache": cache, "early_stop": "false"}


def _pvf_paper(decoder: str, preset: str) -> dict:
    """The PVF paper's Table 1: L = 512, B = 64, tau_high = 0.9, each method's decoder."""
    out = {"decoder": decoder, "gen_length": 512, "block_length": 64}
    if decoder == "pvf":
        out["preset"] = preset
    if decoder in ("threshold", "pvf"):
        out["threshold"] = 0.9
    return {**out, "early_stop": "false"}


def _likelihood(cfg: float, mc_num: int, batch: int) -> dict:
    """LLaDA's ``eval_llada.py`` log-likelihood: ``mc_num`` draws, its ``forward_process`` per
    group of ``batch`` draws (its ``--batch_size``: ``mc_stratum``); cross-entropy over the
    whole vocabulary (mask logit kept); guidance ``cfg`` (0: none). Draws per model call
    (``mc_batch``) do not change the estimate: left at the default."""
    guidance = {"cfg_scale": cfg} if cfg else {}
    return {**guidance, "mc_num": mc_num, "mc_stratum": batch, "mask_logit": "kept"}


#: LLaDA-8B-Base's ppl tasks: eval_llada_lm_eval.sh's task, few-shot count, cfg, mc_num and
#: --batch_size per command, and EVAL.md's figures without and with classifier-free guidance
LLADA_PPL = (("gpqa_main_n_shot", "GPQA", 5, 0.5, 128, 8, "25.2", "26.1"),
             ("truthfulqa_mc2", "TruthfulQA", 0, 2.0, 128, 8, "46.1", "46.4"),
             ("arc_challenge", "ARC-C", 0, 0.5, 128, 8, "45.9", "47.9"),
             ("hellaswag", "Hellaswag", 0, 0.5, 128, 8, "70.5", "72.5"),
             ("winogrande", "WinoGrande", 5, 0.0, 128, 8, "74.8", "74.8"),
             ("piqa", "PIQA", 0, 0.5, 128, 8, "73.6", "74.4"),
             ("mmlu", "MMLU", 5, 0.0, 1, 1, "65.9", None),
             ("cmmlu", "CMMLU", 5, 0.0, 1, 1, "69.9", None),
             ("ceval-valid", "C-Eval", 5, 0.0, 1, 1, "70.5", None))
#: the script's task -> the bundled variant that builds lm-eval 0.4.8's requests where 0.4.13's
#: own task does not (tasks/gpqa_llada/)
LLADA_PPL_VARIANT = {"gpqa_main_n_shot": "gpqa_main_n_shot_llada"}
LLADA_PPL_NOTE = {
    "gpqa_main_n_shot": "task gpqa_main_n_shot_llada: lm-eval 0.4.8's answer preprocessing "
                        "(bracketed text deleted) and answer order (0.4.13's gpqa_main_n_shot "
                        "keeps brackets and shuffles otherwise)",
    "truthfulqa_mc2": "lm-eval 0.4.13 scores mc2 with the true answers wherever they stand; "
                      "0.4.8 took those before the first false one: equal when the true "
                      "answers come first",
}


def _llada_ppl_rows() -> list[Published]:
    """One row per script command (its cfg), and for a command with cfg > 0 also the same
    command at cfg 0 (EVAL.md's "w/o CFG" row, the LLaDA paper's Table 1)."""
    rows = []
    for script_task, bench, shots, cfg, mc_num, batch, plain, guided in LLADA_PPL:
        what = f"LLaDA-8B-Base on lm-eval, {bench} {shots}-shot, likelihood, mc_num {mc_num}"
        figure = f"{plain} (w/o CFG = w/ CFG)" if cfg == 0 and guided else plain
        task = LLADA_PPL_VARIANT.get(script_task, script_task)
        common = dict(source=LLADA_EVAL, model=LLADA_BASE, task=task, num_fewshot=shots,
                      chat="none", bundled_task=task != script_task,
                      note=LLADA_PPL_NOTE.get(script_task, ""))
        rows.append(Published(f"llada-base-{script_task}", setting=f"{what}, no CFG",
                              figure=figure, decoding=_likelihood(0.0, mc_num, batch), **common))
        if cfg:
            rows.append(Published(f"llada-base-{script_task}-cfg", setting=f"{what}, CFG {cfg}",
                                  figure=guided, decoding=_likelihood(cfg, mc_num, batch),
                                  **common))
    return rows


#: what every LLaDA 1.5 row runs on: the checkpoint's own chat template
LLADA15_TEMPLATE_NOTE = ("LLaDA-1.5's hub tokenizer_config.json was not readable offline; the "
                         "prompts were checked with a public copy's chat template (tests/data/"
                         "published/chat_templates.json llada15), which renders them as "
                         "LLaDA-8B-Instruct's does")


def _llada15_rows() -> list[Published]:
    """EVAL.md's LLaDA 1.5 table on OpenCompass (examples/llada_1p5_gen_*.py): the Instruct
    rows' dataset configs and tasks, LLaDA-1.5's checkpoint, gen_steps = gen_length."""
    rows = [("gsm8k", 256, 16, True, "GSM8K (OpenCompass, 4 fixed CoT shots)", "83.8", "83.6",
             "gsm8k_llada_oc", 4, ""),
            ("math", 1024, 128, True, "MATH (OpenCompass, zero-shot)", "42.6", "42.3",
             "math_llada_oc", 0, ""),
            ("gpqa", 256, 16, False, "GPQA Diamond (OpenCompass, 5 fixed worked exemplars in one "
             "user turn)", "36.9", "34.8", "gpqa_diamond_llada_oc", 0, ""),
            ("humaneval", 512, 32, True, "HumanEval (OpenCompass, zero-shot)", "52.4", "51.2",
             "humaneval_llada_oc", 0, ""),
            ("ifeval", 256, 16, True, "IFEval (OpenCompass, the prompt as one user turn)", "66.2",
             "65.2", "ifeval_llada_oc", 0,
             "OpenCompass prints four figures (prompt-level strict, instruction-level strict, "
             "prompt-level loose, instruction-level loose accuracy: the task's "
             "prompt_level_strict_acc, inst_level_strict_acc, prompt_level_loose_acc, "
             "inst_level_loose_acc); EVAL.md does not say which it reports. Scoring needs "
             "lm-eval[ifeval] (the task stops before decoding without it)")]
    out = []
    for bench, gen, block, conf, what, internal, oc, task, shots, note in rows:
        switch = ", confidence_eos_eot_inf" if conf else ""
        decoding = _static(gen, block, confidence_eos_eot_inf=True) if conf else _static(gen, block)
        out.append(Published(
            f"llada15-{bench}-{gen}-{block}", LLADA15_EVAL,
            f"LLaDA 1.5, {what}, gen {gen}, block {block}{switch}",
            f"{internal} (internal), {oc} (OpenCompass)", LLADA_15, task, shots, "multi_turn",
            decoding, note="; ".join(n for n in (note, LLADA15_TEMPLATE_NOTE) if n)))
    return out


#: LLaDA-8B-Base's BBH on lm-eval (eval_llada_lm_eval.sh's --tasks bbh, lm-eval 0.4.8's group):
#: EVAL.md's figure per gen = steps = block length
LLADA_BASE_BBH = {256: "45.0", 512: "50.4", 1024: "49.7"}
LLADA_BASE_BBH_NOTE = ("task bbh_llada: lm-eval 0.4.8's bbh prompts (0.4.13's bbh drops the "
                       "space before each exemplar's answer and the repeated \"Let's think step "
                       "by step.\" that opens 26 subtasks' exemplar answers); the figure is "
                       "exact_match over all questions (0.4.8's size-weighted group mean)")


def _llada_base_bbh_rows() -> list[Published]:
    """``bbh_llada``: 0.4.8's 27 ``bbh_cot_fewshot`` subtasks, 3 exemplars each, no template."""
    return [Published(f"llada-base-bbh-{gen}", LLADA_EVAL,
                      "LLaDA-8B-Base on lm-eval, BBH 3-shot chain of thought (lm-eval 0.4.8's "
                      f"bbh), gen = steps = block = {gen}", figure, LLADA_BASE, "bbh_llada", 3, "none",
                      _static(gen, gen), note=LLADA_BASE_BBH_NOTE)
            for gen, figure in LLADA_BASE_BBH.items()]


#: what the MBPP rows' scoring does otherwise than OpenCompass's MBPPEvaluator
MBPP_NOTE = ("scored in pvf_lmeval.sandbox: the asserts run in a process of their own against "
             "the program's names through plain-literal proxies, so a check that needs a value "
             "that cannot cross (an object passed in or returned) is the verdict unchecked, not "
             "passed, where OpenCompass's one-namespace exec may pass it; 9 CPU seconds per "
             "process where OpenCompass allows 9 s of wall time. Problems: the hub's MBPP test "
             "split (task ids 11-510); OpenCompass reads lines 11-510 of its own mbpp.jsonl, "
             "which could not be compared offline")
#: the LLaDA 1.5 row's prompts were checked under both chat templates
MBPP_LLADA15_NOTE = ("LLaDA-1.5's hub tokenizer_config.json was not readable offline; the "
                     "prompts were checked with LLaDA-8B-Instruct's chat template and a public "
                     "copy of LLaDA-1.5's, which render them alike")


#: what the lm-eval MBPP rows' scoring does otherwise than lm-eval 0.4.8's code_eval
MBPP_LMEVAL_NOTE = ("scored in pvf_lmeval.sandbox, not by HF evaluate's code_eval (an "
                    "unsandboxed exec of the answer and the first three asserts; 3 s of wall "
                    "time, here 3 CPU seconds per process): an answer importing numpy fails, "
                    "a check that needs a value that cannot cross is the verdict unchecked. "
                    "lm-eval 0.4.13's own mbpp builds the same prompts")


def _mbpp_rows() -> list[Published]:
    """EVAL.md's MBPP rows on OpenCompass (mbpp_gen_830460: three fixed exemplars): the
    Instruct pure-diffusion row, the Base row (stop "[DONE]") and LLaDA 1.5's; and
    LLaDA-8B-Base's on lm-eval 0.4.8 (eval_llada_lm_eval.sh's ``--tasks mbpp``, 3 shots)."""
    chat = "MBPP (OpenCompass, 3 fixed exemplars as chat turns)"
    lmeval = [Published(f"llada-base-mbpp-{gen}", LLADA_EVAL,
                        f"LLaDA-8B-Base on lm-eval, MBPP 3-shot (lm-eval 0.4.8's mbpp), "
                        f"gen = steps = block = {gen}", figure, LLADA_BASE, "mbpp_llada", 3,
                        "none", _static(gen, gen), note=MBPP_LMEVAL_NOTE)
              for gen, figure in ((256, "40.2"), (512, "39.2"), (1024, "40.0"))]
    return lmeval + [
        Published("llada-instruct-mbpp-pure", LLADA_EVAL,
                  f"LLaDA-8B-Instruct, {chat}, pure diffusion gen = block = steps = 256, "
                  "confidence_eos_eot_inf", "41.0 (internal), 39.6 (OpenCompass)",
                  LLADA_INSTRUCT, "mbpp_llada_oc", 3, "multi_turn",
                  _static(256, 256, confidence_eos_eot_inf=True), note=MBPP_NOTE),
        Published("llada-base-oc-mbpp-256", LLADA_EVAL,
                  "LLaDA-8B-Base on OpenCompass, MBPP (3 fixed exemplars as plain text, stop "
                  "\"[DONE]\"), gen = steps = block = 256", "38.8", LLADA_BASE,
                  "mbpp_llada_oc_base", 3, "none", _static(256, 256), note=MBPP_NOTE),
        Published("llada15-mbpp-512-32", LLADA15_EVAL,
                  f"LLaDA 1.5, {chat}, gen 512, block 32, confidence_eos_eot_inf",
                  "42.8 (internal), 42.6 (OpenCompass)", LLADA_15, "mbpp_llada_oc", 3,
                  "multi_turn", _static(512, 32, confidence_eos_eot_inf=True),
                  note=f"{MBPP_NOTE}; {MBPP_LLADA15_NOTE}"),
    ]


#: what the HellaSwag row reads otherwise than OpenCompass
HELLASWAG_NOTE = ("OpenCompass reads its own hellaswag.jsonl; the task builds that file's fields "
                  "from the hub's Rowan/hellaswag validation split with lm-eval's hellaswag "
                  "process_docs, which give the file's lines where they were compared (not the "
                  "whole file: its row order and count are not known here)")


def _rows() -> list[Published]:
    rows = [
        Published("llada-instruct-gsm8k-256-8", LLADA_EVAL,
                  "LLaDA-8B-Instruct, GSM8K, gen 256, block 8 (OpenCompass, 4 fixed CoT shots)",
                  "78.6 (internal), 78.9 (OpenCompass)", LLADA_INSTRUCT, "gsm8k_llada_oc", 4,
                  "multi_turn", _static(256, 8)),
        Published("llada-instruct-math-512-64", LLADA_EVAL,
                  "LLaDA-8B-Instruct, MATH, gen 512, block 64 (OpenCompass, zero-shot)",
                  "42.2 (internal), 42.7 (OpenCompass)", LLADA_INSTRUCT, "math_llada_oc", 0,
                  "multi_turn", _static(512, 64)),
        Published("llada-instruct-gsm8k-pure", LLADA_EVAL,
                  "LLaDA-8B-Instruct, GSM8K, pure diffusion gen = block = steps = 512, "
                  "confidence_eos_eot_inf", "69.4 (internal), 68.8 (OpenCompass)",
                  LLADA_INSTRUCT, "gsm8k_llada_oc", 4, "multi_turn",
                  _static(512, 512, confidence_eos_eot_inf=True)),
        Published("llada-instruct-math-pure", LLADA_EVAL,
                  "LLaDA-8B-Instruct, MATH, pure diffusion gen = block = steps = 512, "
                  "confidence_eos_eot_inf", "31.9 (internal), 29.6 (OpenCompass)",
                  LLADA_INSTRUCT, "math_llada_oc", 0, "multi_turn",
                  _static(512, 512, confidence_eos_eot_inf=True)),
        Published("llada-instruct-humaneval-pure", LLADA_EVAL,
                  "LLaDA-8B-Instruct, HumanEval, pure diffusion gen = block = steps = 512, EOS "
                  "logits suppressed (logits_eos_inf)", "49.4 (internal), 47.0 (OpenCompass)",
                  LLADA_INSTRUCT, "humaneval_llada_oc", 0, "multi_turn",
                  _static(512, 512, logits_eos_inf=True)),
        Published("llada-instruct-mmlu-pro-pure", LLADA_EVAL,
                  "LLaDA-8B-Instruct, MMLU-Pro (OpenCompass, zero-shot \"ANSWER: $LETTER\" "
                  "prompt), pure diffusion gen = block = steps = 256",
                  "37.0 (internal), 36.6 (OpenCompass)", LLADA_INSTRUCT, "mmlu_pro_llada_oc", 0,
                  "multi_turn", _static(256, 256),
                  note="OpenCompass's figure is the task's category_mean (the mean of the 14 "
                       "category accuracies); exact_match is over all questions"),
        Published("llada-instruct-arc-c-pure", LLADA_EVAL,
                  "LLaDA-8B-Instruct, ARC-C (OpenCompass, zero-shot; the validation questions "
                  "with four choices), pure diffusion gen = block = steps = 512",
                  "88.5 (internal), 89.2 (OpenCompass)", LLADA_INSTRUCT, "arc_challenge_llada_oc",
                  0, "multi_turn", _static(512, 512)),
        Published("llada-instruct-mmlu-3", LLADA_EVAL,
                  "LLaDA-8B-Instruct, MMLU (OpenCompass, 5 fixed shots per subject as chat turns), "
                  "gen = block = steps = 3", "65.5 (internal), 65.4 (OpenCompass)",
                  LLADA_INSTRUCT, "mmlu_llada_oc", 5, "multi_turn", _static(3, 3),
                  note="OpenCompass prints mmlu (the task's subject_mean, the mean of the 57 "
                       "subject accuracies) and mmlu-weighted (exact_match); EVAL.md does not "
                       "say which it reports"),
        Published("llada-instruct-hellaswag-3", LLADA_EVAL,
                  "LLaDA-8B-Instruct, HellaSwag (OpenCompass, zero-shot \"Which ending makes the "
                  "most sense?\" prompt; the validation contexts), gen = block = steps = 3",
                  "74.6 (internal), 75.3 (OpenCompass)", LLADA_INSTRUCT, "hellaswag_llada_oc", 0,
                  "multi_turn", _static(3, 3), note=HELLASWAG_NOTE),
        Published("llada-instruct-gpqa-pure", LLADA_EVAL,
                  "LLaDA-8B-Instruct, GPQA Diamond (OpenCompass, 5 fixed worked exemplars in one "
                  "user turn), pure diffusion gen = block = steps = 64, confidence_eos_eot_inf",
                  "33.3 (internal), 32.3 (OpenCompass)", LLADA_INSTRUCT, "gpqa_diamond_llada_oc",
                  0, "multi_turn", _static(64, 64, confidence_eos_eot_inf=True)),
    ]
    base = {"gsm8k": ("gsm8k_pvf", 5, "GSM8K 5-shot", {256: "70.0", 512: "70.8", 1024: "70.3"}),
            "math": ("minerva_math_llada", 4, "MATH 4-shot (lm-eval 0.4.8's minerva_math)",
                     {256: "30.3", 512: "30.9", 1024: "31.4"}),
            "humaneval": ("humaneval_pvf", 0, "HumanEval 0-shot",
                          {256: "32.9", 512: "32.9", 1024: "35.4"})}
    for bench, (task, shots, what, figures) in base.items():
        for gen, figure in figures.items():
            rows.append(Published(
                f"llada-base-{bench}-{gen}", LLADA_EVAL,
                f"LLaDA-8B-Base on lm-eval, {what}, gen = steps = block = {gen}", figure,
                LLADA_BASE, task, shots, "none", _static(gen, gen),
                note="exact_match and math_verify need lm-eval[math] (NaN without)"
                if bench == "math" else ""))
    rows += _llada_base_bbh_rows()
    oc_base = (("gsm8k", "gsm8k_llada_oc_base", 4, "GSM8K (4 fixed CoT shots as plain text)",
                "71.9"),
               ("math", "math_llada_oc_base", 4, "MATH (4 fixed shots as plain text, stop "
                "\"Problem:\")", "30.7"),
               ("humaneval", "humaneval_llada_oc_base", 0, "HumanEval (the prompt alone)", "34.1"),
               ("bbh", "bbh_llada_oc_base", 0, "BBH (27 subtasks, each after its chain-of-thought "
                "exemplars)", "47.3"))
    for bench, task, shots, what, figure in oc_base:
        rows.append(Published(
            f"llada-base-oc-{bench}-256", LLADA_EVAL,
            f"LLaDA-8B-Base on OpenCompass, {what}, gen = steps = block = 256", figure,
            LLADA_BASE, task, shots, "none", _static(256, 256),
            note={"math": "exact_match needs math_verify (NaN without)",
                  "bbh": "OpenCompass's figure is the task's subtask_mean (the mean of the 27 "
                         "subtask accuracies)"}.get(bench, "")))
    fast = {("gsm8k", 256): ("79.3", "79.5", "79.2", "78.5"),
            ("gsm8k", 512): ("77.5", "77.0", "77.6", "77.2"),
            ("humaneval", 256): ("41.5", "42.7", "43.9", "43.3"),
            ("humaneval", 512): ("43.9", "45.7", "43.3", "44.5")}
    columns = ("baseline", "cache", "parallel", "cache-parallel", "dual-parallel")
    for (bench, gen), figures in fast.items():
        task, shots, what = (("gsm8k_pvf", 5, "GSM8K 5-shot") if bench == "gsm8k" else
                             ("humaneval_fastdllm", 0, "HumanEval 0-shot"))
        for column, figure in zip(columns, (*figures, "-")):
            rows.append(Published(
                f"fastdllm-{bench}-{gen}-{column}", FAST_DLLM,
                f"LLaDA-8B-Instruct, {what}, gen {gen}, block 32, {column} (chat template, one "
                "user turn)", figure, LLADA_INSTRUCT, task, shots, "single_turn",
                _fast_dllm(gen, column)))
    paper = {("llada", "gsm8k"): "79.46 / 79.62 / 79.08 / 79.75",
             ("llada", "humaneval"): "46.95 / 47.56 / 45.73 / 46.66",
             ("llada", "math"): "41.06 / 40.84 / 40.90 / 40.24",
             ("llada", "mmlu_pro"): "36.80 / 36.20 / 36.70 / 36.40",
             ("dream", "gsm8k"): "78.00 / 77.71 / 79.92 / 79.20",
             ("dream", "humaneval"): "60.37 / 59.14 / 59.15 / 62.66",
             ("dream", "math"): "42.20 / 43.46 / 42.00 / 43.66",
             ("dream", "mmlu_pro"): "41.30 / 40.18 / 41.10 / 43.30"}
    benches = {"gsm8k": "GSM8K", "humaneval": "HumanEval", "math": "MATH", "mmlu_pro": "MMLU-Pro"}
    methods = (("static", "static"), ("fastdllm", "threshold"), ("freedave", "freedave"),
               ("pvf", "pvf"))
    for (family, bench), figures in paper.items():
        model = LLADA_INSTRUCT if family == "llada" else DREAM_INSTRUCT
        for (method, decoder), figure in zip(methods, figures.split(" / ")):
            rows.append(Published(
                f"pvf-paper-{family}-{bench}-{method}", PVF_PAPER,
                f"{model.split('/')[1]}, {benches[bench]} 0-shot, gen 512, block 64, {method}",
                figure, model, f"{bench}_pvf_paper", 0, "multi_turn", _pvf_paper(decoder, bench)))
    return rows + _llada15_rows() + _mbpp_rows() + _llada_ppl_rows()


def published_rows() -> dict[str, Published]:
    """Every published row by name, in the documentation's order. Built on each call (a
    fraction of a millisecond), not once at import: a test that reads a row then runs the code
    that wrote it, which is what lets mutation testing tie the row tables to their tests."""
    return {row.name: row for row in _rows()}


def published(name: str) -> Published:
    """The row called ``name``; a one-line error listing the names otherwise."""
    rows = published_rows()
    if name not in rows:
        raise ValueError(f"published setting {name!r} is not one of {', '.join(rows)}")
    return rows[name]


def markdown_table() -> str:
    """docs/benchmarks.md's table: published setting, figure, the row's name, its command and
    our figure (pending until a GPU and the weights are at hand)."""
    lines = ["| published setting | source | published figure | preset | command | ours |",
             "|---|---|---|---|---|---|"]
    for row in published_rows().values():
        setting = f"{row.setting}<br>*{row.note}*" if row.note else row.setting
        lines.append(f"| {setting} | {row.source} | {row.figure} | `{row.name}` | "
                     f"`{row.command()}` | pending (GPU + weights) |")
    return "\n".join(lines) + "\n"
