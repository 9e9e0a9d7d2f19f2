"""lm-eval 0.4.13's command forms with pvf-dlm, each through a real process, offline, on the CPU.

``lm-eval run`` with space-separated ``--model_args``, ``lm-eval run --config`` with a YAML file
naming pvf-dlm (typed values: integers, booleans, a mapping of model args; the command line over
the file), ``lm-eval ls tasks`` and ``lm-eval validate`` with ``--include_path
$(pvf-tasks-path)``, ``--plugins`` where the installed lm-eval has it, and the chat-template
prompts under ``fewshot_as_multiturn``, its default (true with ``--apply_chat_template``) and
``false``. The runs are started once per module, two at a time, on the bundled tiny-llada and the
offline ``arith`` task with ``--limit`` 2-4.

The chat prompts are checked against lm-eval's own prompt builder (the task's
``build_all_requests``, as the evaluator calls it) rendering through transformers'
``apply_chat_template`` with the fixture's tokenizer, as HFLM renders: pvf-dlm's renderer (a worker
process, ``models/chat_render.py``) must give the same strings.
"""

from __future__ import annotations

import glob
import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from importlib.metadata import version
from pathlib import Path

import pytest

from helpers.prerequisites import require_bundled_weights

BIN = Path(sys.executable).parent
LM_EVAL = str(BIN / "lm-eval")
#: the decoding of test_lm_cli.py's reference run, whose first four documents it pins
BASE_ARGS = ["pretrained=tiny-llada", "decoder=threshold", "gen_length=96", "block_length=32",
             "cache=dual"]
#: the package's tasks (tasks/*/*.yaml) -> their output type
PACKAGE_TASKS = {**dict.fromkeys((
    "arith", "arith_var", "gsm8k_pvf", "gsm8k_cot_pvf", "gsm8k_pvf_chat", "gsm8k_cot_pvf_chat",
    "humaneval_pvf", "humaneval_instruct_pvf", "humaneval_pvf_chat", "humaneval_pvf_sampled",
    "math500_pvf", "math500_pvf_chat", "mmlu_pro_pvf", "mmlu_pro_pvf_chat",
    # the published settings' tasks (lmeval/published.py)
    "gsm8k_llada_oc", "gsm8k_pvf_paper", "math_llada_oc", "humaneval_llada_oc",
    "humaneval_fastdllm", "humaneval_pvf_paper", "gsm8k_llada_oc_base", "math_llada_oc_base",
    "humaneval_llada_oc_base", "minerva_math_llada", "math_pvf_paper", "mmlu_pro_pvf_paper",
    "mmlu_pro_llada_oc", "arc_challenge_llada_oc", "mmlu_llada_oc", "hellaswag_llada_oc",
    "gpqa_diamond_llada_oc", "bbh_llada_oc_base", "ifeval_llada_oc",
    # the bbh_llada group's subtasks (tasks/bbh_llada/_bbh_llada.yaml)
    *(f"bbh_llada_{s}" for s in (
        "boolean_expressions", "causal_judgement", "date_understanding", "disambiguation_qa",
        "dyck_languages", "formal_fallacies", "geometric_shapes", "hyperbaton",
        "logical_deduction_five_objects", "logical_deduction_seven_objects",
        "logical_deduction_three_objects", "movie_recommendation", "multistep_arithmetic_two",
        "navigate", "object_counting", "penguins_in_a_table", "reasoning_about_colored_objects",
        "ruin_names", "salient_translation_error_detection", "snarks", "sports_understanding",
        "temporal_sequences", "tracking_shuffled_objects_five_objects",
        "tracking_shuffled_objects_seven_objects", "tracking_shuffled_objects_three_objects",
        "web_of_lies", "word_sorting")),
    "mbpp_llada_oc", "mbpp_llada_oc_base", "mbpp_llada"),
    "generate_until"),
    "gpqa_main_n_shot_llada": "multiple_choice"}
SHOTS = 2
#: the model args of the --config run, as YAML types them
CONFIG_MODEL_ARGS = {"pretrained": "tiny-llada", "decoder": "threshold", "gen_length": 96,
                     "block_length": 32, "threshold": 0.9, "early_stop": False, "top_k": None}


