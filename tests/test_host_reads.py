"""Host reads of the decode loop: exactly one per round, for every decoder, cache mode and
kind of model, batched or alone.

A host read is anything that brings a tensor's data to Python; on a GPU each one waits for
every queued kernel. :class:`HostReads` records them all while a decode runs: the dispatched
operations whose result needs the data on the host (``.item()``, ``int``/``float``/``bool`` of
a tensor and ``if tensor`` all end in ``_local_scalar_dense``; ``nonzero``, boolean-mask
indexing, ``repeat_interleave`` without ``output_size`` need the device to size their output)
and ``Tensor.tolist``/``numpy``, which dispatch no operation. Reads inside the model call count
too (the KV cache's cached calls run there).

A blocking upload is a host list copied to the device by ``torch.tensor``/``torch.as_tensor``
with a ``device``: from pageable memory, CUDA synchronises the stream before the copy, so it
waits like a read. The loop makes none: its index tensors go through
``pvf_lmeval.tensors.uploads.upload`` (page-locked, asynchronous). :class:`HostReads` records the
others, with the line that made them, in ``uploads``.

Rounds are told apart by ``Runner.call``, which the loop calls once per round after the initial
call. The expected reads, counted from the start of each ``Runner.call``: the initial call's
layout and round 0's (2), then one per round (its stop flags with the next round's layout),
and the last round's plus the finished requests' outputs (2).
"""

from __future__ import annotations

import sys

import pytest
import torch
from helpers.cache_models import arith_prompts
from torch.utils._python_dispatch import TorchDispatchMode

import pvf_lmeval.decoding.runner as runner_mod
import pvf_lmeval.tensors.uploads as uploads
from pvf_lmeval.decoding import decode_batch
from pvf_lmeval.models.kv import cache_segments, is_cached_call
from pvf_lmeval.planning.online import OnlineVocab

aten = torch.ops.aten
SYNCING = {aten._local_scalar_dense.default, aten.nonzero.default, aten.masked_select.default,
           aten.equal.default, aten._unique.default, aten._unique2.default,
           aten.unique_dim.default, aten.unique_consecutive.default}
MASK_INDEXING = {aten.index.Tensor, aten.index_put.default, aten.index_put_.default,
                 aten._index_put_impl_.default}

pytestmark = pytest.mark.usefixtures("one_thread")


class HostReads(TorchDispatchMode):
    """``log``: the host reads made while active (operation names), with ``"|"`` where a
    ``Runner.call`` starts; ``uploads``: the blocking uploads, ``file:line`` of each (see the
    module docstring)."""

    def __init__(self):
        super().__init__()
        self.log: list[str] = []
        self.uploads: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in SYNCING:
            self.log.append(str(func))
        elif func is aten.repeat_interleave.Tensor and kwargs.get("output_size") is None:
            self.log.append(str(func))
        elif func in MASK_INDEXING and any(
                isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8)
                for i in args[1] if i is not None):
            self.log.append(f"{func} with a boolean mask")
        return func(*args, **kwargs)

    def per_call(self) -> list[int]:
        """Reads before the first ``Runner.call``, then from the start of each to the next."""
        out = [0]
        for x in self.log:
            if x == "|":
                out.append(0)
            else:
                out[-1] += 1
        return out


class CallKinds:
    """The model, counting its full and cached calls."""

    def __init__(self, model):
        self.model, self.full, self.cached = model, 0, 0

    def __getattr__(self, name):
        return getattr(self.model, name)

    def logits(self, tokens, positions, *, attention_mask=None, cache=None):
        if is_cached_call(cache_segments(cache, tokens.shape[0])):
            self.cached += 1
        else:
            self.full += 1
        return self.model.logits(tokens, positions, attention_mask=attention_mask, cache=cache)


@pytest.fixture
def counted(monkeypatch):
    reads = HostReads()
    call = runner_mod.Runner.call

    def marked(b, *a, **k):
        reads.log.append("|")
        return call(b, *a, **k)
    monkeypatch.setattr(runner_mod.Runner, "call", marked)
    for name in ("tolist", "numpy"):
        def read(t, *a, _orig=getattr(torch.Tensor, name), _name=name, **k):
            reads.log.append(_name)
            return _orig(t, *a, **k)
        monkeypatch.setattr(torch.Tensor, name, read)
    for name in ("tensor", "as_tensor"):
        def build(data, *a, _orig=getattr(torch, name), **k):
            caller = sys._getframe(1).f_code.co_filename
            if k.get("device") is not None and not isinstance(data, torch.Tensor) \
                    and caller != uploads.__file__:
                reads.uploads.append(f"{caller}:{sys._getframe(1).f_lineno}")
            return _orig(data, *a, **k)
        monkeypatch.setattr(torch, name, build)
    return reads


