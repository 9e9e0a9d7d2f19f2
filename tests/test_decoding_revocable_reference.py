"""``decoder=wino`` and ``decoder=joint`` with ``rules=reference`` against their published code's
outputs (tests/data/reference_decoders: WINO-DLLM's ``decoding_wino``, SGLang 0.5.23's
``JointThreshold``): every case's tokens, model calls (NFE), re-masks and edits, on the seeded
table models (bidirectional, batches of 8; and block-causal in SGLang's own geometry, which is
our block-diffusion one) and on the bundled tiny-llada and tiny-dream (the first 10 held-out
``arith`` prompts, gen_length 96, blocks of 32)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.prerequisites import family_tier
from helpers.reference_tables import ReferenceTable, reference_cases, table_prompts

from pvf_lmeval.decoding import decode, decode_batch
from pvf_lmeval.models import load_model

pytestmark = pytest.mark.usefixtures("one_thread")

ARITH = Path(__file__).resolve().parent.parent / "tasks" / "arith" / "data" / "test.jsonl"
#: reference file stem -> (decoder, its arguments besides the reference's defaults)
RUNS = {"wino": ("wino", {}), "joint": ("joint", {}),
        "joint-quality": ("joint", {"preset": "llada21-quality"})}


def _check(results, name):
    cases = reference_cases(name)
    got = [(r.tokens, r.nfe, r.remasks, r.edits) for r in results]
    assert got == [(c["tokens"], c["nfe"], c["remasks"], c["edits"]) for c in cases]


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("run", list(RUNS))
def test_table_models_decode_as_the_reference(run, seed):
    decoder, kw = RUNS[run]
    results = decode_batch(ReferenceTable(seed), table_prompts(), decoder, gen_length=32,
                           block_length=16, rules="reference", early_stop=False, **kw)
    _check(results, f"{run}.table{seed}")


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_block_causal_table_decodes_as_sglang(seed):
    """SGLang's own geometry: blocks at absolute multiples of 16, the first holding the prompt's
    5 tokens; the region runs to the end of the third block, so our ``edits`` also count the
    rewrites of the 11 positions after the answer, which the reference's counts leave out."""
    results = decode_batch(ReferenceTable(seed, 16), table_prompts(), "joint", gen_length=32,
                           block_length=16, rules="reference", early_stop=False)
    cases = reference_cases(f"joint-aligned.table{seed}")
    assert [(r.tokens, r.nfe, r.remasks) for r in results] == \
        [(c["tokens"], c["nfe"], c["remasks"]) for c in cases]
    assert all(r.edits >= c["edits"] for r, c in zip(results, cases))


@pytest.fixture(scope="module")
def fixtures():
    loaded = {}

    def get(name):
        if name not in loaded:
            m = load_model(name)
            docs = [json.loads(line) for line in ARITH.read_text().splitlines()[:10]]
            prompts = [m.tokenizer.encode(f"Question: {d['question']}\nAnswer:",
                                          add_special_tokens=False) for d in docs]
            loaded[name] = (m, prompts)
        return loaded[name]
    return get


@pytest.mark.parametrize("model,run", [("tiny-llada", r) for r in RUNS] +
                         [("tiny-dream", "joint"), ("tiny-dream", "joint-quality")])
def test_bundled_models_decode_as_the_reference(fixtures, model, run):
    m, prompts = fixtures(model)
    decoder, kw = RUNS[run]
    results = decode_batch(m, prompts, decoder, gen_length=96, block_length=32,
                           rules="reference", early_stop=False, **kw)
    _check(results, f"{run}.{model}")


@pytest.mark.parametrize("decoder", ["wino", "joint"])
@pytest.mark.parametrize("rules", ["paper", pytest.param("reference", marks=family_tier)])
def test_a_request_decodes_alone_as_in_a_batch_of_8(fixtures, decoder, rules):
    m, prompts = fixtures("tiny-llada")
    kw = dict(gen_length=64, block_length=32, rules=rules, batch_invariant=True)
    together = decode_batch(m, prompts[:8], decoder, **kw)
    assert sum(r.edits + r.remasks for r in together) > 0    # the revocable paths ran
    for i, p in enumerate(prompts[:8]):
        alone = decode(m, p, decoder, request_index=i, **kw)
        assert (alone.tokens, alone.routes, alone.stats() | {"wall_s": 0, "tps": 0}) == \
            (together[i].tokens, together[i].routes,
             together[i].stats() | {"wall_s": 0, "tps": 0}), (decoder, rules, i)
