"""``compile=blocks`` stays compiled through batched decoding: rounds vary the rows per call,
the requested positions, left padding and full vs cached calls, and none of that may push dynamo
past its recompile limit (after which calls silently run eager)."""

from __future__ import annotations

import pytest
import torch
from helpers.cache_models import arith_prompts

from pvf_lmeval.decoding import decode_batch
from pvf_lmeval.models import load_model

pytestmark = pytest.mark.usefixtures("one_thread")


def test_batched_runs_stay_within_a_few_graphs_per_block_function():
    """backend=eager: dynamo's capture and guards without inductor's code generation (cheap on a
    CPU). ``fail_on_recompile_limit_hit`` turns a fall-back to eager into an error, and the limit
    is set to 4 graphs per function (dynamo's default is 8)."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    model = load_model("tiny-llada").compile(scope="blocks", backend="eager")
    prompts, _ = arith_prompts(model.tokenizer, 8)
    prompts = [p[:len(p) - (i % 3)] for i, p in enumerate(prompts)]     # left padding
    vocab = range(0, 600, 2)
    with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True, recompile_limit=4):
        for dec, cache, sizes in (("pvf", "dual", (1, 3)), ("pvf", "none", (5,)),
                                  ("freedave", "prefix", (8,))):
            for bs in sizes:
                extra = {"preset": "arith", "plan_vocab": vocab} if dec == "pvf" else {}
                rs = decode_batch(model, prompts[:bs], dec, gen_length=32, block_length=16,
                                  cache=cache, **extra)
                assert len(rs) == bs
    # three block functions (all rows, the last layer's requested rows, cached): at most one
    # graph per (one row or several) x (attention mask or none)
    assert 0 < counters["stats"]["unique_graphs"] <= 10
    torch._dynamo.reset()


def test_compile_seconds_reads_dynamos_record(monkeypatch):
    """``compile_seconds``: dynamo's total of frame compiles, growing with each compile; None
    when torch keeps a record without that entry (a renamed metric is not read as zero)."""
    import torch._dynamo.utils as dynamo_utils

    from pvf_lmeval.models.diffusion_lm import compile_seconds

    before = compile_seconds()
    fn = torch.compile(lambda x: x * 3 + 1, backend="eager")
    assert fn(torch.ones(2)).tolist() == [4.0, 4.0]
    assert compile_seconds() > before
    monkeypatch.setattr(dynamo_utils, "compilation_time_metrics", {"other": [1.0]})
    assert compile_seconds() is None
    monkeypatch.setattr(dynamo_utils, "compilation_time_metrics", {})
    assert compile_seconds() == 0.0
    monkeypatch.setattr(dynamo_utils, "compilation_time_metrics",
                        {"_compile.compile_inner": [1.5, 0.25]})
    assert compile_seconds() == 1.75


def test_results_report_the_compile_scope_and_its_warm_up(monkeypatch):
    """The run's model info names the scope ``compile=true`` resolved to and the seconds spent
    compiling during the run (its warm-up); an eager run reports None. dynamo's record is
    stood in for, so the figure is exact: what was compiled after the model was set up."""
    from lm_eval.api.instance import Instance

    import pvf_lmeval.lmeval.lm as lm_mod
    from pvf_lmeval.lmeval.lm import PVFDiffusionLM

    clock = iter([10.0, 12.5])         # at set-up, then when the info is asked for
    monkeypatch.setattr(lm_mod, "compile_seconds", lambda: next(clock))
    import pvf_lmeval.decoding.compiled as compiled_step

    real = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: real(fn, **{**kw, "backend": "eager"}))
    # the statistics pass's programs built here (backend eager) must not serve later tests
    monkeypatch.setattr(compiled_step, "_programs", {})
    lm = PVFDiffusionLM(pretrained="tiny-llada", device="cpu", decoder="threshold", vocab="none",
                        compile="true", gen_length=16, block_length=16)
    req = Instance(request_type="generate_until", doc={},
                   arguments=("Question: 1 + 2?\nAnswer:", {"until": ["\n\n"]}), idx=0,
                   metadata=("arith", 0, 1))
    assert len(lm.generate_until([req])) == 1
    assert lm.get_model_info()["pvf"]["compile"] == {"scope": "blocks", "round": False,
                                                   "compile_s": 2.5}
    eager = PVFDiffusionLM(pretrained="tiny-llada", device="cpu", decoder="threshold",
                           vocab="none", gen_length=16, block_length=16)
    assert eager.get_model_info()["pvf"]["compile"] is None
