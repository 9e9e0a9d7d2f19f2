"""Work a model call skips or fuses: the last layer runs only on the requested rows, and the
``compile`` option's scopes decode as eager does. (Host reads per round: test_host_reads.py.)"""

from __future__ import annotations

import pytest
import torch

from pvf_lmeval.decoding import decode_batch

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("name", ["tiny-llada", "tiny-dream"])
def test_last_layer_runs_only_on_the_requested_rows(name):
    """``hidden(..., out_index=...)`` equals the full hidden states taken at those rows (the last
    layer just skips the rest), for shared [P] and per-row [N, P] indices, with left padding."""
    from pvf_lmeval.models import load_model
    from pvf_lmeval.models.transformer import take_rows
    net = load_model(name).net
    g = torch.Generator().manual_seed(3)
    tok = torch.randint(4, 500, (3, 40), generator=g)
    am = torch.ones(3, 40, dtype=torch.long)
    am[1, :6] = 0
    shared = torch.arange(20, 36)
    per_row = torch.stack([shared, shared - 3, shared + 4])
    for idx in (shared, per_row):
        for mask in (None, am):
            full = net.hidden(tok, mask)
            part = net.hidden(tok, mask, out_index=idx)
            assert part.shape == (3, 16, net.cfg.d_model)
            torch.testing.assert_close(part, take_rows(full, idx), rtol=1e-5, atol=1e-5)
    # the last layer really computes fewer rows: its MLP sees [N, P, d], not [N, T, d]
    seen = []
    hook = net.blocks[-1].mlp.register_forward_hook(lambda m, i, o: seen.append(i[0].shape))
    net.hidden(tok, out_index=shared)
    hook.remove()
    assert seen == [torch.Size([3, 16, net.cfg.d_model])]


def test_compile_scope_parsing():
    from pvf_lmeval.lmeval.settings import compile_scope as _compile_scope
    assert [_compile_scope(v) for v in (False, "false", "0", True, "true", "model", "Blocks")] == \
        [None, None, None, "true", "true", "model", "blocks"]
    with pytest.raises(ValueError, match="compile='fast' must be one of false, true, blocks, model"):
        _compile_scope("fast")
    from pvf_lmeval.models import load_model
    with pytest.raises(ValueError, match="compile scope='layers' must be one of model, blocks, true"):
        load_model("tiny-llada").compile(scope="layers")


@pytest.mark.parametrize("scope", ["blocks", "model"])
def test_compiled_model_decodes_like_eager(scope):
    """``compile=true|blocks|model``: the compiled model call (full and cached paths, one and several
    rows) decodes the same tokens with the same calls as eager (tiny-llada, greedy)."""
    from pvf_lmeval.models import load_model
    eager = load_model("tiny-llada")
    compiled = load_model("tiny-llada").compile(scope=scope)
    prompts = [[5, 6, 7, 8, 9], [11, 12, 13]]
    kw = dict(gen_length=32, block_length=16, cache="dual", plan_vocab=range(0, 600, 2))
    from torch._dynamo.utils import counters
    counters.clear()
    for dec in ("threshold", "pvf"):
        want = decode_batch(eager, prompts, dec, **kw)
        got = decode_batch(compiled, prompts, dec, **kw)
        assert [(r.tokens, r.nfe, r.branch_rows) for r in got] == \
            [(r.tokens, r.nfe, r.branch_rows) for r in want]
    # the compiled functions really ran (dynamo captured graphs), on the scope asked for
    assert counters["stats"]["unique_graphs"] > 0
    owner = compiled.net.blocks[0] if scope == "blocks" else compiled.net
    assert {"forward", "forward_cached"} <= set(vars(owner)) if scope == "blocks" else \
        {"hidden", "hidden_cached"} <= set(vars(owner))
