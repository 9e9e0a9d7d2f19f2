"""`lmeval/identity.py` on hand-built lm-eval results dicts: which settings make a run what it is.

Each expected identity is written out in full: a key that appears or vanishes changes which
results `pvf-report` puts in one row, one column or one budget.
"""

from __future__ import annotations

import math

import pytest

from pvf_lmeval.lmeval.identity import canon, decoding_identity, run_identity, task_identity


@pytest.mark.parametrize("value, want", [
    ("0.9", 0.9), (0.9, 0.9), (1.0, 1), ("1.0", 1), (3, 3), ("true", True), ("False", False),
    (True, True), (None, None), ((0.2, 0.6), "0.2:0.6"), ("0.2:0.60", "0.2:0.6"), (" plan ", "plan"),
    (float("inf"), float("inf")), ("1e-3", 0.001),
])
def test_canon_spells_each_value_one_way(value, want):
    got = canon(value)
    assert got == want and type(got) is type(want)


def test_canon_keeps_a_nan_a_float():
    assert math.isnan(canon(float("nan")))


def test_decoding_identity_keeps_what_the_decoder_reads():
    """threshold reads the loop's parameters, threshold and factor; pvf's reveal_next is not
    threshold's; a parameter no decoder declares is kept; an unset value is no value."""
    params = {"threshold": "0.90", "factor": None, "reveal_next": 5, "gen_length": 96.0,
              "block_length": 32, "preset": "arith", "plan_vocab": [1, 2], "newer_knob": "x"}
    assert decoding_identity("threshold", params) == {
        "block_length": 32, "gen_length": 96, "newer_knob": "x", "threshold": 0.9}
    assert decoding_identity("pvf", params) == {
        "block_length": 32, "gen_length": 96, "newer_knob": "x", "reveal_next": 5, "threshold": 0.9}


def _pvf_result(**pvf):
    return {"config": {"model": "pvf-dlm", "batch_size": 8, "limit": 50.0,
                       "gen_kwargs": "temperature=0.0,until=x",
                       "pvf": {"decoder": "pvf", "pretrained": "/models/tiny-llada",
                               "params": {"threshold": 0.9, "reveal_next": 2, "gen_length": 96,
                                          "temperature": 0.5, "steps": 96},
                               "vocab": "auto:/home/a/vocab_artifacts/x.json", **pvf}}}


def test_run_identity_of_a_pvf_dlm_run():
    """gen_kwargs that are decoder parameters override them (temperature), the rest stay
    gen_kwargs; the vocabulary without its directories; the prompt-shaping model args; the device kind;
    the batch size from lm-eval's config where the adapter recorded none."""
    r = _pvf_result(dtype="bfloat16", revision="abc123", max_length=4096, add_bos_token="true",
                    tokenizer="/tok", device="cuda:1", truncation="left",
                    online={"updates": 7, "min_count": "2"})
    assert run_identity(r) == {
        "model_type": "pvf-dlm", "model": "/models/tiny-llada", "decoder": "pvf", "dtype": "bfloat16",
        "gen_length": 96, "reveal_next": 2, "temperature": 0, "threshold": 0.9,
        "vocab": "auto:x.json", "online.min_count": 2, "truncation": "left",
        "max_length": 4096, "add_bos_token": True, "tokenizer": "/tok", "revision": "abc123",
        "device": "cuda", "batch_size": 8, "gen_kwargs.until": "x", "limit": 50}


def test_run_identity_batch_size_the_adapters_over_lm_evals_and_none_when_invariant():
    assert run_identity(_pvf_result(batch_size=16))["batch_size"] == 16
    ident = run_identity(_pvf_result(batch_size=16, batch_invariant="true"))
    assert ident["batch_invariant"] is True and "batch_size" not in ident
    assert "batch_invariant" not in run_identity(_pvf_result(batch_invariant=False))


def test_run_identity_of_another_model_type_is_its_model_args():
    """Every model arg but the ones that do not change results (device, batch size, ...)."""
    r = {"config": {"model": "hf", "model_args": "pretrained=gpt2,dtype=float16,device=cuda:0,"
                    "max_batch_size=64,revision=main,trust_remote_code=True"},
         "chat_template_sha": "0123456789abcdef", "fewshot_as_multiturn": True,
         "system_instruction": "Be brief."}
    assert run_identity(r) == {
        "model_type": "hf", "model": "gpt2", "decoder": "hf", "dtype": "float16", "revision": "main",
        "chat_template": "0123456789ab", "fewshot_as_multiturn": True, "system_instruction": "yes"}


def test_run_identity_chat_template_without_its_sha():
    r = {"config": {"model": "hf", "model_args": "pretrained=gpt2"}, "chat_template": "{{ x }}"}
    ident = run_identity(r)
    assert (ident["chat_template"], ident["fewshot_as_multiturn"]) == ("yes", False)


def _task_result(**pvf):
    return {"versions": {"gsm8k": 3.0, "piqa": 1}, "n-shot": {"gsm8k": 5, "piqa": 0},
            "config": {"fewshot_seed": 1234, "pvf": pvf},
            "configs": {"gsm8k": {"output_type": "generate_until"},
                        "piqa": {"output_type": "multiple_choice"}}}


def test_task_identity_of_a_generation_task():
    """Shots with their seed; the measured generation length over the run's; the task's own
    parameters (its preset's) where the decoder reads them, their gen_length left out."""
    r = _task_result(task_params={"gsm8k": {"reveal_next": "5", "gen_length": 256, "steps": 9},
                                  "piqa": {"reveal_next": 1}})
    run = {"decoder": "pvf", "gen_length": 96}
    assert task_identity(r, "gsm8k", 200, run) == {
        "task": "gsm8k", "task_version": 3, "num_fewshot": 5, "fewshot_seed": 1234,
        "gen_length": 200, "reveal_next": 5}
    assert task_identity(r, "gsm8k", None, run)["gen_length"] == 96
    assert "gen_length" not in task_identity(r, "gsm8k", None, {"decoder": "pvf"})


def test_task_identity_seed_only_with_shots_and_a_seed():
    r = _task_result()
    assert "fewshot_seed" not in task_identity(r, "piqa", None, {})
    del r["config"]["fewshot_seed"]
    assert "fewshot_seed" not in task_identity(r, "gsm8k", None, {})


def test_task_identity_of_a_likelihood_task():
    r = _task_result(likelihood={"mc_num": "128", "mc_stratum": 4, "mask_logit": "excluded"})
    assert task_identity(r, "piqa", None, {"decoder": "threshold"}) == {
        "task": "piqa", "task_version": 1, "num_fewshot": 0, "mc_num": 128, "mc_stratum": 4}
    assert "mc_num" not in task_identity(r, "gsm8k", None, {})
