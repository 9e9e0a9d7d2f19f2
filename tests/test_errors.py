"""The errors users hit first, through the adapter: each is one readable line that says what to do.

A checkpoint without a mask token, a prompt longer than the model's context, a chat template
missing under ``--apply_chat_template``, CUDA asked for without a GPU, out of memory.
Runs on small random temporary checkpoints (``test_models_oracle.make_temp_checkpoint``).
"""

from __future__ import annotations

import json
import shutil

import pytest

pytest.importorskip("lm_eval")
torch = pytest.importorskip("torch")

from lm_eval.api.instance import Instance  # noqa: E402
from test_models_oracle import make_temp_checkpoint  # noqa: E402

from pvf_lmeval.lm import PVFDiffusionLM, PVFOutOfMemoryError  # noqa: E402


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_temp_checkpoint(tmp_path_factory.mktemp("ckpt") / "llada", "llada")


@pytest.fixture(scope="module")
def lm(ckpt):
    return PVFDiffusionLM(pretrained=str(ckpt), device="cpu", decoder="pvf", gen_length=16,
                          block_length=8, vocab="none", mc_num=4, mc_batch=4)


def one_line(exc_info) -> str:
    msg = str(exc_info.value)
    assert msg and "\n" not in msg, f"not one line: {msg!r}"
    return msg


def _gen(context: str, doc: int = 0) -> Instance:
    return Instance(request_type="generate_until", doc={}, arguments=(context, {"until": ["\n\n"]}),
                    idx=0, metadata=("arith", doc, 1))


def _ll(context: str, continuation: str, doc: int = 0) -> Instance:
    return Instance(request_type="loglikelihood", doc={}, arguments=(context, continuation), idx=0,
                    metadata=("arith", doc, 1))


# ------------------------------------------------------------------ checkpoint without a mask token


def test_checkpoint_without_mask_token(ckpt, tmp_path):
    folder = tmp_path / "no-mask"
    shutil.copytree(ckpt, folder)
    config = json.loads((folder / "config.json").read_text())
    del config["mask_token_id"]
    (folder / "config.json").write_text(json.dumps(config))
    tj = json.loads((folder / "tokenizer.json").read_text())
    tj["added_tokens"] = [t for t in tj["added_tokens"] if t["content"] != "<|mdm_mask|>"]
    (folder / "tokenizer.json").write_text(json.dumps(tj))
    tc = json.loads((folder / "tokenizer_config.json").read_text())
    tc.pop("mask_token", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(tc))
    with pytest.raises(ValueError) as exc:
        PVFDiffusionLM(pretrained=str(folder), device="cpu")
    msg = one_line(exc)
    assert "no mask token" in msg and "mask_token_id" in msg and "not a masked diffusion LM" in msg


# ------------------------------------------------------------------ prompt longer than the context


def test_prompt_longer_than_context_generation(lm):
    limit = lm.model.max_length
    long_prompt = "Question: " + "one two three " * limit + "\nAnswer:"
    with pytest.raises(ValueError) as exc:
        lm.generate_until([_gen(long_prompt)], disable_tqdm=True)
    msg = one_line(exc)
    assert f"context of {limit} tokens" in msg and "gen_length=16" in msg
    assert "few-shot" in msg                       # says what to do


def test_prompt_plus_gen_length_just_over_context(lm):
    limit = lm.model.max_length
    ids = lm.tokenizer.encode("Question: 1 + 2?\nAnswer:", add_special_tokens=False)
    params_len = 16
    # a prompt that fits alone but not with gen_length
    words = " x" * (limit - len(ids) - params_len + 4)
    with pytest.raises(ValueError) as exc:
        lm.generate_until([_gen("Question:" + words + "\nAnswer:")], disable_tqdm=True)
    assert "longer than the model's context" in one_line(exc)


def test_context_longer_than_model_loglikelihood(lm):
    limit = lm.model.max_length
    with pytest.raises(ValueError) as exc:
        lm.loglikelihood([_ll("Question: " + "one two " * limit, " 3")], disable_tqdm=True)
    msg = one_line(exc)
    assert "context + continuation" in msg and f"context of {limit} tokens" in msg


# ------------------------------------------------------------------ chat template missing


def test_chat_template_missing_with_apply_chat_template(ckpt, tmp_path):
    folder = tmp_path / "base-model"
    shutil.copytree(ckpt, folder)
    tc = json.loads((folder / "tokenizer_config.json").read_text())
    tc.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(tc))
    for extra in folder.glob("chat_template.*"):
        extra.unlink()
    base = PVFDiffusionLM(pretrained=str(folder), device="cpu")
    assert base.chat_template(False) is None            # no --apply_chat_template: fine
    # lm-eval asks lm.chat_template(True) before any request when --apply_chat_template is on
    with pytest.raises(ValueError) as exc:
        base.chat_template(True)
    msg = one_line(exc)
    assert "--apply_chat_template" in msg and "no chat template" in msg and str(folder) in msg
    with pytest.raises(ValueError) as exc:
        base.apply_chat_template([{"role": "user", "content": "1 + 2?"}])
    assert one_line(exc) == msg


def test_chat_template_present_is_returned(lm):
    assert lm.chat_template(True)


# ------------------------------------------------------------------ CUDA without a GPU


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA GPU is present")
@pytest.mark.parametrize("device", ["cuda", "cuda:1"])
def test_cuda_asked_for_without_gpu(ckpt, device):
    with pytest.raises(ValueError) as exc:
        PVFDiffusionLM(pretrained=str(ckpt), device=device)
    msg = one_line(exc)
    assert f"device={device!r}" in msg and "no CUDA GPU" in msg and "device=cpu" in msg


# ------------------------------------------------------------------ out of memory


def _raise_oom(*args, **kwargs):
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a "
                                 "total capacity of 79.1 GiB of which 1.2 GiB is free.\nOf the "
                                 "allocated memory ...")


@pytest.mark.parametrize("kind", ["generate_until", "loglikelihood", "loglikelihood_rolling"])
def test_out_of_memory_suggests_batch_size_dtype_cache(lm, monkeypatch, kind):
    monkeypatch.setattr(lm.model, "logits", _raise_oom)
    if kind == "generate_until":
        call = lambda: lm.generate_until([_gen("Question: 1 + 2?\nAnswer:")], disable_tqdm=True)  # noqa: E731
        what = "while decoding"
    elif kind == "loglikelihood":
        call = lambda: lm.loglikelihood([_ll("Question: 1 + 2?\nAnswer:", " 3")], disable_tqdm=True)  # noqa: E731
        what = "while scoring a continuation"
    else:
        req = Instance(request_type="loglikelihood_rolling", doc={}, arguments=("one two three",),
                       idx=0, metadata=("wikitext", 0, 1))
        call = lambda: lm.loglikelihood_rolling([req], disable_tqdm=True)  # noqa: E731
        what = "while scoring a rolling window"
    with pytest.raises(PVFOutOfMemoryError) as exc:
        call()
    msg = one_line(exc)
    assert msg.startswith("pvf-dlm: out of memory on cpu " + what)
    for hint in ("batch_size", "dtype=bfloat16", "cache=", "mc_batch", "gen_length"):
        assert hint in msg, hint
    assert exc.value.__suppress_context__                # the long torch message is not chained
    assert isinstance(exc.value, RuntimeError)
