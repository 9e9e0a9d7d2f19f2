"""The model side of the KV cache without a model: the call view of the ``cache`` argument
(``cache_segments``; one-request caches through ``benchlib.call_view``: segments, rows, spans,
the keys a full call hands over), its one-line errors, and ``benchlib.CacheDriftProbe``'s
figures on hand-made logits.

The exactness of cached calls against full ones is pinned on the fixtures in
``test_kv_cache.py`` and on a block-causal network in ``test_block_diffusion.py``.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from benchlib import CacheDriftProbe, KVCache, call_view

from pvf_lmeval.models.kv import cache_segments, cached_rows, is_cached_call, keep_pending

INF = float("inf")


def _cache(span=None, kv=None) -> KVCache:
    c = KVCache("dual", prompt_len=2, gen_length=8, block_length=4, mask_id=9, reveal_next=0,
                device="cpu")
    c.span, c.kv = span, kv
    return c


def _kv(tag: float, rows: int = 1, layers: int = 2) -> list:
    """Per layer (keys, values) [rows, 1, 3, 1] whose entries name the tag and the layer."""
    return [(torch.full((rows, 1, 3, 1), tag + layer), torch.full((rows, 1, 3, 1), -tag - layer))
            for layer in range(layers)]


def test_no_cache_is_a_full_call_without_a_view():
    assert cache_segments(None, 3) is None
    assert call_view([(None, 1), (None, 2)], 3) is None
    assert not is_cached_call(None)


def test_one_request_cache_covers_every_row():
    c = _cache()
    view = call_view(c, 3)
    assert view.rows == [3] and view.spans is None and view.span is None
    assert not is_cached_call(view)
    c.span = (4, 8)
    view = call_view(c, 3)
    assert view.rows == [3] and view.spans == [(4, 8)] and view.span == (4, 8)
    assert is_cached_call(view)


def test_segments_concatenate_their_caches_per_layer():
    a, b = _cache((2, 6), _kv(10.0)), _cache((6, 10), _kv(20.0))
    view = call_view([(a, 2), (b, 3)], 5)
    assert view.rows == [2, 3] and view.spans == [(2, 6), (6, 10)] and view.span == (2, 6)
    kv = view.layer_kv()
    assert len(kv) == 2
    for layer, (k, v) in enumerate(kv):
        assert k.shape == (2, 1, 3, 1)
        assert k[:, 0, 0, 0].tolist() == [10.0 + layer, 20.0 + layer]
        assert v[:, 0, 0, 0].tolist() == [-10.0 - layer, -20.0 - layer]
    # one segment: its own list, not a copy
    assert call_view([(a, 2)], 2).layer_kv() is a.kv


def test_a_full_call_hands_each_cache_its_own_rows():
    a, b = _cache(), _cache()
    view = call_view([(a, 2), (None, 1), (b, 2)], 5)
    assert view.spans is None
    rows = torch.arange(5.0)[:, None, None, None]
    keep_pending(view, [(rows, -rows), (rows + 100, -rows - 100)])
    assert [(k.flatten().tolist(), v.flatten().tolist()) for k, v in a.pending] == [
        ([0.0, 1.0], [-0.0, -1.0]), ([100.0, 101.0], [-100.0, -101.0])]
    assert [(k.flatten().tolist(), v.flatten().tolist()) for k, v in b.pending] == [
        ([3.0, 4.0], [-3.0, -4.0]), ([103.0, 104.0], [-103.0, -104.0])]


def test_a_view_object_is_used_as_it_is():
    view = SimpleNamespace(rows=[1, 2], spans=[(0, 4), (0, 4)], layer_kv=lambda: [])
    assert cache_segments(view, 3) is view and is_cached_call(view)
    with pytest.raises(ValueError) as err:
        cache_segments(view, 4)
    assert str(err.value) == "cache segments cover 3 rows, the call has 4"


@pytest.mark.parametrize("segments, n_rows, message", [
    (lambda: [(_cache((4, 8)), 1), (_cache(), 1)], 2,
     "a model call mixes cached and full rows; split it into two calls"),
    (lambda: [(_cache((4, 8)), 1), (None, 1)], 2,
     "a model call mixes cached and full rows; split it into two calls"),
    (lambda: [(None, 1), (None, 1)], 3, "cache segments cover 2 rows, the call has 3"),
    (lambda: [(_cache(), 2)], 3, "cache segments cover 2 rows, the call has 3"),
    (lambda: [(_cache(), 2), (None, 2)], 3, "cache segments cover 4 rows, the call has 3"),
])
def test_segments_that_do_not_describe_the_call_are_refused(segments, n_rows, message):
    with pytest.raises(ValueError) as err:
        call_view(segments(), n_rows)
    assert str(err.value) == message


@pytest.mark.parametrize("spans, message", [
    ([(3, 3)], "cache spans [(3, 3)] do not fit a canvas of 8"),
    ([(0, 9)], "cache spans [(0, 9)] do not fit a canvas of 8"),
    ([(0, 4), (5, 4)], "cache spans [(0, 4), (5, 4)] do not fit a canvas of 8"),
])
def test_spans_outside_the_canvas_are_refused_before_the_model_runs(spans, message):
    view = SimpleNamespace(rows=[1] * len(spans), spans=spans, layer_kv=lambda: [])
    tokens = torch.zeros(len(spans), 8, dtype=torch.long)
    with pytest.raises(ValueError) as err:
        cached_rows(None, tokens, torch.arange(4), None, view, shift=0)
    assert str(err.value) == message


class _Logits:
    """A model that answers each call with the next of two queues: cached calls and full calls."""

    def __init__(self, cached: list, full: list):
        self.cached, self.full = list(cached), list(full)
        self.calls, self.args = [], []
        self.mask_id = 9

    def logits(self, tokens, positions, *, attention_mask=None, cache=None):
        cached = is_cached_call(cache_segments(cache, tokens.shape[0]))
        self.calls.append("cached" if cached else "full")
        self.args.append((positions.tolist(), None if attention_mask is None
                          else attention_mask.tolist()))
        return (self.cached if cached else self.full).pop(0)


def test_drift_probe_measures_cached_calls_against_full_ones():
    # call 1, one row of 2 positions: |differences| 0.5, 0.25, 0.25 and 0 where both logits are
    # finite (4 entries), argmax agrees at both positions; call 2, two rows of 3 positions:
    # differences summing to 9 over 18 entries, argmax agrees at the first row's 3 positions
    out1 = torch.tensor([[[0.5, 1.25, 0.25], [3.0, 1.0, -INF]]])
    ref1 = torch.tensor([[[0.0, 1.0, 0.0], [3.0, -INF, 2.0]]])
    out2 = torch.tensor([[[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 3.0]],
                         [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]])
    ref2 = torch.tensor([[[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]],
                         [[0.0, 2.0, 0.0], [0.0, 0.0, 1.0], [1.0, 0.0, 0.0]]])
    full = torch.zeros(1, 2, 3)
    model = _Logits(cached=[out1, out2], full=[full, ref1, ref2])
    probe = CacheDriftProbe(model)
    assert probe.summary() == {"cached_calls": 0, "full_calls": 0, "max_abs": 0.0,
                               "mean_abs": 0.0, "argmax_agree": 1.0}
    assert probe.logits(torch.zeros(1, 8, dtype=torch.long), torch.arange(2)) is full
    mask = torch.tensor([[0, 1, 1, 1, 1, 1, 1, 1]])
    assert probe.logits(torch.zeros(1, 8, dtype=torch.long), torch.tensor([4, 5]),
                        attention_mask=mask, cache=call_view(_cache((4, 6)), 1)) is out1
    assert probe.logits(torch.zeros(2, 8, dtype=torch.long), torch.arange(3),
                        cache=call_view([(_cache((4, 7)), 1), (_cache((4, 7)), 1)], 2)) is out2
    assert model.calls == ["full", "cached", "full", "cached", "full"]
    # the uncached reference call sees the cached call's positions and attention mask
    assert model.args[1:3] == [([4, 5], mask.tolist())] * 2
    assert model.args[3:5] == [([0, 1, 2], None)] * 2
    assert probe.records == [
        {"max_abs": 0.5, "mean_abs": 0.25, "agree": 1.0, "positions": 2},
        {"max_abs": 2.0, "mean_abs": 0.5, "agree": 0.5, "positions": 6}]
    # position-weighted: (0.25 * 2 + 0.5 * 6) / 8, (1.0 * 2 + 0.5 * 6) / 8
    assert probe.summary() == {"cached_calls": 2, "full_calls": 1, "max_abs": 2.0,
                               "mean_abs": 0.4375, "argmax_agree": 0.625}
    # attributes other than logits are the model's
    assert probe.mask_id == 9


def test_drift_probe_mean_over_a_single_finite_entry():
    # one entry finite in both (difference 0.5); the argmax: 0 cached, 1 uncached
    out = torch.tensor([[[0.5, -INF, -INF]]])
    ref = torch.tensor([[[0.0, 1.0, -INF]]])
    probe = CacheDriftProbe(_Logits(cached=[out], full=[ref]))
    probe.logits(torch.zeros(1, 8, dtype=torch.long), torch.arange(1),
                 cache=call_view(_cache((4, 5)), 1))
    assert probe.records == [{"max_abs": 0.5, "mean_abs": 0.5, "agree": 0.0, "positions": 1}]
    # no entry finite in both: a mean of 0, not NaN
    probe = CacheDriftProbe(_Logits(cached=[torch.tensor([[[-INF, 1.0]]])],
                                    full=[torch.tensor([[[0.0, -INF]]])]))
    probe.logits(torch.zeros(1, 8, dtype=torch.long), torch.arange(1),
                 cache=call_view(_cache((4, 5)), 1))
    assert probe.records == [{"max_abs": 0.0, "mean_abs": 0.0, "agree": 0.0, "positions": 1}]
