"""The adapter's notices: the gen_length rounding notice only when ``max_gen_toks`` was rounded,
and every notice of preparing the requests printed before the progress bar starts."""

from __future__ import annotations

import pytest

pytest.importorskip("lm_eval")
pytest.importorskip("torch")

from lm_eval.api.instance import Instance  # noqa: E402

import pvf_lmeval.lmeval.lm as adapter  # noqa: E402
import pvf_lmeval.lmeval.sink as sink  # noqa: E402


@pytest.fixture(scope="module")
def lm():
    return adapter.PVFDiffusionLM(pretrained="tiny-llada", device="cpu", block_length=32)


@pytest.fixture
def events(lm, monkeypatch):
    """The notices the planner prints (it plans the requests), in order."""
    seen = []
    monkeypatch.setattr(lm.planner, "notice", lambda msg: seen.append(msg))
    return seen


def _request(doc_id: int, max_gen_toks: int) -> Instance:
    return Instance(request_type="generate_until", doc={}, idx=0, metadata=("arith", doc_id, 1),
                    arguments=(f"Question: what is {doc_id} plus 1?\nAnswer:",
                               {"until": ["Question:"], "max_gen_toks": max_gen_toks}))


def test_rounding_notice_only_when_rounded(lm, events):
    lm.planner._notices.clear()
    assert lm.planner.request_params({"max_gen_toks": 96})[0].gen_length == 96
    assert lm.planner.request_params({"max_gen_toks": 32})[0].gen_length == 32
    assert events == []
    assert lm.planner.request_params({"max_gen_toks": 80})[0].gen_length == 96
    assert lm.planner.request_params({"max_gen_toks": 80})[0].gen_length == 96
    assert events == ["pvf-dlm: gen_length=96 (the task's max_gen_toks=80 rounded up to whole "
                      "blocks of 32); pass gen_length to fix it"]


def test_notices_come_before_the_progress_bar(lm, events, monkeypatch):
    lm.planner._notices.clear()
    real = sink.tqdm          # the sink's bar: it answers the planned requests

    def bar(*args, **kwargs):
        events.append("bar")
        return real(*args, **{**kwargs, "disable": True})

    monkeypatch.setattr(sink, "tqdm", bar)
    lm.generate_until([_request(0, 20), _request(1, 20)])
    assert events == ["pvf-dlm: gen_length=32 (the task's max_gen_toks=20 rounded up to whole "
                      "blocks of 32); pass gen_length to fix it", "bar"]
