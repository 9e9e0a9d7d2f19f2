"""The compiled statistics pass (``decode_batch(compile_step=...)``, the adapter's ``compile``
option; ``pvf_lmeval.decoding.compiled``): the same tokens, routes, NFE and branch rows as the
eager pass for every decoder and cache mode at batch 1 and 8 (tiny-llada, greedy, left-padded
prompts); ``compile=true`` resolves per device and compiles the statistics pass too."""

from __future__ import annotations

import pytest
import torch
from helpers.cache_models import arith_prompts

from pvf_lmeval.decoding import compiled, decode_batch
from pvf_lmeval.tensors import compiling
from pvf_lmeval.models import load_model
from pvf_lmeval.models.diffusion_lm import COMPILE_TRUE

pytestmark = pytest.mark.usefixtures("one_thread")

DECODERS = ("static", "threshold", "eb", "freedave", "pvf", "explore", "subblock",
            "hierarchy", "credit")
CACHES = ("none", "prefix", "dual", "dual_base")


def _key(r):
    return (r.tokens, r.nfe, r.branch_rows, r.routes)


@pytest.fixture(scope="module")
def models():
    model = load_model("tiny-llada")
    prompts, _ = arith_prompts(model.tokenizer, 8)
    prompts = [p[:len(p) - (i % 4)] for i, p in enumerate(prompts)]       # left padding
    return model, prompts


@pytest.mark.parametrize("cache", CACHES)
@pytest.mark.parametrize("dec", DECODERS)
def test_compiled_statistics_decode_like_eager(models, dec, cache, monkeypatch):
    model, prompts = models
    kw = dict(gen_length=16, block_length=8, cache=cache, seed=3)
    if dec in ("pvf", "explore"):
        kw.update(preset="arith", reveal_next=3, plan_vocab=list(range(0, 600, 3)))
    if dec == "static":
        kw.update(steps=8)
    ran = []
    real = compiled.compiled_stats_from_logits
    monkeypatch.setattr("pvf_lmeval.decoding.runner.compiled_stats_from_logits",
                        lambda *a, **k: ran.append(1) or real(*a, **k))
    for batch in ([prompts[:1], prompts[1:2]], [prompts]):
        idx = 0
        for chunk in batch:
            ids = list(range(idx, idx + len(chunk)))
            want = decode_batch(model, chunk, dec, request_indices=ids, **kw)
            # the statistics pass compiled, the network eager
            got = decode_batch(model, chunk, dec, request_indices=ids, compile_step=True, **kw)
            assert [_key(r) for r in got] == [_key(r) for r in want], (dec, cache, len(chunk))
            idx += len(chunk)
    assert ran                              # the compiled pass served the calls


def test_the_loop_hands_the_compiled_pass_its_options_canvas_and_noise(monkeypatch):
    """With ``compile_step`` options, every statistics pass of the loop is the compiled one,
    called with those options, the rows' canvas and (when sampling) the request's noise ([P, V]
    for one request); a sampled decode equals the eager one."""
    from helpers.decoding_tables import PROMPT, RandomModel

    from pvf_lmeval.decoding import decode
    seen = []
    real = compiled.compiled_stats_from_logits

    def spy(logits, cur, mask_id, temperature=0.0, noise=None, *, options=None, top_k=None,
            top_p=None, float64=False, suppress=(), unconfident=()):
        seen.append((options, cur.shape == logits.shape[:-1], mask_id, temperature,
                     None if noise is None else noise.shape[-2:] == logits.shape[-2:],
                     top_k, top_p))
        return real(logits, cur, mask_id, temperature, noise, options=options, top_k=top_k,
                    top_p=top_p, float64=float64, suppress=suppress, unconfident=unconfident)
    monkeypatch.setattr("pvf_lmeval.decoding.runner.compiled_stats_from_logits", spy)
    kw = dict(gen_length=16, block_length=8, temperature=0.7, seed=5, top_k=7, top_p=0.9)
    want = decode(RandomModel(3), PROMPT, "threshold", **kw)
    assert seen == []
    got = decode(RandomModel(3), PROMPT, "threshold", compile_step={"backend": "eager"}, **kw)
    assert (got.tokens, got.nfe, got.routes) == (want.tokens, want.nfe, want.routes)
    assert seen == [({"backend": "eager"}, True, 23, 0.7, True, 7, 0.9)] * got.nfe


def test_compile_true_is_the_device_mapping():
    assert COMPILE_TRUE == {"cuda": "blocks", "cpu": "blocks"}
    m = load_model("tiny-llada").compile(scope="true", backend="eager")
    assert "forward_cached" in vars(m.net.blocks[0]) and "hidden" not in vars(m.net)
    assert m.compile_scope == "blocks"


@pytest.mark.parametrize("arg,options", [("true", {}), ("false", None)])
def test_the_compile_model_arg_compiles_the_statistics_pass(monkeypatch, arg, options):
    """The adapter's ``compile`` compiles the model call and hands ``decode_batch`` the
    statistics pass's options (``compile_step``); the round stays eager."""
    pytest.importorskip("lm_eval")
    from lm_eval.api.instance import Instance

    import pvf_lmeval.lmeval.lm as lm_mod
    from pvf_lmeval.models.diffusion_lm import DiffusionLM

    scopes, seen = [], []
    monkeypatch.setattr(DiffusionLM, "compile", lambda self, scope: scopes.append(scope) or self)
    real = lm_mod.decode_batch

    def spy(*args, options=None, **kw):
        seen.append((options.compile_step, options.compile_round))
        return real(*args, **kw)                   # eager: the options are what is checked
    monkeypatch.setattr(lm_mod, "decode_batch", spy)
    lm = lm_mod.PVFDiffusionLM(pretrained="tiny-llada", device="cpu", compile=arg,
                               gen_length=16, block_length=16)
    req = Instance(request_type="generate_until", doc={}, idx=0, metadata=("arith", 0, 1),
                   arguments=("Question: 1 + 2?\nAnswer:", {"until": ["\n\n"]}))
    lm.generate_until([req], disable_tqdm=True)
    assert scopes == (["true"] if options is not None else []) and seen == [(options, None)]


def test_compile_options_reach_torch_compile_with_dynamic_shapes(monkeypatch):
    """``compile_step`` options go to ``torch.compile``; shapes are always dynamic
    (a ``dynamic`` option cannot turn that off); one program per set of options."""
    from pvf_lmeval.decoding.stats import stats_from_logits
    seen = []

    def fake_compile(fn, **kw):
        seen.append(kw)
        return fn
    monkeypatch.setattr(compiling.torch, "compile", fake_compile)
    monkeypatch.setattr(compiled, "_programs", {})
    logits = torch.randn(2, 3, 11)
    cur = torch.zeros(2, 3, dtype=torch.long)
    want = stats_from_logits(logits.clone(), cur, 10)        # (it overwrites its logits)
    for options in ({"backend": "eager", "dynamic": False}, {"backend": "eager", "dynamic": False},
                    None):
        got = compiled.compiled_stats_from_logits(logits.clone(), cur, 10, options=options)
        assert all(torch.equal(g, w) for g, w in zip(got, want))
    assert seen == [{"dynamic": True, "backend": "eager"}, {"dynamic": True}]
