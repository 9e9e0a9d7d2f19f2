"""``decoder=renoise``: DiffusionGemma's sampler as released, against transformers 5.25's own
``DiffusionGemmaForBlockDiffusion.generate`` (``generation_diffusion_gemma.py``).

The reference check decodes transformers' network itself behind the model protocol
(``helpers.dgemma_reference.TransformersCanvas``), so the sampler alone is compared, token for
token and call for call, right after ``torch.manual_seed(seed)`` at batch 1 on the CPU: the
released generation config (48 steps, entropy bound 0.1, temperature 0.8 to 0.4, stability 1,
confidence 0.005) and one whose stop rules fire after a few steps, on two canvases, with the
released generation config's end ids [1, 106, 50]. The native network (logits within 1e-4 of
transformers') gives the same tokens where no sample is close to a tie (one-step canvases).
"""

from __future__ import annotations

import pytest
import torch
from helpers.dgemma_reference import TransformersCanvas, reference_generate
from helpers.gemma_folders import make_gemma_folder
from helpers.prerequisites import family_tier

from pvf_lmeval.decoding.api import decode, decode_batch
from pvf_lmeval.models import load_model

transformers = pytest.importorskip("transformers")

C = 8                       # the tiny folder's canvas
EOS = (1, 106, 50)          # the released generation_config.json's eos_token_id
PAD = 0
PROMPT = [2, 5, 9, 17, 33]
#: generation configs by transformers' names: as released, and stop rules that fire early
RELEASED: dict = {}
EARLY = {"stability_threshold": 0, "confidence_threshold": 5.0}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_gemma_folder(tmp_path_factory.mktemp("renoise") / "dg", seed=1, canvas_length=C)