def _env() -> dict:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
            "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONWARNINGS": "ignore"}


def _run(cmd: list[str], cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, env={**_env(), **(env or {})}, capture_output=True,
                          text=True, timeout=400)


def _ok(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


@pytest.fixture(scope="module")
def tasks_path(tmp_path_factory) -> str:
    """What ``$(pvf-tasks-path)`` gives a shell."""
    proc = _ok(_run([str(BIN / "pvf-tasks-path")], tmp_path_factory.mktemp("tasks_path")))
    return proc.stdout.strip()


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tasks_path) -> dict[str, tuple[subprocess.CompletedProcess, Path]]:
    require_bundled_weights("tiny-llada")
    root = tmp_path_factory.mktemp("cli_forms")
    config = {"model": "pvf-dlm", "model_args": CONFIG_MODEL_ARGS, "tasks": ["arith"],
              "include_path": tasks_path, "limit": 3, "num_fewshot": SHOTS,
              "apply_chat_template": True, "batch_size": 2, "device": "cpu",
              "output_path": str(root / "config"), "log_samples": True}
    # JSON is YAML: the file holds the types YAML gives (int, float, bool, null, list, mapping)
    (root / "run.yaml").write_text(json.dumps(config, indent=2))
    common = ["--tasks", "arith", "--include_path", tasks_path, "--log_samples"]
    jobs = {
        # the subcommand, model args as separate words
        "run": [LM_EVAL, "run", "--model", "pvf-dlm", "--model_args", *BASE_ARGS, "--limit", "4",
                "--output_path", str(root / "run"), *common],
        # the YAML file, and one flag over it (--limit 2 over the file's 3)
        "config": [LM_EVAL, "run", "--config", str(root / "run.yaml"), "--limit", "2"],
        # few-shot in one user turn
        "single_turn": [LM_EVAL, "run", "--model", "pvf-dlm", "--model_args",
                        ",".join(BASE_ARGS), "--limit", "2", "--output_path",
                        str(root / "single_turn"), "--apply_chat_template", "--num_fewshot",
                        str(SHOTS), "--fewshot_as_multiturn", "false", *common],
        "ls": [LM_EVAL, "ls", "tasks", "--include_path", tasks_path],
        "validate": [LM_EVAL, "validate", "--tasks", "arith,arith_var,gsm8k_pvf_chat",
                     "--include_path", tasks_path],
        "validate_without_path": [LM_EVAL, "validate", "--tasks", "arith"],
    }
    with ThreadPoolExecutor(max_workers=2) as pool:
        procs = dict(zip(jobs, pool.map(lambda cmd: _run(cmd, root), jobs.values())))
    return {name: (proc, root / name) for name, proc in procs.items()}


def _samples(out: Path) -> dict[int, dict]:
    (path,) = glob.glob(str(out / "**" / "samples_arith_*.jsonl"), recursive=True)
    return {s["doc_id"]: s for s in map(json.loads, Path(path).read_text().splitlines())}


def _results(out: Path) -> dict:
    (path,) = glob.glob(str(out / "**" / "results_*.json"), recursive=True)
    return json.loads(Path(path).read_text())


def _prompts(out: Path) -> dict[int, str]:
    return {d: s["arguments"]["gen_args_0"]["arg_0"] for d, s in _samples(out).items()}


def lm_evals_chat_prompts(tasks_path: str, limit: int, multiturn: bool) -> dict[int, str]:
    """The prompts lm-eval 0.4.13 builds for ``arith``'s first ``limit`` documents with
    ``SHOTS`` shots (fewshot seed 1234, the CLI's) and the chat template, rendered by
    transformers with the fixture's tokenizer (HFLM's ``apply_chat_template``)."""
    from lm_eval.tasks import TaskManager
    from transformers import AutoTokenizer

    from pvf_lmeval.models.loader import FIXTURES_DIR

    tokenizer = AutoTokenizer.from_pretrained(str(FIXTURES_DIR / "tiny-llada"))

    def render(history, add_generation_prompt=True):
        return tokenizer.apply_chat_template(history, tokenize=False,
                                             add_generation_prompt=add_generation_prompt,
                                             continue_final_message=not add_generation_prompt)

    manager = TaskManager(include_path=tasks_path, include_defaults=False)
    task = manager.load(["arith"])["tasks"]["arith"]
    task.set_config(key="num_fewshot", value=SHOTS)
    task.set_fewshot_seed(seed=1234)
    task.build_all_requests(limit=limit, apply_chat_template=True, fewshot_as_multiturn=multiturn,
                            chat_template=render, tokenizer_name="tiny-llada")
    return {i.doc_id: i.args[0] for i in task.instances}


