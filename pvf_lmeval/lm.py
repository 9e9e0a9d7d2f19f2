"""Kept so that ``pvf_lmeval.lm:PVFDiffusionLM`` stays importable; the adapter lives in
:mod:`pvf_lmeval.lmeval.lm`."""

from .lmeval.lm import PVFDiffusionLM  # noqa: F401
