"""PVF's calibrated planning vocabulary on every model family (``models.formats.MODEL_FAMILIES``):
``pvf-calibrate`` on the family's tiny hub-shaped folder writes an artifact of that family into
the user's vocabulary folder, and ``vocab=auto`` then picks it, as the adapter's planning
vocabulary, and decodes with it. A block-diffusion family calibrates on its own blocks (no
``--block-length``)."""

from __future__ import annotations

import json

import pytest
from helpers.hub_folders import make_dream_folder, make_llada_folder
from helpers.moe_folders import make_llada2_folder, make_lladamoe_folder
from helpers.qwen_folders import make_fast_dllm_folder, make_rnd1_folder, make_sdar_folder

from pvf_lmeval.cli.calibrate import main as calibrate
from pvf_lmeval.models.formats import MODEL_FAMILIES
from pvf_lmeval.planning.vocab import load_artifact

pytestmark = pytest.mark.usefixtures("one_thread")

#: family -> (folder builder, gen_length, block_length); a block-diffusion family decodes in its
#: own blocks, given by no block length
FOLDERS = {
    "llada": (make_llada_folder, 8, 8),
    "dream": (make_dream_folder, 8, 8),
    "llada-moe": (make_lladamoe_folder, 8, 8),
    "llada2": (make_llada2_folder, 32, None),                 # blocks of 32
    "sdar": (make_sdar_folder, 8, None),                      # blocks of 4
    "fast-dllm": (lambda f, seed: make_fast_dllm_folder(f, seed, bd_size=8), 8, None),
    "rnd1": (make_rnd1_folder, 8, 8),
}
PROMPTS = ["Question: Tom has 3 books and gets 2 more. How many books does he have?\nAnswer:",
           "Question: 4 + 5 = ?\nAnswer:"]


#: families without a mask token: their calibration is refused in one line
UNIFORM_STATE = ("diffusion_gemma",)


def test_every_family_is_calibrated_here():
    assert tuple(f for f in MODEL_FAMILIES if f not in UNIFORM_STATE) == tuple(FOLDERS)
    assert set(UNIFORM_STATE) <= set(MODEL_FAMILIES)


def test_a_uniform_state_family_is_refused_in_one_line(tmp_path, monkeypatch, capsys):
    from helpers.gemma_folders import make_gemma_folder

    monkeypatch.setenv("PVF_LMEVAL_HOME", str(tmp_path / "home"))
    folder = make_gemma_folder(tmp_path / "tiny-dg", seed=1)
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    assert calibrate(["--model", str(folder), "--data", str(data), "--family", "math-word",
                      "--gen-length", "32", "--device", "cpu", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "a uniform-state diffusion model (no mask token" in err
    assert not list((tmp_path / "home").rglob("*.json"))


@pytest.mark.parametrize("family", list(FOLDERS))
def test_calibrate_then_vocab_auto(family, tmp_path, monkeypatch):
    from lm_eval.api.instance import Instance

    from pvf_lmeval.lmeval.lm import PVFDiffusionLM

    monkeypatch.setenv("PVF_LMEVAL_HOME", str(tmp_path / "home"))
    make, gen_length, block = FOLDERS[family]
    blocks = ["--block-length", str(block)] if block else []
    folder = make(tmp_path / f"tiny-{family}", seed=1)
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    # every measured token kept: a random network's confidences are spread thin
    assert calibrate(["--model", str(folder), "--data", str(data), "--family", "math-word",
                      "--gen-length", str(gen_length), "--band", "0:1", "--min-n", "1",
                      "--min-m", "0", "--rho-ver", "0", "--gamma-vig", "-1000", "--width", "64",
                      "--device", "cpu", "--no-progress", *blocks]) == 0
    out = tmp_path / "home" / "vocab" / f"tiny-{family}.math-word.calibrated.json"
    art = load_artifact(out)
    assert (art["model_family"], art["kind"], art["task_family"]) == \
        (family, "calibrated", "math-word")
    ids = sorted(t["id"] for t in art["tokens"])
    assert ids

    lm = PVFDiffusionLM(pretrained=str(folder), decoder="pvf", vocab="auto", device="cpu",
                        gen_length=gen_length, **({"block_length": block} if block else {}))
    assert lm.get_model_info()["pvf"]["vocab"] == f"auto:{out}"
    assert list(lm.params.plan_vocab) == ids
    [text] = lm.generate_until([Instance(request_type="generate_until", doc={}, idx=0,
                                         metadata=("mine", 0, 1),
                                         arguments=(PROMPTS[1], {"until": ["Question:"]}))])
    assert text.meta["gen_length"] == gen_length and text.meta["nfe"] >= 1
