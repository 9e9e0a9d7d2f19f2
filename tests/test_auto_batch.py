"""``batch_size=auto``: the largest batch that fits, probed once per canvas size (a fake
out-of-memory above N rows), ``max_batch_size`` honoured, a stated default on the CPU."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from pvf_lmeval.lmeval.auto_batch import AutoBatch, batch_size_arg, largest_fitting  # noqa: E402
from pvf_lmeval.lmeval.model_args import ModelArgError  # noqa: E402


def _fits_up_to(n: int, calls: list):
    def fits(batch: int) -> bool:
        calls.append(batch)
        return batch <= n
    return fits


@pytest.mark.parametrize("n, limit, expected, tried", [
    (20, 64, 20, [64, 32, 16, 24, 20, 22, 21]),     # halve to 16, then bisect 16..32
    (64, 64, 64, [64]),
    (100, 64, 64, [64]),                            # max_batch_size caps it
    (1, 64, 1, [64, 32, 16, 8, 4, 2, 1]),
    (0, 8, 1, [8, 4, 2, 1]),                        # nothing fits: 1 (decoding then reports it)
    (5, 6, 5, [6, 3, 4, 5]),
])
def test_largest_fitting(n, limit, expected, tried):
    calls: list = []
    assert largest_fitting(_fits_up_to(n, calls), limit) == expected
    assert calls == tried


class FakeModel:
    """A model on a device that is not the CPU (``meta``: shapes only) whose forward runs out of
    memory above ``max_rows`` rows."""

    mask_id = 7

    def __init__(self, max_rows: int, device="meta"):
        self.max_rows, self.device, self.calls = max_rows, torch.device(device), []

    def logits(self, tokens, positions, *, attention_mask=None, cache=None):
        self.calls.append((tuple(tokens.shape), tuple(positions.shape)))
        assert bool((tokens == self.mask_id).all()) if tokens.device.type != "meta" else True
        if tokens.shape[0] > self.max_rows:
            raise torch.OutOfMemoryError("CUDA out of memory (fake)")
        return torch.empty(tokens.shape[0], positions.shape[0], 11, device=tokens.device)


def test_probe_picks_the_largest_batch_and_caches_it_per_canvas():
    model = FakeModel(max_rows=40)
    auto = AutoBatch(64)
    # pvf with width 3: 4 rows per request; 40 rows fit -> 10 requests
    assert auto.size(model, canvas=300, gen_length=256, rows_per_request=4) == 10
    probed = [shape for shape, _ in model.calls]
    # requests 64, 32, 16 fail, 8 fits; bisecting 8..16: 12 fails, 10 fits, 11 fails
    assert probed == [(256, 300), (128, 300), (64, 300), (32, 300), (48, 300), (40, 300),
                      (44, 300)]
    assert {pos for _, pos in model.calls} == {(256,)}
    assert auto.size(model, canvas=300, gen_length=256, rows_per_request=4) == 10
    assert len(model.calls) == 7                              # cached: no second probe
    assert auto.size(model, canvas=200, gen_length=128, rows_per_request=1) == 40
    assert auto.sizes == {(300, 4): 10, (200, 1): 40}


def test_max_batch_size_bounds_the_probe():
    model = FakeModel(max_rows=1000)
    assert AutoBatch(12).size(model, canvas=64, gen_length=32, rows_per_request=1) == 12
    assert [shape[0] for shape, _ in model.calls] == [12]


def test_on_the_cpu_the_stated_default_without_probing():
    model = FakeModel(max_rows=1, device="cpu")
    assert AutoBatch(64).size(model, canvas=64, gen_length=32, rows_per_request=4) == 8
    assert AutoBatch(5).size(model, canvas=64, gen_length=32, rows_per_request=4) == 5
    assert model.calls == []


def test_batch_size_args(caplog):
    """As HFLM: ``max_batch_size`` bounds ``auto`` and nothing else (lm-eval's CLI passes it with
    any ``--batch_size``); ``auto:N`` (HFLM's re-detection schedule) runs as ``auto``, saying so
    in one line."""
    size, auto = batch_size_arg("auto", None)
    assert size == "auto" and auto.limit == 64
    assert batch_size_arg("auto", 16)[1].limit == 16
    assert batch_size_arg(4, None) == (4, None)
    assert batch_size_arg("3", None) == (3, None)
    assert batch_size_arg(4, 8) == (4, None)
    with pytest.raises(ModelArgError, match=r"^max_batch_size=0 must be a positive integer$"):
        batch_size_arg("auto", 0)
    with pytest.raises(ModelArgError, match=r"^max_batch_size=0 must be a positive integer$"):
        batch_size_arg(4, 0)
    assert caplog.records == []
    size, auto = batch_size_arg("auto:4", 8)
    assert size == "auto" and auto.limit == 8
    assert [r.getMessage() for r in caplog.records] == [
        "pvf-dlm: batch_size=auto:4 runs as batch_size=auto (the batch is probed once per canvas "
        "size, which covers HFLM's re-detection schedule)"]
    with pytest.raises(ValueError, match=r"^batch_size='auto:x': auto:N needs a number N > 0"):
        batch_size_arg("auto:x", None)
    with pytest.raises(ModelArgError, match=r"^batch_size='x' must be a positive integer$"):
        batch_size_arg("x", None)


def test_the_adapter_decodes_in_batches_of_the_cpu_default(monkeypatch):
    pytest.importorskip("lm_eval")
    from lm_eval.api.instance import Instance

    from pvf_lmeval.lmeval.lm import PVFDiffusionLM

    def request(doc_id):
        return Instance(request_type="generate_until", doc={}, idx=0, metadata=("arith", doc_id, 1),
                        arguments=(f"Question: {doc_id} plus 2?\nAnswer:",
                                   {"until": ["Question:"], "max_gen_toks": 32}))

    requests = [request(i) for i in range(10)]
    fixed = PVFDiffusionLM(pretrained="tiny-llada", device="cpu", batch_size=1, gen_length=32)
    auto = PVFDiffusionLM(pretrained="tiny-llada", device="cpu", batch_size="auto",
                          max_batch_size=3, gen_length=32)
    want = fixed.generate_until(requests)
    import pvf_lmeval.lmeval.lm as adapter

    batches = []
    real = adapter.decode_batch
    monkeypatch.setattr(adapter, "decode_batch",
                        lambda model, prompts, **kw: (batches.append(len(prompts)),
                                                      real(model, prompts, **kw))[1])
    assert auto.generate_until(requests) == want
    assert batches == [3, 3, 3, 1]
    (key,) = auto.batch_sizes
    assert auto.batch_sizes[key] == 3 and key[1] == 1
    assert fixed.batch_sizes == {}
