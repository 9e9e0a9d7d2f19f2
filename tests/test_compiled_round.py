"""The compiled round (``decode_batch(compile_round=...)``, ``pvf_lmeval.decoding.rounds`` as
torch.compile programs): every field of every result equal to the eager loop's, for every
decoder and every cache mode, alone and batched (left-padded prompts, requests finishing in
different rounds), under ``rules=reference`` and with a learning vocabulary; no graph break at
all (a host read, a host value or a side effect inside would be one: explore's draws and the
vocabulary's records are the loop's); one read per round; a bounded number of programs per
decode configuration, each with its own recompile budget; and the lm-eval model arg.

These capture with the ``eager`` backend (dynamo's graphs run op by op: what is checked is the
capture, its guards and its side effects). The slow tier (``PVF_COMPILE_TESTS=1``,
tests/helpers/prerequisites.py) adds the rest of the decoder x cache matrix, sampling, a block-diffusion
model and inductor's generated code."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from helpers.cache_models import arith_prompts
from torch._dynamo.utils import counters

import pvf_lmeval.decoding.runner as runner_mod
from pvf_lmeval.decoding import decode_batch
from pvf_lmeval.models import load_model
from pvf_lmeval.planning.online import OnlineVocab
from helpers.prerequisites import compile_tier

pytestmark = pytest.mark.usefixtures("one_thread")

DECODERS = ("static", "threshold", "eb", "freedave", "pvf", "explore")
CACHES = ("none", "prefix", "dual", "dual_base")
VOCAB = list(range(0, 600, 3))
#: the round compiled, captured op by op (see the module docstring)
EAGER_BACKEND = {"backend": "eager"}


def _fields(results):
    """Every field of each result but the wall time."""
    return [{k: v for k, v in dataclasses.asdict(r).items() if k != "wall_s"} for r in results]


@pytest.fixture(scope="module")
def models():
    model = load_model("tiny-llada")
    prompts, _ = arith_prompts(model.tokenizer, 8)
    prompts = [p[:len(p) - (i % 4)] for i, p in enumerate(prompts)]       # left padding
    return model, prompts


@pytest.fixture
def breaks():
    """The graph breaks dynamo reports while a test runs (reason -> count); a recompile past
    the limit is an error instead of a silent fall-back to eager."""
    counters.clear()
    with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True):
        yield counters["graph_break"]


def _kw(dec, cache, **extra):
    kw = dict(gen_length=16, block_length=8, cache=cache, seed=3)
    if dec in ("pvf", "explore"):
        kw.update(preset="arith", reveal_next=3, plan_vocab=VOCAB)
    if dec == "static":
        kw.update(steps=8)
    return {**kw, **extra}


def _both(models, dec, kw, online=(None, None), options=EAGER_BACKEND):
    """(eager, compiled with ``options``) results at batch 1 (two requests alone) and batch 8."""
    model, prompts = models
    out = []
    for compile_round, vocab in zip((None, options), online):
        res = [decode_batch(model, [p], dec, request_indices=[i], online=vocab,
                            compile_round=compile_round, **kw)[0]
               for i, p in enumerate(prompts[:2])]
        res += decode_batch(model, prompts, dec, request_indices=list(range(8)), online=vocab,
                            compile_round=compile_round, **kw)
        out.append(_fields(res))
    return out


#: every decoder and every cache mode at least once; the slow tier runs the other pairs
COVER = {("static", "none"), ("threshold", "prefix"), ("freedave", "dual_base"),
         ("explore", "dual"), ("pvf", "dual_base")}


@pytest.mark.parametrize("dec,cache", [
    pytest.param(d, c, marks=() if (d, c) in COVER else compile_tier, id=f"{d}-{c}")
    for d in DECODERS for c in CACHES])
def test_compiled_round_decodes_like_eager(models, breaks, dec, cache):
    want, got = _both(models, dec, _kw(dec, cache))
    assert got == want
    assert len({r["nfe"] for r in want[2:]}) > 1 or dec == "static"   # requests end apart
    assert counters["stats"]["unique_graphs"] > 0          # the compiled programs ran
    assert not breaks


@pytest.mark.parametrize("case", ["reference pvf"] + [
    pytest.param(c, marks=compile_tier)
    for c in ("sampled pvf", "block-diffusion pvf", "sampled threshold")])
def test_compiled_round_other_paths(models, breaks, monkeypatch, case):
    dec = case.split()[-1]
    kw = _kw(dec, "dual")
    if case.startswith("sampled"):
        kw.update(temperature=0.7, seed=4)
    elif case.startswith("reference"):
        kw.update(rules="reference")
    else:
        monkeypatch.setattr(models[0], "block_size", 8)
    want, got = _both(models, dec, kw)
    assert got == want and not breaks


def test_compiled_round_records_a_learning_vocabulary_like_eager(models, breaks):
    """The online vocabulary's records (each round's choice says what to record, the loop records
    it) are the eager loop's, in the same order."""
    vocabs = (OnlineVocab(691, explore=2), OnlineVocab(691, explore=2))
    kw = {k: v for k, v in _kw("pvf", "dual").items() if k != "plan_vocab"}
    want, got = _both(models, "pvf", kw, online=vocabs)
    assert got == want and not breaks
    a, b = (v.take_pending() for v in vocabs)
    assert a["tok"].numel() > 0 and all(torch.equal(a[k], b[k]) for k in a)