@pytest.fixture(scope="module")
def prompts(llada):
    ps, _ = arith_prompts(llada.tokenizer, 4)
    return [p[:len(p) - 2 * i] for i, p in enumerate(ps)]       # left padding in the batch


VOCAB = list(range(0, 691, 2))
PLAN = dict(reveal_next=3, plan_vocab=VOCAB, threshold=0.999, plan_lo=0.05, plan_hi=0.99,
            ar_lo=0.05)
DECODERS = [("threshold", {}), ("static", {"steps": 16}), ("freedave", {}),
            ("explore", {"reveal_next": 3, "plan_vocab": VOCAB, "temperature": 0.8,
                         "threshold": 0.999}),
            ("pvf", PLAN), ("pvf", {**PLAN, "rules": "reference"}), ("pvf online", {})]
CACHES = ["none", "prefix", "dual", "dual_base"]


def _decode(model, prompts, dec, kw, cache, online):
    if dec == "pvf online":
        dec, kw = "pvf", {k: v for k, v in PLAN.items() if k != "plan_vocab"}
    return decode_batch(model, prompts, dec, gen_length=32, cache=cache, seed=3, online=online,
                        **({} if model.block_size else {"block_length": 8}), **kw)


def _cases():
    """Every decoder and cache mode on a left-padded batch of 4 (bidirectional); the
    block-diffusion model with its exact cache, alone and batched."""
    ids = [d[0] + (" reference" if "rules" in d[1] else "") for d in DECODERS]
    out = [pytest.param(dec, kw, cache, None, 4, id=f"{i}-{cache}-bidirectional-4")
           for i, (dec, kw) in zip(ids, DECODERS) for cache in CACHES]
    out += [pytest.param(dec, kw, cache, 8, batch, id=f"{i}-{cache}-block-diffusion-{batch}")
            for i, (dec, kw) in zip(ids, DECODERS) for cache in ("dual",) for batch in (1, 4)]
    return out


@pytest.mark.parametrize("dec,kw,cache,blocks,batch", _cases())
def test_one_host_read_per_round(llada, prompts, counted, monkeypatch, dec, kw, cache, blocks,
                                 batch):
    monkeypatch.setattr(llada, "block_size", blocks)
    model = CallKinds(llada)
    online = OnlineVocab(691, explore=2) if dec == "pvf online" else None
    with counted:
        res = _decode(model, prompts[:batch], dec, kw, cache, online)
    rounds = counted.log.count("|") - 1
    assert counted.per_call() == [0, 2] + [1] * (rounds - 1) + [2], counted.log
    assert counted.uploads == []
    # a long schedule: four blocks, requests finishing in different rounds (static's fixed
    # schedule excepted), cached calls between refreshes
    assert rounds >= 4 and (batch == 1 or dec == "static" or len({r.nfe for r in res}) > 1)
    if cache != "none":
        assert model.cached > 0 and model.full > 1


def test_the_counter_sees_each_kind_of_read(counted):
    x = torch.arange(6)
    with counted:
        x.tolist()
        x.numpy()
        int(x[1])
        bool(x[2] > 1)
        if x.any():
            pass
        x.nonzero()
        x[x > 2]
        torch.repeat_interleave(x, x)
        # no reads: the output size is given, indices are not a mask
        torch.repeat_interleave(x, x, output_size=15)
        x[torch.tensor([1, 2])]
        torch.where(x > 2, x, 0)
        # one blocking upload; a tensor's own device change and ``upload`` are not
        torch.tensor([1, 2], device="cpu")
        torch.as_tensor(x, device="cpu")
        torch.tensor([3])
        uploads.upload([1, 2], "cpu")
    assert counted.per_call() == [8]
    assert [u.rsplit("/", 1)[-1].split(":")[0] for u in counted.uploads] == ["test_host_reads.py"]
