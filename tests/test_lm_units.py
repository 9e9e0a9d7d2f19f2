"""In-process units of the lm-eval adapter ``pvf-dlm`` (no CLI): the statistics-carrying string,
``until`` cutting and ``gen_tokens``, rank totals, request parameters (``--gen_kwargs``
overrides, ``max_gen_toks`` rounding), evaluator padding, chat templates, argument precedence.

The model-backed tests use the bundled ``tiny-llada`` on the CPU.
"""

from __future__ import annotations

import copy
import json
import logging
import math
import pickle
import random
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("lm_eval")
torch = pytest.importorskip("torch")

from lm_eval.api.instance import Instance  # noqa: E402

from pvf_lmeval.decoding import STAT_KEYS, DecodeResult  # noqa: E402
from pvf_lmeval.lmeval.generation import GenerationText, cut_at_stop, tokens_before  # noqa: E402
from pvf_lmeval.lmeval.lm import PVFDiffusionLM  # noqa: E402
from pvf_lmeval.models.loader import FIXTURES_DIR, load_tokenizer  # noqa: E402
from pvf_lmeval.lmeval.stats import MEAN_KEYS, StatTotals  # noqa: E402
from pvf_lmeval.lmeval.task_metrics import SummedRate, cost_metrics, ratio_of_sums  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
MODEL = "tiny-llada"
ARITH_KWARGS = {"until": ["Question:"], "do_sample": False, "temperature": 0.0, "max_gen_toks": 96}
QUESTION = ("Question: Tom has 15 books. He gets 7 books from Noah. Later he gives 9 books to Noah. "
            "How many books does Tom have now?\nAnswer:")
ANSWER = "Step 1: Tom starts with 15 books.\nSo Tom has 13 books.\n#### 13\n"