def test_one_read_per_round_when_compiled(models, breaks, monkeypatch):
    """The compiled loop reads the host exactly as often as the eager one: ``tolist`` once per
    ``Runner.call`` (the initial call and each round) plus the two of every batch (round 0's
    layout, the outputs; tests/test_host_reads.py pins the eager count); a read inside a
    program would be a graph break, asserted absent."""
    model, prompts = models
    reads, calls = [], []
    real_tolist, real_call = torch.Tensor.tolist, runner_mod.Runner.call
    monkeypatch.setattr(torch.Tensor, "tolist", lambda t: reads.append(1) or real_tolist(t))
    monkeypatch.setattr(runner_mod.Runner, "call", lambda *a, **k: calls.append(1) or
                        real_call(*a, **k))
    # a configuration of its own, so that its programs are compiled (and counted) here
    decode_batch(model, prompts, "pvf", request_indices=list(range(8)),
                 compile_round=EAGER_BACKEND, **_kw("pvf", "dual", width=2))
    assert len(calls) > 4 and len(reads) == len(calls) + 2 and not breaks
    assert counters["stats"]["unique_graphs"] > 0


def test_programs_per_configuration():
    """One pair of programs per decode configuration, compiled the same few times whatever the
    batch sizes (1, 3 and 12 here); a second configuration does not use up the first's
    recompile budget, and a configuration seen before compiles nothing."""
    compiles = []

    def backend(gm, example_inputs):
        compiles.append(1)
        return gm.forward
    model = load_model("tiny-llada")
    prompts, _ = arith_prompts(model.tokenizer, 12)
    configs = [("threshold", _kw("threshold", "dual")),
               ("threshold", _kw("threshold", "dual", threshold=0.8))]
    counts = []
    # a limit of 3 programs per code object: enough for one configuration, not for two
    with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True, recompile_limit=3):
        for dec, kw in configs + configs:
            before = len(compiles)
            for size in (1, 3, 12):
                for a in range(0, 12, size):
                    decode_batch(model, prompts[a:a + size], dec,
                                 request_indices=list(range(a, a + size)),
                                 compile_round={"backend": backend}, **kw)
            counts.append(len(compiles) - before)
    # settle and prepare, for a batch of any size (one included), and settle once more for
    # the rounds after a request has finished (its inputs are then no longer views)
    assert counts == [3, 3, 0, 0], counts


def test_the_model_arg_compiles_the_round(monkeypatch):
    """``compile_round=true``: every decode_batch call of the run gets the round's options
    (the model call and the statistics pass stay eager), and the results report it."""
    pytest.importorskip("lm_eval")
    from lm_eval.api.instance import Instance

    import pvf_lmeval.lmeval.lm as lm_mod

    clock = iter([10.0, 11.5])
    monkeypatch.setattr(lm_mod, "compile_seconds", lambda: next(clock))
    seen = []
    real = lm_mod.decode_batch

    def spy(*args, options=None, **kw):
        seen.append((options.compile_step, options.compile_round))
        return real(*args, **kw)                   # eager: the options are what is checked
    monkeypatch.setattr(lm_mod, "decode_batch", spy)
    req = Instance(request_type="generate_until", doc={}, idx=0, metadata=("arith", 0, 1),
                   arguments=("Question: 1 + 2?\nAnswer:", {"until": ["\n\n"]}))
    on = lm_mod.PVFDiffusionLM(pretrained="tiny-llada", device="cpu", compile_round="true",
                               gen_length=16, block_length=16)
    on.generate_until([req], disable_tqdm=True)
    assert on.get_model_info()["pvf"]["compile"] == {"scope": None, "round": True,
                                                     "compile_s": 1.5}
    off = lm_mod.PVFDiffusionLM(pretrained="tiny-llada", device="cpu", gen_length=16,
                                block_length=16)
    off.generate_until([req], disable_tqdm=True)
    assert seen == [(None, {}), (None, None)] and off.get_model_info()["pvf"]["compile"] is None


@compile_tier
def test_inductor_round_decodes_like_eager(models):
    """inductor's generated programs (the default backend) make the eager loop's decisions:
    pvf with the dual cache, alone and at batch 8, every field equal."""
    want, got = _both(models, "pvf", _kw("pvf", "dual"), options={})
    assert got == want


def test_batch_invariant_is_refused_with_a_compiled_round(models):
    """``batch_invariant`` with a compiled round is a one-line error before any work, from
    ``decode_batch`` and from the lm-eval model args (inductor does not compile the round's
    fixed-order sums over a dynamic canvas)."""
    model, prompts = models
    want = ("batch_invariant=true cannot be combined with compile_round=true: inductor does "
            "not compile the round's fixed-order sums over a dynamic canvas; turn one of them off")
    with pytest.raises(ValueError) as err:
        decode_batch(model, prompts[:1], "pvf", batch_invariant=True,
                     compile_round=EAGER_BACKEND, **_kw("pvf", "dual"))
    assert str(err.value) == want
    pytest.importorskip("lm_eval")
    from pvf_lmeval.lmeval.lm import PVFDiffusionLM
    with pytest.raises(ValueError) as err:
        PVFDiffusionLM(pretrained="no/such-model", compile_round="true", batch_invariant="true")
    assert str(err.value) == want


def test_importing_the_package_leaves_dynamo_unimported():
    """Importing the package imports neither dynamo nor Triton (a first compiled program does):
    importing dynamo imports Triton, whose interpreter mode the kernel tests choose when they
    are collected (tests/test_batch_invariant_kernels.py)."""
    import subprocess
    import sys

    code = ("import sys, torch; import pvf_lmeval.lmeval.lm, pvf_lmeval.decoding, "
            "pvf_lmeval.planning.online; "
            "print(sorted(k for k in ('torch._dynamo', 'triton') if k in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"
