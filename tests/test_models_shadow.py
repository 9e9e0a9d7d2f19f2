"""The model protocol's shadow block (``Shadow(start, length)``, WINO's verification rows) on the
one native network.

Oracle: transformers run on the extended sequence (canvas + ``length`` mask tokens carrying the
shadowed columns' position ids) with the dense 4-D boolean mask WINO builds
(Feng-Hong/WINO-DLLM ``LLaDA/decoding.py``, ``decoding_wino``: canvas rows see no shadow row;
shadow row j sees the canvas but the column it shadows, and every shadow row), padding keys
hidden and, on a block-causal family, the block rule on top. LLaDA against ``LlamaForCausalLM``,
SDAR (block-causal) against ``Qwen3ForCausalLM``, SDAR-MoE against ``Qwen3MoeForCausalLM``, with
``is_causal=False``, sdpa and float32 (transformers' eager attention reads a boolean 4-D mask as
additive 0/1, so it is not an oracle here). LLaDA-MoE and LLaDA2 have no transformers class:
their shadow rows are checked by what they may and may not see. Logit-shifted families (Dream,
Fast-dLLM v2, RND1), the uniform-state DiffusionGemma and cached calls refuse a shadow in one
line.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers
from helpers.gemma_folders import make_gemma_folder
from helpers.moe_folders import make_llada2_folder, make_lladamoe_folder
from helpers.prerequisites import require_bundled_weights
from helpers.qwen_folders import make_fast_dllm_folder, make_rnd1_folder, make_sdar_folder
from safetensors import safe_open
from test_models_oracle import REL_TOL, hf_logits, hf_oracle, make_temp_checkpoint, rel_err

from pvf_lmeval.models import load_model
from pvf_lmeval.models.loader import FIXTURES_DIR, _weight_files
from pvf_lmeval.tensors.shadow import Shadow

pytestmark = pytest.mark.usefixtures("one_thread")

ORACLE_CASES = ("tiny-llada", "llada-temp", "sdar", "sdar_moe")


# --- the oracle -----------------------------------------------------------------------------------

def wino_visible(t: int, length: int, starts, keep=None, positions=None, block=None):
    """[N, 1, T + S, T + S] boolean (True: attend), WINO's mask row by row: canvas rows see the
    canvas only, shadow row j sees the canvas but column ``start + j`` and every shadow row;
    then padding keys (``keep`` [N, T] False) hidden from every row, and with ``block`` the
    block rule on ``positions`` [N, T + S] (a key of a later block is hidden)."""
    rows = []
    for n, s in enumerate(starts):
        m = torch.ones(t + length, t + length, dtype=torch.bool)
        m[:, t:] = False
        m[t:, t:] = True
        m[t:, s:s + length] = ~torch.eye(length, dtype=torch.bool)
        if keep is not None:
            m[:, :t] &= keep[n][None, :]
        if block is not None:
            b = positions[n] // block
            m &= b[None, :] <= b[:, None]
        rows.append(m)
    return torch.stack(rows)[:, None]


def extended(tokens, mask_id: int, length: int, starts, keep=None):
    """(tokens + ``length`` mask columns, their position ids [N, T + S]) as WINO lays them out."""
    n, t = tokens.shape
    pos = (torch.arange(t).expand(n, t) if keep is None
           else (keep.long().cumsum(-1) - 1).clamp(min=0))
    cols = torch.tensor(starts)[:, None] + torch.arange(length)
    ext = torch.cat([tokens, torch.full((n, length), mask_id)], dim=1)
    return ext, torch.cat([pos, pos.gather(1, cols)], dim=1)


def _state(folder: Path, rename=lambda n: n) -> dict:
    state = {}
    for file in _weight_files(folder):
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                state[rename(name)] = f.get_tensor(name).float()
    return state


def qwen3_oracle(folder: Path):
    """Qwen3 (SDAR) or Qwen3-MoE (SDAR-MoE) from the folder's config and tensors; the experts
    stacked into transformers' fused ``gate_up_proj`` / ``down_proj``."""
    cfg = json.loads((folder / "config.json").read_text())
    common = dict(vocab_size=cfg["vocab_size"], hidden_size=cfg["hidden_size"],
                  intermediate_size=cfg["intermediate_size"],
                  num_hidden_layers=cfg["num_hidden_layers"],
                  num_attention_heads=cfg["num_attention_heads"],
                  num_key_value_heads=cfg["num_key_value_heads"], head_dim=cfg["head_dim"],
                  rms_norm_eps=cfg["rms_norm_eps"], rope_theta=cfg["rope_theta"],
                  max_position_embeddings=cfg["max_position_embeddings"],
                  attention_bias=cfg["attention_bias"], tie_word_embeddings=False,
                  is_causal=False, hidden_act="silu", attn_implementation="sdpa")
    state = _state(folder)
    if "num_experts" not in cfg:
        model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**common))
    else:
        hf = transformers.Qwen3MoeConfig(
            num_experts=cfg["num_experts"], num_experts_per_tok=cfg["num_experts_per_tok"],
            moe_intermediate_size=cfg["moe_intermediate_size"],
            norm_topk_prob=cfg["norm_topk_prob"], decoder_sparse_step=cfg["decoder_sparse_step"],
            mlp_only_layers=cfg["mlp_only_layers"], **common)
        model = transformers.Qwen3MoeForCausalLM(hf)
        for i in range(cfg["num_hidden_layers"]):
            p = f"model.layers.{i}.mlp.experts."
            if p + "0.gate_proj.weight" not in state:
                continue
            experts = range(cfg["num_experts"])
            state[p + "gate_up_proj"] = torch.stack(
                [torch.cat([state.pop(f"{p}{e}.gate_proj.weight"),
                            state.pop(f"{p}{e}.up_proj.weight")]) for e in experts])
            state[p + "down_proj"] = torch.stack([state.pop(f"{p}{e}.down_proj.weight")
                                                  for e in experts])
    model.eval().load_state_dict(state, strict=True)
    return model


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """Every feed-forward width and LLaDA2's expert count multiples of 32: a CPU elementwise
    kernel (the gate's activation, LLaDA2's sigmoid router scores) computes the last partial
    stride of two vectors of a tensor in scalar code (32 float32 values with AVX-512 kernels, 16
    with AVX2), so at other widths a row's values depend on how many rows share the call, and
    bit-for-bit comparisons across batches or routings would test that instead of the shadow."""
    root = tmp_path_factory.mktemp("shadow")
    return {"llada-temp": make_temp_checkpoint(root / "llada", "llada", seed=3),
            "sdar": make_sdar_folder(root / "sdar", seed=4),
            "sdar_moe": make_sdar_folder(root / "sdar_moe", seed=5, moe=True,
                                         mlp_only_layers=[0], moe_intermediate_size=32),
            "lladamoe": make_lladamoe_folder(root / "lladamoe", seed=6, dense_intermediate_size=64,
                                             expert_intermediate_size=32,
                                             shared_expert_intermediate_size=32),
            "llada2": make_llada2_folder(root / "llada2", seed=7, intermediate_size=64,
                                         moe_intermediate_size=32, num_experts=32),
            "lladamoe-1": make_lladamoe_folder(root / "lladamoe-1", seed=11, num_hidden_layers=1,
                                               moe_layer_freq=[1], expert_intermediate_size=32,
                                               shared_expert_intermediate_size=32),
            "llada2-1": make_llada2_folder(root / "llada2-1", seed=12, num_hidden_layers=1,
                                           first_k_dense_replace=0, moe_intermediate_size=32),
            "rnd1": make_rnd1_folder(root / "rnd1", seed=8),
            "fast_dllm": make_fast_dllm_folder(root / "fast_dllm", seed=9),
            "gemma": make_gemma_folder(root / "gemma", seed=10)}