@pytest.fixture(autouse=True)
def _one_thread():
    """One intra-op thread: the tiny model gains nothing from more, and on a busy machine
    spinning OpenMP threads make each call many times slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _stats(**kw) -> dict:
    base = {k: 0 for k in STAT_KEYS}
    base.update(kw)
    return base


def _instance(context: str, gen_kwargs: dict, doc_id: int, task: str = "arith") -> Instance:
    return Instance(request_type="generate_until", doc={}, arguments=(context, gen_kwargs), idx=0,
                    metadata=(task, doc_id, 1))


# ---------------------------------------------------------------- GenerationText


def test_generation_text_pickles_and_copies_with_meta():
    g = GenerationText("#### 13", meta=_stats(nfe=7, gen_tokens=3))
    for clone in (pickle.loads(pickle.dumps(g)), copy.deepcopy(g), copy.copy(g)):
        assert type(clone) is GenerationText and clone == "#### 13"
        assert clone.meta == g.meta
    assert GenerationText("x").meta == {}
    # the meta dict is the string's own copy
    src = {"nfe": 1}
    g2 = GenerationText("x", meta=src)
    src["nfe"] = 99
    assert g2.meta == {"nfe": 1}


def test_generation_text_survives_take_first_and_feeds_task_metrics():
    from lm_eval.filters.selection import TakeFirstFilter

    sys.path.insert(0, str(REPO / "tasks" / "arith"))
    try:
        import utils as arith_utils  # the task's own process_results
    finally:
        sys.path.pop(0)
    g = GenerationText("So Tom has 13 books.\n#### 13", meta=_stats(nfe=4, gen_tokens=12, wall_s=0.5))
    (first,) = list(TakeFirstFilter().apply([[g]], [{}]))
    assert first is g and first.meta["nfe"] == 4
    out = arith_utils.process_results({"target": "13"}, [first])
    assert out["exact_match"] == 1.0 and out["nfe"] == 4.0
    assert out["tpf"] == 3.0 and out["tpf"].for_aggregation == (12.0, 4.0)
    assert out["tps"] == 24.0 and json.loads(json.dumps(out))["tps"] == 24.0   # the log's value
    # a plain str (another model type, or after a regex filter): NaN costs, accuracy unchanged
    plain = arith_utils.process_results({"target": "13"}, ["#### 13"])
    assert plain["exact_match"] == 1.0 and math.isnan(plain["nfe"])
    rates = [SummedRate(12.0, 4.0), SummedRate(6.0, 2.0), SummedRate(0.0, 3.0)]
    assert ratio_of_sums(rates) == pytest.approx(18 / 9)          # not the mean rate, 2.0
    assert pickle.loads(pickle.dumps(rates[0])).for_aggregation == (12.0, 4.0)
    assert set(cost_metrics(g)) == set(MEAN_KEYS) | {"tpf", "tps"}


# ---------------------------------------------------------------- until cutting


class CharTokenizer:
    """One token per character; id 0 is end-of-text (a special token)."""

    def encode(self, text, add_special_tokens=False):
        return [ord(c) for c in text]

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i) for i in ids if not (skip_special_tokens and i == 0))


def _fake_lm(tokenizer, eos_ids):
    """What cuts an answer: the sink, with ``tokenizer`` (``eos_ids`` are the results')."""
    from pvf_lmeval.lmeval.sink import Sink

    return SimpleNamespace(sink=Sink(tokenizer=tokenizer, model_name="fake", model_family="fake",
                                     vocab=None, options=None, ranks=None))


def _result(tokens, eos_ids, nfe=4) -> DecodeResult:
    before_eos = next((k for k, t in enumerate(tokens) if t in eos_ids), len(tokens))
    return DecodeResult(tokens=list(tokens), nfe=nfe, branch_rows=nfe, routes=["base"] * len(tokens),
                        committed=len(tokens), gen_tokens=before_eos, gen_length=len(tokens),
                        wall_s=0.25, early_stop=True, tokens_base=len(tokens))


def test_until_cut_with_a_fake_tokenizer():
    tok = CharTokenizer()
    assert cut_at_stop("abcQ:def", ["Q:"]) == 3
    assert cut_at_stop("abcQ:dXf", ["X", "Q:", ""]) == 3
    assert cut_at_stop("abc", ["Q:"]) == 3 and cut_at_stop("abc", []) == 3
    assert tokens_before(tok.encode("hello world"), 5, tok) == 5
    lm = _fake_lm(tok, [0])
    ids = tok.encode("12 + 1 = 13\nQuestion: next") + [0] * 6
    text, stats = lm.sink.text(_result(ids, {0}, nfe=5), ["Question:"])
    assert text == "12 + 1 = 13\n" and type(text) is str
    assert stats["gen_tokens"] == len("12 + 1 = 13\n")
    assert stats["tpf"] == stats["gen_tokens"] / 5
    assert tuple(stats) == STAT_KEYS
    # no stop string: everything before end-of-text counts
    text, stats = lm.sink.text(_result(ids, {0}, nfe=5), [])
    assert text == "12 + 1 = 13\nQuestion: next" and stats["gen_tokens"] == len(text)


def test_until_cut_with_the_fixture_tokenizer():
    tok = load_tokenizer(FIXTURES_DIR / "tiny-llada")
    eos = tok.eos_token_id
    lm = _fake_lm(tok, [eos])
    head = tok.encode(ANSWER, add_special_tokens=False)
    tail = tok.encode("Question: Tom has 3 books.", add_special_tokens=False)
    ids = head + tail + [eos] + tok.encode("Question: x", add_special_tokens=False) + [eos] * 4
    assert tok.decode(head, skip_special_tokens=True) == ANSWER
    text, stats = lm.sink.text(_result(ids, {eos}, nfe=3), ["Question:"])
    assert text == ANSWER
    assert stats["gen_tokens"] == len(head)          # not len(head + tail), not gen_length
    assert stats["committed"] == len(ids) and stats["gen_length"] == len(ids)
    assert stats["tpf"] == pytest.approx(len(head) / 3)
    # a stop string that starts inside a token: that token is not counted
    text, stats = lm.sink.text(_result(ids, {eos}, nfe=3), ["uestion:"])
    assert text == ANSWER + "Q" and stats["gen_tokens"] == len(head)
    # end-of-text first: the text after it is never searched
    text, stats = lm.sink.text(_result(head + [eos] + tail, {eos}, nfe=3), ["Question:"])
    assert text == ANSWER and stats["gen_tokens"] == len(head)


# ---------------------------------------------------------------- rank totals


def test_stat_totals_merged_equals_one_rank_with_all_requests():
    rng = random.Random(0)
    records = []
    for i in range(11):
        nfe = rng.randint(1, 40)
        gen = rng.randint(0, 64)
        records.append(("arith" if i % 3 else "gsm8k",
                        _stats(nfe=nfe, branch_rows=nfe + rng.randint(0, 5), gen_length=64,
                               gen_tokens=gen, committed=gen + 3, wall_s=rng.random(),
                               tokens_base=gen, tokens_plan=rng.randint(0, 4))))
    whole = StatTotals()
    ranks = [StatTotals(), StatTotals(), StatTotals()]   # the third rank gets nothing
    for i, (task, st) in enumerate(records):
        whole.add(task, st)
        ranks[i % 2].add(task, st)
    # states cross processes pickled (all_gather_object); JSON is stricter still
    states = [json.loads(json.dumps(r.state())) for r in ranks]
    merged = StatTotals.merged(states).summary()
    want = whole.summary()
    assert set(merged) == set(want) == {"arith", "gsm8k"}
    for task in want:
        assert merged[task].keys() == want[task].keys()
        for k, v in want[task].items():
            assert merged[task][k] == pytest.approx(v), (task, k)
    arith = [st for t, st in records if t == "arith"]
    assert want["arith"]["requests"] == len(arith)
    assert want["arith"]["nfe_total"] == sum(s["nfe"] for s in arith)
    assert want["arith"]["tpf"] == pytest.approx(sum(s["gen_tokens"] for s in arith) /
                                                 sum(s["nfe"] for s in arith))
    assert StatTotals.merged([{}, {}]).summary() == {}


# ---------------------------------------------------------------- the model-backed adapter


@pytest.fixture(scope="module")
def lm():
    return PVFDiffusionLM.create_from_arg_string(
        f"pretrained={MODEL},decoder=threshold,block_length=64",
        {"batch_size": 1, "max_batch_size": None, "device": "cpu"})


def test_request_params_rounding_and_gen_kwargs_overrides(lm):
    assert lm.params.threshold == 0.9 and lm.params.block_length == 64
    params, until, ignored, _ = lm.planner.request_params(dict(ARITH_KWARGS))
    assert params.gen_length == 128            # max_gen_toks 96 rounded up to blocks of 64
    assert until == ["Question:"] and ignored == [] and params.temperature == 0.0
    assert lm.planner.request_params({"max_new_tokens": 65})[0].gen_length == 128
    assert lm.planner.request_params({"max_gen_toks": 64})[0].gen_length == 64
    params, _, ignored, _ = lm.planner.request_params({**ARITH_KWARGS, "threshold": 0.5,
                                                       "top_p": 1, "num_beams": 1})
    assert params.threshold == 0.5 and lm.params.threshold == 0.9 and params.top_p is None
    assert ignored == ["num_beams"]                    # top_p is a decoding parameter
    with pytest.raises(ValueError, match="unknown generation kwarg 'foo'"):
        lm.planner.request_params({**ARITH_KWARGS, "foo": 1})
    assert lm.planner.request_params({**ARITH_KWARGS, "gen_length": 64})[0].gen_length == 64
    with pytest.raises(ValueError, match="threshold=1.5"):
        lm.planner.request_params({**ARITH_KWARGS, "threshold": 1.5})


def test_explicit_gen_length_wins_over_max_gen_toks():
    lm = PVFDiffusionLM.create_from_arg_string(
        f"pretrained={MODEL},gen_length=32,block_length=32", {"batch_size": 1, "device": "cpu"})
    assert lm.planner.request_params(dict(ARITH_KWARGS))[0].gen_length == 32


def test_generate_until_records_stats_and_skips_padding_copies():
    lm = PVFDiffusionLM.create_from_arg_string(
        f"pretrained={MODEL},decoder=threshold,gen_length=32,block_length=32",
        {"batch_size": 1, "device": "cpu"})
    a = _instance(QUESTION, dict(ARITH_KWARGS), doc_id=0)
    b = _instance(QUESTION.replace("15", "12"), dict(ARITH_KWARGS), doc_id=1)
    # the evaluator pads the last rank by repeating its last request object
    out = lm.generate_until([a, b, b, b])
    assert all(isinstance(o, GenerationText) for o in out)
    assert out[2] is out[1] and out[3] is out[1]
    summary = lm.get_model_info()["pvf"]["totals"]["arith"]
    assert summary["requests"] == 2
    assert summary["nfe_total"] == out[0].meta["nfe"] + out[1].meta["nfe"]
    # a deterministic run of the bundled fixture: its exact text and NFE
    text = (" Step 1: Tom starts with 2 books.\nStep 2: He gets 1 from Noah so so 2 + 1 = 8.\n"
            "Step 3: He gives")
    for o in out[:2]:
        assert (str(o), o.meta["gen_length"], o.meta["nfe"]) == (text, 32, 4)
    # the same request decodes the same way again (deterministic per task/doc/idx)
    again = lm.generate_until([_instance(QUESTION, dict(ARITH_KWARGS), doc_id=0)])
    assert again[0] == out[0] and again[0].meta["nfe"] == out[0].meta["nfe"]


def test_gen_kwargs_threshold_changes_nfe():
    lm = PVFDiffusionLM.create_from_arg_string(
        f"pretrained={MODEL},decoder=threshold,threshold=1.0,gen_length=32,block_length=32",
        {"batch_size": 1, "device": "cpu"})
    strict = lm.generate_until([_instance(QUESTION, dict(ARITH_KWARGS), 0)])[0]
    loose = lm.generate_until([_instance(QUESTION, {**ARITH_KWARGS, "threshold": 0.3}, 0)])[0]
    assert (strict.meta["nfe"], loose.meta["nfe"]) == (29, 1)     # deterministic: exact


def test_chat_template(lm):
    msgs = [{"role": "user", "content": QUESTION}]
    prompt = lm.apply_chat_template(msgs)
    assert prompt.startswith("<|startoftext|><|start_header_id|>user")
    assert prompt.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")
    # a task gen_prefix: lm-eval passes add_generation_prompt=False and the prompt continues it
    cont = lm.apply_chat_template(msgs + [{"role": "assistant", "content": "Step 1:"}],
                                  add_generation_prompt=False)
    assert cont.endswith("assistant<|end_header_id|>\n\nStep 1:")
    assert lm.chat_template() and lm.tokenizer_name == MODEL.replace("/", "__")


def test_tiny_dream_rounds_max_gen_toks_and_has_its_own_template():
    lm = PVFDiffusionLM.create_from_arg_string("pretrained=tiny-dream,decoder=threshold,block_length=64",
                                               {"batch_size": 1, "device": "cpu"})
    prompt = lm.apply_chat_template([{"role": "user", "content": QUESTION}])
    assert prompt.startswith("<|im_start|>system\n") and prompt.endswith("<|im_start|>assistant\n")
    out = lm.generate_until([_instance(QUESTION, dict(ARITH_KWARGS), 0)], disable_tqdm=True)[0]
    assert out.meta["gen_length"] == 128              # max_gen_toks 96 over blocks of 64
    # a deterministic run of the bundled fixture: its exact text and NFE
    assert str(out) == (" Step 1: Tom starts with 3 books.\nStep 2: He gets 1 from Noah, so 2 + 1 = "
                        "3.\nStep 3: He gives away 1, so 3 - 1 = 7.\nSo Tom has 7 books.\n#### 7")
    assert out.meta["nfe"] == 4
    info = lm.get_model_info()["pvf"]
    assert info["model_family"] == "dream" and info["totals"]["arith"]["requests"] == 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU fallback")
def test_model_args_batch_size_wins_and_cli_default_device_falls_back(caplog):
    with caplog.at_level(logging.WARNING, logger="pvf_lmeval"):
        lm = PVFDiffusionLM.create_from_arg_string(
            f"pretrained={MODEL},batch_size=4",
            {"batch_size": 1, "max_batch_size": None, "device": "cuda:0"})  # what the CLI passes
    assert lm.batch_size == 4 and lm.device.type == "cpu"
    assert "no CUDA GPU; using the CPU" in caplog.text
    lm = PVFDiffusionLM.create_from_arg_obj({"pretrained": MODEL, "batch_size": 2},
                                            {"batch_size": 1, "device": "cpu"})
    assert lm.batch_size == 2


def test_builtin_models_resolve_next_to_the_plugin():
    from lm_eval.api.registry import get_model

    assert get_model("pvf-dlm") is PVFDiffusionLM
    assert get_model("hf").__name__ == "HFLM"


def test_reads_is_greedy_per_document_and_for_requests_without_one():
    """One request alone of its (task, document) is read; the choices of a document are not;
    the same object repeated counts once; an object without ``doc_id`` (the Python API's) is."""
    from pvf_lmeval.lmeval.planner import reads_is_greedy

    alone = SimpleNamespace(task_name="lambada", doc_id=0)
    a, b = SimpleNamespace(task_name="piqa", doc_id=0), SimpleNamespace(task_name="piqa", doc_id=0)
    other_task = SimpleNamespace(task_name="arc", doc_id=0)
    no_doc = SimpleNamespace(args=("ctx", " cont"))
    assert reads_is_greedy([alone, a, b, other_task, alone, no_doc]) == [
        True, False, False, True, True, True]


def test_do_sample_without_temperature_is_one_line(lm):
    with pytest.raises(ValueError) as e:
        lm.planner.request_params({**ARITH_KWARGS, "do_sample": True})
    assert str(e.value) == (
        "pvf-dlm: do_sample=True with temperature=0.0 (task generation_kwargs, --gen_kwargs or "
        "the temperature model arg): sampling needs a temperature > 0 (HFLM refuses it too); give "
        "one, e.g. --gen_kwargs do_sample=true,temperature=0.7, or do_sample=false for greedy decoding")
    assert lm.planner.request_params({**ARITH_KWARGS, "do_sample": True,
                                      "temperature": 0.5})[0].temperature == 0.5


def test_a_request_without_a_task_is_planned_under_unknown(lm):
    """lm-eval's Python API may pass bare requests: task "unknown", the document its index;
    greedy requests are lm-eval-cacheable, sampled ones are not."""
    bare = SimpleNamespace(args=(QUESTION, dict(ARITH_KWARGS)))
    sampled = SimpleNamespace(args=(QUESTION, {**ARITH_KWARGS, "do_sample": True, "temperature": 0.5}))
    plan = lm.planner.generation([bare, sampled], seed=0)
    assert [(r.task, r.key, r.cached) for r in plan.requests] == [
        ("unknown", "unknown/0/0", True), ("unknown", "unknown/1/0", False)]


def test_rounding_max_gen_toks_is_noticed_once_per_length():
    lm = PVFDiffusionLM.create_from_arg_string(f"pretrained={MODEL},block_length=64",
                                               {"batch_size": 1, "device": "cpu"})
    said = []
    lm.planner.notice = said.append
    for _ in range(2):
        lm.planner.request_params(dict(ARITH_KWARGS))
    lm.planner.request_params({**ARITH_KWARGS, "max_gen_toks": 64})      # a whole block: silent
    assert said == ["pvf-dlm: gen_length=128 (the task's max_gen_toks=96 rounded up to whole blocks "
                    "of 64); pass gen_length to fix it"]


def test_model_info_says_where_the_seed_came_from(lm):
    assert lm.get_model_info()["pvf"]["seed_from"] == "lm-eval --seed (torch's seed)"
    seeded = PVFDiffusionLM.create_from_arg_string(f"pretrained={MODEL},seed=3",
                                                   {"batch_size": 1, "device": "cpu"})
    assert seeded.get_model_info()["pvf"]["seed_from"] == "seed model arg"


def test_likelihood_costs_sum_over_a_documents_continuations():
    """One document, two continuations: calls, rows and canvases summed, draws per
    continuation; an answer without statistics (read from a cache: a plain float) gives NaN."""
    from pvf_lmeval.lmeval.generation import LikelihoodScore
    from pvf_lmeval.lmeval.task_metrics import likelihood_costs

    a = LikelihoodScore(-1.5, {"nfe": 2, "branch_rows": 16, "canvases": 16, "mc_num": 16})
    b = LikelihoodScore(-0.5, {"nfe": 3, "branch_rows": 16, "canvases": 17, "mc_num": 16})
    assert likelihood_costs([(a, False), (b, True)]) == {
        "nfe": 5.0, "branch_rows": 32.0, "canvases": 33.0, "mc_num": 16.0}
    costs = likelihood_costs([(a, False), (-0.5, True)])
    assert sorted(costs) == ["branch_rows", "canvases", "mc_num", "nfe"]
    assert all(math.isnan(v) for v in costs.values())
