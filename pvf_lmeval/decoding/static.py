"""``static``: LLaDA low-confidence remasking (SPEC decoder 1).

Each step commits the most confident masked position(s) of the active block: one per step by
default (``steps = L``), or the LLaDA per-block schedule when ``steps < L``. Labels: ``base``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .param_spec import POSITIONS, Param, Rule
from .select import llada_count_tensor, static_select
from .stats import Stats
from .step import BASE, NONE, Branches, Step, single_row

STEPS = Param("steps", int, None, "denoising steps", none_means="gen_length", cap=POSITIONS,
              exclusive=True)
#: LLaDA's ``generate.py`` switches (its EVAL.md's pure-diffusion rows); the statistics pass
#: applies them (``stats.eos_switches``)
LOGITS_EOS_INF = Param("logits_eos_inf", bool, None, "LLaDA's logits_eos_inf: end-of-text "
                       "(the model's first end id) is never chosen", off=False,
                       none_means="false", exclusive=True)
CONFIDENCE_EOS_EOT_INF = Param("confidence_eos_eot_inf", bool, None, "LLaDA's "
                               "confidence_eos_eot_inf: end-of-text and end-of-turn chosen get "
                               "confidence 0 (committed last; temperature > 0: end-of-turn "
                               "only)", off=False, none_means="false", exclusive=True)


def _steps_fit(p) -> str | None:
    """``steps``: a whole number of steps per block, at most one position per step."""
    if p.steps is None or (p.steps >= 1 and not p.steps % p.num_blocks
                           and p.steps <= p.gen_length):
        return None
    return (f"steps={p.steps} must be a multiple of the number of blocks ({p.num_blocks}) "
            f"and at most gen_length={p.gen_length}")


class StaticDecoder(Step):
    name = "static"
    summary = ("LLaDA's low-confidence remasking: the most confident position(s) on a fixed "
               "schedule")
    baseline = True
    reads = (STEPS, LOGITS_EOS_INF, CONFIDENCE_EOS_EOT_INF)
    checks = (Rule(_steps_fit, "steps", "a multiple of the number of blocks, at most "
                                        "gen_length"),)

    def __init__(self, params):
        super().__init__(params)
        self.steps_per_block = None if params.steps is None else params.steps // params.num_blocks

    def branches(self, b, y: Tensor, st: Stats, state=None, draws=None) -> Branches:
        W = b.working_set(y)
        k = 1
        if self.steps_per_block is not None:
            left = W.sum(-1, keepdim=True)
            m = b.block_masks(y)          # masks of the active block when it became active
            k = torch.minimum(left, llada_count_tensor(m, self.steps_per_block, m - left))
        sel = static_select(st.conf, W, k)
        labels = torch.where(sel, BASE, NONE).to(torch.int8)
        return single_row(b, torch.where(sel, st.tok, y), labels)
