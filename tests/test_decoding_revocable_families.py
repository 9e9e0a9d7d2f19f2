"""``decoder=wino`` and ``decoder=joint`` on every family's network (bidirectional: LLaDA, Dream,
LLaDA-MoE; block-causal: LLaDA 2.x, SDAR, SDAR-MoE, Fast-dLLM v2, RND1), from the bundled
fixtures and the hub-shaped test folders: a request decodes in a left-padded batch of 4 as it
does alone (every statistic, with batch_invariant), and WINO is refused in one line on the
families that shift their logits (its shadow rows cannot hide a position there). The joint
threshold on the three other Qwen-headed families (a 152k-id LM head per call) is the
``PVF_FAMILY_TESTS=1`` tier."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
from helpers.prerequisites import family_tier
from helpers.moe_folders import make_llada2_folder, make_lladamoe_folder
from helpers.qwen_folders import (load_peaked, make_fast_dllm_folder, make_rnd1_folder,
                                  make_sdar_folder)

from pvf_lmeval.decoding import decode, decode_batch
from pvf_lmeval.models import load_model

pytestmark = pytest.mark.usefixtures("one_thread")

#: family -> folder builder (None: a bundled fixture), gen_length, block_length (None: the
#: model's own)
FAMILIES = {
    "llada": ("tiny-llada", 16, 8),
    "dream": ("tiny-dream", 16, 8),
    "llada-moe": (make_lladamoe_folder, 16, 8),
    "llada2": (make_llada2_folder, 32, None),
    "sdar": (make_sdar_folder, 8, None),
    "sdar_moe": (lambda f, seed: make_sdar_folder(f, seed, moe=True), 8, None),
    "fast_dllm": (lambda f, seed: make_fast_dllm_folder(f, seed, bd_size=8), 8, None),
    "rnd1": (make_rnd1_folder, 16, 8),
}
SHIFTED = {"dream", "fast_dllm", "rnd1"}
#: id sequences every test folder's tokenizer holds (small ids), of different lengths; the
#: bundled models read the first held-out ``arith`` questions
PROMPTS = [[220, 17, 25, 4], [40, 41, 42, 43, 44, 45, 46], [30, 31], [50, 51, 52, 53, 54]]
ARITH = Path(__file__).resolve().parent.parent / "tasks" / "arith" / "data" / "test.jsonl"


def prompts_for(name, m):
    if not isinstance(FAMILIES[name][0], str):
        return PROMPTS
    docs = [json.loads(line) for line in ARITH.read_text().splitlines()[:4]]
    return [m.tokenizer.encode(f"Question: {d['question']}\nAnswer:", add_special_tokens=False)
            for d in docs]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """The families' models, each loaded once, when a test first asks."""
    @functools.cache
    def get(name):
        make = FAMILIES[name][0]
        if isinstance(make, str):
            return load_model(make)
        return load_peaked(make(tmp_path_factory.mktemp(name) / "f", seed=3))
    return get


def _kw(name, **more):
    _, gen_length, block_length = FAMILIES[name]
    kw = {"gen_length": gen_length, "batch_invariant": True, **more}
    if block_length is not None:
        kw["block_length"] = block_length
    return kw


def _record(r):
    return (r.tokens, r.routes, r.stats() | {"wall_s": 0, "tps": 0})


TIER = {("joint", "sdar_moe"), ("joint", "fast_dllm"), ("joint", "rnd1"), ("wino", "sdar_moe")}


@pytest.mark.parametrize("decoder,name", [
    pytest.param(d, f, marks=family_tier if (d, f) in TIER else (), id=f"{d}-{f}")
    for d in ("wino", "joint") for f in FAMILIES])
def test_every_family_decodes_alone_as_in_a_batch(models, name, decoder):
    m = models(name)
    kw = _kw(name, threshold=0.3, **({"post_edit_steps": 2} if decoder == "joint" else {}))
    prompts = prompts_for(name, m)
    if decoder == "wino" and name in SHIFTED:
        with pytest.raises(ValueError, match=r"^decoder=wino: .* shifts its logits"):
            decode_batch(m, prompts, decoder, **kw)
        return
    together = decode_batch(m, prompts, decoder, **kw)
    for i, p in enumerate(prompts):
        assert _record(decode(m, p, decoder, request_index=i, **kw)) == _record(together[i]), i
    assert len({tuple(r.tokens) for r in together}) > 1          # the requests really differ
