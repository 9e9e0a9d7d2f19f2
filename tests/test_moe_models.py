"""LLaDA-MoE and LLaDA 2.x: loading from hub-shaped folders, routing, the expert layer, and the
block-causal attention of block diffusion on every path (full, out_index, cached)."""

from __future__ import annotations

import json
import math

import pytest
import torch
from helpers.edited_folders import DROP, edit_config, edited_copy
from helpers.moe_folders import lladamoe_config, make_llada2_folder, make_lladamoe_folder
from safetensors import safe_open

from pvf_lmeval.models import load_model
from pvf_lmeval.models.formats import UnsupportedCheckpoint, format_for
from pvf_lmeval.models.loader import load_native_state
from pvf_lmeval.models.moe import MoEConfig, RoutedExperts, route
from pvf_lmeval.models.transformer import MLP

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("moe")
    return {"lladamoe": make_lladamoe_folder(root / "LLaDA-MoE-7B-A1B-Instruct", seed=1),
            # as released: moe_layer_freq all ones (every layer routed), dense_intermediate_size
            # present but read by no layer
            "lladamoe_released": make_lladamoe_folder(root / "LLaDA-MoE-released", seed=3,
                                                      moe_layer_freq=[1, 1, 1]),
            "llada2": make_llada2_folder(root / "LLaDA2.0-mini", seed=2)}


