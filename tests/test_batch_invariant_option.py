"""``batch_invariant``: where it is allowed (the CPU in float32, CUDA with Triton; a one-line
error elsewhere, before any work), that it reaches the model (the batch-invariant ops are
active during every model call) and the decoding side (fixed-order sums), and the fixed-order
sum itself."""

from __future__ import annotations

import math

import pytest
import torch
from helpers.cache_models import dream_like, random_prompts

from pvf_lmeval.decoding import decode, decode_batch
from pvf_lmeval.decoding.batch import Batch
from pvf_lmeval.tensors.fixed_order import fixed_sum
from pvf_lmeval.decoding.stats import log_softmax_fixed
from pvf_lmeval.decoding.likelihood import Estimator, loglikelihood
from pvf_lmeval.models import ops
from pvf_lmeval.models.batch_invariant import batch_invariant_ops, support_error
from pvf_lmeval.models.batch_invariant.cpu import CPU_INVARIANT

pytestmark = pytest.mark.usefixtures("one_thread")


def test_fixed_sum_order_is_pairwise_halving():
    # float32: [1e8, 1, -1e8, 1] -> halves [1e8 + -1e8, 1 + 1] = [0, 2] -> 2 (left to right: 1)
    x = torch.tensor([[1e8, 1.0, -1e8, 1.0]])
    assert fixed_sum(x).tolist() == [2.0]
    # odd width: [a, b, c] -> [a + b, c] -> (a + b) + c; in float32 2**24 + 1 rounds to 2**24
    assert fixed_sum(torch.tensor([2.0 ** 24, 1.0, 1.0])).item() == 2.0 ** 24
    assert fixed_sum(torch.tensor([1.0, 1.0, 2.0 ** 24])).item() == 2.0 ** 24 + 2
    assert fixed_sum(torch.zeros(3, 0)).tolist() == [0.0, 0.0, 0.0]
    assert fixed_sum(torch.tensor([5.0])).item() == 5.0


def test_log_softmax_fixed_closed_form():
    # logits (c, c + 1, -inf): log-probabilities -ln(1 + e), 1 - ln(1 + e), -inf for any c;
    # c = 1000 overflows exp unless the row maximum is subtracted first
    x = torch.tensor([[0.0, 1.0, float("-inf")], [1000.0, 1001.0, float("-inf")]])
    norm = math.log(1 + math.e)
    for row in log_softmax_fixed(x).tolist():
        assert row[0] == pytest.approx(-norm, abs=1e-6)
        assert row[1] == pytest.approx(1 - norm, abs=1e-6)
        assert row[2] == float("-inf")


def test_fixed_sum_rows_alone_equal_rows_in_a_batch():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(7, 1003, generator=g) * 1e3
    assert torch.equal(fixed_sum(x)[4:5], fixed_sum(x[4:5].clone()))
    ls = log_softmax_fixed(x)
    assert torch.equal(ls[2], log_softmax_fixed(x[2:3].clone())[0])
    assert torch.allclose(ls, torch.log_softmax(x, -1), atol=1e-3)


def test_cpu_below_float32_is_an_error():
    m = dream_like()
    m.net.to(torch.bfloat16)
    with pytest.raises(ValueError, match=r"^batch_invariant=true on the CPU covers float32 only "
                                         r"\(dtype torch.bfloat16\); pass dtype=float32$"):
        decode(m, [5, 6, 7], "threshold", gen_length=8, block_length=4, batch_invariant=True)
    with pytest.raises(ValueError, match=r"^batch_invariant=true on the CPU covers float32 only"):
        loglikelihood(m, [5, 6], [7, 8], estimator=Estimator(mc_num=2), batch_invariant=True)
    assert ops.active() is ops.TORCH


