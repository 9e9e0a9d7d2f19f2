"""The per-round rules of the revocable decoders on hand-built probability tables: WINO's drafts
and re-masks (decoding/wino.py) and LLaDA2.1's joint threshold (decoding/joint.py), every bound
strict or inclusive as the reference code has it (Feng-Hong/WINO-DLLM LLaDA/decoding.py;
sglang 0.5.23 joint_threshold.py)."""

from __future__ import annotations

import torch

from pvf_lmeval.decoding.joint import joint_transfers
from pvf_lmeval.decoding.wino import draft_cap, wino_drafts, wino_remasks

F64 = torch.float64


def bools(s: str) -> torch.Tensor:
    return torch.tensor([c == "1" for c in s])


def where(mask: torch.Tensor) -> list[int]:
    return mask.nonzero().flatten().tolist()


# ------------------------------------------------------------------ WINO: drafts


def test_draft_cap_is_seventy_percent_of_the_masks_between_5_and_20():
    # int(m * 0.7): 3 -> 2 -> 5 (floor); 8 -> 5.6 -> 5; 10 -> 7; 20 -> 14; 29 -> 20.3 -> 20;
    # 40 -> 28 -> 20
    m = torch.tensor([3, 8, 10, 20, 29, 40])
    assert draft_cap(m).tolist() == [5, 5, 7, 14, 20, 20]


def test_drafts_are_the_masks_strictly_above_the_threshold():
    conf = torch.tensor([0.6, 0.61, 0.2, 0.95, 0.7, 0.0], dtype=F64)
    W = bools("111110")
    drafts, forced = wino_drafts(conf, W, 0.6)
    assert where(drafts) == [1, 3, 4]           # 0.6 itself does not pass; 5 is not a mask
    assert not forced.any()


def test_without_a_passing_mask_the_most_confident_one_is_forced():
    conf = torch.tensor([0.3, 0.5, 0.59, 0.9], dtype=F64)
    W = bools("1110")                           # 3 is outside the block's masks
    drafts, forced = wino_drafts(conf, W, 0.6)
    assert where(drafts) == [2] and where(forced) == [2]


def test_more_passing_masks_than_the_cap_keep_the_most_confident():
    # 10 masks -> cap 7; 9 pass (all but 8): the 7 most confident are 5, 2, 0, 6, 1, 7, 3
    conf = torch.tensor([0.9, 0.8, 0.95, 0.7, 0.65, 0.99, 0.85, 0.75, 0.1, 0.61], dtype=F64)
    W = torch.ones(10, dtype=torch.bool)
    drafts, forced = wino_drafts(conf, W, 0.6)
    assert where(drafts) == [0, 1, 2, 3, 5, 6, 7] and not forced.any()
    # 8 pass above 0.62 (> 7, the cap): the same 7
    drafts, _ = wino_drafts(conf, W, 0.62)
    assert where(drafts) == [0, 1, 2, 3, 5, 6, 7]


def test_exactly_the_cap_passing_keeps_every_one():
    conf = torch.tensor([0.9, 0.8, 0.95, 0.7, 0.65, 0.99, 0.85, 0.1, 0.1, 0.1], dtype=F64)
    drafts, _ = wino_drafts(conf, torch.ones(10, dtype=torch.bool), 0.6)
    assert where(drafts) == [0, 1, 2, 3, 4, 5, 6]


def test_drafts_are_per_request():
    conf = torch.tensor([[0.9, 0.1, 0.1], [0.1, 0.2, 0.3]], dtype=F64)
    drafts, forced = wino_drafts(conf, torch.ones(2, 3, dtype=torch.bool), 0.6)
    assert drafts.tolist() == [[True, False, False], [False, False, True]]
    assert forced.tolist() == [[False, False, False], [False, False, True]]


# ------------------------------------------------------------------ WINO: re-masks


def test_remasks_are_verified_tokens_strictly_below_the_back_threshold():
    pback = torch.tensor([0.9, 0.89, 0.1, 0.95, 0.0], dtype=F64)
    verifiable = bools("11110")                 # 4 holds a mask: nothing to verify
    rem = wino_remasks(pback, verifiable, 0.9, torch.tensor([2]), torch.tensor([30]))
    assert where(rem) == [1, 2]


