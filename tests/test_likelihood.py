"""Log-likelihood requests: LLaDA's Monte Carlo ELBO (``pvf_lmeval.decoding.likelihood``), its
batched form against the one-request reference, ``is_greedy`` as LLaDA's suffix greedy
prediction (only where lm-eval reads it), and their wiring into
``PVFDiffusionLM.loglikelihood`` / ``loglikelihood_rolling``.

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

from pvf_lmeval.decoding.likelihood import (Continuation, Estimator, elbo, elbo_batch,
                                            loglikelihood, mask_draws, rolling_loglikelihood,
                                            loglikelihoods, suffix_greedy)

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
    draws differ with what is masked (a model with real Monte Carlo noise); position p also
    favours token ``p % 8``, so that reading another position's logits changes the result."""

    mask_id = MASK
    eos_ids = (0,)

    def __init__(self):
        self.calls: list[torch.Tensor] = []

    def logits(self, tokens, positions, *, attention_mask=None, cache=None):
        assert attention_mask is None           # the likelihood path never pads
        self.calls.append(tokens.clone())
        out = torch.zeros(tokens.shape[0], positions.shape[-1], V)
        for n, row in enumerate(tokens):
            seen = torch.bincount(row[row != MASK], minlength=V)[:V].float()
            out[n] = seen.log1p().unsqueeze(0) * 2.0
        pos = positions.expand(tokens.shape[0], -1)
        out.scatter_add_(-1, (pos % 8).unsqueeze(-1), torch.ones(*pos.shape, 1))
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
    draws, nfe = elbo(m, [1, 2], target, estimator=Estimator(mc_num=8), mc_batch=3)
    assert nfe == 3 and [r for r, _ in m.calls] == [3, 3, 2]
    # with a target of one repeated token every draw is exact
    d2, _ = elbo(m, [1, 2], [3, 3, 3, 3], estimator=Estimator(mc_num=8), mc_batch=8)
    assert torch.allclose(d2, torch.full((8,), 4 * math.log(0.5), dtype=torch.float64), atol=1e-5)
    # in general the mean is unbiased: E[T/l * sum_masked] = sum over all positions
    exact = float(sum(m.logp[t] for t in target))
    many, _ = elbo(m, [1, 2], target, estimator=Estimator(mc_num=4000), mc_batch=4000)
    assert abs(float(many.mean()) - exact) < 0.05 * abs(exact)
    # each draw is T/l times the log-probabilities of its l masked targets (masks: the seeded
    # draw of request 0, seed 0)
    from pvf_lmeval.decoding.batch import mix_seed

    masked, counts = mask_draws(5, 8, torch.Generator().manual_seed(mix_seed(0, 0, 0)))
    lp = [math.log(0.5) if t == 3 else math.log(0.5 / 14) for t in target]
    want = [5 / int(n) * sum(lp[i] for i in range(5) if masked[d, i]) for d, n in enumerate(counts)]
    assert draws.tolist() == pytest.approx(want, abs=1e-5)


def test_mask_logit_is_excluded_from_the_softmax():
    plain = loglikelihood(ConstModel(), [1], [3, 3], estimator=Estimator(mc_num=4))
    with_mask = loglikelihood(ConstModel(mask_logit=3.0), [1], [3, 3],
                              estimator=Estimator(mc_num=4))
    assert with_mask.logprob == pytest.approx(plain.logprob, abs=1e-5)