def _turns(prompt: str) -> list[str]:
    """The roles of a tiny-llada chat prompt's turns, in order."""
    return re.findall(r"<\|start_header_id\|>(\w+)<\|end_header_id\|>", prompt)


def test_lm_eval_run_with_space_separated_model_args(runs):
    """``lm-eval run --model_args k=v k=v``: the model args as a mapping, decoded as the legacy
    ``lm_eval --model_args k=v,k=v`` decodes them (test_lm_cli.py pins those documents: all four
    right, 4, 3, 5 and 3 calls)."""
    proc, out = runs["run"]
    _ok(proc)
    samples = _samples(out)
    assert [samples[d]["nfe"] for d in range(4)] == [4, 3, 5, 3]
    assert [samples[d]["exact_match"] for d in range(4)] == [1.0] * 4
    results = _results(out)
    assert results["config"]["model_args"] == {"pretrained": "tiny-llada", "decoder": "threshold",
                                               "gen_length": 96, "block_length": 32,
                                               "cache": "dual"}
    assert results["config"]["pvf"]["params"]["cache"] == "dual"
    assert "|arith|" in proc.stdout       # lm-eval's table


def test_lm_eval_run_config_yaml_naming_pvf_dlm(runs, tasks_path):
    """``lm-eval run --config run.yaml``: the file names pvf-dlm and gives its model args as a
    mapping of YAML types (96 an int, false a bool, null); the command line's ``--limit 2`` wins
    over the file's 3. Its few-shot chat prompts take lm-eval 0.4.13's default,
    ``fewshot_as_multiturn`` true: each shot a user turn and an assistant turn."""
    proc, out = runs["config"]
    _ok(proc)
    results = _results(out)
    config, pvf = results["config"], results["config"]["pvf"]
    assert config["model"] == "pvf-dlm" and config["model_args"] == CONFIG_MODEL_ARGS
    assert config["batch_size"] == 2 and config["limit"] == 2 and config["device"] == "cpu"
    assert pvf["early_stop"] is False and pvf["params"]["gen_length"] == 96
    assert pvf["params"]["top_k"] is None and pvf["device"] == "cpu"
    assert results["fewshot_as_multiturn"] is True
    assert "Using default fewshot_as_multiturn=True." in proc.stderr
    prompts = _prompts(out)
    assert sorted(prompts) == [0, 1]
    for prompt in prompts.values():
        assert _turns(prompt) == ["user", "assistant"] * SHOTS + ["user", "assistant"]
    assert prompts == lm_evals_chat_prompts(tasks_path, 2, multiturn=True)


def test_fewshot_as_multiturn_false_puts_the_shots_in_one_user_turn(runs, tasks_path):
    proc, out = runs["single_turn"]
    _ok(proc)
    assert _results(out)["fewshot_as_multiturn"] is False
    prompts = _prompts(out)
    for prompt in prompts.values():
        assert _turns(prompt) == ["user", "assistant"]
        assert prompt.count("Question:") == SHOTS + 1
    assert prompts == lm_evals_chat_prompts(tasks_path, 2, multiturn=False)


def test_lm_eval_ls_tasks_lists_the_package_tasks(runs, tasks_path):
    """``lm-eval ls tasks --include_path $(pvf-tasks-path)``: every task of the package, each
    at its YAML under that folder, as a generate_until task (lm-eval's own tasks beside them)."""
    proc, _ = runs["ls"]
    _ok(proc)
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in proc.stdout.splitlines()
            if line.startswith("|")]
    ours = {r[0]: r[1:] for r in rows if len(r) == 3 and r[1].startswith(tasks_path + os.sep)}
    assert set(ours) == set(PACKAGE_TASKS)
    for name, (location, output_type) in ours.items():
        assert Path(location).suffix == ".yaml" and output_type == PACKAGE_TASKS[name], name
    assert "gsm8k" in {r[0] for r in rows}


