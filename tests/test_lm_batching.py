"""How ``generate_until`` forms batches (``pvf_lmeval.lmeval.batching``): grouped by decoding
parameters, longest prompt first inside a group, results back in the evaluator's order, and
the same texts and statistics as decoding one request at a time."""

from __future__ import annotations

import zlib

import pytest

pytest.importorskip("lm_eval")
torch = pytest.importorskip("torch")

from lm_eval.api.instance import Instance  # noqa: E402

from pvf_lmeval.lmeval import lm as lm_module  # noqa: E402
from pvf_lmeval.lmeval.batching import batches, padding_share  # noqa: E402
from pvf_lmeval.lmeval.lm import PVFDiffusionLM  # noqa: E402

KWARGS = {"until": ["Question:"], "do_sample": False, "temperature": 0.0, "max_gen_toks": 32}
QUESTION = "Question: Tom has 15 books. He gets 7 books from Noah. How many books does Tom have{}?\nAnswer:"


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_batches_group_by_key_then_longest_first():
    keys = ["a", "b", "a", "b", "a", "b", "a"]
    lengths = [3, 7, 9, 1, 4, 8, 9]
    # group a (first seen): 2 and 6 (9, ties keep their order), 4 (4), 0 (3); group b: 5, 1, 3
    assert batches(keys, lengths, 2) == [[2, 6], [4, 0], [5, 1], [3]]
    assert batches(keys, lengths, 3) == [[2, 6, 4], [0], [5, 1, 3]]
    assert batches(keys, lengths, 1) == [[2], [6], [4], [0], [5], [1], [3]]
    assert batches([], [], 4) == []


def test_batches_bad_input():
    with pytest.raises(ValueError, match=r"batch_size=0 must be a positive integer"):
        batches(["a"], [1], 0)
    with pytest.raises(ValueError, match=r"keys \(2\) and lengths \(1\)"):
        batches(["a", "a"], [1], 2)


def test_padding_share():
    lengths = [10, 4, 8, 6]
    # [10, 4]: width 20, real 14; [8, 6]: width 16, real 14 -> 8 pad columns of 36
    assert padding_share(lengths, [[0, 1], [2, 3]]) == pytest.approx(8 / 36)
    assert padding_share(lengths, [[0, 2], [3, 1]]) == pytest.approx(4 / 32)
    assert padding_share(lengths, [[0], [1]]) == 0.0
    assert padding_share([0, 0], [[0, 1]]) == 0.0


def _requests():
    """Docs 0..6: doc k's prompt has ``extra[k]`` more words; odd docs ask threshold 0.5."""
    extra = [1, 3, 5, 0, 2, 4, 5]
    out = []
    for k, n in enumerate(extra):
        kw = dict(KWARGS, threshold=0.5) if k % 2 else dict(KWARGS)
        out.append(Instance(request_type="generate_until", doc={}, idx=0,
                            arguments=(QUESTION.format(" now" * n), kw),
                            metadata=("arith", k, 1)))
    return out


def _lm(batch_size: int) -> PVFDiffusionLM:
    return PVFDiffusionLM.create_from_arg_string(
        "pretrained=tiny-llada,decoder=threshold,block_length=32",
        {"batch_size": batch_size, "device": "cpu"})


def test_generate_until_batches_by_params_longest_first_results_in_order(monkeypatch):
    doc_of = {zlib.crc32(f"arith/{k}/0".encode()): k for k in range(7)}
    seen = []
    real = lm_module.decode_batch

    def recording(model, prompts, **kw):
        seen.append([doc_of[i] for i in kw["request_indices"]])
        return real(model, prompts, **kw)

    lm = _lm(2)
    monkeypatch.setattr(lm_module, "decode_batch", recording)
    got = lm.generate_until(_requests())
    # threshold 0.9 (docs 0, 2, 4, 6; 6 and 2 equally long, 2 first), then 0.5 (docs 1, 3, 5)
    assert seen == [[2, 6], [4, 0], [5, 1], [3]]

    monkeypatch.setattr(lm_module, "decode_batch", real)
    alone = _lm(1)
    want = alone.generate_until(_requests())
    assert [str(g) for g in got] == [str(w) for w in want]
    for g, w in zip(got, want):
        assert {k: v for k, v in g.meta.items() if k not in ("wall_s", "tps")} == \
               {k: v for k, v in w.meta.items() if k not in ("wall_s", "tps")}
    timing = {"wall_s", "tps"}
    totals = [{k: v for k, v in x.get_model_info()["pvf"]["totals"]["arith"].items()
               if k not in timing} for x in (lm, alone)]
    assert totals[0] == totals[1] and totals[0]["requests"] == 7
    # request 1 (threshold 0.5) decoded on its own lands at index 1
    one = alone.generate_until([_requests()[1]])[0]
    assert str(got[1]) == str(one) and got[1].meta["nfe"] == one.meta["nfe"]
