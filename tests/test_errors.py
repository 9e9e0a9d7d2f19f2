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
from helpers.edited_folders import DROP, edit_json, edited_copy, strip_added_token  # noqa: E402
from test_models_oracle import make_temp_checkpoint  # noqa: E402

from pvf_lmeval.lmeval.lm import PVFDiffusionLM, PVFOutOfMemoryError  # noqa: E402


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
    folder = edited_copy(ckpt, tmp_path / "no-mask", mask_token_id=DROP)
    strip_added_token(folder, "<|mdm_mask|>")
    with pytest.raises(ValueError) as exc:
        PVFDiffusionLM(pretrained=str(folder), device="cpu")
    msg = one_line(exc)
    assert "no mask token" in msg and "mask_token_id" in msg and "not a masked diffusion LM" in msg


# ------------------------------------------------------------------ prompt longer than the context


def _long_prompt(lm) -> str:
    return "Question: " + "one two three " * lm.model.max_length + "\nAnswer:"


def test_long_prompt_is_left_truncated_like_hflm(ckpt, tmp_path, caplog):
    """Default truncation=left keeps the prompt's last context - gen_length tokens (lm-eval's
    HFLM rule), warns once per run with the count, and counts truncated_prompts per task."""
    trace = tmp_path / "trace.jsonl"
    lm = PVFDiffusionLM(pretrained=str(ckpt), device="cpu", decoder="threshold", gen_length=16,
                        block_length=8, trace=str(trace))
    limit = lm.model.max_length
    long_prompt = _long_prompt(lm)
    full = lm.tokenizer.encode(long_prompt, add_special_tokens=False)
    assert len(full) + 16 > limit
    with caplog.at_level("WARNING", logger="pvf_lmeval"):
        out = lm.generate_until([_gen(long_prompt, 3), _gen("Question: 1 + 2?\nAnswer:", 4),
                                 _gen(long_prompt + " ", 5)], disable_tqdm=True)
    assert len(out) == 3 and all(isinstance(o, str) for o in out)
    notices = [r.getMessage() for r in caplog.records if "left-truncated" in r.getMessage()]
    assert len(notices) == 1 and notices[0].startswith("pvf-dlm: 2 of 3 prompts")
    assert f"context of {limit} tokens" in notices[0] and "truncation=error" in notices[0]
    # records come in decoding order (longest prompt first); the request key names the document
    records = {json.loads(line)["request"]: json.loads(line) for line in trace.read_text().splitlines()}
    assert sorted(records) == ["arith/3/0", "arith/4/0", "arith/5/0"]
    assert records["arith/3/0"]["prompt_ids"] == full[-(limit - 16):]      # the tail, exactly
    short = lm.tokenizer.encode("Question: 1 + 2?\nAnswer:", add_special_tokens=False)
    assert records["arith/4/0"]["prompt_ids"] == short                      # untouched
    totals = lm.get_model_info()["pvf"]["totals"]["arith"]
    assert totals["truncated_prompts"] == 2 and totals["requests"] == 3


def test_truncation_error_checks_every_request_before_decoding(ckpt):
    lm = PVFDiffusionLM(pretrained=str(ckpt), device="cpu", decoder="threshold", gen_length=16,
                        block_length=8, truncation="error")
    limit = lm.model.max_length
    n = len(lm.tokenizer.encode(_long_prompt(lm), add_special_tokens=False))
    with pytest.raises(ValueError) as exc:
        lm.generate_until([_gen("Question: 1 + 2?\nAnswer:", 0), _gen("Question: 2 + 2?\nAnswer:", 1),
                           _gen(_long_prompt(lm), 7), _gen(_long_prompt(lm), 8)], disable_tqdm=True)
    msg = one_line(exc)
    assert "truncation=error" in msg and "doc_id 7" in msg and "doc_id 8" not in msg
    assert f"prompt {n} tokens + gen_length 16 > context {limit}" in msg
    assert lm.get_model_info()["pvf"]["totals"] == {}             # nothing was decoded


def test_bad_truncation_value(ckpt):
    with pytest.raises(ValueError) as exc:
        PVFDiffusionLM(pretrained=str(ckpt), device="cpu", truncation="right")
    msg = one_line(exc)
    assert "truncation='right'" in msg and "left" in msg and "error" in msg


def test_gen_length_alone_longer_than_context_fails_before_decoding(ckpt):
    lm = PVFDiffusionLM(pretrained=str(ckpt), device="cpu", decoder="threshold", gen_length=256,
                        block_length=8)
    assert lm.model.max_length == 256
    with pytest.raises(ValueError) as exc:
        lm.generate_until([_gen("Question: 1 + 2?\nAnswer:", 0)], disable_tqdm=True)
    msg = one_line(exc)
    assert "gen_length=256" in msg and "context of 256 tokens" in msg
    assert lm.get_model_info()["pvf"]["totals"] == {}


