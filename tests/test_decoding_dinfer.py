"""hierarchy and credit (dInfer): the per-round rules on hand-built confidences (every bound as
the reference: strict for hierarchy, inclusive for credit's near-best bar), the unrolled
windows, and ``rules=reference`` against dInfer's own outputs (tests/data/reference_decoders)."""

import pytest
import torch

from pvf_lmeval.decoding.dinfer import credit_select, hierarchy_select, window_size

T, F = True, False


def _members(*m):
    return torch.tensor(m)


def _conf(*c):
    return torch.tensor(c, dtype=torch.float32)


def _on(x):
    return torch.nonzero(x).flatten().tolist()


def test_hierarchy_each_runs_best_above_low_threshold_ties_all():
    members = _members(T, T, T, F, T, T, F, T)
    conf = _conf(.5, .2, .5, .95, .25, .3, .99, .3)
    # run {0,1,2}: .5 twice (both); run {4,5}: best .3 is not > .3; run {7}: .3 neither;
    # the non-members' .95 and .99 never count; the block's best (.5, first index) is 0
    assert _on(hierarchy_select(conf, members, .9, .3)) == [0, 2]
    assert _on(hierarchy_select(conf, members, .9, .29)) == [0, 2, 5, 7]


def test_hierarchy_threshold_is_strict():
    members = _members(T, T, F, T)
    conf = _conf(.9, .95, .1, .2)
    assert _on(hierarchy_select(conf, members, .9, .3)) == [1]          # .9 is not > .9
    assert _on(hierarchy_select(conf, members, .89, .3)) == [0, 1]


def test_hierarchy_block_best_always_commits():
    members = _members(F, T, T, T)
    conf = _conf(.99, .1, .2, .2)                 # nothing above low_threshold: the best, first
    assert _on(hierarchy_select(conf, members, .9, .3)) == [2]
    assert _on(hierarchy_select(conf, _members(F, F, F, F), .9, .3)) == []


def test_hierarchy_batched_rows_are_independent():
    members = torch.stack([_members(T, T, F, T), _members(F, T, T, T)])
    conf = torch.stack([_conf(.5, .6, .9, .1), _conf(.9, .2, .35, .34)])
    assert hierarchy_select(conf, members, .9, .3).tolist() == [[F, T, F, F], [F, F, T, F]]


def test_credit_commits_at_threshold_inclusive():
    tau = float(torch.tensor(.9))
    members = _members(T, T, T, F)
    conf = _conf(.95, tau, .5, .99)
    assert _on(credit_select(conf, members, tau)) == [0, 1]             # .9 >= .9


def test_credit_near_ties_of_the_best_commit_below_threshold():
    best = torch.tensor(.5)
    bar = float(best - 1e-5)                       # the rule's own float32 arithmetic
    below = float(torch.nextafter(torch.tensor(bar), torch.tensor(0.)))
    members = _members(T, T, T, T)
    conf = _conf(.5, bar, below, .2)
    assert _on(credit_select(conf, members, .9)) == [0, 1]
    assert _on(credit_select(conf, _members(F, F, F, F), .9)) == []


@pytest.mark.parametrize("masks,calls", [(0, 1), (7, 1), (8, 1), (15, 1), (16, 2), (24, 3),
                                         (31, 3), (32, 4), (33, 4), (256, 4)])
def test_window_size(masks, calls):
    assert window_size(torch.tensor(masks)).item() == calls


# ---------------------------------------------------------------- against dInfer's code

def _check(model, prompts, cases, decoder, **kw):
    """(tokens equal, NFE equal, ours, theirs) per case, decoded with ``rules=reference``."""
    from pvf_lmeval.decoding import decode
    out = []
    for case in cases:
        r = decode(model, prompts[case["case"]], decoder, rules="reference", **kw)
        out.append((r.tokens == case["tokens"], r.nfe == case["nfe"], r.nfe, case["nfe"]))
    return out


def _all_equal(got):
    assert got == [(True, True, n, n) for _, _, _, n in got]


@pytest.mark.parametrize("decoder,name", [("hierarchy", "dinfer-hier"),
                                          ("credit", "dinfer-credit")])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_reference_tables(decoder, name, seed):
    from helpers.reference_tables import ReferenceTable, reference_cases, table_prompts
    _all_equal(_check(ReferenceTable(seed), table_prompts(8),
                      reference_cases(f"{name}.table{seed}"), decoder, gen_length=32,
                      block_length=16))


@pytest.mark.parametrize("decoder,name,block", [
    ("hierarchy", "dinfer-hier.tiny-llada", 32), ("hierarchy", "dinfer-hier.tiny-dream", 32),
    ("credit", "dinfer-credit.tiny-llada", 32), ("credit", "dinfer-credit.tiny-dream", 32),
    ("hierarchy", "dinfer-hierar-b8.tiny-llada", 8), ("credit", "dinfer-credit-b8.tiny-llada", 8)])
def test_reference_bundled(one_thread, decoder, name, block):
    from helpers.cache_models import arith_prompts
    from helpers.reference_tables import reference_cases
    from pvf_lmeval.models import load_model
    m = load_model(name.split(".")[1], device="cpu")
    prompts, _ = arith_prompts(m.tokenizer, 10)
    _all_equal(_check(m, prompts, reference_cases(name), decoder, gen_length=96,
                      block_length=block))


@pytest.mark.parametrize("decoder,rows,threshold", [
    # hierarchy: the mask at 0 is the run's and the block's best (a commit of the mask id
    # changes nothing); .55 at 1 passes threshold .5
    ("hierarchy", [[0., 0., 0., 1.61], [1.3, 0., 0., 0.], [0.] * 4, [0.] * 4], .5),
    # credit leaves it out of the best confidence: .5 at 1 commits (not the mask's .6)
    ("credit", [[0., 0., 0., 1.61], [1.2, 0., 0.2, 0.], [0., 1.18, 0.2, 0.], [0.] * 4], .9),
])
def test_reference_argmax_over_mask(decoder, rows, threshold):
    """A position whose argmax is the mask id (p .6 under the softmax over all four ids) stays
    masked under rules=reference."""
    from helpers.decoding_tables import LogitRows

    from pvf_lmeval.decoding import decode
    m = LogitRows(rows)
    r = decode(m, [1], decoder, gen_length=4, block_length=4, rules="reference", trace=True,
               early_stop=False, threshold=threshold)
    assert r.steps[0]["committed"] == [[1, "base"]]
    assert r.tokens == [0, 0, 0, 0] and r.nfe == 2