_LOADED: dict = {}


def _folder(folders, case: str) -> Path:
    if case in folders:
        return Path(folders[case])
    require_bundled_weights(case)
    return FIXTURES_DIR / case


def model_of(folders, case: str):
    folder = _folder(folders, case)
    if ("model", folder) not in _LOADED:
        _LOADED["model", folder] = load_model(str(folder), device="cpu", dtype="float32")
    return _LOADED["model", folder]


def oracle_of(folders, case: str):
    folder = _folder(folders, case)
    if ("oracle", folder) not in _LOADED:
        _LOADED["oracle", folder] = (qwen3_oracle(folder) if case.startswith("sdar")
                                     else hf_oracle(folder, "sdpa"))
    return _LOADED["oracle", folder]


def _tokens(model, n: int, t: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, min(model.decodable, 1000), (n, t), generator=gen)
    tokens[:, t - 6:] = model.mask_id            # masks at the end, as a block in decoding
    tokens[:, 14] = model.mask_id
    return tokens


#: the left-padded batches: each row's real tokens, and the column its shadow starts at
LENGTHS, STARTS = (24, 19, 15), [16, 12, 14]


def _left_padded(model, t: int, seed: int):
    """(rows [3, t] of :func:`_tokens`, the rows of ``LENGTHS`` real tokens left-padded to ``t``,
    the mask of their real tokens [3, t] bool)."""
    base = _tokens(model, 3, t, seed)
    tokens = torch.full((3, t), model.pad_id)
    keep = torch.zeros(3, t, dtype=torch.bool)
    for r, n in enumerate(LENGTHS):
        tokens[r, t - n:] = base[r, :n]
        keep[r, t - n:] = True
    return base, tokens, keep


