"""Log-likelihood requests: LLaDA's Monte Carlo ELBO (``pvf_lmeval.decoding.likelihood``) and its
wiring into ``PVFDiffusionLM.loglikelihood`` / ``loglikelihood_rolling``.

Exact checks use hand-written models; the held-out ``arith`` check runs on the bundled
``tiny-llada`` / ``tiny-dream`` fixtures once their weights exist; the variance check runs on a
random temporary checkpoint (no training needed for the Monte Carlo noise to shrink).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from pvf_lmeval.decoding.likelihood import (elbo, greedy_match, loglikelihood, mask_draws,
                                            rolling_loglikelihood)

REPO = Path(__file__).resolve().parents[1]
V, MASK = 16, 15


pytestmark = pytest.mark.usefixtures("one_thread")


class ConstModel:
    """Every position predicts the same distribution, whatever the canvas: ``p(tok) = probs``.

    Then the per-draw ELBO is exact: sum over l masked of log p * T/l = sum over all T of log p
    when the target is constant, so every draw equals the true log-likelihood.
    """

    mask_id = MASK
    eos_ids = (0,)

    def __init__(self, top: int = 3, p: float = 0.5, mask_logit: float | None = None):
        probs = torch.full((V,), (1 - p) / (V - 2))
        probs[top] = p
        probs[MASK] = 0
        self.logp = torch.log(probs)
        if mask_logit is not None:
            self.logp[MASK] = mask_logit
        self.calls: list[tuple[int, int]] = []

    def logits(self, tokens, positions, *, attention_mask=None, cache=None):
        self.calls.append((tokens.shape[0], tokens.shape[1]))
        return self.logp.expand(tokens.shape[0], positions.shape[-1], V).clone()


class CopyModel:
    """Predicts, at every masked position, the token the unmasked canvas holds most often; so
    draws differ with what is masked (a model with real Monte Carlo noise)."""

    mask_id = MASK
    eos_ids = (0,)

    def logits(self, tokens, positions, *, attention_mask=None, cache=None):
        out = torch.zeros(tokens.shape[0], positions.shape[-1], V)
        for n, row in enumerate(tokens):
            seen = torch.bincount(row[row != MASK], minlength=V)[:V].float()
            out[n] = seen.log1p().unsqueeze(0) * 2.0
        out[..., MASK] = 5.0          # the mask's own logit must be ignored
        return out


# ------------------------------------------------------------------ the estimator


def test_mask_draws_are_stratified_and_seeded():
    g = torch.Generator().manual_seed(1)
    masked, counts = mask_draws(10, 10, g)
    assert masked.shape == (10, 10) and counts.shape == (10,)
    assert torch.equal(masked.sum(-1), counts)
    # stratified: 10 draws over 10 tokens mask every count 1..10 exactly once
    assert sorted(counts.tolist()) == list(range(1, 11))
    m2, c2 = mask_draws(7, 50, torch.Generator().manual_seed(2))
    assert torch.equal(m2.sum(-1), c2) and c2.min() >= 1 and c2.max() <= 7
    assert (m2.float().mean(0) - c2.float().mean() / 7).abs().max() < 0.25   # positions uniform
    again, counts2 = mask_draws(10, 10, torch.Generator().manual_seed(1))
    assert torch.equal(masked, again) and torch.equal(counts, counts2)


def test_elbo_is_exact_for_a_factorised_model():
    m = ConstModel(top=3, p=0.5)
    target = [3, 3, 4, 3, 7]
    draws, nfe = elbo(m, [1, 2], target, mc_num=8, mc_batch=3)
    assert nfe == 3 and [r for r, _ in m.calls] == [3, 3, 2]
    # with a target of one repeated token every draw is exact
    d2, _ = elbo(m, [1, 2], [3, 3, 3, 3], mc_num=8, mc_batch=8)
    assert torch.allclose(d2, torch.full((8,), 4 * math.log(0.5), dtype=torch.float64), atol=1e-5)
    # in general the mean is unbiased: E[T/l * sum_masked] = sum over all positions
    exact = float(sum(m.logp[t] for t in target))
    many, _ = elbo(m, [1, 2], target, mc_num=4000, mc_batch=4000)
    assert abs(float(many.mean()) - exact) < 0.05 * abs(exact)
    # each draw is T/l times the log-probabilities of its l masked targets (masks: the seeded
    # draw of request 0, seed 0)
    from pvf_lmeval.decoding.batch import mix_seed

    masked, counts = mask_draws(5, 8, torch.Generator().manual_seed(mix_seed(0, 0, 0)))
    lp = [math.log(0.5) if t == 3 else math.log(0.5 / 14) for t in target]
    want = [5 / int(n) * sum(lp[i] for i in range(5) if masked[d, i]) for d, n in enumerate(counts)]
    assert draws.tolist() == pytest.approx(want, abs=1e-5)


def test_mask_logit_is_excluded_from_the_softmax():
    plain = loglikelihood(ConstModel(), [1], [3, 3], mc_num=4)
    with_mask = loglikelihood(ConstModel(mask_logit=3.0), [1], [3, 3], mc_num=4)
    assert with_mask.logprob == pytest.approx(plain.logprob, abs=1e-5)


def test_seeded_deterministic_and_independent_of_mc_batch():
    m = CopyModel()
    prefix, target = [1, 2, 2, 5], [2, 5, 2, 2, 9, 2]
    a = loglikelihood(m, prefix, target, mc_num=24, mc_batch=24, seed=3, request_index=7)
    b = loglikelihood(m, prefix, target, mc_num=24, mc_batch=5, seed=3, request_index=7)
    c = loglikelihood(m, prefix, target, mc_num=24, mc_batch=24, seed=3, request_index=7)
    assert a.logprob == c.logprob and torch.equal(a.draws, c.draws)
    assert torch.allclose(a.draws, b.draws, atol=1e-9)
    assert a.draws.std() > 0                                    # the model has real MC noise
    other = loglikelihood(m, prefix, target, mc_num=24, seed=4, request_index=7)
    assert not torch.equal(other.draws, a.draws)
    assert a.nfe == 2 and b.nfe == 6                            # 1 or 5 ELBO calls + greedy


def test_is_greedy_is_the_one_step_prediction():
    m = ConstModel(top=3, p=0.5, mask_logit=10.0)              # the mask never wins
    assert greedy_match(m, [1], [3, 3, 3]) is True
    assert greedy_match(m, [1], [3, 4]) is False
    assert loglikelihood(m, [1], [3, 3], mc_num=2).is_greedy is True
    assert loglikelihood(m, [1], [3, 3], mc_num=2, greedy=False).is_greedy is None


def test_rolling_sums_the_windows():
    m = ConstModel(top=3, p=0.5)
    windows = [([0], [3, 3, 3]), ([3], [3, 3])]
    r = rolling_loglikelihood(m, windows, mc_num=6, mc_batch=4)
    assert r.logprob == pytest.approx(5 * math.log(0.5), abs=1e-5) and r.nfe == 4
    assert r.draws.shape == (6,)


def test_bad_arguments_are_one_line():
    m = ConstModel()
    for kw, name in (({"mc_num": 0}, "mc_num"), ({"mc_batch": 0}, "mc_batch")):
        with pytest.raises(ValueError, match=name):
            elbo(m, [1], [3], **kw)
    with pytest.raises(ValueError, match="no tokens"):
        elbo(m, [1], [])


# ------------------------------------------------------------------ through the adapter

ARITH = [json.loads(line) for line in (REPO / "tasks/arith/data/test.jsonl").read_text().splitlines()]


def _prompt(item) -> str:
    return f"Question: {item['question']}\nAnswer:"


def perturb(item) -> str:
    """The answer with a wrong final result: ``#### N`` and ``... has N ...`` get the same wrong N
    (same number of digits, so the two continuations tokenise alike)."""
    n = int(item["target"])
    wrong = n + 1 if len(str(n + 1)) == len(str(n)) else n - 1
    lines = item["answer"].split("\n")
    lines[-2] = lines[-2].replace(f" {n} ", f" {wrong} ")
    lines[-1] = f"#### {wrong}"
    return "\n".join(lines)


def _requests(items, kind="loglikelihood"):
    from lm_eval.api.instance import Instance

    reqs = []
    for d, item in enumerate(items):
        for idx, answer in enumerate((item["answer"], perturb(item))):
            reqs.append(Instance(request_type=kind, doc={}, arguments=(_prompt(item), " " + answer),
                                 idx=idx, metadata=("arith", d, 1)))
    return reqs


def _fixture_lm(name: str, **kw):
    from helpers.prerequisites import require_bundled_weights

    from pvf_lmeval.lmeval.lm import PVFDiffusionLM

    require_bundled_weights(name)
    return PVFDiffusionLM(pretrained=name, device="cpu", **kw)


N_ITEMS = 12


@pytest.mark.parametrize("name", ["tiny-llada", "tiny-dream"])
def test_correct_arith_answers_score_higher_than_perturbed(name):
    lm = _fixture_lm(name, mc_num=16, mc_batch=16)
    items = ARITH[-N_ITEMS:]
    out = lm.loglikelihood(_requests(items), disable_tqdm=True)
    assert all(isinstance(lp, float) and isinstance(g, bool) for lp, g in out)
    wins = sum(out[2 * i][0] > out[2 * i + 1][0] for i in range(len(items)))
    # a deterministic run (seeded draws): both fixtures rank the correct answer first on every
    # item (tiny-llada: 192/200 with mc_num=32 over 200 items)
    assert wins == len(items), f"{name}: correct > perturbed on {wins}/{len(items)}"


def test_variance_shrinks_with_mc_num_on_the_fixture():
    lm = _fixture_lm("tiny-llada")
    tok, model = lm.tokenizer, lm.model
    pooled = {}
    for mc in (2, 8, 32):
        variances = []
        for item in ARITH[:4]:
            ctx = tok.encode(_prompt(item), add_special_tokens=False)
            cont = tok.encode(_prompt(item) + " " + item["answer"], add_special_tokens=False)[len(ctx):]
            est = [loglikelihood(model, ctx, cont, mc_num=mc, mc_batch=32, seed=s, greedy=False).logprob
                   for s in range(5)]
            variances.append(torch.tensor(est, dtype=torch.float64).var().item())
        pooled[mc] = sum(variances) / len(variances)
    # 16x the draws: about 16x less variance; draws with few masks weigh T/l, so the spread has
    # a heavy tail and 5 seeds measure it roughly, hence the margin
    assert pooled[2] > pooled[8] > pooled[32] and pooled[32] < pooled[2] / 3, pooled


def test_adapter_is_deterministic_and_variance_shrinks_with_mc_num(tmp_path):
    pytest.importorskip("lm_eval")
    from test_models_oracle import make_temp_checkpoint

    from pvf_lmeval.decoding.params import override
    from pvf_lmeval.lmeval.lm import PVFDiffusionLM

    ckpt = make_temp_checkpoint(tmp_path / "ckpt", "llada", seed=1)
    item = ARITH[0]
    spread = {}
    for mc in (4, 64):
        lm = PVFDiffusionLM(pretrained=str(ckpt), device="cpu", mc_num=mc, mc_batch=64)
        reqs = _requests([item])[:1]
        vals = []
        for seed in range(8):
            lm.params = override(lm.params, seed=seed)
            vals.append(lm.loglikelihood(reqs, disable_tqdm=True)[0][0])
        assert lm.loglikelihood(reqs, disable_tqdm=True)[0][0] == vals[-1]   # same seed, same value
        spread[mc] = torch.tensor(vals, dtype=torch.float64).var().item()
    assert spread[64] < spread[4] / 4, spread


def test_rolling_through_the_adapter(tmp_path):
    pytest.importorskip("lm_eval")
    from lm_eval.api.instance import Instance
    from test_models_oracle import make_temp_checkpoint

    from pvf_lmeval.lmeval.lm import PVFDiffusionLM

    ckpt = make_temp_checkpoint(tmp_path / "ckpt", "llada", seed=2)
    lm = PVFDiffusionLM(pretrained=str(ckpt), device="cpu", mc_num=4, mc_batch=4)
    text = " ".join(ARITH[i]["answer"] for i in range(6))          # longer than one window
    n_tok = len(lm.tokenizer.encode(text, add_special_tokens=False))
    assert n_tok > lm.model.max_length
    req = Instance(request_type="loglikelihood_rolling", doc={}, arguments=(text,), idx=0,
                   metadata=("wikitext", 0, 1))
    (a,) = lm.loglikelihood_rolling([req], disable_tqdm=True)
    (b,) = lm.loglikelihood_rolling([req], disable_tqdm=True)
    assert a == b
    # a deterministic run (seeded weights and draws): the sum over the windows of 347 tokens;
    # a random model scores about log(1/691) = -6.5 per token
    assert n_tok == 347 and len(lm.tokenizer) == 691
    assert a == pytest.approx(-2427.255625638984, rel=1e-6)


def test_model_args_mc_num_and_mc_batch_are_validated(tmp_path):
    pytest.importorskip("lm_eval")
    from pvf_lmeval.lmeval.lm import PVFDiffusionLM

    for arg in ("mc_num=0", "mc_batch=x", "mc_num=2.5"):
        with pytest.raises(ValueError) as exc:
            PVFDiffusionLM.create_from_arg_string(f"pretrained=/nonexistent,{arg}")
        assert arg.split("=")[0] in str(exc.value) and "\n" not in str(exc.value)