@pytest.fixture(scope="module")
def ref(folder):
    from transformers import DiffusionGemmaForBlockDiffusion

    return DiffusionGemmaForBlockDiffusion.from_pretrained(str(folder), dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def native(folder):
    return load_model(str(folder), device="cpu", dtype="float32")


@pytest.mark.parametrize("config", [RELEASED, EARLY], ids=["released", "early-stop"])
@pytest.mark.parametrize("seed", [0, pytest.param(1, marks=family_tier),
                                  pytest.param(2, marks=family_tier)])
def test_reference_rules_are_transformers_generate(ref, config, seed):
    want, calls = reference_generate(ref, PROMPT, seed, 2 * C, EOS, PAD, **config)
    got = decode(TransformersCanvas(ref, EOS, PAD), PROMPT, "renoise", rules="reference",
                 seed=seed, gen_length=2 * C, **config)
    assert got.tokens == want
    assert got.nfe == calls
    if config is EARLY:         # the stop rules ended canvases before the step budget
        assert calls < 2 * 48


def test_an_end_id_ends_generation_after_its_canvas(ref):
    """An end id in the second canvas: generate pads after it and stops; renoise stops there
    too (its early-stop fill repeats the end id where generate writes pad)."""
    tokens, _ = reference_generate(ref, PROMPT, 3, 3 * C, EOS, PAD, **EARLY)
    end = tokens[C + 2]                          # an id of the second canvas, made an end id
    want, calls = reference_generate(ref, PROMPT, 3, 3 * C, EOS + (end,), PAD, **EARLY)
    e = want.index(end)
    assert C <= e < 2 * C and set(want[e + 1:]) == {PAD} and len(want) == 2 * C
    got = decode(TransformersCanvas(ref, EOS + (end,), PAD), PROMPT, "renoise",
                 rules="reference", seed=3, gen_length=3 * C, **EARLY)
    assert got.tokens == want[:e + 1] + [end] * (3 * C - e - 1)
    assert got.nfe == calls and got.gen_tokens == e


@pytest.mark.parametrize("seed", [0, 1])
def test_the_native_network_gives_generate_on_one_step_canvases(ref, native, seed):
    one_step = {"stability_threshold": 0, "confidence_threshold": 100.0}
    want, calls = reference_generate(ref, PROMPT, seed, 2 * C, native.eos_ids, PAD, **one_step)
    got = decode(native, PROMPT, "renoise", rules="reference", seed=seed, gen_length=2 * C,
                 **one_step)
    assert (got.tokens, got.nfe) == (want, calls) and calls == 2


class OneRowAtATime:
    """The native network called on each row's real tokens alone: every row's logits are
    those of a batch of one. The native network's CPU logits move by a few 1e-6 with the batch
    (its gelu_tanh MLP's elementwise tail), and on random weights every entropy lies within
    that of another, so batching it directly reorders the accepted sets; this pins the
    decoder's own batching (layout, right-alignment, carries, draws) exactly."""

    def __init__(self, model):
        self.model = model
        for name in ("canvas_length", "vocab_size", "eos_ids", "pad_id", "dtype", "name"):
            setattr(self, name, getattr(model, name))

    def logits(self, tokens, positions, *, attention_mask=None, cache=None,
               self_conditioning=None):
        c, out = self.canvas_length, []
        for r in range(tokens.shape[0]):
            row = tokens[r:r + 1]
            if attention_mask is not None:          # left padding only
                row = row[:, attention_mask[r].bool()]
            t = row.shape[1]
            out.append(self.model.logits(row, torch.arange(t - c, t), self_conditioning=None
                                         if self_conditioning is None else self_conditioning[r:r + 1]))
        return torch.cat(out)


def test_batch_of_four_gives_each_request_alone(native):
    """rules=paper: every request draws from its own generator; left-padded prompts of other
    lengths, canvases ending at different steps, so that a call holds requests on different
    canvases and steps (with and without self-conditioning)."""
    prompts = [PROMPT, [2, 40, 41], [2] + list(range(60, 70)), [2, 7]]
    kw = dict(gen_length=3 * C, seed=11, **EARLY)
    batch = decode_batch(OneRowAtATime(native), prompts, "renoise", **kw)
    nfe = []
    for i, p in enumerate(prompts):
        alone = decode(native, p, "renoise", request_index=i, **kw)
        assert (batch[i].tokens, batch[i].nfe, batch[i].routes) == \
            (alone.tokens, alone.nfe, alone.routes)
        nfe.append(alone.nfe)
    assert len(set(nfe)) == len(nfe)                # no two moved in lockstep


def test_defaults_are_the_released_sampler(native):
    from pvf_lmeval.decoding.params import make_params

    p = make_params("renoise")
    assert (p.max_denoising_steps, p.entropy_bound, p.t_min, p.t_max, p.stability_threshold,
            p.confidence_threshold) == (48, 0.1, 0.4, 0.8, 1, 0.005)
    r = decode(native, PROMPT, "renoise", gen_length=C)
    assert r.block_size is None and r.committed == C and r.routes == ["base"] * C


@pytest.mark.parametrize("kw,says", [
    (dict(decoder="threshold"),
     "decoder=threshold fills masked positions; diffusion_gemma is a uniform-state diffusion "
     "model (no mask token: its canvas of 8 starts as random tokens): use decoder=renoise "
     "(docs/decoding.md, \"Uniform-state canvases\")"),
    (dict(decoder="pvf"), "decoder=pvf fills masked positions"),
    (dict(decoder="eb"), "decoder=eb fills masked positions"),
    (dict(decoder="renoise", block_length=16),
     "block_length=16 must equal the model's canvas_length=8 (decoder=renoise denoises one "
     "canvas per block)"),
    (dict(decoder="renoise", gen_length=12), "gen_length=12 must be a multiple of block_length=8"),
    (dict(decoder="renoise", temperature=0.5),
     "temperature, top_k, top_p: renoise samples on its own schedule (t_max to t_min, no "
     "filter); leave them unset"),
    (dict(decoder="renoise", cfg_scale=1.0),
     "cfg_scale=1.0: guidance masks the prompt, and a uniform-state model has no mask token; "
     "leave cfg_scale unset with decoder=renoise"),
    (dict(decoder="renoise", cache="dual"),
     "cache=dual: decoder=renoise allows cache=none|prefix"),
    (dict(decoder="renoise", entropy_bound=0.0), "entropy_bound=0.0 must be > 0"),
])
def test_what_it_cannot_decode_is_one_line(native, kw, says):
    kw = {"gen_length": 2 * C, **kw}
    with pytest.raises(ValueError) as ei:
        decode(native, PROMPT, kw.pop("decoder"), **kw)
    msg = str(ei.value)
    assert msg.startswith(says) and "\n" not in msg


def test_renoise_on_a_masked_model_is_one_line():
    m = load_model("tiny-llada")
    with pytest.raises(ValueError) as ei:
        decode(m, [5, 6, 7], "renoise", gen_length=8, block_length=8)
    assert str(ei.value).endswith("has a mask token: use a decoder that fills masked positions "
                                  "(threshold, pvf, ...)")
    assert str(ei.value).startswith("decoder=renoise denoises a uniform-state canvas "
                                    "(DiffusionGemma); ")