# --- against transformers -------------------------------------------------------------------------

@pytest.mark.parametrize("case", ORACLE_CASES)
def test_shadow_rows_are_transformers_with_winos_mask(folders, case):
    """Two rows shadowing blocks at different columns (on SDAR, whose blocks are 4 positions,
    the second one straddles two of them): the shadow rows are transformers' rows of the
    extended sequence, the canvas rows those of the call without a shadow."""
    model, oracle = model_of(folders, case), oracle_of(folders, case)
    t, length, starts = 24, 8, [8, 14]
    tokens = _tokens(model, 2, t, seed=1)
    ext, pos = extended(tokens, model.mask_id, length, starts)
    block = model.block_size
    mask = wino_visible(t, length, starts, positions=pos, block=block)
    ref = hf_logits(oracle, ext, attention_mask=mask, position_ids=pos)
    got = model.logits(tokens, torch.arange(t), shadow=Shadow(torch.tensor(starts), length))
    v = model.decodable
    assert got.shape == (2, t + length, model.vocab_size) and got.dtype == torch.float32
    err = rel_err(got[:, t:, :v], ref[:, t:, :v])
    print(f"\n[shadow] {case}: shadow rows, max relative error {err:.2e}")
    assert err < REL_TOL
    plain = model.logits(tokens, torch.arange(t))
    assert rel_err(got[:, :t, :v], plain[..., :v]) < REL_TOL
    assert rel_err(got[:, :t, :v], ref[:, :t, :v]) < REL_TOL
    # not a plain call with the shadowed positions masked: the shadow rows also read each other
    masked = tokens.clone()
    masked[0, 8:16] = model.mask_id
    assert rel_err(got[0, t:, :v], model.logits(masked, torch.arange(8, 16))[0, :, :v]) > 1e-2


@pytest.mark.parametrize("case", ORACLE_CASES)
def test_left_padded_shadow_rows_are_transformers_and_the_rows_alone(folders, case):
    """Rows of 24, 19 and 15 real tokens, left-padded to 24, each shadowing a block at its own
    column: transformers with the padding hidden and position ids counting real tokens, and
    each row called alone, unpadded."""
    model, oracle = model_of(folders, case), oracle_of(folders, case)
    t, length = 24, 8
    base, tokens, keep = _left_padded(model, t, seed=2)
    ext, pos = extended(tokens, model.mask_id, length, STARTS, keep)
    mask = wino_visible(t, length, STARTS, keep, pos, model.block_size)
    ref = hf_logits(oracle, ext, attention_mask=mask, position_ids=pos)
    got = model.logits(tokens, torch.arange(t), attention_mask=keep.long(),
                       shadow=Shadow(torch.tensor(STARTS), length))
    v = model.decodable
    assert rel_err(got[:, t:, :v], ref[:, t:, :v]) < REL_TOL
    for r, n in enumerate(LENGTHS):
        alone = model.logits(base[r:r + 1, :n], torch.arange(n),
                             shadow=Shadow(torch.tensor([STARTS[r] - (t - n)]), length))
        assert rel_err(got[r, t - n:t, :v], alone[0, :n, :v]) < REL_TOL
        assert rel_err(got[r, t:, :v], alone[0, n:, :v]) < REL_TOL


