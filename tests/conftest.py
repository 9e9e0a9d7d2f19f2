"""Fixtures shared by the test files that run the bundled tiny models."""

from __future__ import annotations

import pytest
import torch

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