def test_where_the_implementations_run(monkeypatch):
    cuda = torch.device("cuda")
    for dt in (torch.bfloat16, torch.float16, torch.float32):
        assert support_error(cuda, dt) is None or "Triton" in support_error(cuda, dt)
    assert "dtype torch.float64" in support_error(cuda, torch.float64)
    assert support_error("meta", torch.float32) == (
        "batch_invariant=true runs on CUDA devices and the CPU only (device meta)")
    # the CPU in float32: the plain-torch implementation, Triton or its interpreter or not
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert support_error("cpu", torch.float32) is None
    assert batch_invariant_ops("cpu") is CPU_INVARIANT
    for dt in (torch.bfloat16, torch.float16, torch.float64):
        assert support_error("cpu", dt).startswith("batch_invariant=true on the CPU covers "
                                                   f"float32 only (dtype {dt})")


def test_cpu_model_selects_the_plain_torch_implementation():
    m = dream_like()
    with m.batch_invariant():
        assert ops.active() is CPU_INVARIANT
    assert ops.active() is ops.TORCH


def test_model_without_kernels_is_an_error():
    class Plain:                      # the model protocol, without batch_invariant()
        mask_id, eos_ids, pad_id = 9, (2,), 3

        def logits(self, tokens, positions, *, attention_mask=None, cache=None):
            raise AssertionError("no call may happen")
    with pytest.raises(ValueError, match=r"^batch_invariant=true: the model \(Plain\) has no "):
        decode(Plain(), [5, 6], "threshold", gen_length=4, block_length=4, batch_invariant=True)


class _CountingOps(ops.TorchOps):
    """torch's kernels, counting the calls that reach them."""

    name = "counting"

    def __init__(self):
        self.calls = 0

    def linear(self, *a):
        self.calls += 1
        return super().linear(*a)


@pytest.mark.parametrize("cache", ("none", "dual"))
def test_option_reaches_model_and_decoding_side(monkeypatch, cache):
    """Every model call runs under the model's batch-invariant ops, the decoding side sums in
    the fixed order, and nothing leaks out of the call."""
    m = dream_like()
    spy = _CountingOps()
    seen = []
    monkeypatch.setattr(type(m), "batch_invariant", lambda self: ops.use(spy))
    real_logits = type(m).logits

    def logits(self, *a, **k):
        seen.append(ops.active() is spy)
        return real_logits(self, *a, **k)
    monkeypatch.setattr(type(m), "logits", logits)
    sums = []
    real_rowsum = Batch.rowsum
    monkeypatch.setattr(Batch, "rowsum", lambda self, x: (sums.append(self.invariant),
                                                          real_rowsum(self, x))[1])
    import pvf_lmeval.decoding.runner as runner_mod
    fixed = []
    real_stats = runner_mod.stats_from_logits
    monkeypatch.setattr(runner_mod, "stats_from_logits",
                        lambda *a, **k: (fixed.append(k.get("fixed")), real_stats(*a, **k))[1])
    prompts = random_prompts(3, 47, seed=2)
    kw = dict(gen_length=8, block_length=4, cache=cache, preset="arith", reveal_next=2,
              plan_vocab=list(range(4, 40)))
    on = decode_batch(m, prompts, "pvf", batch_invariant=True, **kw)
    assert seen and all(seen) and spy.calls > 0 and sums and all(sums)
    assert fixed and all(f is True for f in fixed)
    assert ops.active() is ops.TORCH
    seen.clear()
    fixed.clear()
    off = decode_batch(m, prompts, "pvf", **kw)
    assert seen and not any(seen) and fixed and not any(fixed)
    # torch's ops under the spy: the same numbers, and on the CPU in float32 fixed-order sums
    # decide the same tokens here
    assert [r.tokens for r in on] == [r.tokens for r in off]