@pytest.mark.parametrize("case", ["llada-temp", "sdar", "sdar_moe", "lladamoe", "llada2"])
def test_batch_invariant_shadow_calls_ignore_the_batch(folders, case):
    """``batch_invariant`` on the CPU: each row of a left-padded batch of shadow calls is bit for
    bit the row called alone, and the canvas rows bit for bit the call without a shadow."""
    model = model_of(folders, case)
    t, length = 24, 8
    base, tokens, keep = _left_padded(model, t, seed=3)
    pos = torch.tensor([3, 20, 9])
    with model.batch_invariant():
        got = model.logits(tokens, pos, attention_mask=keep.long(),
                           shadow=Shadow(torch.tensor(STARTS), length))
        plain = model.logits(tokens, pos, attention_mask=keep.long())
        assert torch.equal(got[:, :3], plain)
        for r, n in enumerate(LENGTHS):
            p = t - n
            alone = model.logits(base[r:r + 1, :n], (pos - p).clamp(min=0),
                                 shadow=Shadow(torch.tensor([STARTS[r] - p]), length))
            real = pos >= p
            assert torch.equal(got[r, :3][real], alone[0, :3][real])
            assert torch.equal(got[r, 3:], alone[0, 3:])


# --- what a shadow row sees, on the families transformers has no class for --------------------------

