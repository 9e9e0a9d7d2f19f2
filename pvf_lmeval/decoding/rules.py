"""``rules=paper|reference``: the paper's decoding rules, or the published reference code's.

Researchers compare our numbers with papers, and papers' numbers come from their authors' code,
which differs from the paper's text in a few places. ``rules=reference`` switches each known
difference to the published code's behaviour; ``rules=paper`` (the default) follows the paper
(docs/decoding.md). Every difference is one named switch below, read by the step code where it applies;
``docs/reference-differences.md`` lists them with their measured effect.

``rules=`` also takes the paper's rules plus single switches, ``paper+<switch>+...``, so that
each difference can be measured (and used) on its own.

Switches (numbers as in the documentation's table):

1. ``factor_last_rank_commits_all`` (Fast-dLLM's factor rule, ``threshold`` and ``freedave``
   with ``base_rule=threshold``): when the first position that fails its factor threshold is the
   last one in the confidence ranking, every remaining masked position of the block is committed,
   the failing one included.
2. Capitalised tokens (a token whose text starts with an upper-case letter) are planning tokens
   besides the vocabulary. The step code never sees strings: ``decode``/``decode_batch`` add those
   ids, from the model's ``tokenizer``, to the planning vocabulary (``plan_vocab.capitalised_ids``).
3. ``force_after_routes`` (``pvf``, ``explore``): the most confident position is forced only when
   the step commits nothing else (after planning, AR or the exploration pick), not as part of the
   base set before them.
4. ``impact_includes_committed`` (``pvf``): the impact set is taken over every position of W_t
   masked *before* the base commit (so it includes the base set and the candidate's own
   position), and an empty impact set passes.
5. ``c_total_over_step_masks`` (``pvf``): C_total sums over every position of W_t masked before
   the base commit (base set and the candidate's own position included).
6. ``ar_after_failed_plan`` (``pvf``): when every planning branch fails, the step goes on to
   commit the impact set and to try AR fills from the base row, with a second model call (here:
   the next round, which skips planning).
7. ``fresh_call_after_failed_fill`` (``pvf``): when AR verifies no fill (or a failed planning step
   has nothing to fill), that call's results are discarded and the next step makes a fresh call
   on the committed state instead of reusing them.
8. ``self_check_max_prob`` (``pvf``): the reference always checks that a candidate's position
   keeps a top probability ``>= plan_lo`` under its own branch (the highest probability there,
   not the placed token's, which is what ``plan_self_check`` tests under the paper's rules).
9. ``count_unmade_calls`` (``pvf``, NFE only): the reference counts a model call when it enters
   its fallback, also when the fallback then finds nothing to fill and makes no call (after a
   failed plan whose base row leaves no AR position; or in-band positions without a planning
   token and no AR position). Outputs are unchanged; NFE counts that call too.

Switches of the newer decoders' references (SGLang, WINO, dInfer, Fast-dLLM v2, transformers'
DiffusionGemma). Those the loop applies (10, 11, 12, 15) apply only to the decoders that name
them in ``Step.loop_switches``; the others are read by the step code that needs them:

10. ``stop_after_block`` (loop): a request stops once a block it can no longer change (a
    *settled* block) holds end-of-text, and the positions after that block are filled; the
    tokens after end-of-text inside the block stay as decoded (SGLang, dInfer, Fast-dLLM v2 and
    DiffusionGemma finish a request after the block, or canvas, that holds it).
11. ``argmax_over_mask`` (loop, the statistics pass): the mask id competes in the argmax like
    any token (the references that do not suppress its logit); a position whose argmax is the
    mask id stays masked when "committed".
12. ``softmax64`` (loop, the statistics pass): probabilities (``conf``, ``pmax``, ``pcur``,
    ``pback``) from a float64 softmax of the logits (WINO).
13. ``strict_threshold`` (step): a confidence threshold commits ``p > threshold`` instead of
    ``p >= threshold``.
14. ``unmade_extra_calls`` (step, NFE only): the model calls the reference makes whose outputs
    are never used (SGLang's call on a completed block, dInfer's unrolled calls after a block
    completes, Fast-dLLM v2's prefill), counted without being made (``Branches.unmade``,
    ``Choice.unmade``).
15. ``torch_seed`` (loop): request i draws from a generator seeded with ``seed`` itself (on the
    CPU at batch 1, torch's default generator after ``torch.manual_seed(seed)``), not from the
    per-request mix of seed, request and repeat index (so batch 1 = batch n no longer holds).
"""

from __future__ import annotations

from dataclasses import dataclass

RULES = ("paper", "reference")


@dataclass(frozen=True)
class Rules:
    """The switches of one rule set (see the module docstring)."""

    name: str = "paper"
    factor_last_rank_commits_all: bool = False
    capitalised_plan_tokens: bool = False
    force_after_routes: bool = False
    impact_includes_committed: bool = False
    c_total_over_step_masks: bool = False
    ar_after_failed_plan: bool = False
    fresh_call_after_failed_fill: bool = False
    self_check_max_prob: bool = False
    count_unmade_calls: bool = False
    stop_after_block: bool = False
    argmax_over_mask: bool = False
    softmax64: bool = False
    strict_threshold: bool = False
    unmade_extra_calls: bool = False
    torch_seed: bool = False


SWITCHES = tuple(f for f in Rules.__dataclass_fields__ if f != "name")
#: the switches the loop applies (the others are read by step code): a decoder names those that
#: apply to it in ``Step.loop_switches``
LOOP_SWITCHES = ("stop_after_block", "argmax_over_mask", "softmax64", "torch_seed")

PAPER = Rules()
REFERENCE = Rules("reference", **{s: True for s in SWITCHES})


def rules_for(name: str) -> Rules:
    """The rule set called ``name``: ``paper``, ``reference``, or the paper's rules plus some
    switches, ``paper+<switch>+<switch>...`` (the leading ``paper+`` may be left out), e.g.
    ``rules=fresh_call_after_failed_fill`` for one difference on its own."""
    if name == "paper":
        return PAPER
    if name == "reference":
        return REFERENCE
    parts = [x for x in str(name).split("+") if x]
    if parts and parts[0] == "paper":
        parts = parts[1:]
    bad = [x for x in parts if x not in SWITCHES]
    if not parts or bad:
        raise ValueError(f"rules={name!r} must be one of {', '.join(RULES)}, or switches joined "
                         f"by '+' from: {', '.join(SWITCHES)}")
    return Rules(str(name), **{x: True for x in parts})
