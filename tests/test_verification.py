"""One verification function (``decoding.verify``): the PVF planning route (which feeds the
online vocabulary) and the calibration measure the same A and VIG on the same state; batched
verification of several requests equals verifying each alone."""

from __future__ import annotations

import pytest
import torch

from helpers.decoding_tables import PROMPT, TableModel, band_pair_table
from pvf_lmeval.planning.calibrate import CalibConfig, calibrate_prompt
from pvf_lmeval.decoding import decode
from pvf_lmeval.decoding.stats import Stats
from pvf_lmeval.planning.online import OnlineVocab
from pvf_lmeval.decoding.verify import verify_plans

# The two band candidates of decoding_tables: branch 30 passes (A = 1), branch 31 fails (A = 0).
table = band_pair_table


def test_pvf_and_calibration_measure_the_same_a_and_vig():
    cal = calibrate_prompt(TableModel(table), PROMPT, CalibConfig(gen_length=4, block_length=4))
    online = OnlineVocab(64, explore=0)                 # learning: records A and VIG
    online.seed([{"id": t, "n": 100, "m": 100, "r": 1.0, "vig": 0.5} for t in (30, 31)])
    r = decode(TableModel(table), PROMPT, "pvf", gen_length=4, block_length=4, plan_lo=0.15,
               plan_hi=0.25, width=2, trace=True, online=online)
    assert r.steps[0]["route"] == "plan" and r.steps[0]["candidates"] == [1, 2]
    d = online.take_pending()
    from_pvf = {int(t): [1.0, float(nv), float(a), float(v)]
                for t, nv, a, v in zip(d["tok"], d["nonvac"], d["passed"], d["vig"])}
    assert set(from_pvf) == set(cal.stats) == {30, 31}
    for t in (30, 31):
        assert from_pvf[t] == pytest.approx(cal.stats[t], abs=1e-12), t
    assert cal.stats[30][2] == 1 and cal.stats[30][3] > 0 and cal.stats[31][2:] == [0, 0]


def _stats(tok, pmax, ent):
    tok = torch.tensor(tok)
    pmax = torch.tensor(pmax)
    return Stats(tok, pmax, pmax, torch.zeros_like(pmax), torch.tensor(ent))


def test_batched_verification_equals_one_request_at_a_time():
    # request 0: S_imp = {1, 2}; branch 0 (own 1) agrees at 2, branch 1 (own 3) differs at 1.
    # request 1: nothing confident: every branch vacuous.
    base = _stats([[5, 6, 7, 8], [5, 6, 7, 8]], [[1., .95, .92, .3], [1., .5, .4, .3]],
                  [[0., .2, .3, .9], [0., .8, .7, .9]])
    plans = _stats([[[5, 9, 7, 8], [5, 4, 7, 8]], [[5, 6, 7, 8], [5, 6, 7, 8]]],
                   [[[1., .9, .97, .3], [1., .9, .9, .3]], [[1., .5, .4, .3]] * 2],
                   [[[0., .1, .1, .5], [0., .3, .1, .2]], [[0., .8, .7, .9]] * 2])
    own = torch.tensor([[[0, 1, 0, 0], [0, 0, 0, 1]]] * 2, dtype=torch.bool)
    masked = torch.tensor([[0, 1, 1, 1]] * 2, dtype=torch.bool)
    v = verify_plans(base, plans, own, masked, 0.9)
    assert v.nonvacuous.tolist() == [[True, True], [False, False]]
    assert v.passed.tolist() == [[True, False], [False, False]]
    # VIG of request 0 branch 0: mean over R = {2, 3} of H(base) - H(plan) = (.2 + .4) / 2
    assert v.vig[0, 0].item() == pytest.approx(0.3) and v.vig[0, 1].item() == 0
    for r in range(2):
        one = verify_plans(Stats(*(t[r:r + 1] for t in (base.tok, base.conf, base.pmax,
                                                         base.pcur, base.ent))),
                           Stats(*(t[r:r + 1] for t in (plans.tok, plans.conf, plans.pmax,
                                                        plans.pcur, plans.ent))),
                           own[r:r + 1], masked[r:r + 1], 0.9)
        assert torch.equal(one.passed[0], v.passed[r]) and torch.equal(one.vig[0], v.vig[r])
