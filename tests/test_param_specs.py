"""Decoders declare their parameters (``Step.reads``, ``Step.checks``; docs/design.md,
"Parameters"): the registry's lists, the parameters' fields, the report's run identity and the
``--model_args`` table derive from the step classes, and a new decoder is its step module plus
its line in ``decoding/registry.py``."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pvf_lmeval.cli.report import compare
from pvf_lmeval.lmeval import identity
from pvf_lmeval.decoding import DecodeParams
from pvf_lmeval.decoding.param_spec import Param
from pvf_lmeval.decoding.params import PARAM_NAMES, every_param
from pvf_lmeval.decoding.registry import (DECODER_NAMES, DECODERS, PLANNING_DECODERS,
                                          REFERENCE_DECODERS, REVEALING_DECODERS)
from pvf_lmeval.decoding.shared_params import THRESHOLD

REPO = Path(__file__).resolve().parents[1]


def test_registry_lists_derive_from_the_step_classes():
    assert DECODER_NAMES == ("static", "threshold", "eb", "freedave", "pvf", "explore", "subblock",
                             "hierarchy", "credit", "wino", "joint", "pvf-edit", "renoise")
    assert all(cls.name == name for name, cls in DECODERS.items())
    assert PLANNING_DECODERS == ("pvf", "explore", "pvf-edit")
    assert REVEALING_DECODERS == ("pvf", "explore", "pvf-edit")      # they read reveal_next
    assert REFERENCE_DECODERS == ("static", "threshold")


def test_the_fields_are_the_declared_parameters_each_once():
    assert PARAM_NAMES == (
        "decoder", "preset", "gen_length", "block_length", "temperature", "top_k", "top_p",
        "seed", "early_stop", "cache", "rules", "cfg_scale", "plan_vocab",       # the loop's
        "model_block",
        "steps", "logits_eos_inf", "confidence_eos_eot_inf", "threshold", "factor", "gamma",
        "draft_steps", "base_rule", "plan_lo", "plan_hi", "ar_lo", "width", "reveal_next", "routes",
        "plan_self_check", "pick", "band", "sub_block", "low_threshold", "credit_alpha",
        "boost_gamma", "decay", "back_threshold", "edit_threshold", "editing",
        "post_edit_steps", "penalty", "max_denoising_steps", "entropy_bound", "t_min",
        "t_max", "stability_threshold", "confidence_threshold")
    assert tuple(f.name for f in dataclasses.fields(DecodeParams)) == PARAM_NAMES


def test_a_parameter_declared_twice_is_refused():
    class Mine:
        reads = (THRESHOLD,)

    class Other:
        reads = (Param("threshold", float, 0.5, "another threshold", bounds="(0, 1]"),)

    assert "threshold" in every_param({"a": Mine, "b": Mine})
    with pytest.raises(TypeError, match=r"decoder b: parameter 'threshold' is declared twice; "
                                        r"declare it once \(decoding/shared_params.py\)"):
        every_param({"a": Mine, "b": Other})


def test_report_lists_derive_from_the_declarations():
    assert compare.DECODER_ORDER == list(DECODER_NAMES)
    assert identity.PLANNING_DECODERS == ("pvf", "explore", "pvf-edit")
    assert identity.LOOP_PARAMS == ("gen_length", "block_length", "temperature", "top_k",
                                    "top_p", "seed", "early_stop", "cache", "rules",
                                    "cfg_scale")
    assert identity.DECODER_PARAMS == {
        "static": ("steps", "logits_eos_inf", "confidence_eos_eot_inf"),
        "threshold": ("threshold", "factor"),
        "eb": ("gamma",),
        "freedave": ("draft_steps", "base_rule", "threshold", "factor"),
        "pvf": ("threshold", "plan_lo", "plan_hi", "ar_lo", "width", "reveal_next", "routes",
                "plan_self_check"),
        "explore": ("threshold", "pick", "band", "reveal_next"),
        "subblock": ("threshold", "sub_block"),
        "hierarchy": ("threshold", "low_threshold"),
        "credit": ("threshold", "credit_alpha", "boost_gamma", "decay"),
        "wino": ("threshold", "back_threshold"),
        "joint": ("threshold", "edit_threshold", "editing", "post_edit_steps", "penalty"),
        "pvf-edit": ("threshold", "plan_lo", "plan_hi", "ar_lo", "width", "reveal_next",
                     "routes", "plan_self_check", "edit_threshold", "editing", "post_edit_steps"),
        "renoise": ("max_denoising_steps", "entropy_bound", "t_min", "t_max",
                    "stability_threshold", "confidence_threshold"),
    }
    # freedave reads threshold and factor under base_rule=threshold only
    params = {"gen_length": 32, "threshold": 0.9, "factor": None, "draft_steps": 4,
              "width": 3, "base_rule": "static"}
    assert identity.reads("freedave", params) == {"gen_length", "draft_steps", "base_rule"}
    params["base_rule"] = "threshold"
    assert identity.reads("freedave", params) == {"gen_length", "draft_steps", "base_rule",
                                                  "threshold", "factor"}


# A decoder that is not one of ours: its step module and its registry line are all it adds.
NEW_STEP = '''"""``topk``: the k most confident masked positions of the active block per step."""

from __future__ import annotations

import torch

from .param_spec import ROWS, Param, Rule
from .select import static_select
from .step import Step, base_labels, single_row


def _k_fits(p):
    if p.k > p.block_length:
        return f"k={p.k} must not exceed block_length={p.block_length}"
    return None


class TopKDecoder(Step):
    name = "topk"
    summary = "the k most confident positions of the active block per step"
    reads = (Param("k", int, 2, "positions per step", bounds=">= 1", cap=ROWS),)
    checks = (Rule(_k_fits, "k", "at most block_length"),)

    def branches(self, b, y, st, state=None, draws=None):
        sel = static_select(st.conf, b.working_set(y), self.p.k)
        return single_row(b, torch.where(sel, st.tok, y),
                          base_labels(sel, torch.zeros_like(sel)))
'''

CHECK_NEW = r'''
import subprocess, sys
from pvf_lmeval.decoding import decode, make_params
from pvf_lmeval.decoding.params import PARAM_NAMES
from pvf_lmeval.lmeval.identity import decoding_identity
from pvf_lmeval.models import load_model

assert PARAM_NAMES[-1] == "k"
for kw, message in ((dict(k=0), "k=0 must be >= 1"), (dict(k="two"), "k='two' must be an integer"),
                    (dict(k=65), "k=65 must be at most 64 (rows one request sends"),
                    (dict(k=9, block_length=8, gen_length=16), "k=9 must not exceed block_length=8")):
    try:
        make_params("topk", **kw)
    except ValueError as e:
        assert message in str(e), str(e)
    else:
        raise AssertionError(kw)
model = load_model("tiny-llada", device="cpu")
r = decode(model, [5, 6, 7], "topk", k="4", gen_length=16, block_length=8, early_stop=False)
assert (r.nfe, r.committed, r.decoder) == (4, 16, "topk"), r     # a call before each 4
ident = decoding_identity("topk", {"k": 4, "threshold": 0.9, "gen_length": 16})
assert ident == {"k": 4, "gen_length": 16}, ident
args = subprocess.run([sys.executable, "-m", "pvf_lmeval.cli.dlm", "args"], capture_output=True,
                      text=True, check=True).stdout
row = next(line for line in args.splitlines() if line.startswith("k "))
assert row.split() == ["k", "2", "1", "to", "64,", "at", "most", "block_length", "topk:",
                       "positions", "per", "step"], row
decoders = subprocess.run([sys.executable, "-m", "pvf_lmeval.cli.dlm", "decoders"],
                          capture_output=True, text=True, check=True).stdout
assert decoders.splitlines()[-1].split()[0] == "topk" and decoders.rstrip().endswith("  k")
print("ok")
'''


def test_a_new_decoder_is_its_step_module_and_one_registry_line(tmp_path):
    """A copy of the package with a sixth decoder: one new file (its step module, with a
    parameter, a rule across parameters, a summary) and its entry in ``registry.py`` (the
    import and the name). It
    decodes, its parameter is coerced and checked with one-line errors, ``pvf-dlm args`` and
    ``decoders`` list it, and the run identity reads it."""
    pkg = tmp_path / "pvf_lmeval"
    shutil.copytree(REPO / "pvf_lmeval", pkg, ignore=shutil.ignore_patterns("__pycache__"))
    (pkg / "decoding" / "topk.py").write_text(NEW_STEP)
    registry = pkg / "decoding" / "registry.py"
    text = registry.read_text()
    assert text.count("\n)}") == 1                     # the end of the decoders' tuple
    text = text.replace("from .threshold import ThresholdDecoder\n",
                        "from .threshold import ThresholdDecoder\nfrom .topk import TopKDecoder\n")
    registry.write_text(text.replace("\n)}", "\n    TopKDecoder,\n)}"))
    proc = subprocess.run([sys.executable, "-c", CHECK_NEW], cwd=tmp_path, capture_output=True,
                          text=True, timeout=600, env={**_env(), "PYTHONPATH": str(tmp_path)})
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]


def _env() -> dict:
    import os

    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def test_a_free_text_parameter_is_coerced_to_its_text():
    """A decoder may declare a ``str`` parameter without choices or parser (none of today's
    does): its loose value is taken as text, and its ``off`` text turns it off."""
    from pvf_lmeval.decoding.param_spec import Param

    free = Param("label", str, None, "a free-text label")
    assert free.coerce(5) == "5" and free.coerce("planning") == "planning"
    assert Param("label", str, None, "a label", off="none").coerce("none") is None


@pytest.mark.parametrize("default, extra, want", [
    (None, {}, "none"), (None, {"none_means": "the model's"}, "the model's"),
    (True, {}, "true"), (False, {}, "false"), ((0.2, 0.6), {}, "0.2:0.6"), (32.0, {}, "32"),
    (0.9, {}, "0.9"), (7, {}, "7"), ("plan", {}, "plan"), (0.9, {"preset": True}, "0.9 (or the preset's)"),
])
def test_default_text_spells_the_default_as_users_type_it(default, extra, want):
    assert Param("p", type(default) if default is not None else float, default, "p",
                 **extra).default_text() == want


@pytest.mark.parametrize("kind, extra, want", [
    (str, {"choices": ("a", "b")}, "a, b"), (bool, {}, "true, false"),
    (int, {"bounds": ">= 1"}, "a positive integer"),
    (int, {"bounds": ">= 0"}, "an integer >= 0"), (int, {}, ""),
    (float, {"bounds": "[0, 1]"}, "[0, 1]"), (float, {"bounds": "> 0", "finite": True}, "a finite number > 0"),
    (float, {"bounds": ">= 0"}, "a number >= 0"), (float, {}, ""), (str, {}, ""),
])
def test_allowed_words_derive_from_type_and_bounds(kind, extra, want):
    assert Param("p", kind, None, "p", **extra).allowed_text() == want


def test_allowed_words_of_a_row_capped_count_and_of_rules():
    from pvf_lmeval.decoding.param_spec import ROWS, Cap, Rule

    assert Param("width", int, 4, "w", bounds=">= 1", cap=ROWS).allowed_text() == "1 to 64"
    assert Param("n", int, 4, "n", bounds=">= 1", cap=Cap(9)).allowed_text() == "a positive integer"
    assert Param("p", float, 0.5, "p", bounds="[0, 1]", allowed="a probability").allowed_text() == \
        "a probability"
    rules = (Rule(lambda v: None, "p", "at most threshold"), Rule(lambda v: None, "q", "other"),
             Rule(lambda v: None, "p", ""))
    assert Param("p", float, 0.5, "p", bounds="[0, 1]").allowed_text(rules) == "[0, 1], at most threshold"
