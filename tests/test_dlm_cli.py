"""``pvf-dlm``: the model args, decoders, presets and bundled vocabularies, printed from the code;
docs/arguments.md's model-args table is its ``args --markdown`` output."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def dlm(*argv: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "pvf_lmeval.cli.dlm", *argv], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_console_script_is_declared():
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["pvf-dlm"] == "pvf_lmeval.cli.dlm:main"


def test_the_model_args_table_is_the_generated_one():
    text = (REPO / "docs" / "arguments.md").read_text()
    begin, end = "<!-- model-args:begin -->\n", "\n<!-- model-args:end -->"
    assert text.count(begin) == 1 and text.count(end) == 1
    table = text.split(begin)[1].split(end)[0] + "\n"
    assert table == dlm("args", "--markdown"), "docs/arguments.md's model-args table drifted: paste " \
        "the output of `pvf-dlm args --markdown` between the model-args markers"


def test_the_table_lists_exactly_the_keys_the_adapter_accepts():
    from pvf_lmeval.decoding.params import PARAMS
    from pvf_lmeval.lmeval import parallel, settings
    from pvf_lmeval.lmeval.model_args import ALL_ARGS
    from pvf_lmeval.planning.vocab import VOCAB_ARGS

    specs = {a.name: a for a in ALL_ARGS}
    taken = [k for k in parallel.KEYS if k not in parallel.ALIASES]   # parse_parallel's
    decoding = [name for name, p in PARAMS.items() if p.public]
    assert sorted(specs) == sorted([*settings.MODEL_KEYS, *settings.OPTION_KEYS, "vocab",
                                    *VOCAB_ARGS, *decoding, *taken])
    run = settings.RunSettings.parse({})
    assert (specs["pretrained"].default, specs["dtype"].default) == (run.model.pretrained,
                                                                     run.model.dtype)
    assert specs["vocab"].default == run.vocabulary.spec
    for name in ("batch_size", "mc_num", "mc_batch", "truncation"):
        assert specs[name].default == str(getattr(run.options, name)), name
    assert (run.model.compile, run.options.trace) == (None, None)
    assert (specs["compile"].default, specs["trace"].default) == ("false", "none")


def test_args_plain_lines():
    lines = dlm("args").splitlines()
    assert lines[0].split() == ["key", "default", "allowed", "meaning"]
    row = next(line for line in lines if line.startswith("decoder "))
    assert row.split(None, 2)[:2] == ["decoder", "threshold"]
    assert row.split("  ")[-1].strip() == "the decoding algorithm (pvf-dlm decoders)"
    assert "  static, threshold, eb, freedave, pvf, explore, subblock, hierarchy, credit, wino, joint, pvf-edit, renoise  " in row
    assert len(lines) == 1 + 78


def test_decoders_and_their_parameters():
    rows = {line.split()[0]: line for line in dlm("decoders").splitlines()[1:]}
    assert list(rows) == ["static", "threshold", "eb", "freedave", "pvf", "explore", "subblock",
                          "hierarchy", "credit", "wino", "joint", "pvf-edit", "renoise"]
    own = {name: line.rsplit("  ", 1)[1].strip() for name, line in rows.items()}
    assert own == {
        "static": "steps, logits_eos_inf, confidence_eos_eot_inf",
        "threshold": "threshold, factor",
        "eb": "gamma",
        "freedave": "draft_steps, base_rule, threshold (with base_rule=threshold), factor (with "
                    "base_rule=threshold)",
        "pvf": "threshold, plan_lo, plan_hi, ar_lo, width, reveal_next, routes, plan_self_check, vocab",
        "explore": "threshold, pick, band, reveal_next, vocab",
        "subblock": "threshold, sub_block",
        "hierarchy": "threshold, low_threshold",
        "credit": "threshold, credit_alpha, boost_gamma, decay",
        "wino": "threshold, back_threshold",
        "joint": "threshold, edit_threshold, editing, post_edit_steps, penalty",
        "pvf-edit": "threshold, plan_lo, plan_hi, ar_lo, width, reveal_next, routes, "
                    "plan_self_check, edit_threshold, editing, post_edit_steps, vocab",
        "renoise": "max_denoising_steps, entropy_bound, t_min, t_max, stability_threshold, "
                   "confidence_threshold",
    }


def test_presets_table():
    """The paper's table (SPEC "Defaults"): math-word/knowledge 0.2-0.65, ar_lo 0.1, N_s 5;
    code/math 0.8-0.9, ar_lo 0.3, N_s 0; width 3 everywhere."""
    rows = [line.split(None, 7) for line in dlm("presets").splitlines()[1:]]
    assert [r[:7] for r in rows] == [
        ["none", "-", "0.2", "0.65", "0.1", "3", "0"],
        ["gsm8k", "math-word", "0.2", "0.65", "0.1", "3", "5"],
        ["arith", "math-word", "0.2", "0.65", "0.1", "3", "5"],
        ["mmlu_pro", "knowledge", "0.2", "0.65", "0.1", "3", "5"],
        ["humaneval", "code", "0.8", "0.9", "0.3", "3", "0"],
        ["math", "math", "0.8", "0.9", "0.3", "3", "0"],
    ]
    assert rows[2][7] == "arith, arith_var"


def test_vocab_lists_every_bundled_artifact():
    lines = dlm("vocab").splitlines()[1:]
    files = sorted((REPO / "vocab_artifacts").glob("*.json"))
    assert [line.split()[0] for line in lines] == [f.stem for f in files]
    row = next(line for line in lines if line.startswith("tiny-llada.math-word.calibrated "))
    n = len(json.loads((REPO / "vocab_artifacts" / "tiny-llada.math-word.calibrated.json").read_text())["tokens"])
    assert row.split()[1:6] == ["calibrated", "llada", "math-word", str(n), "tiny-llada"]


def test_models_lists_every_family_and_how_it_is_recognised():
    text = dlm("models")
    rows = [line for line in text.split("\n\n")[0].splitlines()[1:]]
    by_type = {line.split("  ")[0]: line for line in rows}
    assert len(rows) == 11
    sdar = next(line for line in rows if line.startswith("SDAR, TraDo "))
    assert sdar.split()[2:5] == ["sdar", "sdar", "SDARForCausalLM"]     # model_family: sdar
    assert "block-causal, blocks of block_size (4 if absent)" in sdar
    fast = next(line for line in rows if line.startswith("Fast-dLLM v2 "))
    assert fast.split()[-2:] == ["yes", "151665"]                 # shifted; |<MASK>| by default
    assert "LLaDA-MoE" in by_type and "model_type llada with num_experts is LLaDA-MoE" in text
    gemma = by_type["DiffusionGemma"]
    assert gemma.split()[1:4] == ["diffusion_gemma", "diffusion_gemma", "DiffusionGemmaForBlockDiffusion"]
    assert "causal on the context, bidirectional on a canvas of canvas_length (256 if" in gemma
    assert gemma.split()[-2:] == ["no", "none"]                    # not shifted; no mask token
    assert "Uniform-state (no mask token; its canvas starts as random tokens): DiffusionGemma" in text
    assert "Refused with one line" not in text


def test_no_command_is_a_usage_error():
    proc = subprocess.run([sys.executable, "-m", "pvf_lmeval.cli.dlm"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "required: COMMAND" in proc.stderr
