"""Bad ``--model_args`` fail fast with a one-line message naming the argument, both through the
real CLI (``lm_eval`` in a subprocess, offline) and through ``create_from_arg_string``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

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
    ("max_batch_size", f"pretrained={MODEL},max_batch_size=64",
     "max_batch_size=64 has no effect: pvf-dlm decodes a fixed batch_size"),
    ("compile", f"pretrained={MODEL},compile=fast",
     "compile='fast' must be one of false, true, blocks, model"),
]
#: cases also run through the CLI (each costs an interpreter start and a task index, ~10 s)
CLI_CASES = ("decoder", "device")


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
def cli_failures(gpt2_folder, tmp_path_factory) -> dict:
    """Every CLI case, two interpreters at a time: id -> CompletedProcess."""
    out_dir = tmp_path_factory.mktemp("cli_errors")

    def run(case):
        cid, model_args, _ = case
        cmd = [str(BIN / "lm_eval"), "--model", "pvf-dlm", "--model_args", _args(model_args, gpt2_folder),
               "--include_path", str(REPO / "tasks"), "--tasks", "arith", "--limit", "1",
               "--output_path", str(out_dir / cid)]
        return cid, subprocess.run(cmd, cwd=out_dir, env=_env(), capture_output=True, text=True,
                                   timeout=300)

    cases = [c for c in CASES if c[0] in CLI_CASES and (c[0] != "device" or NO_GPU)]
    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(pool.map(run, cases))


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


@pytest.mark.parametrize("cid", CLI_CASES)
def test_bad_model_args_through_the_cli(cid, cli_failures):
    if cid == "device" and not NO_GPU:
        pytest.skip("a GPU is present")
    message = dict((c[0], c[2]) for c in CASES)[cid]
    proc = cli_failures[cid]
    assert proc.returncode != 0
    last = _last_line(proc.stderr)
    assert "Error" in last.split(":")[0] or "Checkpoint" in last.split(":")[0], last
    assert message in last, proc.stderr[-2000:]
    assert "Traceback" not in proc.stdout


def test_unknown_model_arg_lists_the_allowed_ones():
    from pvf_lmeval.lmeval.lm import PVFDiffusionLM

    with pytest.raises(ValueError, match=r"unknown model arg 'tresh'; allowed: pretrained, .*threshold"):
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
