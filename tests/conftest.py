"""Fixtures shared by the test files that run the bundled tiny models.

``tests/`` is on ``sys.path`` (pytest's rootdir-relative imports), so the test files import their
helpers as ``from helpers.x import ...``; ``bench/`` is put there too, for the tests of the
benchmark scripts and of ``bench/benchlib.py``'s one-request cache."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from pvf_lmeval.models import load_model


@pytest.fixture(scope="module")
def one_thread():
    """Small CPU forwards: one torch thread is several times faster than two on a shared 2-core box."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def llada():
    return load_model("tiny-llada")