@pytest.fixture(scope="module")
def llada2(folders):
    return load_model(str(folders["llada2"]), device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def llada2_dense(tmp_path_factory):
    """Every layer dense (first_k_dense_replace = all): products whose row count never depends
    on the routing, so independence from later blocks can be checked bit for bit. (With routed
    experts the rows an expert multiplies together change with the other tokens, and the last
    bits of a product may follow; a batch-invariant ``ops`` implementation removes that.)"""
    folder = make_llada2_folder(tmp_path_factory.mktemp("dense") / "f", seed=4,
                                first_k_dense_replace=3)
    return load_model(str(folder), device="cpu", dtype="float32")


def _checkpoint_tensors(folder):
    out = {}
    for shard in sorted(folder.glob("*.safetensors")):
        with safe_open(str(shard), framework="pt") as f:
            out.update({k: f.get_tensor(k).float() for k in f.keys()})
    return out


# --- loading ------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["lladamoe", "lladamoe_released", "llada2"])
def test_every_checkpoint_tensor_lands_in_its_native_slot(folders, name):
    folder = folders[name]
    config = json.loads((folder / "config.json").read_text())
    fmt = format_for(config)
    m = load_model(str(folder), device="cpu", dtype="float32")
    state = m.net.state_dict()
    tensors = _checkpoint_tensors(folder)
    filled = set()
    for ckpt_name, t in tensors.items():
        native, expert = fmt.slot(ckpt_name)
        got = state[native] if expert is None else state[native][expert]
        assert torch.equal(got, t), ckpt_name
        filled.add(native)
    assert filled == set(state)                  # nothing native left at its init value
    assert set(load_native_state(folder, fmt, config, torch.float32, "cpu")) == set(state)


def test_lladamoe_released_model_type_llada_is_read_as_lladamoe(folders):
    m = load_model(str(folders["lladamoe"]), device="cpu", dtype="float32")
    assert m.family == "llada-moe" and m.block_size is None
    assert isinstance(m.net.blocks[0].mlp, MLP)                   # moe_layer_freq [0, 1, 1]
    assert [type(b.mlp) for b in m.net.blocks[1:]] == [RoutedExperts, RoutedExperts]
    moe = m.net.blocks[1].mlp
    assert moe.gate_proj.shape == (8, 16, 32) and moe.down_proj.shape == (8, 32, 16)
    assert moe.shared.gate_proj.weight.shape == (24, 32)
    c = m.net.cfg
    assert (c.head_dim, c.rope_dim, c.qk_norm, c.n_kv_heads) == (8, 4, True, 2)
    assert (moe.cfg.score, moe.cfg.normalize, moe.cfg.bias_in_weight) == ("softmax", False, True)
    tok = m.tokenizer.get_vocab()
    assert m.mask_id == tok["<|mdm_mask|>"] and tok["<|endoftext|>"] in m.eos_ids


def test_llada2_reads_its_config(llada2):
    c = llada2.net.cfg
    assert llada2.family == "llada2" and llada2.block_size == 32
    assert (c.head_dim, c.rope_dim, c.fused_qkv, c.o_bias, c.qkv_bias) == (16, 8, True, False, False)
    assert llada2.net.blocks[0].attn.qkv_proj.weight.shape == ((4 + 2 * 2) * 16, 32)
    assert isinstance(llada2.net.blocks[0].mlp, MLP)             # first_k_dense_replace 1
    moe = llada2.net.blocks[1].mlp.cfg
    assert (moe.score, moe.n_groups, moe.topk_groups, moe.scaling, moe.normalize) == \
        ("sigmoid", 4, 2, 2.5, True)
    assert llada2.net.blocks[1].mlp.shared.gate_proj.weight.shape == (16, 32)


def test_lladamoe_mask_comes_from_the_tokenizer_when_config_has_none(tmp_path):
    """LLaDA-MoE's config.json has no mask_token_id; its tokenizer's mask token is ``<|mask|>``
    (156895 at full size). Here the tiny tokenizer's mask (id 690) is renamed to that token."""
    folder = make_lladamoe_folder(tmp_path / "LLaDA-MoE-7B-A1B-Base", seed=3)
    edit_config(folder, mask_token_id=DROP)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        path = folder / name
        path.write_text(path.read_text().replace("<|mdm_mask|>", "<|mask|>"))
    m = load_model(str(folder), device="cpu", dtype="float32")
    assert m.tokenizer.convert_tokens_to_ids("<|mask|>") == 690 == m.mask_id
    assert 690 not in m.eos_ids


def test_llada2_ids_fall_back_to_the_reference_generate_defaults():
    from pvf_lmeval.models.loader import _special_ids
    from pvf_lmeval.models.formats import LLADA2
    defaults = dict(LLADA2.generate_defaults)
    # neither config.json nor a tokenizer names them: the reference generate's mask and end ids
    assert _special_ids({}, None, defaults) == (156895, (156892,), 156892)
    # config.json wins over the defaults
    assert _special_ids({"mask_token_id": 7, "eos_token_id": 8}, None, defaults) == (7, (8,), 8)
    assert _special_ids({"mask_token_id": 7}, None, {}) == (7, (), None)


def test_lladamoe_as_released_routes_every_layer(folders):
    m = load_model(str(folders["lladamoe_released"]), device="cpu", dtype="float32")
    assert [type(b.mlp) for b in m.net.blocks] == [RoutedExperts] * 3
    assert m.net.cfg.ffn_hidden == 0 and not m.net.cfg.has_dense_layer
    assert m.net.blocks[0].mlp.shared.gate_proj.weight.shape == (24, 32)


@pytest.mark.parametrize("freq,routed", [
    ([1, 1, 1], (True, True, True)),                     # the released 7B-A1B's form
    ([0, 1, 1], (False, True, True)),
    ([True, False, True], (True, False, True)),          # the reference compares with == 0
    ([1.0, 0.0, 2], (True, False, True)),
    ([1, 1, 1, 0], (True, True, True)),                  # entries past the last layer: unread
])
def test_moe_layer_freq_is_read_as_the_reference_reads_it(freq, routed):
    cfg = lladamoe_config(64, {}, moe_layer_freq=freq)
    net = format_for(cfg).read_config(cfg)
    assert tuple(net.moe.routed(i) for i in range(3)) == routed
    assert net.ffn_hidden == (0 if all(routed) else 48)


@pytest.mark.parametrize("name,change,says", [
    ("lladamoe", {"moe_layer_freq": 1}, "moe_layer_freq=1; a LLaDA-MoE checkpoint needs a list of at least num_hidden_layers=3 numbers"),
    ("lladamoe", {"moe_layer_freq": [1, 1]}, "moe_layer_freq=[1, 1]; a LLaDA-MoE checkpoint needs a list of at least num_hidden_layers=3 numbers"),
    ("lladamoe", {"moe_layer_freq": [1, "dense", 1]}, "moe_layer_freq=[1, \"dense\", 1]; a LLaDA-MoE"),
    ("lladamoe", {"moe_layer_freq": [0, 1, 1], "dense_intermediate_size": None}, "dense_intermediate_size is null"),
    ("lladamoe", {"clip_qkv": 8.0}, "clip_qkv=8.0 is not supported"),
    ("lladamoe", {"partial_rotary_factor": None}, "partial_rotary_factor=null; a LLaDA-MoE checkpoint needs it in (0, 1]"),
    ("lladamoe", {"head_dim": 16}, "head_dim=16 differs from hidden_size/num_attention_heads=8"),
    ("llada2", {"num_key_value_heads": 0}, "num_key_value_heads=0; a llada2_moe checkpoint needs a positive divisor"),
    ("llada2", {"n_group": 3}, "n_group is 3; a llada2_moe checkpoint needs it as a divisor of num_experts=8"),
    ("llada2", {"norm_head": True}, "norm_head=true is not supported"),
    # the per-layer routed table is never built for a layer count no checkpoint has
    ("llada2", {"num_hidden_layers": 65537}, "num_hidden_layers=65537; a llada2_moe checkpoint has at most 65536"),
])
def test_unsupported_config_is_one_line(folders, tmp_path, name, change, says):
    folder = edited_copy(folders[name], tmp_path / name, **change)
    with pytest.raises(ValueError) as ei:
        load_model(str(folder), device="cpu", dtype="float32")
    assert says in str(ei.value) and "\n" not in str(ei.value)


def test_missing_expert_is_named(folders, tmp_path):
    import shutil

    from safetensors.torch import save_file
    folder = tmp_path / "f"
    shutil.copytree(folders["llada2"], folder)
    shard = folder / "model-00002-of-00002.safetensors"
    with safe_open(str(shard), framework="pt") as f:
        kept = {k: f.get_tensor(k) for k in f.keys() if not k.startswith("model.layers.2.mlp.experts.5.")}
    save_file(kept, str(shard), metadata={"format": "pt"})
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    index["weight_map"] = {k: v for k, v in index["weight_map"].items()
                           if not k.startswith("model.layers.2.mlp.experts.5.")}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(UnsupportedCheckpoint, match=r"lacks expert\(s\) \[5\]"):
        load_model(str(folder), device="cpu", dtype="float32")


# --- routing ------------------------------------------------------------------------------------

def _logit(p):
    return math.log(p / (1 - p))


def test_group_limited_sigmoid_routing_by_hand():
    # scores s (sigmoid of the logits); expert 4 gets a selection bias of 0.5:
    #   selection = [.9 .1 | .6 .5 | .7 .8 | .3 .4]   groups of 2, scored by their best two:
    #   1.0, 1.1, 1.5, 0.7 -> groups 2 and 1 stay; best two eligible: expert 5 (.8), expert 4 (.7)
    #   (expert 0, the best overall, is in a dropped group). Weights from the unbiased scores:
    #   .8 and .2, renormalised to .8 and .2 (sum 1), times 2.5 -> 2.0 and 0.5.
    s = [0.9, 0.1, 0.6, 0.5, 0.2, 0.8, 0.3, 0.4]
    logits = torch.tensor([[_logit(p) for p in s]])
    bias = torch.tensor([0, 0, 0, 0, 0.5, 0, 0, 0])
    cfg = MoEConfig(n_experts=8, top_k=2, expert_hidden=1, score="sigmoid", expert_bias=True,
                    normalize=True, scaling=2.5, n_groups=4, topk_groups=2)
    idx, w = route(logits, cfg, bias)
    assert idx.tolist() == [[5, 4]]
    assert torch.allclose(w, torch.tensor([[2.0, 0.5]]), atol=1e-6)
    # without the group limit the best overall expert wins
    idx, _ = route(logits, MoEConfig(n_experts=8, top_k=2, expert_hidden=1, score="sigmoid"), bias)
    assert idx.tolist() == [[0, 5]]


def test_softmax_routing_with_the_bias_in_the_weights_by_hand():
    # softmax(log[1,2,3,4]) = [.1 .2 .3 .4]; bias .35 on expert 0 -> [.45 .2 .3 .4]: experts 0
    # and 3 with weights .45 and .4 (LLaDA-MoE keeps the biased values, no renormalisation)
    logits = torch.log(torch.tensor([[1.0, 2.0, 3.0, 4.0]]))
    cfg = MoEConfig(n_experts=4, top_k=2, expert_hidden=1, expert_bias=True, bias_in_weight=True)
    idx, w = route(logits, cfg, torch.tensor([0.35, 0, 0, 0]))
    assert idx.tolist() == [[0, 3]]
    assert torch.allclose(w, torch.tensor([[0.45, 0.4]]), atol=1e-6)
    normalized = MoEConfig(n_experts=4, top_k=2, expert_hidden=1, normalize=True, scaling=2.0)
    idx, w = route(logits, normalized)                    # .4 and .3 -> 4/7 and 3/7, times 2
    assert idx.tolist() == [[3, 2]]
    assert torch.allclose(w, torch.tensor([[8 / 7, 6 / 7]]), atol=1e-6)


def _loop_reference(layer: RoutedExperts, x: torch.Tensor) -> torch.Tensor:
    """The expert layer one token at a time, written from the routing rule."""
    cfg = layer.cfg
    silu = torch.nn.functional.silu
    out = []
    for h in x.reshape(-1, x.shape[-1]):
        z = layer.router.weight @ h
        s = torch.softmax(z, -1) if cfg.score == "softmax" else torch.sigmoid(z)
        sel = s + (layer.expert_bias if layer.expert_bias is not None else 0)
        size = cfg.n_experts // cfg.n_groups
        groups = [sorted(sel[g * size:(g + 1) * size].tolist())[-2:] for g in range(cfg.n_groups)]
        group_score = [sum(v) for v in groups] if cfg.n_groups > 1 else [0.0]
        kept = sorted(range(cfg.n_groups), key=lambda g: -group_score[g])[:cfg.topk_groups]
        eligible = [e for e in range(cfg.n_experts) if e // size in kept]
        chosen = sorted(eligible, key=lambda e: -float(sel[e]))[:cfg.top_k]
        w = torch.stack([sel[e] if cfg.bias_in_weight else s[e] for e in chosen])
        if cfg.normalize and cfg.top_k > 1:
            w = w / w.sum()
        w = w * cfg.scaling
        y = torch.zeros_like(h)
        for e, we in zip(chosen, w):
            g = silu(layer.gate_proj[e] @ h) * (layer.up_proj[e] @ h)
            y = y + we * (layer.down_proj[e] @ g)
        if layer.shared is not None:
            sh = layer.shared
            y = y + sh.down_proj.weight @ (silu(sh.gate_proj.weight @ h) * (sh.up_proj.weight @ h))
        out.append(y)
    return torch.stack(out).view(x.shape)


@pytest.mark.parametrize("cfg", [
    MoEConfig(n_experts=8, top_k=2, expert_hidden=12, shared_hidden=10, expert_bias=True,
              bias_in_weight=True),
    MoEConfig(n_experts=12, top_k=3, expert_hidden=12, shared_hidden=0, score="sigmoid",
              expert_bias=True, normalize=True, scaling=2.5, n_groups=4, topk_groups=2,
              router_fp32=True),
], ids=["lladamoe-rule", "llada2-rule"])
def test_expert_layer_equals_a_per_token_loop(cfg):
    torch.manual_seed(0)
    layer = RoutedExperts(16, cfg)
    with torch.no_grad():
        for p in layer.parameters():
            p.normal_(0, 0.5)
        if layer.expert_bias is not None:
            layer.expert_bias.normal_(0, 0.1)
    x = torch.randn(3, 7, 16)
    with torch.no_grad():
        got, want = layer(x), _loop_reference(layer, x)
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-5)


# --- block-causal attention ---------------------------------------------------------------------

def _canvas(model, n, t, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 200, (n, t), generator=g)


@pytest.mark.parametrize("name,atol", [("llada2_dense", 0.0), ("llada2", 1e-5)])
def test_block_b_ignores_later_blocks_and_sees_earlier_ones(request, name, atol):
    model = request.getfixturevalue(name)
    model.block_size = 4
    try:
        x = _canvas(model, 1, 16)
        pos = torch.arange(16)
        base = model.logits(x, pos)
        later = x.clone()
        later[0, 8:] = _canvas(model, 1, 8, seed=1)
        after = model.logits(later, pos)
        same = (after[:, :8] - base[:, :8]).abs().max()
        assert same <= atol                                         # blocks 0 and 1: untouched
        assert not torch.allclose(after[:, 8:12], base[:, 8:12])   # block 2 sees its own change
        earlier = x.clone()
        earlier[0, 1] = x[0, 1] + 1
        moved = model.logits(earlier, pos)
        assert not torch.allclose(moved[:, 4:8], base[:, 4:8], atol=1e-4)   # block 1 sees block 0
        # the same rule when only some rows are asked for (the last layer's out_index path)
        assert torch.allclose(model.logits(later, torch.tensor([5, 6])), base[:, 5:7], atol=1e-5)
    finally:
        model.block_size = 32


def test_fully_bidirectional_without_block_size(llada2):
    llada2.block_size = None
    try:
        x = _canvas(llada2, 1, 16)
        later = x.clone()
        later[0, 12:] = _canvas(llada2, 1, 4, seed=1)
        pos = torch.arange(8)
        assert not torch.allclose(llada2.logits(x, pos), llada2.logits(later, pos), atol=1e-4)
    finally:
        llada2.block_size = 32


def test_blocks_are_aligned_on_position_ids_under_left_padding(llada2):
    llada2.block_size = 4
    try:
        x = _canvas(llada2, 1, 13)
        pad = llada2.pad_id
        padded = torch.cat([torch.full((1, 3), pad), x], dim=1)
        rows = torch.cat([torch.cat([x, torch.full((1, 3), pad)], dim=1), padded])
        mask = torch.ones(2, 16, dtype=torch.long)
        mask[0, 13:] = 0                                            # right padding on row 0 ...
        mask[1, :3] = 0                                             # ... left padding on row 1
        out = llada2.logits(rows, torch.arange(16), attention_mask=mask)
        assert torch.allclose(out[1, 3:], out[0, :13], atol=1e-5)
        alone = llada2.logits(x, torch.arange(13))
        assert torch.allclose(out[1, 3:], alone[0], atol=1e-5)
    finally:
        llada2.block_size = 32


class _View:
    """The model side of a cache call (see ``models/kv.py``): one request, its span."""

    def __init__(self):
        self.rows, self.spans, self.kv = [1], None, None

    def layer_kv(self):
        return self.kv

    def keep(self, kv_out):
        self.kv = kv_out


@pytest.mark.parametrize("block_size,exact", [(4, True), (None, False)])
def test_cached_block_is_exact_with_the_block_causal_mask(llada2, block_size, exact):
    """Keys cached from an older canvas: later blocks are stale, the active block is recomputed.
    With the block-causal mask the stale keys are hidden, so the cached call equals a full call
    on the new canvas; fully bidirectional, it does not."""
    llada2.block_size = block_size
    try:
        old = _canvas(llada2, 1, 16)
        view = _View()
        llada2.logits(old, torch.arange(16), cache=view)              # full call: keys kept
        new = old.clone()
        new[0, 4:8] = _canvas(llada2, 1, 4, seed=2)                   # the active block changes
        new[0, 8:] = _canvas(llada2, 1, 8, seed=3)                    # so do later blocks
        view.spans = [(4, 8)]
        cached = llada2.logits(new, torch.arange(4, 8), cache=view)
        full = llada2.logits(new, torch.arange(4, 8))
        assert torch.allclose(cached, full, atol=1e-5) == exact
    finally:
        llada2.block_size = 32


def test_block_size_is_validated(llada2):
    with pytest.raises(ValueError, match=r"block_size=0 must be a positive integer or None"):
        llada2.block_size = 0
    assert llada2.block_size == 32


def test_lladamoe_left_padding_leaves_the_real_rows_unchanged(folders):
    m = load_model(str(folders["lladamoe"]), device="cpu", dtype="float32")
    x = _canvas(m, 1, 12)
    rows = torch.cat([torch.cat([x, torch.full((1, 4), m.pad_id)], dim=1),
                      torch.cat([torch.full((1, 4), m.pad_id), x], dim=1)])
    mask = torch.ones(2, 16, dtype=torch.long)
    mask[0, 12:] = 0
    mask[1, :4] = 0
    out = m.logits(rows, torch.arange(16), attention_mask=mask)
    alone = m.logits(x, torch.arange(12))
    assert torch.allclose(out[1, 4:], alone[0], atol=1e-5)
    assert torch.allclose(out[0, :12], alone[0], atol=1e-5)
    # without the mask the padding is attended to, and the rows move
    unmasked = m.logits(rows, torch.arange(16))
    assert not torch.allclose(unmasked[1, 4:], alone[0], atol=1e-3)