def _changed(model, tokens, shadow, column: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(shadow rows, shadow rows with the token at ``column`` replaced), batch-invariant
    kernels: a key a row does not see changes nothing in it, bit for bit, whatever the routing
    of the other rows."""
    other = tokens.clone()
    other[0, column] = (tokens[0, column] + 7) % 40
    pos = torch.arange(tokens.shape[1])
    with model.batch_invariant():
        return (model.logits(tokens, pos, shadow=shadow)[0, tokens.shape[1]:],
                model.logits(other, pos, shadow=shadow)[0, tokens.shape[1]:])


@pytest.mark.parametrize("case", ["lladamoe-1", "llada2-1"])
def test_a_one_layer_shadow_row_ignores_its_own_column_only(folders, case):
    """One routed layer (deeper, the other canvas rows carry every token to every row): shadow
    row 3 ignores the token of the column it shadows, rows 2 and 4 read it."""
    model = model_of(folders, case)
    tokens = _tokens(model, 1, 48, seed=4)
    shadow = Shadow(torch.tensor([32]), 8)
    got, changed = _changed(model, tokens, shadow, 32 + 3)
    assert torch.equal(changed[3], got[3])
    assert not torch.equal(changed[2], got[2]) and not torch.equal(changed[4], got[4])


def test_llada2_shadow_rows_never_read_a_later_block(folders):
    """LLaDA2 (blocks of 32 positions), three layers: the shadow of block 1 ignores a token of
    block 2 and reads one of block 0; its canvas rows are the call without a shadow; and it is
    not a plain call with the block masked (the shadow rows read each other)."""
    model = model_of(folders, "llada2")
    assert model.block_size == 32
    tokens = _tokens(model, 1, 72, seed=5)
    shadow = Shadow(torch.tensor([32]), 8)
    got, later = _changed(model, tokens, shadow, 66)
    assert torch.equal(later, got)
    _, earlier = _changed(model, tokens, shadow, 20)
    assert not torch.equal(earlier[0], got[0])
    pos = torch.arange(72)
    with model.batch_invariant():
        assert torch.equal(model.logits(tokens, pos, shadow=shadow)[:, :72],
                           model.logits(tokens, pos))
    masked = tokens.clone()
    masked[0, 32:40] = model.mask_id
    assert rel_err(got, model.logits(masked, torch.arange(32, 40))[0]) > 1e-2


# --- refusals -------------------------------------------------------------------------------------

def _one_line(call, error=ValueError) -> str:
    with pytest.raises(error) as exc:
        call()
    msg = str(exc.value)
    assert "\n" not in msg, msg
    return msg


@pytest.mark.parametrize("case,family", [("tiny-dream", "dream"), ("fast_dllm", "fast-dllm"),
                                         ("rnd1", "rnd1")])
def test_logit_shifted_families_refuse_a_shadow_in_one_line(folders, case, family):
    model = model_of(folders, case)
    tokens = torch.full((1, 16), model.mask_id)
    msg = _one_line(lambda: model.logits(tokens, torch.arange(16),
                                         shadow=Shadow(torch.tensor([4]), 4)))
    assert msg.startswith(f"shadow: {family} shifts its logits (position j is read from the row "
                          f"at j - 1"), msg


def test_a_uniform_state_model_refuses_a_shadow_in_one_line(folders):
    model = model_of(folders, "gemma")
    tokens = torch.full((1, 12), 5)
    msg = _one_line(lambda: model.logits(tokens, torch.arange(4, 12),
                                         shadow=Shadow(torch.tensor([4]), 4)))
    assert msg.startswith("shadow: diffusion_gemma is a uniform-state model (no mask token"), msg


def test_a_cached_call_refuses_a_shadow_in_one_line(folders):
    model = model_of(folders, "llada-temp")
    msg = _one_line(lambda: model.logits(torch.full((1, 16), model.mask_id), torch.arange(16),
                                         cache=object(), shadow=Shadow(torch.tensor([4]), 4)))
    assert msg == "cache: a call with a shadow takes no KV cache (cache=None)"


@pytest.mark.parametrize("start,length,says", [
    (torch.tensor([4, 4]), 0, "shadow.length=0 must be an integer from 1 to the call's 16"),
    (torch.tensor([4, 4]), 17, "shadow.length=17 must be an integer from 1"),
    (torch.tensor([4, 4]), True, "shadow.length=True must be an integer"),
    (torch.tensor([4, 4]), 4.0, "shadow.length=4.0 must be an integer"),
    (torch.tensor([4.0, 4.0]), 4, "shadow.start must be an int64 or int32 tensor [N] = [2] (one "
                                  "start column per row); got torch.float32 of shape (2,)"),
    (torch.tensor([4]), 4, "shadow.start must be an int64 or int32 tensor [N] = [2]"),
    ([4, 4], 4, "shadow.start must be an int64 or int32 tensor [N] = [2] (one start column per "
                "row); got list"),
])
def test_a_bad_shadow_is_one_line_naming_it(folders, start, length, says):
    model = model_of(folders, "llada-temp")
    tokens = torch.full((2, 16), model.mask_id)
    msg = _one_line(lambda: model.logits(tokens, torch.arange(16),
                                         shadow=Shadow(start, length)))
    assert msg.startswith(says), msg


@pytest.mark.parametrize("starts,says", [
    ([4, 9], "shadow.start: every start must lie in 0..8 (the 16 canvas columns minus "
             "shadow.length=8)"),
    ([-1, 0], "shadow.start: every start must lie in 0..8"),
    ([3, 2], "shadow.start: a shadowed column is padding (attention_mask 0)"),
])
def test_a_start_out_of_the_canvas_or_on_padding_stops_the_call(folders, starts, says):
    """Checked on the device, without a host read: on the CPU a RuntimeError naming
    ``shadow.start`` (on CUDA a device-side assert)."""
    model = model_of(folders, "llada-temp")
    tokens = torch.full((2, 16), model.mask_id)
    keep = torch.ones(2, 16, dtype=torch.long)
    keep[1, :3] = 0
    msg = _one_line(lambda: model.logits(tokens, torch.arange(16), attention_mask=keep,
                                         shadow=Shadow(torch.tensor(starts), 8)),
                    RuntimeError)
    assert msg.startswith(says), msg


def test_a_shadow_call_reads_nothing_back_to_the_host(folders):
    """No host read inside the call (the decode loop's one read per round stays one), the
    checks of ``shadow.start`` included."""
    from test_host_reads import HostReads

    model = model_of(folders, "sdar")
    tokens = _tokens(model, 2, 24, seed=5)
    keep = torch.ones(2, 24, dtype=torch.long)
    keep[1, :4] = 0
    with HostReads() as reads:
        model.logits(tokens, torch.arange(24), attention_mask=keep,
                     shadow=Shadow(torch.tensor([8, 16]), 8))
    assert reads.log == []


def test_compiled_blocks_take_a_shadow(folders):
    """``compile=blocks`` (dynamo's capture, backend eager): the same logits as the eager
    network, with and without left padding."""
    folder = _folder(folders, "llada-temp")
    model = load_model(str(folder), device="cpu", dtype="float32")
    tokens = _tokens(model, 2, 24, seed=6)
    keep = torch.ones(2, 24, dtype=torch.long)
    keep[1, :4] = 0
    shadow = Shadow(torch.tensor([8, 16]), 8)
    want = [model.logits(tokens, torch.arange(24), attention_mask=m, shadow=shadow)
            for m in (None, keep)]
    torch._dynamo.reset()
    model.compile(scope="blocks", backend="eager")
    try:
        for m, w in zip((None, keep), want):
            assert torch.equal(model.logits(tokens, torch.arange(24), attention_mask=m,
                                            shadow=shadow), w)
    finally:
        torch._dynamo.reset()
