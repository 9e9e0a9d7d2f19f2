"""The lm-eval adapter on a block-diffusion model: ``block_length`` from the model, the one-line
error for another one before any decoding, the exact cache named in the run's configuration.

The model is a small random checkpoint that reports a block size of 8 (its attention stays
bidirectional: only the adapter's wiring is under test here).
"""

from __future__ import annotations

import pytest

pytest.importorskip("lm_eval")
pytest.importorskip("torch")

from lm_eval.api.instance import Instance  # noqa: E402
from test_models_oracle import make_temp_checkpoint  # noqa: E402

import pvf_lmeval.models as models  # noqa: E402
from pvf_lmeval.lmeval.lm import PVFDiffusionLM  # noqa: E402


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_temp_checkpoint(tmp_path_factory.mktemp("ckpt") / "llada", "llada")


@pytest.fixture
def block_lm(ckpt, monkeypatch):
    real = models.load_model
    loaded = []

    def load(*args, **kwargs):
        m = real(*args, **kwargs)
        m.block_size = 8
        loaded.append(m)
        return m

    monkeypatch.setattr(models, "load_model", load)

    def make(**kw):
        return PVFDiffusionLM(pretrained=str(ckpt), device="cpu", decoder="threshold",
                              vocab="none", **kw)
    return make


def _request(gen_kwargs: dict) -> Instance:
    return Instance(request_type="generate_until", doc={},
                    arguments=("Question: 1 + 2?\nAnswer:", {"until": ["\n\n"], **gen_kwargs}),
                    idx=0, metadata=("arith", 0, 1))


def test_block_length_comes_from_the_model(block_lm):
    lm = block_lm(gen_length=16)
    assert lm.params.block_length == 8
    info = lm.get_model_info()["pvf"]
    assert info["block_size"] == 8 and info["params"]["block_length"] == 8
    assert info["cache_exact"] is True


def test_cache_named_exact_on_a_block_model(block_lm):
    assert block_lm(gen_length=16, cache="prefix").get_model_info()["pvf"]["cache_exact"] is True


def test_cache_named_approximate_on_a_bidirectional_model(ckpt):
    plain = PVFDiffusionLM(pretrained=str(ckpt), device="cpu", decoder="threshold", vocab="none",
                           gen_length=16, block_length=8, cache="prefix").get_model_info()["pvf"]
    assert plain["cache_exact"] is False and plain["block_size"] is None


def test_explicit_block_length_that_does_not_fit_is_one_line_error(block_lm):
    with pytest.raises(ValueError) as exc:
        block_lm(gen_length=16, block_length=4)
    msg = str(exc.value)
    assert "\n" not in msg and msg.startswith("block_length=4 must equal the model's block size 8")


def test_request_block_length_that_does_not_fit_fails_before_decoding(block_lm):
    lm = block_lm(gen_length=16)
    with pytest.raises(ValueError, match="block_length=16 must equal the model's block size 8"):
        lm.generate_until([_request({}), _request({"block_length": 16})], disable_tqdm=True)
    assert lm.get_model_info()["pvf"]["totals"] == {}             # nothing was decoded