@pytest.mark.parametrize("value, dtype, message", [
    ("true", "bfloat16", r"^batch_invariant=true on the CPU covers float32 only "
                         r"\(dtype torch.bfloat16\)"),
    ("maybe", "float32", r"^batch_invariant='maybe'"),
])
def test_model_arg_errors_before_the_model_loads(monkeypatch, value, dtype, message):
    import pvf_lmeval.models.loader as loader
    from pvf_lmeval.lmeval.lm import PVFDiffusionLM

    def no_load(*a, **k):
        raise AssertionError("the weights were read")
    monkeypatch.setattr(loader, "load_native_state", no_load)
    monkeypatch.setattr(loader, "load_tokenizer", no_load)
    with pytest.raises(ValueError, match=message):
        PVFDiffusionLM(pretrained="tiny-llada", device="cpu", dtype=dtype, batch_invariant=value)


def test_model_arg_reaches_every_call(monkeypatch):
    """pvf-dlm's batch_invariant=true goes to decode_batch and to the likelihoods, and into
    the results' config.pvf (the run's identity)."""
    from types import SimpleNamespace

    import pvf_lmeval.decoding.likelihood as likelihood
    import pvf_lmeval.lmeval.lm as lm_mod

    lm = lm_mod.PVFDiffusionLM(pretrained="tiny-llada", device="cpu", batch_invariant="true",
                               gen_length=8, block_length=8, batch_size=2)
    assert lm.get_model_info()["pvf"]["batch_invariant"] is True
    seen = []
    real = lm_mod.decode_batch

    def decode_spy(*a, batch_invariant=False, options=None, **k):
        seen.append(("decode", options.batch_invariant if options else batch_invariant))
        return real(*a, **k)            # the option counted, not run: torch's kernels here
    monkeypatch.setattr(lm_mod, "decode_batch", decode_spy)

    def elbo_spy(model, items, *a, batch_invariant=False, **k):
        seen.append(("likelihood", batch_invariant))
        return [SimpleNamespace(logprob=-1.0, is_greedy=None, greedy_first=None,
                                stats=lambda: dict.fromkeys(("nfe", "branch_rows", "canvases",
                                                             "mc_num"), 0)) for _ in items]

    def greedy_spy(model, items, firsts, *a, batch_invariant=False, **k):
        seen.append(("greedy", batch_invariant))
        return [likelihood.GreedyCheck(True, 0, 0) for _ in items]
    monkeypatch.setattr(likelihood, "loglikelihoods", elbo_spy)
    monkeypatch.setattr(likelihood, "suffix_greedy", greedy_spy)
    req = SimpleNamespace(args=("Question: 1+1?\nAnswer:", {"until": ["\n"]}), repeats=1,
                          task_name="t", doc_id=0, idx=0)
    lm.generate_until([req])
    lm.loglikelihood([SimpleNamespace(args=("Question: 1+1?\nAnswer:", " 2"), task_name="t",
                                      doc_id=0, idx=0)])
    assert seen == [("decode", True), ("likelihood", True), ("greedy", True)]


def test_likelihood_sums_in_the_fixed_order_only_when_asked(monkeypatch):
    """``batch_invariant`` in ``loglikelihood``: the log-softmax normaliser and the sum over the
    target are the fixed-order ones (and only then); the estimate is the same number up to the
    float32 order of the sums."""
    import pvf_lmeval.decoding.likelihood as likelihood
    m = dream_like()
    called = []
    for name in ("log_softmax_fixed", "fixed_sum"):
        real = getattr(likelihood, name)
        monkeypatch.setattr(likelihood, name,
                            lambda x, _n=name, _f=real: (called.append(_n), _f(x))[1])
    on = loglikelihood(m, [5, 6, 7], [8, 9, 10], estimator=Estimator(mc_num=4), mc_batch=2, batch_invariant=True)
    # once per model call (its distinct canvases, two per call)
    assert called.count("log_softmax_fixed") == called.count("fixed_sum") == on.nfe >= 1
    called.clear()
    off = loglikelihood(m, [5, 6, 7], [8, 9, 10], estimator=Estimator(mc_num=4), mc_batch=2)
    assert called == []
    assert on.logprob == pytest.approx(off.logprob, abs=1e-4)
