"""``decoder=eb``: the entropy bound's rule on hand-built tables (inclusive bound, ties by
position, the lowest always), its parameter, SGLang ``EBSampling``'s tokens and calls under
``rules=reference`` (tests/data/reference_decoders/eb.json, see its README), and batch 1 =
batch 8 with ``batch_invariant=true``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers.decoding_tables import EOS, PROMPT, TableModel, dist_logits, filled
from helpers.reference_tables import ReferenceTable

from pvf_lmeval.decoding import decode, decode_batch, make_params
from pvf_lmeval.decoding.eb import entropy_bound_select
from pvf_lmeval.decoding.stats import entropy_from_logits
from pvf_lmeval.models import load_model

pytestmark = pytest.mark.usefixtures("one_thread")

REFERENCE = json.loads((Path(__file__).parent / "data" / "reference_decoders" / "eb.json")
                       .read_text())

# ------------------------------------------------------------ the rule


def _select(ent, gamma, W=None):
    ent = torch.tensor([ent], dtype=torch.float32)
    W = torch.ones_like(ent, dtype=torch.bool) if W is None else torch.tensor([W])
    return entropy_bound_select(ent, W, gamma)[0].tolist()


def test_the_bound_is_inclusive_on_the_entropy_summed_before_a_position():
    # sorted: .25 (always), .5 (.25 before it), 1 (.75 before it), 2 (1.75 before it)
    ent = [1.0, 0.25, 2.0, 0.5]
    assert _select(ent, 0.75) == [True, True, False, True]
    assert _select(ent, 0.7499999) == [False, True, False, True]
    assert _select(ent, 0.25) == [False, True, False, True]
    assert _select(ent, 0.0) == [False, True, False, False]        # the lowest, always
    assert _select(ent, 1.75) == [True] * 4


def test_ties_go_by_position_and_only_the_working_set_counts():
    assert _select([0.5, 0.5, 0.5], 0.5) == [True, True, False]
    assert _select([0.0, 0.5, 0.1], 10.0, W=[False, True, True]) == [False, True, True]
    assert _select([0.3, 0.0], 0.0, W=[False, False]) == [False, False]


def test_the_rule_equals_its_definition_on_random_entropies():
    g = torch.Generator().manual_seed(0)
    for _ in range(200):
        ent = (torch.rand(7, generator=g) * 0.4).tolist()
        W = (torch.rand(7, generator=g) < 0.7).tolist()
        gamma = float(torch.rand(1, generator=g)) * 0.6
        order = sorted((e, j) for j, (e, w) in enumerate(zip(ent, W)) if w)
        want, before = [False] * 7, torch.tensor(0.0)
        for k, (e, j) in enumerate(order):
            want[j] = k == 0 or bool(before <= gamma)
            before = before + torch.tensor(e)       # float32, as the reference's cumsum
        assert _select(ent, gamma, W) == want


# ------------------------------------------------------------ through the loop


#: round 0's distributions: entropies ascending in position order 3, 0, 2, 1
ROUND0 = {0: (20, .9), 1: (21, .5), 2: (22, .7), 3: (23, .97)}


def _ent(d) -> float:
    """The entropy the loop computes for distribution ``d`` (float32)."""
    return float(entropy_from_logits(dist_logits(d)[None, None], 63)[0, 0])


def _table(g):
    f = filled(g)
    return ROUND0 if not f else {j: (24 + j, .99) for j in range(4)}


def test_the_loop_commits_exactly_the_bounded_prefix():
    e = [_ent(ROUND0[j]) for j in range(4)]
    assert e[3] < e[0] < e[2] < e[1]
    two = float(torch.tensor(e[3]) + torch.tensor(e[0]))       # float32 sum of the first two
    r = decode(TableModel(_table), PROMPT, "eb", gen_length=4, block_length=4, gamma=two,
               trace=True)
    assert r.steps[0]["committed"] == [[0, "base"], [2, "base"], [3, "base"]]
    assert r.tokens == [20, 25, 22, 23]
    below = float(torch.tensor(two).nextafter(torch.tensor(0.0)))
    r = decode(TableModel(_table), PROMPT, "eb", gen_length=4, block_length=4, gamma=below,
               trace=True)
    assert r.steps[0]["committed"] == [[0, "base"], [3, "base"]]


def test_reference_rules_count_the_extra_call_of_every_completed_block():
    table = lambda g: {j: (30 + j, .999) for j in range(8)}    # a block per round
    paper = decode(TableModel(table), PROMPT, "eb", gen_length=8, block_length=4)
    ref = decode(TableModel(table), PROMPT, "eb", gen_length=8, block_length=4,
                 rules="reference", early_stop=False)
    assert paper.tokens == ref.tokens == list(range(30, 38))
    assert (paper.nfe, ref.nfe) == (2, 4)         # 2 calls made, + 1 per completed block


def test_reference_rules_stop_after_the_block_that_holds_end_of_text():
    table = lambda g: {0: (30, .999), 1: (EOS, .999), 2: (32, .999), 3: (33, .999),
                       **{j: (30 + j, .999) for j in range(4, 8)}}
    ref = decode(TableModel(table), PROMPT, "eb", gen_length=8, block_length=4,
                 rules="reference")
    assert ref.tokens == [30, EOS, 32, 33] + [EOS] * 4
    assert ref.nfe == 1 + 1 and ref.gen_tokens == 1     # the initial call + block 0's extra
    paper = decode(TableModel(table), PROMPT, "eb", gen_length=8, block_length=4)
    assert paper.tokens == [30, EOS] + [EOS] * 6 and paper.nfe == 1


def test_gamma_is_checked_in_one_line():
    assert make_params("eb").gamma == 0.15
    assert make_params("eb", gamma=0).gamma == 0.0
    for bad, why in (("-0.1", "gamma=-0.1 must be >= 0"), ("inf", "gamma=inf")):
        with pytest.raises(ValueError, match=why) as e:
            make_params("eb", gamma=bad)
        assert "\n" not in str(e.value)


# ------------------------------------------------------------ SGLang's tokens and calls


def _model(run):
    name = run["model"]
    if name.startswith("table"):
        block = run["block_length"] if run["geometry"] == "aligned" else None
        return ReferenceTable(int(name[5:]), block)
    return load_model(name, device="cpu", dtype="float32")


@pytest.mark.parametrize("run", REFERENCE["runs"],
                         ids=[f"{r['model']}-{r['geometry']}" for r in REFERENCE["runs"]])
def test_reference_rules_give_sglangs_tokens_and_calls(run):
    cases = run["cases"]
    out = decode_batch(_model(run), [c["prompt"] for c in cases], "eb",
                       gen_length=run["gen_length"], block_length=run["block_length"],
                       gamma=run["gamma"], rules="reference", early_stop=False)
    got = [(r.tokens, r.nfe, r.edits, r.remasks) for r in out]
    assert got == [(c["tokens"], c["nfe"], c["edits"], c["remasks"]) for c in cases]


def test_reference_cases_cover_every_geometry():
    runs = {(r["model"], r["geometry"]) for r in REFERENCE["runs"]}
    assert {("tiny-llada", "canvas"), ("tiny-dream", "canvas"), ("table0", "aligned")} <= runs
    assert sum(len(r["cases"]) for r in REFERENCE["runs"]) == 68


# ------------------------------------------------------------ batch invariance


def test_batch_of_one_equals_batch_of_eight_on_every_statistic():
    m = load_model("tiny-llada", device="cpu", dtype="float32")
    prompts = [c["prompt"] for c in REFERENCE["runs"][0]["cases"][:8]]
    kw = dict(gen_length=32, block_length=16, batch_invariant=True)
    batch = decode_batch(m, prompts, "eb", **kw)
    for i, p in enumerate(prompts):
        one = decode(m, p, "eb", request_index=i, **kw)
        a, b = one.stats(), batch[i].stats()
        for k in ("wall_s", "tps"):
            a.pop(k), b.pop(k)
        assert (one.tokens, one.routes, a) == (batch[i].tokens, batch[i].routes, b), i
    assert len({tuple(r.tokens) for r in batch}) > 1