def test_a_round_that_drafts_one_position_remasks_nothing():
    pback = torch.tensor([0.1, 0.2], dtype=F64)
    rem = wino_remasks(pback, bools("11"), 0.9, torch.tensor([1]), torch.tensor([30]))
    assert not rem.any()


def test_as_many_failures_as_last_round_drafted_keep_one_fewer_the_least_probable():
    pback = torch.tensor([0.5, 0.1, 0.3, 0.2, 0.95], dtype=F64)
    verifiable = bools("11111")
    # 4 fail, last round drafted 4 (>= is inclusive): the 3 least probable
    rem = wino_remasks(pback, verifiable, 0.9, torch.tensor([2]), torch.tensor([4]))
    assert where(rem) == [1, 2, 3]
    # last round drafted 5: 4 < 5, every failure
    rem = wino_remasks(pback, verifiable, 0.9, torch.tensor([2]), torch.tensor([5]))
    assert where(rem) == [0, 1, 2, 3]
    # last round drafted 1: keep 0
    rem = wino_remasks(pback, verifiable, 0.9, torch.tensor([3]), torch.tensor([1]))
    assert not rem.any()


# ------------------------------------------------------------------ joint threshold

M = 9      # mask id of the joint tables


def test_masks_strictly_above_the_threshold_take_the_argmax():
    y = torch.tensor([M, M, M, 4, M])
    tok = torch.tensor([1, 2, 3, 4, 5])
    conf = torch.tensor([0.5, 0.51, 0.9, 0.99, 0.2])
    block = bools("11111")
    m2t, t2t, forced = joint_transfers(tok, conf, y, block, bools("00000"), M, 0.5, 0.0)
    assert where(m2t) == [1, 2] and not forced.any()
    assert not t2t.any()                        # the token at 3 is its argmax already


def test_without_a_passing_mask_the_most_probable_mask_is_forced():
    y = torch.tensor([M, M, 7, M])
    conf = torch.tensor([0.1, 0.3, 0.95, 0.3])
    m2t, _, forced = joint_transfers(torch.tensor([1, 2, 7, 3]), conf, y, bools("1111"),
                                     bools("0000"), M, 0.5, 0.0)
    assert where(m2t) == [1] and where(forced) == [1]   # tie 0.3: the lower position


def test_tokens_whose_argmax_differs_are_edited_strictly_above_the_edit_threshold():
    y = torch.tensor([4, 5, 6, 7, M])
    tok = torch.tensor([1, 5, 2, 3, 8])
    conf = torch.tensor([0.5, 0.9, 0.51, 0.3, 0.1])
    m2t, t2t, _ = joint_transfers(tok, conf, y, bools("11111"), bools("00000"), M, 0.7, 0.5)
    assert where(t2t) == [2]                    # 0: 0.5 not above; 1: same token; 3: below
    assert where(m2t) == [4]                    # forced


def test_edit_threshold_zero_edits_every_disagreement_and_off_edits_none():
    y = torch.tensor([4, 5, 6])
    tok = torch.tensor([1, 5, 2])
    conf = torch.tensor([0.01, 0.9, 0.2])
    _, t2t, _ = joint_transfers(tok, conf, y, bools("111"), bools("000"), M, 0.5, 0.0)
    assert where(t2t) == [0, 2]
    _, t2t, _ = joint_transfers(tok, conf, y, bools("111"), bools("000"), M, 0.5, None)
    assert not t2t.any()


def test_only_the_held_block_and_never_its_fixed_tokens_change():
    y = torch.tensor([4, 5, M, 6, M, M])
    tok = torch.tensor([1, 2, 3, 7, 8, 9])
    conf = torch.tensor([0.9, 0.9, 0.9, 0.9, 0.9, 0.9])
    block = bools("011100")                     # positions 1..3; 4 and 5 belong to the next
    fixed = bools("010000")                     # 1 held a token when the block was entered
    m2t, t2t, _ = joint_transfers(tok, conf, y, block, fixed, M, 0.5, 0.0)
    assert where(m2t) == [2] and where(t2t) == [3]


def test_an_edit_may_write_the_mask_id():
    # argmax over the mask (rules=reference): the rewrite of a token to the mask id
    y = torch.tensor([4, M])
    tok = torch.tensor([M, 3])
    conf = torch.tensor([0.8, 0.9])
    m2t, t2t, _ = joint_transfers(tok, conf, y, bools("11"), bools("00"), M, 0.5, 0.0)
    assert where(t2t) == [0] and where(m2t) == [1]
