"""``decoder=wino`` and ``decoder=joint``: their parameters (defaults, presets, bounds, the
one-line errors), what they refuse before any call, and the joint threshold's repetition
penalty and editing switch."""

from __future__ import annotations

import pytest
import torch
from helpers.reference_tables import ReferenceTable, table_prompts

from pvf_lmeval.decoding import decode_batch, make_params
from pvf_lmeval.decoding.hooks import CallView
from pvf_lmeval.decoding.joint import JointDecoder
from pvf_lmeval.models import load_model


def test_defaults_are_the_references():
    w = make_params("wino", gen_length=64, block_length=32)
    assert (w.threshold, w.back_threshold) == (0.6, None)        # None: 0.9
    j = make_params("joint", gen_length=64, block_length=32)
    assert (j.threshold, j.edit_threshold, j.editing, j.post_edit_steps, j.penalty) == \
        (0.5, None, None, None, None)                             # 0, on, 16, 0
    assert make_params("threshold").threshold == 0.9              # the others keep theirs


def test_presets_are_the_model_card_modes_and_explicit_values_win():
    q = make_params("joint", preset="llada21-quality")
    assert (q.threshold, q.edit_threshold, q.editing) == (0.7, 0.5, None)
    s = make_params("joint", preset="llada21-speed")
    assert (s.threshold, s.edit_threshold, s.editing) == (0.5, None, False)
    assert make_params("joint", preset="llada21-speed", threshold=0.8).threshold == 0.8
    assert make_params("wino", threshold=0.7).threshold == 0.7


@pytest.mark.parametrize("args,message", [
    (dict(decoder="threshold", preset="llada21-quality"),
     "preset=llada21-quality applies only to decoder=joint"),
    (dict(decoder="threshold", back_threshold=0.5),
     "back_threshold=0.5 applies only to decoder=wino"),
    (dict(decoder="wino", back_threshold=1.5), "back_threshold=1.5 must be in [0, 1]"),
    (dict(decoder="joint", edit_threshold=-0.1), "edit_threshold=-0.1 must be in [0, 1]"),
    (dict(decoder="joint", post_edit_steps=-1), "post_edit_steps=-1 must be >= 0"),
    (dict(decoder="joint", penalty=float("inf")), "penalty=inf must be a finite number"),
    (dict(decoder="pvf", editing=False), "editing=False applies only to decoder=joint, pvf-edit"),
    (dict(decoder="wino", cache="prefix"), "cache=prefix: decoder=wino allows cache=none"),
    (dict(decoder="joint", cache="dual"), "cache=dual: decoder=joint allows cache=none"),
    (dict(decoder="wino", cfg_scale=0.5),
     "cfg_scale=0.5: wino verifies through a shadow block that the guided call does not compute; "
     "leave cfg_scale unset with decoder=wino"),
])
def test_bad_arguments_fail_in_one_line(args, message):
    decoder = args.pop("decoder")
    with pytest.raises(ValueError) as err:
        make_params(decoder, gen_length=64, block_length=32, **args)
    assert str(err.value) == message


def test_wino_refuses_a_logit_shifted_model_before_any_call():
    dream = load_model("tiny-dream")
    calls = []
    real = dream.logits
    dream.logits = lambda *a, **k: calls.append(1) or real(*a, **k)
    with pytest.raises(ValueError) as err:
        decode_batch(dream, [[5, 6, 7]], "wino", gen_length=32, block_length=32)
    assert str(err.value).startswith("decoder=wino: dream shifts its logits")
    assert "\n" not in str(err.value) and calls == []


def test_the_speed_preset_never_edits_and_the_default_does():
    prompts = table_prompts()
    kw = dict(gen_length=32, block_length=16, early_stop=False)
    speed = decode_batch(ReferenceTable(0), prompts, "joint", preset="llada21-speed", **kw)
    full = decode_batch(ReferenceTable(0), prompts, "joint", **kw)
    assert [r.edits for r in speed] == [0] * 8
    assert all(r.edits > 0 for r in full)
    # no editing: a block costs its mask rounds and one call that finds nothing to do; the
    # table model's first blocks fill in a few rounds
    assert all(r.nfe < f.nfe for r, f in zip(speed, full))


def test_the_penalty_lowers_the_previous_position_s_token_inside_a_block():
    step = JointDecoder(make_params("joint", gen_length=8, block_length=4, penalty=2.5))

    class B:
        B = 4

    logits = torch.zeros(1, 6, 5)
    view = CallView(logits=logits, tokens=torch.tensor([[1, 2, 2, 4, 0, 3]]),
                    gpos=torch.tensor([[0, 1, 2, 3, 4, 5]]),
                    inside=torch.tensor([[True] * 5 + [False]]), open=None, block=None,
                    carry=None, carried=None, draws=(), args={})
    out = step.call_hook(B(), view).logits[0]
    want = torch.zeros(6, 5)
    # positions 1, 2, 3 of the first block lose the token before them (1, 2, 2); position 4
    # starts the second block; column 5 is outside the row's range
    want[1, 1] = want[2, 2] = want[3, 2] = -2.5
    assert torch.equal(out, want)
    assert JointDecoder(make_params("joint")).call_hook is None
