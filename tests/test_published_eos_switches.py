"""LLaDA's end-of-text switches (``logits_eos_inf``, ``confidence_eos_eot_inf``) under
``decoder=static``: the tokens and the commit order of LLaDA's own ``generate.py`` on the same
fixed-logit models (``tests/data/published/llada_eos_switches.json``, written by running the
published code; see ``tests/data/published/README.md``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from pvf_lmeval.decoding import decode
from pvf_lmeval.decoding.stats import eos_switches, stats_from_logits

DATA = json.loads((Path(__file__).parent / "data" / "published" / "llada_eos_switches.json").read_text())
MASK, EOS, EOT, V, P = DATA["mask"], DATA["eos"], DATA["eot"], DATA["vocab"], DATA["prompt_len"]


class FixedLogits:
    """LLaDA's test model: every logit -10 except ``table`` {canvas position: {token: logit}},
    whatever the canvas holds (the published script's ``Fixed``)."""

    def __init__(self, table: dict):
        self.table = {int(i): {int(t): float(v) for t, v in row.items()} for i, row in table.items()}
        self.mask_id, self.eos_ids, self.canvases = MASK, (EOS, EOT), []

    def logits(self, tokens, positions, *, attention_mask=None, cache=None):
        self.canvases.append(tokens[0].clone())
        pos = positions.tolist() if positions.dim() == 1 else positions[0].tolist()
        out = torch.full((tokens.shape[0], len(pos), V), -10.0)
        for j, p in enumerate(pos):
            for t, v in self.table.get(p, {}).items():
                out[:, j, t] = v
        return out


#: case -> (table, gen_length, block_length, steps, switches)
CASES = {
    "A_off_T0": ("A", 4, 4, 4, {}),
    "A_conf_T0": ("A", 4, 4, 4, {"confidence_eos_eot_inf": True}),
    "B_conf_T0": ("B", 4, 4, 4, {"confidence_eos_eot_inf": True}),
    "B_eos_T0": ("B", 4, 4, 4, {"logits_eos_inf": True}),
    "B_both_T0": ("B", 4, 4, 4, {"logits_eos_inf": True, "confidence_eos_eot_inf": True}),
    "C_conf_T0_blocks": ("C", 8, 4, 4, {"confidence_eos_eot_inf": True}),
    "C_off_T0_blocks": ("C", 8, 4, 4, {}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_static_decoding_equals_lladas_generate(case):
    table, gen, block, steps, switches = CASES[case]
    m = FixedLogits(DATA["tables"][table])
    r = decode(m, [11] * P, "static", gen_length=gen, block_length=block, steps=steps,
               early_stop=False, trace=True, **switches)
    want = DATA["cases"][case]
    assert r.tokens == want["tokens"]
    assert [sorted(p for p, _ in s["committed"]) for s in r.steps] == want["commits"]


def test_switch_ids_follow_lladas_temperature_rule():
    """At temperature 0 LLaDA's ``logits_with_noise`` is ``logits``: both end ids lose their
    probability; above 0 only end-of-turn's (``generate.py`` l.91-98)."""
    from types import SimpleNamespace as P_

    both = P_(logits_eos_inf=True, confidence_eos_eot_inf=True, temperature=0.0)
    assert eos_switches(both, (EOS, EOT)) == ((EOS,), (EOS, EOT))
    assert eos_switches(P_(**{**vars(both), "temperature": 1.0}), (EOS, EOT)) == ((EOS,), (EOT,))
    assert eos_switches(P_(logits_eos_inf=None, confidence_eos_eot_inf=None, temperature=0.0),
                        (EOS, EOT)) == ((), ())


def test_unconfident_token_keeps_its_choice_with_confidence_zero():
    lg = torch.tensor([[[0.0, 3.0, 1.0, 2.0]]])
    tok, conf, pmax, _ = stats_from_logits(lg.clone(), torch.tensor([[0]]), mask_id=0,
                                           unconfident=(1,))
    assert tok.tolist() == [[1]] and conf.tolist() == [[0.0]]
    e1, e2 = torch.exp(torch.tensor(1.0)), torch.exp(torch.tensor(2.0))
    assert pmax.item() == pytest.approx((e2 / (e1 + e2)).item(), rel=1e-6)
    tok, conf, _, _ = stats_from_logits(lg.clone(), torch.tensor([[0]]), mask_id=0, suppress=(1,))
    assert tok.tolist() == [[3]]


def test_switches_apply_to_static_only():
    with pytest.raises(ValueError, match="logits_eos_inf"):
        decode(FixedLogits({}), [11] * P, "threshold", gen_length=4, block_length=4,
               logits_eos_inf=True)