# ------------------------------------------------------------------ generation kwargs


def _gen_kwargs(kwargs: dict, doc: int = 0) -> Instance:
    return Instance(request_type="generate_until", doc={},
                    arguments=("Question: 1 + 2?\nAnswer:", {"until": ["\n\n"], **kwargs}),
                    idx=0, metadata=("arith", doc, 1))


@pytest.mark.parametrize("value", [0, -5, "0", 2.5, "many"])
def test_max_gen_toks_must_be_positive(lm, value):
    with pytest.raises(ValueError) as exc:
        lm.generate_until([_gen_kwargs({}), _gen_kwargs({"max_gen_toks": value}, 1)], disable_tqdm=True)
    msg = one_line(exc)
    assert f"max_gen_toks={value!r}" in msg and "positive integer" in msg


@pytest.mark.parametrize("typo,closest", [("treshold", "threshold"), ("block_lenght", "block_length"),
                                          ("max_gen_tokens", "max_gen_toks"), ("unitl", "until")])
def test_unknown_gen_kwarg_names_the_closest_key(ckpt, typo, closest):
    lm = PVFDiffusionLM(pretrained=str(ckpt), device="cpu", decoder="threshold", gen_length=16,
                        block_length=8)
    with pytest.raises(ValueError) as exc:
        lm.generate_until([_gen_kwargs({}), _gen_kwargs({typo: 1}, 1)], disable_tqdm=True)
    msg = one_line(exc)
    assert f"unknown generation kwarg {typo!r}" in msg and f"did you mean {closest!r}" in msg
    assert lm.get_model_info()["pvf"]["totals"] == {}             # checked before decoding


def test_standard_generation_keys_are_not_errors(ckpt, caplog):
    lm = PVFDiffusionLM(pretrained=str(ckpt), device="cpu", decoder="threshold", gen_length=16,
                        block_length=8)
    with caplog.at_level("WARNING", logger="pvf_lmeval"):
        out = lm.generate_until([_gen_kwargs({"top_p": 0.95, "repetition_penalty": 1.1,
                                              "do_sample": False, "temperature": 0.0,
                                              "max_new_tokens": 16})], disable_tqdm=True)
    assert len(out) == 1
    assert any("['repetition_penalty']" in r.getMessage() and "ignored" in r.getMessage()
               for r in caplog.records)


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
    edit_json(folder / "tokenizer_config.json", {"chat_template": DROP})
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


def test_chat_template_present_is_returned(lm, ckpt):
    import json

    template = json.loads((ckpt / "tokenizer_config.json").read_text())["chat_template"]
    assert template.startswith("{% for message in messages %}")
    assert lm.chat_template(True) == template


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
        what = "while scoring continuations"
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


# ------------------------------------------------------------------ broken checkpoint folders


def test_corrupt_safetensors_names_the_file(ckpt, tmp_path):
    folder = tmp_path / "corrupt"
    shutil.copytree(ckpt, folder)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])          # a truncated download
    with pytest.raises(ValueError) as exc:
        PVFDiffusionLM(pretrained=str(folder), device="cpu")
    msg = one_line(exc)
    assert str(weights) in msg and "not a readable safetensors file" in msg


def test_missing_shard_names_the_file(ckpt, tmp_path):
    folder = tmp_path / "sharded"
    shutil.copytree(ckpt, folder)
    (folder / "model.safetensors").rename(folder / "model-00001-of-00002.safetensors")
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
        "a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}))
    with pytest.raises(ValueError) as exc:
        PVFDiffusionLM(pretrained=str(folder), device="cpu")
    msg = one_line(exc)
    assert "model-00002-of-00002.safetensors" in msg and "missing" in msg


@pytest.mark.parametrize("keep,says", [((), "no tokenizer files"),
                                       (("vocab.json",), "merges.txt is missing"),
                                       (("merges.txt",), "vocab.json is missing")])
def test_folder_without_tokenizer_files_says_what_is_missing(ckpt, tmp_path, keep, says):
    folder = tmp_path / "no-tokenizer"
    shutil.copytree(ckpt, folder)
    (folder / "tokenizer.json").unlink()
    for name in keep:
        (folder / name).write_text("{}" if name.endswith(".json") else "#version: 0.2\n")
    with pytest.raises(ValueError) as exc:
        PVFDiffusionLM(pretrained=str(folder), device="cpu")
    msg = one_line(exc)
    assert str(folder) in msg and says in msg and "tokenizer.json" in msg
    assert "sentencepiece" not in msg and "tiktoken" not in msg


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_model_info_records_the_device_and_dtype_used(ckpt, dtype):
    lm = PVFDiffusionLM(pretrained=str(ckpt), device="cpu", dtype=dtype)
    info = lm.get_model_info()["pvf"]
    assert info["device"] == "cpu" and info["dtype"] == dtype
