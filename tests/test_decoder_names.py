"""The torch-free decoder names (``pvf_lmeval.decoder_names``) agree with the step classes the
decoders are (``decoding/registry.py``), and the report reads them without importing torch."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

from pvf_lmeval import decoder_names as names
from pvf_lmeval.decoding import DecodeParams
from pvf_lmeval.decoding.registry import DECODERS, PLANNING_DECODERS
from pvf_lmeval.cli.report import compare, identity


def test_registry_and_names_agree():
    assert tuple(DECODERS) == names.DECODER_NAMES
    assert all(cls.name == name for name, cls in DECODERS.items())
    assert PLANNING_DECODERS == names.PLANNING_DECODERS
    assert tuple(n for n, cls in DECODERS.items() if cls.uses_vocab) == names.PLANNING_DECODERS
    assert tuple(n for n, cls in DECODERS.items() if cls.reveals) == names.REVEALING_DECODERS
    assert set(names.REFERENCE_DECODERS) <= set(names.DECODER_NAMES)


def test_report_lists_derive_from_the_names():
    assert compare.DECODER_ORDER == list(names.DECODER_NAMES)
    assert identity.PLANNING_DECODERS == names.PLANNING_DECODERS
    # the parameters each decoder reads: one entry per decoder, each a real decoding parameter
    assert tuple(identity.DECODER_PARAMS) == names.DECODER_NAMES
    fields = {f.name for f in dataclasses.fields(DecodeParams)}
    assert {p for ps in identity.DECODER_PARAMS.values() for p in ps} <= fields
    assert set(identity.LOOP_PARAMS) <= fields


def test_report_does_not_import_torch():
    code = ("import sys\n"
            "import pvf_lmeval.cli.report, pvf_lmeval.cli.report.cli, pvf_lmeval.decoder_names\n"
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')"
            " or m.startswith('pvf_lmeval.decoding')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]", out.stdout
