"""Bad ``--model_args`` fail fast with a one-line message naming the argument, both through the
real CLI (``lm_eval`` in a subprocess, offline: one line on stderr, no traceback, exit status 1,
nothing loaded) and through ``create_from_arg_string`` (a ``ValueError``); so do a mistyped
``--gen_kwargs`` key and ``--apply_chat_template`` on a tokenizer without a template."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from helpers.edited_folders import DROP, edit_json

pytest.importorskip("lm_eval")
torch = pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
MODEL = "tiny-llada"
NO_GPU = not torch.cuda.is_available()

#: (id, model_args, pattern that the one-line message must contain); "{gpt2}" is a folder whose
#: config.json says model_type gpt2
CASES = [
    ("decoder", f"pretrained={MODEL},decoder=bogus", "decoder='bogus' is not one of static, threshold"),
    ("gen_length", f"pretrained={MODEL},gen_length=100,block_length=32",
     "gen_length=100 must be a multiple of block_length=32"),
    ("threshold_high", f"pretrained={MODEL},threshold=1.5", "threshold=1.5 must be in (0, 1]"),
    ("threshold_zero", f"pretrained={MODEL},threshold=0", "threshold=0.0 must be in (0, 1]"),
    ("unknown_arg", f"pretrained={MODEL},tresh=0.5", "unknown model arg 'tresh'"),
    ("checkpoint", "pretrained={gpt2}", "model_type='gpt2'"),
    ("device", f"pretrained={MODEL},device=cuda", "device='cuda'"),
    ("max_batch_size", f"pretrained={MODEL},max_batch_size=0",
     "max_batch_size=0 must be a positive integer"),
    ("batch_size_auto_n", f"pretrained={MODEL},batch_size=auto:x",
     "batch_size='auto:x': auto:N needs a number N > 0"),
    ("max_length", f"pretrained={MODEL},max_length=1024",
     "max_length=1024 is longer than the checkpoint's context of 512 tokens; use at most that"),
    ("max_length_zero", f"pretrained={MODEL},max_length=0", "max_length=0 must be a positive integer"),
    ("add_bos_token", "pretrained=tiny-dream,add_bos_token=true",
     "add_bos_token=true: the tokenizer of 'tiny-dream' has no BOS token; drop add_bos_token"),
    ("add_bos_token_value", f"pretrained={MODEL},add_bos_token=maybe",
     "add_bos_token='maybe' must be true or false"),
    ("compile", f"pretrained={MODEL},compile=fast",
     "compile='fast' must be one of false, true, blocks, model"),
    ("compile_round", f"pretrained={MODEL},compile_round=fast",
     "compile_round='fast' must be true or false"),
]
#: every key that works, in the order the unknown-key message lists them
ALLOWED = ("pretrained, revision, tokenizer, dtype, device, batch_size, batch_invariant, "
           "max_batch_size, compile, compile_round, max_length, truncation, add_bos_token, "
           "trace, trace_append, mc_num, mc_batch, mc_stratum, mask_logit, "
           "tensor_parallel_size, parallel_layers, data_parallel_size, decoder, preset, "
           "gen_length, block_length, temperature, top_k, top_p, seed, early_stop, cache, rules, "
           "cfg_scale, steps, logits_eos_inf, confidence_eos_eot_inf, threshold, factor, gamma, "
           "draft_steps, base_rule, plan_lo, plan_hi, ar_lo, width, reveal_next, routes, "
           "plan_self_check, pick, band, sub_block, low_threshold, credit_alpha, boost_gamma, "
           "decay, back_threshold, edit_threshold, editing, post_edit_steps, penalty, "
           "max_denoising_steps, entropy_bound, t_min, t_max, stability_threshold, "
           "confidence_threshold, vocab, vocab_force, rho_ver, gamma_vig, online_level, online_explore, "
           "online_explore_max, online_seed, online_save, online_frozen, online_merge")
#: through the CLI (each costs an interpreter start and lm-eval's task index, 10-90 s): the
#: exact stderr line. The checkpoint does not exist, so an error about it would mean that the
#: arguments were checked after loading began.
MISSING = "/nonexistent/checkpoint"
#: (id, model_args, the exact last line of stderr, more CLI arguments); "{bare}" is tiny-llada
#: without a chat template
CLI_CASES = [
    ("typo", f"pretrained={MISSING},decodr=pvf",
     f"pvf-dlm: unknown model arg 'decodr'; did you mean 'decoder'? allowed: {ALLOWED} "
     "(pvf-dlm args explains each)", []),
    ("value", f"pretrained={MISSING},decoder=bogus",
     "pvf-dlm: decoder='bogus' is not one of static, threshold, eb, freedave, pvf, explore, "
     "subblock, hierarchy, credit, wino, joint, pvf-edit, renoise", []),
    ("combination", f"pretrained={MISSING},decoder=pvf,plan_hi=0.95",
     "pvf-dlm: plan_hi=0.95 must not exceed threshold=0.9", []),
    # HFLM: max_batch_size bounds batch_size=auto only; lm-eval passes it with any --batch_size
    # (accepted: the error is the checkpoint's, checked after the arguments)
    ("max_batch_size", f"pretrained={MISSING}",
     f"pvf-dlm: pretrained='{MISSING}': no such checkpoint folder (written as a local path, so "
     "it is not looked up on the hub; bundled models: tiny-llada, tiny-dream)",
     ["--batch_size", "4", "--max_batch_size", "8"]),
    ("gen_kwargs", f"pretrained={MODEL},gen_length=32",
     "pvf-dlm: unknown generation kwarg 'temprature' (task generation_kwargs or --gen_kwargs); "
     "did you mean 'temperature'? Valid: decoding parameters (", ["--gen_kwargs", "temprature=0.5"]),
    ("chat_template", "pretrained={bare},gen_length=32",
     "pvf-dlm: --apply_chat_template: the tokenizer of '{bare}' has no chat template (a base "
     "checkpoint?); drop --apply_chat_template or use an instruct checkpoint",
     ["--apply_chat_template"]),
]


def _env() -> dict:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1",
            "TOKENIZERS_PARALLELISM": "false"}


@pytest.fixture(scope="module")
def gpt2_folder(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("gpt2")
    (folder / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": 2, "vocab_size": 50}))
    return folder


def _args(model_args: str, gpt2: Path) -> str:
    return model_args.replace("{gpt2}", str(gpt2))


@pytest.fixture(scope="module")
def bare_folder(tmp_path_factory) -> Path:
    """tiny-llada without a chat template (a base checkpoint)."""
    import shutil

    from pvf_lmeval.models.loader import FIXTURES_DIR

    folder = tmp_path_factory.mktemp("bare") / "tiny-llada-base"
    shutil.copytree(FIXTURES_DIR / "tiny-llada", folder)
    edit_json(folder / "tokenizer_config.json", {"chat_template": DROP})
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    return folder


@pytest.fixture(scope="module")
def cli_failures(gpt2_folder, bare_folder, tmp_path_factory) -> dict:
    """Every CLI case, two interpreters at a time: id -> CompletedProcess."""
    out_dir = tmp_path_factory.mktemp("cli_errors")

    def run(case):
        cid, model_args, _, more = case
        cmd = [str(BIN / "lm_eval"), "--model", "pvf-dlm",
               "--model_args", model_args.replace("{bare}", str(bare_folder)),
               "--include_path", str(REPO / "tasks"), "--tasks", "arith", "--limit", "1",
               "--device", "cpu", "--output_path", str(out_dir / cid), *more]
        return cid, subprocess.run(cmd, cwd=out_dir, env=_env(), capture_output=True, text=True,
                                   timeout=300)

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(pool.map(run, CLI_CASES))


def _last_line(text: str) -> str:
    return [line for line in text.splitlines() if line.strip()][-1]


@pytest.mark.parametrize("cid,model_args,message", CASES, ids=[c[0] for c in CASES])
def test_bad_model_args_in_process(cid, model_args, message, gpt2_folder):
    from pvf_lmeval.lmeval.lm import PVFDiffusionLM

    if cid == "device" and not NO_GPU:
        pytest.skip("a GPU is present")
    with pytest.raises(ValueError) as info:
        PVFDiffusionLM.create_from_arg_string(_args(model_args, gpt2_folder),
                                              {"batch_size": 1, "max_batch_size": None, "device": "cpu"})
    text = str(info.value)
    assert message in text and "\n" not in text


@pytest.mark.parametrize("cid,model_args,line,more", CLI_CASES, ids=[c[0] for c in CLI_CASES])
def test_bad_model_args_through_the_cli(cid, model_args, line, more, cli_failures, bare_folder):
    proc = cli_failures[cid]
    assert proc.returncode == 1, proc.stderr[-2000:]
    line = line.replace("{bare}", str(bare_folder))
    last = _last_line(proc.stderr)
    assert (last.startswith(line) if cid == "gen_kwargs" else last == line), proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr + proc.stdout


def test_the_unknown_key_message_lists_only_keys_that_work():
    from pvf_lmeval.lmeval.model_args import ModelArgError, check_keys

    with pytest.raises(ModelArgError) as info:
        check_keys(["decodr"])
    listed = str(info.value).split("allowed: ")[1].split(" (")[0]
    assert listed == ALLOWED
    assert "trust_remote_code" not in listed.split(", ")
    check_keys(["trust_remote_code"])   # accepted for HFLM command lines, ignored with a notice
    with pytest.raises(ModelArgError, match=r"^pvf-dlm: unknown model arg 'zzz'; allowed: "):
        check_keys(["zzz"])             # nothing close: no guess


def test_the_one_line_hook_prints_only_marked_errors(capsys, monkeypatch):
    """The CLI's uncaught argument error prints as one line; any other error keeps its
    traceback (the previous hook)."""
    import sys as _sys

    from pvf_lmeval.one_line import exit_in_one_line

    seen = []
    monkeypatch.setattr(_sys, "excepthook", lambda *a: seen.append(a[1]))
    marked = ValueError("threshold=1.5 must be in\n(0, 1]")
    exit_in_one_line(marked)
    _sys.excepthook(ValueError, marked, None)
    other = RuntimeError("boom")
    _sys.excepthook(RuntimeError, other, None)
    assert capsys.readouterr().err == "pvf-dlm: threshold=1.5 must be in (0, 1]\n"
    assert seen == [other]


def test_unknown_model_arg_lists_the_allowed_ones():
    from pvf_lmeval.lmeval.lm import PVFDiffusionLM

    with pytest.raises(ValueError, match=r"^pvf-dlm: unknown model arg 'tresh'; did you mean 'threshold'\? allowed: pretrained, "):
        PVFDiffusionLM.create_from_arg_string(f"pretrained={MODEL},tresh=0.5", {"device": "cpu"})


def test_bad_arguments_fail_before_the_checkpoint_loads(tmp_path):
    """A decoder argument error wins even when ``pretrained`` does not exist: nothing is loaded."""
    from pvf_lmeval.lmeval.lm import PVFDiffusionLM

    with pytest.raises(ValueError, match="decoder='bogus'"):
        PVFDiffusionLM.create_from_arg_string(f"pretrained={tmp_path / 'missing'},decoder=bogus",
                                              {"device": "cpu"})
    with pytest.raises(ValueError, match=r"batch_size='x' must be a positive integer"):
        PVFDiffusionLM.create_from_arg_string(f"pretrained={tmp_path / 'missing'},batch_size=x",
                                              {"device": "cpu"})


@pytest.mark.parametrize("args, message", [
    ({"vocab": "online", "rho_ver": "x"}, r"rho_ver='x' must be a number"),
    ({"online_level": 0.3}, r"online_level applies only to vocab=online"),
    ({"batch_size": 2.5}, r"batch_size=2.5 must be a positive integer"),
    ({"mc_num": 0}, r"mc_num=0 must be a positive integer"),
])
def test_every_argument_is_checked_before_the_model_loads(args, message):
    from pvf_lmeval.lmeval.lm import PVFDiffusionLM

    # a checkpoint that does not exist: the argument's error must come first
    with pytest.raises(ValueError, match=message):
        PVFDiffusionLM(pretrained="/nonexistent/checkpoint", device="cpu", **args)
