"""A run's ``--model_args`` parsed once into typed groups (``lmeval/settings.py``) and bound to
the loaded model once: the groups, the model-dependent defaults, the one-line errors."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from pvf_lmeval.decoding.blocks import on_model
from pvf_lmeval.decoding.options import ROUND_NOT_INVARIANT, DecodeOptions
from pvf_lmeval.decoding.params import make_params
from pvf_lmeval.lmeval.model_args import ModelArgError
from pvf_lmeval.lmeval.settings import RunSettings


def _model(block_size=None, max_length=64, bos=1):
    return SimpleNamespace(block_size=block_size, max_length=max_length,
                           tokenizer=SimpleNamespace(bos_token_id=bos))


def test_the_arguments_split_into_typed_groups():
    run = RunSettings.parse({
        "pretrained": "tiny-dream", "max_length": "48", "compile": "true", "batch_size": "3",
        "batch_invariant": "true", "truncation": "error", "mc_num": "16", "tp_size": 1,
        "vocab": "none", "vocab_force": "yes", "decoder": "pvf", "threshold": "0.95",
        "width": "2", "preset": None, "trust_remote_code": True}, env={})
    assert (run.model.pretrained, run.model.max_length, run.model.compile) == \
        ("tiny-dream", 48, "true")
    assert (run.options.batch_size, run.options.auto, run.options.truncation,
            run.options.mc_num) == (3, None, "error", 16)
    # the model is compiled, so is the statistics pass; batch invariance without the round
    assert run.options.decode == DecodeOptions(True, {}, None)
    assert (run.parallel.tp, run.parallel.world) == (1, 1)
    assert (run.vocabulary.spec, run.vocabulary.cfg["force"]) == ("none", True)
    assert (run.decoding.decoder, run.decoding.given) == ("pvf", {"threshold": 0.95, "width": 2})
    assert run.decoding.preset_given and run.decoding.preset is None
    assert not run.decoding.seed_given and run.remote_code_asked


@pytest.mark.parametrize("args, message", [
    ({"gen_lenght": 32}, "pvf-dlm: unknown model arg 'gen_lenght'; did you mean 'gen_length'?"),
    ({"decoder": "pvf", "plan_hi": 0.95}, "plan_hi=0.95 must not exceed threshold=0.9"),
    ({"batch_invariant": "true", "compile_round": "true"}, ROUND_NOT_INVARIANT),
    ({"tp_size": 2}, "tensor_parallel_size=2 needs 2 processes per model copy"),
    ({"compile": "fast"}, "compile='fast' must be one of false, true, blocks, model"),
    ({"online_level": 0.3}, "pvf-dlm: online_level applies only to vocab=online"),
])
def test_each_group_is_checked_when_parsed(args, message):
    with pytest.raises(ValueError) as e:
        RunSettings.parse(args, env={})
    assert str(e.value).startswith(message) and "\n" not in str(e.value)
    assert isinstance(e.value, ModelArgError) == ("tp_size" in args or "gen_lenght" in args)


def test_without_block_length_gen_length_is_the_one_block_until_the_model_is_known():
    run = RunSettings.parse({"gen_length": 12}, env={})        # not a multiple of 32
    assert run.decoding.given == {"gen_length": 12}
    with pytest.raises(ValueError, match="^gen_length=12 must be a multiple of block_length=32$"):
        run.bind(_model())
    bound = run.bind(_model(block_size=4))                    # a block-diffusion model's block
    assert (bound.params.block_length, bound.params.model_block, bound.context) == (4, 4, 64)


def test_bind_resolves_what_depends_on_the_model():
    assert RunSettings.parse({}, env={}).bind(_model()).params.block_length == 32
    run = RunSettings.parse({"block_length": 8, "max_length": 40}, env={})
    assert run.bind(_model()).context == 40
    with pytest.raises(ValueError, match="^block_length=8 must equal the model's block size 4 "):
        run.bind(_model(block_size=4))
    with pytest.raises(ValueError, match="^max_length=40 is longer than the checkpoint's "
                                         "context of 32 tokens"):
        run.bind(_model(max_length=32))
    with pytest.raises(ValueError, match="add_bos_token=true: the tokenizer of 'tiny-llada' "
                                         "has no BOS token"):
        RunSettings.parse({"add_bos_token": "true"}, env={}).bind(_model(bos=None))
    # a task's preset on the bound parameters keeps the model's block
    bound = RunSettings.parse({"decoder": "pvf"}, env={}).bind(_model(block_size=4))
    under = bound.params_under("gsm8k")
    assert (under.preset, under.reveal_next, under.block_length, under.model_block) == \
        ("gsm8k", 5, 4, 4)


def test_parameters_are_bound_to_a_model_once():
    p = make_params("threshold", gen_length=8, block_length=4, model_block=4)
    assert on_model(p, _model(block_size=4)) is p                 # bound already: no new check
    assert on_model(p, _model()).model_block is None              # another model: rebound
    with pytest.raises(ValueError, match="^block_length=4 must equal the model's block size 8 "):
        on_model(p, _model(block_size=8))


def test_decode_options_are_checked_when_made():
    with pytest.raises(ValueError, match="^batch_invariant=true cannot be combined with "
                                         "compile_round=true"):
        DecodeOptions(batch_invariant=True, compile_round={})
    assert DecodeOptions.of(True, True, None) == DecodeOptions(True, {}, None)
    with pytest.raises(ValueError, match="^compile_round='fast' must be true, false or a dict"):
        DecodeOptions.of(compile_round="fast")
