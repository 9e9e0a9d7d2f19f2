"""DiffusionGemma loaded natively: its folders as published (``helpers/gemma_folders.py``) and as
transformers' own ``save_pretrained`` writes them, every tensor in its slot, its config read as
the configuration classes read it, float32 logits against transformers' own
``DiffusionGemmaForBlockDiffusion`` (no padding, left padding, self-conditioning, the encoder's
own layer scalars, committed canvases encoded chunk by chunk), the model protocol's extras, and
one-line refusals of what the network does not implement."""

from __future__ import annotations

import json

import pytest
import torch
from helpers.gemma_folders import (END_OF_TURN, PUBLISHED, VISION, VOCAB, gemma_config,
                                   make_gemma_folder, write_gemma_tokenizer)
from safetensors import safe_open

from pvf_lmeval.decoding.api import decode
from pvf_lmeval.decoding.cache import ContextKV
from pvf_lmeval.models import load_model
from pvf_lmeval.models.diffusion_lm import NoMaskToken
from pvf_lmeval.models.formats import DIFFUSION_GEMMA, UnsupportedCheckpoint, format_for

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")

C = 8                   # the tiny folders' canvas
TOLERANCE = 1e-4        # of each row's largest |logit|


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("dgemma")
    return {"released": make_gemma_folder(root / "diffusiongemma-26B-A4B-it", seed=1),
            "own_scalars": make_gemma_folder(root / "own-scalars", seed=2,
                                             encoder_scalars="own")}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A folder written by the configuration class and ``save_pretrained`` (its own layout:
    ``per_layer_config`` instead of the global keys), with the stand-in tokenizer."""
    from transformers import DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion

    folder = tmp_path_factory.mktemp("saved")
    text = {k: v for k, v in gemma_config()["text_config"].items()
            if k not in ("model_type", "dtype")}
    cfg = DiffusionGemmaConfig(text_config=text, vision_config=dict(VISION), canvas_length=C)
    torch.manual_seed(5)
    net = DiffusionGemmaForBlockDiffusion(cfg)
    with torch.no_grad():          # norms and scalars away from their initial ones
        for name, p in net.named_parameters():
            if name.endswith(("norm.weight", "scale")):
                p.add_(0.2 * torch.randn(p.shape))
    net.save_pretrained(folder)
    write_gemma_tokenizer(folder)
    return folder


_MODELS: dict = {}


def _pair(folder):
    """(native model, transformers' reference) of ``folder``, float32, each loaded once."""
    from transformers import DiffusionGemmaForBlockDiffusion

    if folder not in _MODELS:
        ref, info = DiffusionGemmaForBlockDiffusion.from_pretrained(
            str(folder), dtype=torch.float32, output_loading_info=True)
        assert not any(info.values()), info          # every tensor of the folder is the reference's
        _MODELS[folder] = (load_model(str(folder), device="cpu", dtype="float32"), ref.eval())
    return _MODELS[folder]


def _relative(ours: torch.Tensor, ref: torch.Tensor) -> float:
    """The largest |difference| of a row over that row's largest |logit|."""
    return ((ours - ref).abs().amax(-1) / ref.abs().amax(-1)).max().item()


def _batch(lens, seed=0):
    """Contexts of ``lens`` tokens left-padded to the longest, random canvases, and
    self-conditioning logits: (context, mask, canvas, self_conditioning)."""
    g = torch.Generator().manual_seed(seed)
    n, p = len(lens), max(lens)
    ctx = torch.randint(4, VOCAB, (n, p), generator=g)
    mask = torch.ones(n, p, dtype=torch.long)
    for r, length in enumerate(lens):
        mask[r, :p - length] = 0
        ctx[r, :p - length] = 0
    canvas = torch.randint(0, VOCAB, (n, C), generator=g)
    return ctx, mask, canvas, 3 * torch.randn(n, C, VOCAB, generator=g)


# --- loading ------------------------------------------------------------------------------------

def test_every_checkpoint_tensor_lands_in_its_native_slot(folders):
    folder = folders["own_scalars"]
    m = load_model(str(folder), device="cpu", dtype="float32")
    state = m.net.state_dict()
    filled, vision = set(), 0
    for shard in sorted(folder.glob("*.safetensors")):
        with safe_open(str(shard), framework="pt") as f:
            for name in f.keys():
                if name.startswith(("model.encoder.vision_tower.", "model.encoder.embed_vision.")):
                    assert DIFFUSION_GEMMA.slot(name) is None
                    vision += 1
                    continue
                native, expert = DIFFUSION_GEMMA.slot(name)
                assert expert is None and torch.equal(state[native], f.get_tensor(name).float()), name
                filled.add(native)
    assert vision == 18
    assert filled | {"lm_head.weight"} == set(state)        # nothing left at its init value
    assert m.net.lm_head.weight.data_ptr() == m.net.embed.weight.data_ptr()   # head = embedding
    assert not torch.equal(m.net.blocks[0].layer_scalar, m.net.blocks[0].encoder_layer_scalar)


def test_the_published_keys_are_read_as_the_config_classes_read_them(folders):
    m = load_model(str(folders["released"]), device="cpu", dtype="float32")
    c = m.net.cfg
    assert m.family == "diffusion_gemma" and m.canvas_length == C and m.block_size is None
    assert c.global_layers == (False,) * 5 + (True,)
    assert (c.head_dim, c.n_kv_heads, c.rope_theta, c.rotary_dim, c.rope_pairs) == (16, 2, 1e4, None, None)
    g = c.global_attention
    # proportional rotary: int(0.25 * 32 // 2) = 4 of the 16 frequency pairs turn
    assert (g.head_dim, g.n_kv_heads, g.rope_theta, g.rope_pairs, g.values_from_keys) == (32, 1, 1e6, 4, True)
    assert (c.sliding_window, c.logit_softcap, c.attn_scale, c.ffn_hidden) == (4, 30.0, 1.0, 48)
    moe = c.moe
    assert (moe.n_experts, moe.top_k, moe.expert_hidden, moe.activation) == (8, 2, 16, "gelu_tanh")
    assert not hasattr(m.net.blocks[5].attn, "v_proj") and hasattr(m.net.blocks[4].attn, "v_proj")
    assert m.net.blocks[5].attn.q_proj.weight.shape == (4 * 32, 64)
    # every id of config.json's eos_token_id list; pad from text_config
    assert m.eos_ids == (1, END_OF_TURN) and m.pad_id == 0


def test_the_26b_config_as_published_and_as_transformers_writes_it():
    published = gemma_config(vocab=PUBLISHED["vocab_size"], canvas_length=256, **PUBLISHED)
    c = DIFFUSION_GEMMA.read_config(published)
    assert (c.d_model, c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim) == (2816, 30, 16, 8, 256)
    assert c.global_layers == ((False,) * 5 + (True,)) * 5
    assert (c.global_attention.head_dim, c.global_attention.n_kv_heads) == (512, 2)
    assert c.global_attention.rope_pairs == 64 and c.sliding_window == 1024
    assert c.canvas_length == 256 and c.moe.n_experts == 128 and c.moe.top_k == 8
    # transformers 5.25's config class writes the global layers' shape per layer index
    written = json.loads(json.dumps(published))
    text = written["text_config"]
    del text["global_head_dim"], text["num_global_key_value_heads"]
    text["per_layer_config"] = {f"{i:02d}": {"head_dim": 512, "num_key_value_heads": 2}
                                for i in (5, 11, 17, 23, 29)}
    assert DIFFUSION_GEMMA.read_config(written) == c
    # absent: the class's default global head width (512) and the sliding layers' heads
    del text["per_layer_config"]
    assert DIFFUSION_GEMMA.read_config(written).global_attention.n_kv_heads == 8


def test_the_writer_round_trips():
    cfg = DIFFUSION_GEMMA.read_config(gemma_config())
    assert DIFFUSION_GEMMA.read_config(DIFFUSION_GEMMA.write_config(cfg, {})) == cfg


# --- logits against transformers ----------------------------------------------------------------

@pytest.mark.parametrize("lens,self_cond", [
    ([11, 11], False),          # no padding; the sliding layers' window (4) is shorter
    ([11, 7, 3, 1], False),     # left padding
    ([11, 11], True),           # self-conditioning
    ([11, 7, 3, 1], True),
])
def test_logits_equal_transformers(folders, lens, self_cond):
    m, ref = _pair(folders["released"])
    ctx, mask, canvas, sc = _batch(lens)
    sc = sc if self_cond else None
    p = ctx.shape[1]
    tokens = torch.cat([ctx, canvas], 1)
    full = torch.cat([mask, torch.ones_like(canvas)], 1)
    ours = m.logits(tokens, torch.arange(p, p + C), attention_mask=full, self_conditioning=sc)
    with torch.no_grad():       # the reference's positions: real tokens counted, as ours
        out = ref(input_ids=ctx, attention_mask=mask,
                  position_ids=(mask.cumsum(-1) - 1).clamp(min=0), decoder_input_ids=canvas,
                  decoder_attention_mask=full.bool(),
                  decoder_position_ids=mask.sum(-1, keepdim=True) + torch.arange(C),
                  self_conditioning_logits=sc).logits
    assert _relative(ours, out) < TOLERANCE
    for r, length in enumerate(lens):   # each row alone, unpadded
        with torch.no_grad():
            alone = ref(input_ids=ctx[r:r + 1, p - length:], decoder_input_ids=canvas[r:r + 1],
                        self_conditioning_logits=None if sc is None else sc[r:r + 1]).logits
        assert _relative(ours[r:r + 1], alone) < TOLERANCE


def test_encoder_and_decoder_layer_scalars_are_each_their_own(folders):
    m, ref = _pair(folders["own_scalars"])
    ctx, _, canvas, sc = _batch([9, 9], seed=1)
    ours = m.logits(torch.cat([ctx, canvas], 1), torch.arange(9, 9 + C), self_conditioning=sc)
    with torch.no_grad():
        out = ref(input_ids=ctx, decoder_input_ids=canvas, self_conditioning_logits=sc).logits
    assert _relative(ours, out) < TOLERANCE


def test_committed_canvases_are_context_as_the_encoder_reads_them(folders):
    """generate encodes the prompt, then each committed canvas into its cache (chunk by chunk,
    the sliding layers keeping their last window - 1 keys), and the decoder reads that cache."""
    from transformers.cache_utils import DynamicCache

    m, ref = _pair(folders["released"])
    g = torch.Generator().manual_seed(3)
    prompt, c1, c2 = (torch.randint(4, VOCAB, (1, n), generator=g) for n in (5, C, C))
    with torch.no_grad():
        cache = DynamicCache(config=ref.config.get_text_config(decoder=True))
        ref.model.encoder(input_ids=prompt, cache=cache, position_ids=torch.arange(5)[None])
        ref.model.encoder(input_ids=c1, cache=cache, position_ids=torch.arange(5, 5 + C)[None])
        out = ref(cache=cache, decoder_input_ids=c2,
                  decoder_position_ids=torch.arange(5 + C, 5 + 2 * C)[None]).logits
    assert cache.layers[0].keys.shape[2] == 3             # window 4: the last 3 keys kept
    ours = m.logits(torch.cat([prompt, c1, c2], 1), torch.arange(5 + C, 5 + 2 * C))
    assert _relative(ours, out) < TOLERANCE


def test_a_folder_saved_by_transformers_loads(saved):
    m, ref = _pair(saved)
    ctx, mask, canvas, sc = _batch([10, 6])
    tokens = torch.cat([ctx, canvas], 1)
    full = torch.cat([mask, torch.ones_like(canvas)], 1)
    ours = m.logits(tokens, torch.arange(10, 10 + C), attention_mask=full, self_conditioning=sc)
    for r, length in enumerate([10, 6]):
        with torch.no_grad():
            alone = ref(input_ids=ctx[r:r + 1, 10 - length:], decoder_input_ids=canvas[r:r + 1],
                        self_conditioning_logits=sc[r:r + 1]).logits
        assert _relative(ours[r:r + 1], alone) < TOLERANCE
    assert m.eos_ids == (1,)                           # text_config's eos_token_id


def test_logits_name_canvas_positions_only(folders):
    m, _ = _pair(folders["released"])
    ctx, mask, canvas, _ = _batch([6, 6])
    tokens = torch.cat([ctx, canvas], 1)
    ours = m.logits(tokens, torch.arange(6, 6 + C))
    some = m.logits(tokens, torch.tensor([[8, 13], [6, 7]]))
    # the same rows (the last layer computes only these queries: equal up to rounding)
    assert _relative(some, torch.stack([ours[0, [2, 7]], ours[1, [0, 1]]])) < 1e-5
    assert _relative(some, torch.stack([ours[0, [3, 7]], ours[1, [0, 1]]])) > 0.1


@pytest.mark.parametrize("call,says", [
    (lambda m, t: m.logits(t, torch.arange(5, 5 + C)), "positions must name canvas columns (6..13 of 14)"),
    (lambda m, t: m.logits(t[:, :5], torch.arange(5)), "tokens hold 5 columns"),
    (lambda m, t: m.logits(t, torch.arange(6, 14), cache=object()),
     "cache: diffusion_gemma (a uniform-state model) takes a context cache "
     "(decoding.cache.ContextKV), not object"),
    (lambda m, t: m.logits(t, torch.arange(6, 14), cache=ContextKV(
        n=2, width=6, canvas=C, windows=m.sliding_windows, device="cpu").call(
            [0], full=True, attention=None, columns=14)),
     "cache segments cover 1 rows, the call has 2"),
    (lambda m, t: m.logits(t, torch.arange(6, 14), attention_mask=torch.zeros_like(t)),
     "attention_mask: the canvas (the last 8 columns) holds padding"),
    (lambda m, t: m.logits(t, torch.arange(6, 14), self_conditioning=torch.zeros(2, C, 7)),
     "self_conditioning of shape (2, 8, 7); expected [N, canvas, V] = [2, 8, 512]"),
])
def test_calls_it_cannot_take_are_one_line(folders, call, says):
    m, _ = _pair(folders["released"])
    ctx, _, canvas, _ = _batch([6, 6])
    with pytest.raises(ValueError) as ei:
        call(m, torch.cat([ctx, canvas], 1))
    assert says in str(ei.value) and "\n" not in str(ei.value)


def test_the_masked_decoders_refuse_a_uniform_state_model_in_one_line(folders):
    m, _ = _pair(folders["released"])
    for decoder in ("static", "threshold", "freedave", "pvf", "explore"):
        with pytest.raises(ValueError) as ei:
            decode(m, [5, 6, 7], decoder, gen_length=C, block_length=C)
        msg = str(ei.value)
        assert msg.startswith(f"decoder={decoder} fills masked positions; diffusion_gemma is a "
                              "uniform-state diffusion model (no mask token") and "\n" not in msg
    with pytest.raises(NoMaskToken) as ei:
        m.mask_id
    assert str(ei.value).endswith("decode it with decoder=renoise, the decoders that fill masked "
                                  "positions do not apply")


def test_expert_and_tensor_parallel_on_two_real_processes(folders):
    """Expert parallel: one process's logits bit for bit; all (attention replicated, the dense
    MLPs and the head split): within 2e-5 of each row's largest logit; the ranks alike.

    The other families' bound is 1e-5 (tests/test_parallel.py). This random released-shape
    folder's rows peak at 2.7 (a trained model's at about 20), so the same rounding of the split
    sums is a larger share of them: measured 5.6e-6 with torch's AVX2 kernels and 1.1e-5 with
    its AVX-512 ones (the kernels picked by the CPU)."""
    from helpers import parallel_jobs as jobs
    from helpers.ranks import RankPool

    folder = str(folders["released"])
    one = jobs.canvas_logits(folder, None)
    pool = RankPool(2)
    try:
        for layers in ("experts", "all"):
            first, second = pool.run(jobs.canvas_logits, folder, layers)
            assert torch.equal(first, second)
            if layers == "experts":
                assert torch.equal(first, one)
            else:
                assert _relative(first, one) < 2e-5
    finally:
        pool.close()


# --- refusals -----------------------------------------------------------------------------------

@pytest.mark.parametrize("text,top,says", [
    ({"use_bidirectional_attention": "all"}, {},
     'use_bidirectional_attention="all" is not supported by the native network'),
    ({"hidden_activation": "gelu"}, {}, 'hidden_activation="gelu" is not supported'),
    ({"attention_bias": True}, {}, "attention_bias=true is not supported"),
    ({}, {"tie_word_embeddings": False}, "tie_word_embeddings=false is not supported"),
    ({"rope_parameters": {"full_attention": {"rope_type": "yarn", "rope_theta": 1e6},
                          "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}}, {},
     'text_config.rope_parameters.full_attention.rope_type="yarn" is not supported'),
    ({"rope_parameters": {"full_attention": {"rope_type": "proportional", "rope_theta": 1e6,
                                             "partial_rotary_factor": 0.25, "factor": 8.0},
                          "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}}, {},
     "text_config.rope_parameters.full_attention.factor=8.0 is not supported"),
    ({"per_layer_config": {"5": {"head_dim": 32, "sliding_window": 8}}}, {},
     "text_config.per_layer_config[\"5\"].sliding_window is not supported"),
    ({"per_layer_config": {"0": {"head_dim": 32}}}, {},
     "the sliding_attention layers differ in head_dim / num_key_value_heads (layer 1"),
    ({"layer_types": ["sliding_attention"] * 5}, {}, "text_config.layer_types=["),
    ({"num_experts": None}, {}, "text_config.num_experts is null"),
    ({"final_logit_softcapping": None}, {}, "text_config.final_logit_softcapping=null"),
    ({"num_global_key_value_heads": 3}, {}, "text_config.num_global_key_value_heads=3 key/value "
                                            "heads do not divide num_attention_heads=4"),
    ({}, {"canvas_length": 0}, "canvas_length is 0; a diffusion_gemma checkpoint needs it as a "
                               "positive integer"),
    ({}, {"text_config": None}, "text_config=null; a diffusion_gemma checkpoint needs"),
])
def test_what_the_network_does_not_implement_is_refused_in_one_line(text, top, says):
    cfg = gemma_config(top=top, **text)
    with pytest.raises(UnsupportedCheckpoint) as ei:
        format_for(cfg).read_config(cfg)        # what load_model raises, before any weight
    assert says in str(ei.value) and "\n" not in str(ei.value)


def test_a_refusal_comes_before_any_weight_is_read(folders, tmp_path):
    import shutil

    folder = tmp_path / "f"
    shutil.copytree(folders["released"], folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["text_config"]["use_bidirectional_attention"] = "all"
    (folder / "config.json").write_text(json.dumps(cfg))
    for shard in folder.glob("*.safetensors"):
        shard.write_bytes(b"")          # unreadable: never reached
    with pytest.raises(UnsupportedCheckpoint, match='use_bidirectional_attention="all"'):
        load_model(str(folder), device="cpu", dtype="float32")


def test_a_layer_type_absent_takes_the_class_pattern():
    cfg = gemma_config(num_hidden_layers=7)
    del cfg["text_config"]["layer_types"]
    # every sixth layer global, and the last forced global
    assert format_for(cfg).read_config(cfg).global_layers == (False,) * 5 + (True, True)