def test_seeded_deterministic_and_independent_of_mc_batch():
    m = CopyModel()
    prefix, target = [1, 2, 2, 5], [2, 5, 2, 2, 9, 2]
    est = Estimator(mc_num=24)
    a = loglikelihood(m, prefix, target, estimator=est, mc_batch=24, seed=3, request_index=7)
    b = loglikelihood(m, prefix, target, estimator=est, mc_batch=5, seed=3, request_index=7)
    c = loglikelihood(m, prefix, target, estimator=est, mc_batch=24, seed=3, request_index=7)
    assert a.logprob == c.logprob and torch.equal(a.draws, c.draws)
    assert torch.allclose(a.draws, b.draws, atol=1e-9)
    assert a.draws.std() > 0                                    # the model has real MC noise
    other = loglikelihood(m, prefix, target, estimator=est, seed=4, request_index=7)
    assert not torch.equal(other.draws, a.draws)
    # the distinct canvases, 5 per call: the draws' distinct masks (the seeded draw of
    # request 7, seed 3)
    from pvf_lmeval.decoding.batch import mix_seed

    masks, _ = mask_draws(6, 24, torch.Generator().manual_seed(mix_seed(3, 7, 0)))
    distinct = len({tuple(row.tolist()) for row in masks})
    assert a.nfe == 1 and b.nfe == -(-distinct // 5)


def _reference_canvas(item: Continuation, masked_row) -> tuple[int, ...]:
    return tuple(item.prefix) + tuple(MASK if hide else t for t, hide in zip(item.target, masked_row))


def test_batch_equals_the_one_request_reference_and_computes_each_canvas_once():
    """``elbo_batch`` gives every item the draws ``elbo`` gives it alone, bit for bit (the model
    computes each row on its own), while the model sees each distinct canvas once, in calls of
    at most ``rows_per_call`` rows of one length."""
    from pvf_lmeval.decoding.batch import mix_seed

    items = [Continuation([1, 2, 2], [2, 5, 2, 9], 0), Continuation([1, 2, 2], [2, 5, 2, 4], 0),
             Continuation([1, 2, 2], [7, 5, 2], 0),          # the choices of one question
             Continuation([5, 5], [9], 1), Continuation([5, 5], [4], 1),   # one-token choices
             Continuation([], [3, 3, 5, 1, 2, 6, 7], 2), Continuation([9, 1, 1, 4, 2, 6], [1], 3)]
    for rows_per_call in (1, 3, 1000):
        m = CopyModel()
        got = elbo_batch(m, items, estimator=Estimator(mc_num=16), rows_per_call=rows_per_call,
                         seed=5)
        for item, scored in zip(items, got):
            ref, _ = elbo(CopyModel(), item.prefix, item.target, estimator=Estimator(mc_num=16),
                          mc_batch=16, seed=5, request_index=item.key)
            assert torch.equal(scored.draws, ref)
        calls = [scored.calls for scored in got]
        rows = [tuple(r.tolist()) for call in m.calls for r in call]
        want = set()
        for item in items:
            masks, _ = mask_draws(len(item.target), 16,
                                  torch.Generator().manual_seed(mix_seed(5, item.key, 0)))
            want |= {_reference_canvas(item, row.tolist()) for row in masks}
        assert sorted(rows) == sorted(want)               # each distinct canvas exactly once
        assert all(call.shape[0] <= rows_per_call for call in m.calls)
        assert len(calls) == len(items) and min(calls) >= 1
    # the one-token choices [9] and [4] after [5, 5] share their only canvas: [5, 5, MASK]
    assert rows.count((5, 5, MASK)) == 1


class PositionModel:
    """Greedy generation is known in closed form: every masked position predicts token
    ``1 + position % 4`` (probability 0.6); the mask's own logit is the largest and ignored."""

    mask_id = MASK
    eos_ids = (0,)

    def __init__(self):
        self.calls = 0

    def logits(self, tokens, positions, *, attention_mask=None, cache=None):
        self.calls += 1
        pos = positions if positions.dim() == 2 else positions.expand(tokens.shape[0], -1)
        if attention_mask is not None:          # positions count real tokens: left padding off
            pos = pos - (attention_mask == 0).sum(-1, keepdim=True)
        probs = torch.full((*pos.shape, V), 0.4 / (V - 2))
        probs.scatter_(-1, (1 + pos % 4).unsqueeze(-1), 0.6)
        out = probs.log()
        out[..., MASK] = 10.0
        return out


def test_is_greedy_is_llada_suffix_greedy_prediction():
    """LLaDA's ``suffix_greedy_prediction``: on prefix + T masks, one token per call at the most
    confident masked position. PositionModel predicts ``1 + position % 4`` everywhere with the
    same confidence, so the commits go left to right (ties: the lowest position): after a
    3-token prefix the greedy suffix is 4 1 2 3 4 ..., and a check stops at its first wrong
    commit (a committed token is never revised, so the rest cannot make it true)."""
    prefix = [5, 6, 7]
    targets = [[4, 1, 2], [4, 1, 1], [1, 1, 2], [4, 1, 2, 3, 4]]
    m = PositionModel()
    items = [Continuation(prefix, t, 0) for t in targets]
    got = suffix_greedy(m, items, [None] * len(items), rows_per_call=8)
    assert [(g.value, g.calls) for g in got] == [(True, 3), (False, 3), (False, 1), (True, 5)]
    # the three canvases of one length step together (3 calls), the longer one alone (5)
    assert m.calls == 8
    # a first step already taken (position 0, right): one call fewer
    again = suffix_greedy(PositionModel(), items[:1], [0])
    assert [(g.value, g.calls) for g in again] == [(True, 2)]


def test_the_draws_decide_is_greedy_where_they_hold_its_first_step():
    """The draw that masks every target token is the greedy check's first canvas: a one-token
    continuation is decided by it (no call of its own), a longer one whose first commit is
    right hands on the position it committed."""
    m = PositionModel()
    items = [Continuation([5, 6, 7], [4], 0), Continuation([5, 6, 7], [1], 0),
             Continuation([5, 6, 7], [4, 1, 2], 1), Continuation([5, 6, 7], [3, 1, 2], 1)]
    got = loglikelihoods(m, items, estimator=Estimator(mc_num=4), rows_per_call=64)
    assert [(r.is_greedy, r.greedy_first) for r in got] == \
        [(True, None), (False, None), (None, 0), (False, None)]
    # [4] and [1] share their only canvas; the other two: at most 4 distinct draws each
    assert [r.canvases for r in got][:2] == [1, 1] and m.calls == 2


def _llada_suffix_greedy(model, prefix, target) -> tuple[bool, int]:
    """LLaDA's ``suffix_greedy_prediction`` (eval_llada.py) as written there, with the mask
    token's logit excluded (pvf-dlm's default): (is_greedy, model calls until decided)."""
    mask = int(model.mask_id)
    seq = torch.tensor([*prefix, *[mask] * len(target)])
    P, calls, ok = len(prefix), 0, True
    for _ in range(len(target)):
        masked = (seq == mask).nonzero().squeeze(1)
        logits = model.logits(seq[None], torch.arange(P, len(seq)), attention_mask=None,
                              cache=None)[0].float()
        calls += 1
        logits[:, mask] = float("-inf")
        p = torch.softmax(logits[masked - P], dim=-1)
        x0 = p.argmax(-1)
        best = int(p.gather(1, x0[:, None]).squeeze(1).argmax())
        seq[masked[best]] = x0[best]
        if int(x0[best]) != target[int(masked[best]) - P]:
            ok = False
            break
    return ok, calls


def test_adapter_reads_is_greedy_only_where_lm_eval_does():
    """A document with one request (``output_type: loglikelihood``, lambada's ``acc``) gets
    LLaDA's is_greedy; the choices of a ``multiple_choice`` document get False and no call:
    their model calls are the draws' only (one per continuation: 8 draws fit one call)."""
    from lm_eval.api.instance import Instance

    lm = _fixture_lm("tiny-llada", mc_num=8, batch_invariant=True)
    items = ARITH[:6]
    # the solution's last two lines after the rest (10 tokens): the model's greedy suffix on
    # half of them
    whole = [Instance(request_type="loglikelihood", doc={}, idx=0, metadata=("lambada_like", d, 1),
                      arguments=(_prompt(it) + " " + it["answer"].rsplit("\n", 2)[0] + "\n",
                                 "\n".join(it["answer"].split("\n")[-2:])))
             for d, it in enumerate(items)]
    choices = _requests(items)
    calls, real = [], lm.model.logits
    lm.model.logits = lambda tokens, *a, **k: (calls.append(len(tokens)), real(tokens, *a, **k))[1]
    got = lm.loglikelihood(choices, disable_tqdm=True)
    assert [g for _, g in got] == [False] * len(choices) and len(calls) == len(choices)
    calls.clear()
    got = lm.loglikelihood(whole, disable_tqdm=True)
    draws = len(calls)
    lm.model.logits = real
    want = []
    for r in whole:
        ctx, cont = lm.prompts.pair(*r.args)
        want.append(_llada_suffix_greedy(lm.model, ctx, cont))
    assert [g for _, g in got] == [ok for ok, _ in want]
    assert any(ok for ok, _ in want) and not all(ok for ok, _ in want)
    # every check's first step is a draw: the draws' calls, then each check's other steps
    totals = lm.get_model_info()["pvf"]["totals"]
    assert totals["lambada_like"]["greedy_checks"] == sum(n > 1 for _, n in want)
    assert totals["lambada_like"]["nfe_total"] == draws == len(whole) + sum(n - 1 for _, n in want)


def test_rolling_sums_the_windows():
    m = ConstModel(top=3, p=0.5)
    windows = [([0], [3, 3, 3]), ([3], [3, 3])]
    r = rolling_loglikelihood(m, windows, estimator=Estimator(mc_num=6), mc_batch=4)
    # every canvas of a constant model gives the same exact draw: the sum of the windows
    assert r.logprob == pytest.approx(5 * math.log(0.5), abs=1e-5)
    assert r.draws.shape == (6,)


def test_bad_arguments_are_one_line():
    m = ConstModel()
    with pytest.raises(ValueError, match=r"^mc_num=0 must be a positive integer$"):
        Estimator(mc_num=0)
    with pytest.raises(ValueError, match=r"^mc_batch=0 must be a positive integer$"):
        elbo(m, [1], [3], mc_batch=0)
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
            est = [loglikelihood(model, ctx, cont, estimator=Estimator(mc_num=mc), mc_batch=32,
                                 seed=s).logprob for s in range(5)]
            variances.append(torch.tensor(est, dtype=torch.float64).var().item())
        pooled[mc] = sum(variances) / len(variances)
    # 16x the draws: about 16x less variance; draws with few masks weigh T/l, so the spread has
    # a heavy tail and 5 seeds measure it roughly, hence the margin
    assert pooled[2] > pooled[8] > pooled[32] and pooled[32] < pooled[2] / 3, pooled


def test_adapter_is_deterministic_and_variance_shrinks_with_mc_num(tmp_path):
    pytest.importorskip("lm_eval")
    from test_models_oracle import make_temp_checkpoint

    from pvf_lmeval.lmeval.lm import PVFDiffusionLM

    ckpt = make_temp_checkpoint(tmp_path / "ckpt", "llada", seed=1)
    item = ARITH[0]
    spread = {}
    for mc in (4, 64):
        lm = PVFDiffusionLM(pretrained=str(ckpt), device="cpu", mc_num=mc, mc_batch=64)
        reqs = _requests([item])[:1]
        vals = []
        for seed in range(8):        # lm-eval's --seed: torch.manual_seed before the requests
            torch.manual_seed(seed)
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
    lm = PVFDiffusionLM(pretrained=str(ckpt), device="cpu", mc_num=4, mc_batch=4, seed=0)
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


def test_adapter_batches_continuations_by_batch_size():
    """HFLM scores ``batch_size`` requests per forward; here a batch's draws share model calls of
    at most ``batch_size * mc_batch`` distinct canvases, and the estimates and is_greedy equal
    those of ``batch_size=1`` (bit for bit: batch_invariant)."""
    reqs = _requests(ARITH[:3])
    calls, results = {}, {}
    for size in (1, 4):
        lm = _fixture_lm("tiny-llada", mc_num=8, mc_batch=4, batch_size=size, gen_length=32,
                         batch_invariant=True)
        rows, real = [], lm.model.logits
        lm.model.logits = lambda tokens, *a, _r=real, _rows=rows, **k: (_rows.append(len(tokens)),
                                                                        _r(tokens, *a, **k))[1]
        results[size] = lm.loglikelihood(reqs, disable_tqdm=True)
        calls[size] = rows
        assert max(rows) <= size * 4
    assert results[4] == results[1]
    assert max(calls[1]) <= 4 < max(calls[4]) and len(calls[4]) < len(calls[1])