def test_lm_eval_validate_with_and_without_include_path(runs):
    proc, _ = runs["validate"]
    _ok(proc)
    assert proc.stdout.splitlines()[-1] == "All tasks found and valid"
    # without --include_path lm-eval's validate says so itself, in one line (exit 1)
    proc, _ = runs["validate_without_path"]
    assert proc.returncode == 1 and proc.stdout.splitlines()[-1] == "Tasks not found: arith"


def test_plugins_flag_where_lm_eval_has_it(tmp_path, tasks_path):
    """lm-eval releases after 0.4.13 load model entry points (``--plugins`` /
    ``LM_EVAL_PLUGINS``); pyproject.toml declares pvf-dlm's in ``lm_eval.models``. Where the
    installed lm-eval has the flag, pvf-dlm must run through it with the ``.pth`` hook also
    installed (no second registration)."""
    help_text = _ok(_run([LM_EVAL, "run", "--help"], tmp_path)).stdout
    if "--plugins" not in help_text:
        proc = _run([LM_EVAL, "run", "--plugins", "pvf-dlm", "--model", "pvf-dlm", "--tasks",
                     "arith"], tmp_path)
        assert proc.returncode == 2 and "unrecognized arguments: --plugins" in proc.stderr
        pytest.skip(f"lm-eval {version('lm_eval')} has no --plugins or LM_EVAL_PLUGINS: pvf-dlm "
                    "reaches its CLI through the .pth hook; the lm_eval.models entry point stays "
                    "for the releases that read it")
    require_bundled_weights("tiny-llada")
    for extra, env in ((["--plugins", "pvf-dlm"], None), ([], {"LM_EVAL_PLUGINS": "pvf-dlm"})):
        proc = _run([LM_EVAL, "run", *extra, "--model", "pvf-dlm", "--model_args", *BASE_ARGS,
                     "--tasks", "arith", "--include_path", tasks_path, "--limit", "2"],
                    tmp_path, env)
        _ok(proc)
        assert "|arith|" in proc.stdout


def test_model_args_on_the_command_line_replace_the_config_files_and_pretrained_is_noted(
        tmp_path, tasks_path, caplog):
    """``lm-eval run --config run.yaml --model_args decoder=pvf``: lm-eval 0.4.13 replaces the
    file's model_args mapping whole, so the file's ``pretrained`` is gone. HFLM then fails
    (``pretrained`` has no default); pvf-dlm loads its bundled default and says so in one line.
    lm-eval's own parser and config builder make the model args, as its CLI does."""
    from lm_eval._cli.harness import HarnessCLI
    from lm_eval.config.evaluate_config import EvaluatorConfig

    from pvf_lmeval.lmeval.lm import PVFDiffusionLM

    require_bundled_weights("tiny-llada")
    (tmp_path / "run.yaml").write_text(json.dumps(
        {"model": "pvf-dlm", "model_args": {"pretrained": "tiny-dream", "gen_length": 64},
         "tasks": ["arith"], "include_path": tasks_path}))
    argv = ["lm-eval", "run", "--config", str(tmp_path / "run.yaml"), "--model_args",
            "decoder=pvf"]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys, "argv", argv)
        config = EvaluatorConfig.from_cli(HarnessCLI().parse_args())
    assert config.model_args == {"decoder": "pvf"}
    notice = ("pvf-dlm: no pretrained in the model args, so the bundled tiny-llada loads (with "
              "lm-eval run --config, a --model_args on the command line replaces the file's "
              "model_args whole, pretrained included)")
    lm = PVFDiffusionLM.create_from_arg_obj(config.model_args, {"device": "cpu"})
    assert lm.pretrained == "tiny-llada" and lm.params.decoder == "pvf"
    assert [r.getMessage() for r in caplog.records].count(notice) == 1
    caplog.clear()
    PVFDiffusionLM.create_from_arg_obj({"pretrained": "tiny-llada"}, {"device": "cpu"})
    assert notice not in [r.getMessage() for r in caplog.records]
