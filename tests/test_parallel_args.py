"""The parallel model args and their checks, in this process: one-line errors before any
process group exists or any weight is read; the layout each rank takes of a model (its parts
of every tensor, by hand); lm-eval's view of one process."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from pvf_lmeval.lmeval.model_args import ModelArgError, check_keys
from pvf_lmeval.lmeval.parallel import HABITS, ParallelArgs, Ranks
from pvf_lmeval.lmeval.settings import RunSettings, parse_parallel
from pvf_lmeval.models import loader
from pvf_lmeval.models.moe import MoEConfig
from pvf_lmeval.models.parallel import SKIP, WHOLE, ParallelLayoutError, Part, Shard, span
from pvf_lmeval.models.transformer import TransformerConfig

W4 = {"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "4"}


@pytest.mark.parametrize("key", sorted(HABITS))
def test_other_backends_habits_point_to_tensor_parallel_size(key):
    with pytest.raises(ModelArgError) as e:
        check_keys({key: "True"})
    msg = str(e.value)
    assert msg.startswith(f"pvf-dlm: {key} is {HABITS[key]}; did you mean "
                          "tensor_parallel_size=N? ") and "\n" not in msg
    assert "torchrun --nproc_per_node N -m lm_eval" in msg


def test_aliases_and_derived_data_parallel():
    run = RunSettings.parse({"tp_size": "2", "dp_size": "2", "decoder": "pvf"}, W4)
    got = run.parallel                                    # their own group, not decoding's
    assert (got.tp, got.dp, got.world, got.layers, got.check_ranks) == (2, 2, 4, "all", False)
    assert run.decoding.decoder == "pvf" and run.decoding.given == {}
    got = parse_parallel({"tensor_parallel_size": 4, "parallel_layers": "experts"},
                         {**W4, "PVF_CHECK_RANKS": "1"})
    assert (got.tp, got.dp, got.layers, got.check_ranks) == (4, 1, "experts", True)
    assert parse_parallel({}, {}) == ParallelArgs(tp=1, dp=1, world=1)
    assert parse_parallel({}, W4).dp == 4                 # plain data parallel


@pytest.mark.parametrize("args,env,says", [
    ({"tensor_parallel_size": 2}, {}, "tensor_parallel_size=2 needs 2 processes per model copy "
     "and this run has one: launch it with torchrun --nproc_per_node 2 -m lm_eval"),
    ({"tensor_parallel_size": 3}, W4, "tensor_parallel_size=3 must divide the launcher's 4 "
     "processes (WORLD_SIZE)"),
    ({"tensor_parallel_size": 4}, {"WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "2"},
     "tensor_parallel_size=4 must divide the 2 processes per node (LOCAL_WORLD_SIZE)"),
    ({"tensor_parallel_size": 2, "data_parallel_size": 4}, W4, "data_parallel_size=4, but 4 "
     "processes at tensor_parallel_size=2 make 2 model copies"),
    ({"tensor_parallel_size": 2, "tp_size": 4}, W4, "tp_size=4 and tensor_parallel_size=2 "
     "disagree"),
    ({"tensor_parallel_size": 0}, W4, "tensor_parallel_size=0 must be a positive integer"),
    ({"tensor_parallel_size": "two"}, W4, "tensor_parallel_size='two' must be a positive"),
    ({"parallel_layers": "heads"}, W4, "parallel_layers='heads' must be one of all, experts"),
    ({}, {**W4, "PVF_CHECK_RANKS": "maybe"}, "PVF_CHECK_RANKS='maybe' must be true or false"),
])
def test_bad_parallel_args_are_one_line(args, env, says):
    with pytest.raises(ModelArgError) as e:
        parse_parallel(dict(args), env)
    assert says in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_the_adapter_checks_before_loading_anything(monkeypatch):
    """No launcher: the error comes before the checkpoint is even looked for."""
    from pvf_lmeval.lmeval.lm import PVFDiffusionLM

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setattr(loader, "checkpoint_folder", lambda *a: pytest.fail("looked it up"))
    with pytest.raises(ModelArgError, match="needs 2 processes per model copy"):
        PVFDiffusionLM(pretrained="/no/such/folder", tp_size=2)


def test_one_process_is_rank_0_of_1():
    ranks = Ranks.launch(ParallelArgs(), "cpu")
    assert (ranks.dp_rank, ranks.dp_size, ranks.mp_rank, ranks.comm, ranks.writes) == \
        (0, 1, 0, None, True)
    assert ranks.gather_object({"a": 1}) == [{"a": 1}] and ranks.gather_world(3) == [3]
    assert torch.equal(ranks.all_gather(torch.tensor(5)), torch.tensor([5]))
    ranks.same_on_every_rank("the requests", [1, 2])      # one rank: nothing to compare


# ------------------------------------------------------------------ the layout of a rank

def _cfg(**kw) -> TransformerConfig:
    base = dict(vocab_size=691, d_model=64, n_layers=2, n_heads=8, n_kv_heads=4, ffn_hidden=100,
                head_size=16, fused_qkv=True,
                moe=MoEConfig(n_experts=8, top_k=2, expert_hidden=32, shared_hidden=48,
                              layers=(False, True)))
    return TransformerConfig(**{**base, **kw})


def test_spans_cover_every_item_once_in_order():
    for n, size in ((691, 2), (100, 3), (8, 8), (5, 4)):
        parts = [span(n, size, r) for r in range(size)]
        assert parts[0][0] == 0 and parts[-1][1] == n
        assert all(a[1] == b[0] for a, b in zip(parts, parts[1:]))
    assert [span(691, 2, r) for r in range(2)] == [(0, 345), (345, 691)]


def test_rank_1_of_2_reads_its_slices():
    s = Shard.plan(_cfg(), 2, 1)
    assert (s.attention, s.mlp, s.head, s.experts) == (True, True, True, (4, 8))
    # fused qkv rows: 8 query heads of 16 (128 rows), then 4 key and 4 value heads (64 each);
    # rank 1 holds query heads 4-7 and key/value heads 2-3
    assert s.part("blocks.0.attn.qkv_proj.weight", None) == Part(
        dim=0, ranges=((64, 128), (128 + 32, 128 + 64), (192 + 32, 192 + 64)))
    assert s.part("blocks.0.attn.o_proj.weight", None) == Part(dim=1, ranges=((64, 128),))
    assert s.part("blocks.0.attn.o_proj.bias", None) == WHOLE
    assert s.part("blocks.0.attn.q_norm.weight", None) == WHOLE
    assert s.part("blocks.0.mlp.gate_proj.weight", None) == Part(dim=0, ranges=((50, 100),))
    assert s.part("blocks.0.mlp.down_proj.weight", None) == Part(dim=1, ranges=((50, 100),))
    assert s.part("blocks.1.mlp.shared.up_proj.weight", None) == Part(dim=0, ranges=((24, 48),))
    assert s.part("blocks.1.mlp.gate_proj", 3) == SKIP
    assert s.part("blocks.1.mlp.gate_proj", 4) == WHOLE
    assert s.part("blocks.1.mlp.gate_proj", None) == Part(dim=0, ranges=((4, 8),))  # stacked
    assert s.part("blocks.1.mlp.router.weight", None) == WHOLE
    assert s.part("lm_head.weight", None) == Part(dim=0, ranges=((345, 691),))
    assert s.part("embed.weight", None) == WHOLE
    assert s.notes() == []


def test_separate_projections_and_their_biases():
    s = Shard.plan(_cfg(fused_qkv=False, qkv_bias=True), 2, 0)
    assert s.part("blocks.0.attn.q_proj.bias", None) == Part(dim=0, ranges=((0, 64),))
    assert s.part("blocks.0.attn.k_proj.weight", None) == Part(dim=0, ranges=((0, 32),))
    assert s.part("blocks.0.attn.v_proj.bias", None) == Part(dim=0, ranges=((0, 32),))


def test_attention_replicated_when_the_kv_heads_do_not_split():
    s = Shard.plan(_cfg(), 8, 5)
    assert not s.attention and s.mlp and s.experts == (5, 6)
    assert s.part("blocks.0.attn.qkv_proj.weight", None) == WHOLE
    assert s.notes() == ["attention is replicated on each of the 8 ranks: its 4 key/value heads "
                         "do not split over 8"]


def test_experts_only_splits_nothing_else():
    s = Shard.plan(_cfg(), 2, 0, "experts")
    assert (s.attention, s.mlp, s.head, s.experts) == (False, False, False, (0, 4))
    for name in ("blocks.0.attn.qkv_proj.weight", "blocks.0.mlp.down_proj.weight",
                 "lm_head.weight", "blocks.1.mlp.shared.down_proj.weight"):
        assert s.part(name, None) == WHOLE
    assert s.part("blocks.1.mlp.up_proj", 5) == SKIP


@pytest.mark.parametrize("kw,size,layers,says", [
    ({}, 3, "all", "tensor_parallel_size=3 must divide the model's 8 routed experts"),
    ({"moe": None}, 2, "experts", "parallel_layers=experts: the model is dense"),
])
def test_layouts_a_model_cannot_take(kw, size, layers, says):
    with pytest.raises(ParallelLayoutError, match=says):
        Shard.plan(_cfg(**kw), size, 0, layers)


def test_the_layout_is_checked_before_any_weight_is_read(monkeypatch):
    """load_model refuses a layout after reading config.json and the headers, never a tensor."""
    monkeypatch.setattr(loader, "_open_safetensors", lambda *a: pytest.fail("read a weight"))
    with pytest.raises(ParallelLayoutError, match="parallel_layers=experts: the model is dense"):
        loader.load_model("tiny-llada", device="cpu", comm=SimpleNamespace(size=2, rank=0),
                          parallel_layers="experts")
