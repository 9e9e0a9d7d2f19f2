"""``decoder=pvf-edit`` (docs/decoding.md, "PVF with editing"): PVF's step on a held block whose
decided tokens stay editable. The block rule on hand-built tensors (edits strictly above
``edit_threshold``, never a fixed token or another block's, the editing rounds after the last
mask, release to the next block that has something to do); whole decodes on hand-built
probability tables (a planned token edited in the next round, the editing-round budget, the
next block from the same call, early stop only once the block is released); ``editing=false``
is ``pvf`` on the bundled models; a request alone is the same as in a batch of 8 with
``batch_invariant`` on a bidirectional and a block-causal family; the refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers.decoding_tables import EOS, filled, run
from helpers.moe_folders import make_llada2_folder
from helpers.qwen_folders import load_peaked

from pvf_lmeval.decoding import decode, decode_batch, make_params
from pvf_lmeval.decoding.pvf_edit import held_blocks
from pvf_lmeval.models import load_model
from pvf_lmeval.planning.vocab import resolve_vocab_for

M = 99          # mask id of the block tables (B = 4)
VOCAB = {30, 31, 32, 33}
ARITH = Path(__file__).resolve().parent.parent / "tasks" / "arith" / "data" / "test.jsonl"


def held(y, tok, conf, *, block=0, post=0, fixed=None, edit=0.5, post_steps=16):
    """held_blocks on one request (lists), B = 4: (block, post, edited positions)."""
    y = torch.tensor([y])
    fixed = torch.zeros_like(y, dtype=torch.bool) if fixed is None else torch.tensor([fixed])
    h, p, e = held_blocks(y, torch.tensor([tok]), torch.tensor([conf]), fixed,
                          torch.tensor([block]), torch.tensor([post]), M, 4, edit, post_steps)
    return int(h), int(p), e[0].nonzero().flatten().tolist()


# ------------------------------------------------------------------ the block rule

def test_a_decided_token_is_edited_strictly_above_the_edit_threshold():
    y = [10, 11, 12, 13, M, M, M, M]
    tok = [20, 11, 22, 23, 1, 1, 1, 1]
    conf = [.5, .9, .51, .3, .9, .9, .9, .9]
    # 0: .5 is not above .5; 1: its own argmax; 3: below: only 2; the block stays held
    assert held(y, tok, conf, edit=.5) == (0, 1, [2])
    # .51 is not above .51: nothing to edit, the full block is released to the next one
    assert held(y, tok, conf, edit=.51) == (1, 0, [])
    # edit_threshold 0: every disagreement, however improbable; editing off: none
    assert held(y, tok, [.01] * 8, edit=0.0) == (0, 1, [0, 2, 3])
    assert held(y, tok, conf, edit=None) == (1, 0, [])


def test_only_the_held_block_s_own_decided_tokens_are_edited():
    y = [7, 11, M, M, 14, 15, M, M]
    fixed = [True] + [False] * 7                # 0 held a token when the block was entered
    tok, conf = [1] * 8, [.9] * 8
    # the held block still has masks: its one decided token, never the fixed one or block 1's
    assert held(y, tok, conf, fixed=fixed) == (0, 0, [1])


def test_editing_rounds_after_the_last_mask_stop_at_post_edit_steps():
    y = [10, 11, 12, 13, M, M, M, M]
    tok, conf = [20, 11, 12, 13, 1, 1, 1, 1], [.9] * 8
    assert held(y, tok, conf, post=0, post_steps=2) == (0, 1, [0])
    assert held(y, tok, conf, post=1, post_steps=2) == (0, 2, [0])
    assert held(y, tok, conf, post=2, post_steps=2) == (1, 0, [])      # round 3 of 2: released
    assert held(y, tok, conf, post=0, post_steps=0) == (1, 0, [])


def test_release_goes_on_to_the_first_block_with_something_to_do():
    y = [10, 11, 12, 13, 14, 15, 16, 17, M, M, M, M]     # block 1 filled while revealed
    agree = [10, 11, 12, 13, 14, 15, 16, 17, 1, 1, 1, 1]
    conf = [.9] * 12
    assert held(y, agree, conf) == (2, 0, [])
    edit5 = list(agree)
    edit5[5] = 25
    assert held(y, edit5, conf) == (1, 1, [5])   # block 1 is held: its first editing round
    edit0 = list(agree)
    edit0[0] = 20
    assert held(y, edit0, conf, block=1) == (2, 0, [])    # a released block is not held again
    done = y[:8] + [18, 19, 20, 21]
    assert held(done, done, conf) == (3, 0, [])  # every block done: none held
    # per request, in one batch
    Y = torch.tensor([y, done])
    h, p, e = held_blocks(Y, torch.tensor([edit5, done]), torch.full((2, 12), .9),
                          torch.zeros(2, 12, dtype=torch.bool), torch.tensor([0, 2]),
                          torch.tensor([0, 1]), M, 4, 0.5, 16)
    assert h.tolist() == [1, 3] and p.tolist() == [1, 0] and e.nonzero().tolist() == [[0, 5]]


# ------------------------------------------------------------------ whole decodes on tables

def _planned_then_edited(edit_to):
    """Round 1 commits 10 at 0 (base) and plans 30 at 1 (verified: 2 stays 11 under it); the
    state that holds the plan predicts ``edit_to`` at 1 (p .8) and 11, 12 at 2, 3; once they
    are committed every position agrees."""
    def table(g):
        f = filled(g)
        if not f:
            return {0: (10, .95), 1: (30, .5)}
        if f == {0}:
            return {1: (30, .5), 2: (11, .95)}
        if f == {0, 1}:
            return {0: (10, .99), 1: (edit_to, .8), 2: (11, .95), 3: (12, .95)}
        return {i: (t, .99) for i, t in enumerate(g) if t is not None}
    return table


def test_a_planned_token_is_edited_by_the_state_that_holds_it():
    r, m = run("pvf-edit", _planned_then_edited(31), plan_vocab=VOCAB, gen_length=4,
               edit_threshold=0.5)
    assert r.tokens == [10, 31, 11, 12] and r.routes == ["base", "edit", "base", "base"]
    assert (r.edits, r.tokens_edit, r.tokens_plan, r.plan_tried, r.plan_passed) == (1, 1, 0, 1, 1)
    assert [s["committed"] for s in r.steps] == [[[0, "base"], [1, "plan"]],
                                                 [[2, "base"], [3, "base"]], []]
    assert [s["edited"] for s in r.steps] == [[], [1], []]
    # initial, the plan's two rows, the edited full block (read for edits), then released
    assert (r.nfe, r.branch_rows) == (3, 4) and [n for n, _ in m.calls] == [1, 2, 1]
    # at the edit threshold itself (strict) the plan stays; the full block is still read once
    r, _ = run("pvf-edit", _planned_then_edited(31), plan_vocab=VOCAB, gen_length=4,
               edit_threshold=0.8)
    assert r.tokens == [10, 30, 11, 12] and (r.edits, r.tokens_plan, r.nfe) == (0, 1, 3)


def test_editing_off_is_pvf_on_the_same_table():
    want, _ = run("pvf", _planned_then_edited(31), plan_vocab=VOCAB, gen_length=4)
    got, _ = run("pvf-edit", _planned_then_edited(31), plan_vocab=VOCAB, gen_length=4,
                 editing=False)
    assert want.tokens == got.tokens == [10, 30, 11, 12] and want.nfe == got.nfe == 2
    assert want.stats() | {"wall_s": 0, "tps": 0} == got.stats() | {"wall_s": 0, "tps": 0}
    assert want.routes == got.routes and got.edits == 0


def _swapping(first, second, *, forever=True):
    """Every position confident from the start (block of 4); the full block predicts ``second``
    at 0 while it holds ``first`` and (``forever``) ``first`` while it holds ``second``."""
    def table(g):
        f = filled(g)
        if not f:
            return {0: (first, .95), 1: (11, .95), 2: (12, .95), 3: (13, .95)}
        other = {first: second, second: first if forever else second}[g[0]]
        return {0: (other, .9), 1: (11, .99), 2: (12, .99), 3: (13, .99)}
    return table


@pytest.mark.parametrize("post_edit_steps, nfe, token", [(0, 2, 10), (1, 3, 20), (3, 5, 20),
                                                         (4, 6, 10)])
def test_a_block_is_edited_at_most_post_edit_steps_rounds_after_its_last_mask(
        post_edit_steps, nfe, token):
    r, _ = run("pvf-edit", _swapping(10, 20), plan_vocab=VOCAB, gen_length=4,
               post_edit_steps=post_edit_steps)
    assert (r.nfe, r.edits, r.tokens[0]) == (nfe, post_edit_steps, token)
    assert r.routes[0] == ("edit" if post_edit_steps else "base")


def test_the_first_round_that_changes_nothing_releases_the_block_into_the_next_one():
    r, m = run("pvf-edit", _swapping(10, 20, forever=False), plan_vocab=VOCAB, gen_length=4)
    assert (r.nfe, r.edits, r.tokens) == (3, 1, [20, 11, 12, 13])

    def two_blocks(g):                  # block 1 is confident once block 0 is full
        f = filled(g)
        if not f:
            return {i: (10 + i, .95) for i in range(4)}
        if f == {0, 1, 2, 3}:
            return {i: (10 + i, .99) for i in range(8)}
        return {i: (10 + i, .99) for i in range(8)}
    r, m = run("pvf-edit", two_blocks, plan_vocab=VOCAB, gen_length=8, block_length=4)
    # block 0's full state is called once and its call also decides block 1 (released in
    # the same round); block 1's full state is read once more for its edits
    assert r.tokens == list(range(10, 18)) and r.edits == 0
    assert [s["block"] for s in r.steps] == [0, 1, 2] and r.nfe == 3
    p, _ = run("pvf", two_blocks, plan_vocab=VOCAB, gen_length=8, block_length=4)
    assert p.tokens == r.tokens and p.nfe == 2       # pvf reads no finished state


def _edit_then_next_block(g):
    """Block 0 (10..13) is confident at once; its full state predicts 20 at 0 once (p .9), and
    block 1 (14..17) confidently."""
    f = filled(g)
    if not f:
        return {i: (10 + i, .95) for i in range(4)}
    first = 20 if g[0] == 10 else g[0]
    return {0: (first, .9), **{i: (10 + i, .95) for i in range(1, 8)}}


def test_an_editing_round_commits_in_the_next_block_only_when_it_is_revealed():
    r, _ = run("pvf-edit", _edit_then_next_block, plan_vocab=VOCAB, gen_length=8,
               block_length=4)
    assert [[p for p, _ in s["committed"]] for s in r.steps] == [[0, 1, 2, 3], [], [4, 5, 6, 7],
                                                                 []]
    assert [s["edited"] for s in r.steps] == [[], [0], [], []]
    assert r.nfe == 4 and r.tokens == [20] + list(range(11, 18))
    # reveal_next=1: a held block with no mask left has at most 1, so the next block joins W
    r, _ = run("pvf-edit", _edit_then_next_block, plan_vocab=VOCAB, gen_length=8,
               block_length=4, reveal_next=1)
    assert [[p for p, _ in s["committed"]] for s in r.steps] == [[0, 1, 2, 3], [4, 5, 6, 7], []]
    assert [s["edited"] for s in r.steps] == [[], [0], []]
    assert r.nfe == 3 and r.tokens == [20] + list(range(11, 18))


def test_end_of_text_stops_decoding_only_once_its_block_is_released():
    def table(g):
        f = filled(g)
        if not f:
            return {0: (EOS, .95)}
        return {0: (EOS, .99), 1: (11, .95), 2: (12, .95), 3: (13, .95)}
    p, _ = run("pvf", table, plan_vocab=VOCAB)
    assert p.nfe == 1 and p.tokens == [EOS] * 8 and p.committed == 1
    r, _ = run("pvf-edit", table, plan_vocab=VOCAB, block_length=4)
    # block 0 fills (EOS held, not settled), its full state is read, then the release stops it
    assert r.nfe == 3 and r.tokens == [EOS] * 8 and r.routes[:2] == ["base", None]
    assert [s.get("early_stop_at") for s in r.steps] == [None, None, 0]


# ------------------------------------------------------------------ the bundled models


def _arith_prompts(model, n=8):
    docs = [json.loads(line) for line in ARITH.read_text().splitlines()[:n]]
    return [model.tokenizer.encode(f"Question: {d['question']}\nAnswer:", add_special_tokens=False)
            for d in docs]


def _record(r):
    return (r.tokens, r.routes, r.stats() | {"wall_s": 0, "tps": 0}, r.plan_tried,
            r.plan_passed)


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("fixture", ["tiny-llada", "tiny-dream"])
def test_editing_off_is_pvf_on_the_bundled_models(fixture):
    m = load_model(fixture)
    prompts = _arith_prompts(m)
    vocab, _ = resolve_vocab_for(m, "auto", task_family="math-word")
    kw = dict(preset="arith", gen_length=64, block_length=32, plan_vocab=vocab)
    want = decode_batch(m, prompts, "pvf", **kw)
    got = decode_batch(m, prompts, "pvf-edit", editing=False, **kw)
    assert [_record(r) for r in got] == [_record(r) for r in want]
    assert sum(r.plan_tried for r in want) > 0 and sum(r.tokens_ar for r in want) > 0


@pytest.fixture(scope="module")
def llada2(tmp_path_factory):
    return load_peaked(make_llada2_folder(tmp_path_factory.mktemp("llada2") / "f", seed=3))


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("family", ["llada", "llada2"])
def test_a_request_alone_is_the_same_as_in_a_batch_of_8(family, request):
    if family == "llada":
        m = load_model("tiny-llada")
        prompts = _arith_prompts(m)
        vocab, _ = resolve_vocab_for(m, "auto", task_family="math-word")
        kw = dict(preset="arith", gen_length=32, block_length=16, edit_threshold=0.5,
                  post_edit_steps=2, plan_vocab=vocab)
    else:                               # block-causal, blocks of 32: a partial first block
        m = request.getfixturevalue("llada2")
        prompts = [[220, 17, 25, 4], [40, 41, 42, 43, 44, 45, 46], [30, 31], [50, 51, 52, 53],
                   [60, 61, 62], [70] * 9, [80, 81, 82, 83, 84, 85], list(range(90, 101))]
        kw = dict(threshold=0.3, plan_lo=0.05, plan_hi=0.3, reveal_next=4, edit_threshold=0.6,
                  post_edit_steps=1, plan_vocab=list(range(691)), gen_length=32)
    together = decode_batch(m, prompts, "pvf-edit", batch_invariant=True, **kw)
    for i, p in enumerate(prompts):
        alone = decode(m, p, "pvf-edit", request_index=i, batch_invariant=True, **kw)
        assert _record(alone) == _record(together[i]), i
    assert sum(r.edits > 0 for r in together) >= 6 and sum(r.plan_tried for r in together) > 0
    assert family == "llada" or sum(r.plan_passed > 0 for r in together) == 8
    assert len({tuple(r.tokens) for r in together}) > 1


# ------------------------------------------------------------------ parameters

def test_defaults_are_pvf_s_and_joint_s_editing():
    p = make_params("pvf-edit", preset="arith", gen_length=64, block_length=32)
    assert (p.threshold, p.plan_lo, p.plan_hi, p.ar_lo, p.width, p.reveal_next) == \
        (0.9, 0.2, 0.65, 0.1, 3, 5)
    assert (p.edit_threshold, p.editing, p.post_edit_steps) == (None, None, None)  # 0, on, 16


@pytest.mark.parametrize("args, message", [
    (dict(rules="reference"), "rules=reference: decoder=pvf-edit has no published code to "
                              "follow; it decodes with rules=paper"),
    (dict(rules="paper+impact_includes_committed"),
     "rules=paper+impact_includes_committed: decoder=pvf-edit has no published code to follow; "
     "it decodes with rules=paper"),
    (dict(cache="prefix"), "cache=prefix: decoder=pvf-edit allows cache=none"),
    (dict(cache="dual_base"), "cache=dual_base: decoder=pvf-edit allows cache=none"),
    (dict(penalty=1.0), "penalty=1.0 applies only to decoder=joint"),
    (dict(preset="llada21-quality"), "preset=llada21-quality applies only to decoder=joint"),
    (dict(edit_threshold=1.5), "edit_threshold=1.5 must be in [0, 1]"),
])
def test_bad_arguments_fail_in_one_line(args, message):
    with pytest.raises(ValueError) as err:
        make_params("pvf-edit", gen_length=64, block_length=32, **args)
    assert str(err.value) == message


@pytest.mark.parametrize("decoder", ["pvf-edit", "joint"])
@pytest.mark.parametrize("post_edit_steps, rounds", [(None, 16), (0, 0), (2, 2)])
def test_both_editing_decoders_edit_post_edit_steps_rounds_16_by_default(decoder, post_edit_steps,
                                                                         rounds):
    """A block whose prediction flips forever: one call fills it, then ``post_edit_steps``
    editing rounds (SGLang's JointThreshold default: 16) each rewrite a token, and one more read
    finds the limit and releases the block."""
    extra = {"plan_vocab": VOCAB} if decoder == "pvf-edit" else {}
    r, _ = run(decoder, _swapping(10, 20), gen_length=4, post_edit_steps=post_edit_steps, **extra)
    assert (r.nfe, r.edits) == (1 + rounds + 1, rounds)
    assert r.tokens[0] == (10 if rounds % 2 == 0 else 20)
