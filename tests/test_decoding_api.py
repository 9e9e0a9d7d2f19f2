"""``decode``/``decode_batch`` behave as the lm-eval adapter does: ``rules=reference`` plans on
the capitalised tokens of the model's tokenizer too, and ``gen_length`` must fit the model's
context with the prompt (a one-line error naming the three)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from helpers.decoding_tables import PROMPT, TableModel  # noqa: E402

import pvf_lmeval.decoding.api as api  # noqa: E402
from pvf_lmeval.decoding import decode, decode_batch, make_params  # noqa: E402


class Capitals:
    """Ids 10 (" Emma") and 11 ("The") are capitalised; 12 is special (capitalised text, left
    out); every other id decodes to lower case."""

    all_special_ids = [12]

    def __len__(self) -> int:
        return 64

    def decode(self, ids) -> str:
        return {10: " Emma", 11: "The", 12: "<EOS>"}.get(ids[0], " x")


@pytest.fixture
def seen_vocab(monkeypatch):
    """The planning vocabulary each decode hands to the loop."""
    seen = []
    real = api.run
    monkeypatch.setattr(api, "run", lambda *a, **kw: (seen.append(kw["vocab"]), real(*a, **kw))[1])
    return seen


def _model(tokenizer=Capitals(), **attrs):
    model = TableModel(lambda g: {})
    model.tokenizer = tokenizer
    for k, v in attrs.items():
        setattr(model, k, v)
    return model


def test_reference_rules_add_the_capitalised_tokens(seen_vocab):
    decode(_model(), PROMPT, "pvf", gen_length=4, block_length=4, plan_vocab=[3], rules="reference")
    decode(_model(), PROMPT, "pvf", gen_length=4, block_length=4, plan_vocab=[3])
    decode(_model(), PROMPT, "pvf", gen_length=4, block_length=4,
           rules="paper+capitalised_plan_tokens")
    assert [v.ids for v in seen_vocab] == [(3, 10, 11), (3,), (10, 11)]


def test_reference_rules_need_a_tokenizer_and_a_fixed_vocabulary():
    with pytest.raises(ValueError, match=r"^rules=reference plans on capitalised tokens: the model "
                                         r"needs a tokenizer attribute \(or use rules=paper\)$"):
        decode(_model(tokenizer=None), PROMPT, "pvf", gen_length=4, block_length=4, rules="reference")
    # threshold reads no planning vocabulary: no tokenizer needed
    decode(_model(tokenizer=None), PROMPT, "threshold", gen_length=4, block_length=4, rules="reference")
    with pytest.raises(ValueError, match=r"^rules=reference adds capitalised tokens to a fixed "
                                         r"planning vocabulary; an online vocabulary learns its own"):
        decode(_model(), PROMPT, "pvf", gen_length=4, block_length=4, rules="reference",
               online=object())


def test_gen_length_must_fit_the_context_with_the_prompt():
    model = _model(max_length=10)
    decode(model, PROMPT, "threshold", gen_length=7, block_length=7)      # 3 + 7 = 10 fits
    with pytest.raises(ValueError) as info:
        decode(model, PROMPT, "threshold", gen_length=8, block_length=8)
    assert str(info.value) == ("gen_length=8 after a prompt of 3 tokens needs 11 positions, more "
                               "than the model's context of 10 tokens; lower gen_length or shorten "
                               "the prompt")
    with pytest.raises(ValueError, match=r"^gen_length=6 after a prompt of 5 tokens needs 11 "):
        decode_batch(model, [PROMPT, PROMPT + [40, 41]], "threshold", gen_length=6, block_length=6)
    decode(_model(), PROMPT, "threshold", gen_length=64, block_length=64)   # no max_length: unchecked


def test_the_api_decodes_as_the_adapter_under_reference_rules(one_thread):
    """The adapter's rules=reference run (its vocabulary: the capitalised tokens, vocab=none) and
    a plain API call with the same parameters give the same tokens and NFE."""
    pytest.importorskip("lm_eval")
    from helpers.cache_models import arith_prompts

    from pvf_lmeval.lmeval.lm import PVFDiffusionLM

    lm = PVFDiffusionLM(pretrained="tiny-llada", device="cpu", decoder="pvf", preset="arith",
                        vocab="none", rules="reference", gen_length=64, block_length=32)
    prompts, _ = arith_prompts(lm.tokenizer, 3)
    params = lm._with_vocab(lm.params)
    assert params.plan_vocab           # the adapter's capitalised tokens
    want = decode_batch(lm.model, prompts, params=params)
    plain = make_params("pvf", preset="arith", rules="reference", gen_length=64, block_length=32)
    assert plain.plan_vocab is None
    got = decode_batch(lm.model, prompts, params=plain)
    assert [(g.tokens, g.nfe) for g in got] == [(w.tokens, w.nfe) for w in want]
    paper = decode_batch(lm.model, prompts, params=make_params(
        "pvf", preset="arith", rules="paper+force_after_routes+impact_includes_committed+"
        "c_total_over_step_masks+ar_after_failed_plan+fresh_call_after_failed_fill+"
        "self_check_max_prob+count_unmade_calls+factor_last_rank_commits_all",
        gen_length=64, block_length=32))
    assert [(g.tokens, g.nfe) for g in paper] != [(w.tokens, w.nfe) for w in want]


@pytest.mark.parametrize("name,value", [("compile_round", "fast"), ("compile_step", 1)])
def test_compile_options_are_checked_before_any_work(seen_vocab, name, value):
    """``compile_step``/``compile_round`` take True/False/None or torch.compile options; anything
    else is a one-line error naming the argument, before the loop runs."""
    with pytest.raises(ValueError) as err:
        decode(_model(), PROMPT, "threshold", gen_length=4, block_length=4, **{name: value})
    assert str(err.value) == (f"{name}={value!r} must be true, false or a dict of torch.compile "
                              "options")
    assert seen_vocab == []


def test_batch_invariant_needs_a_model_with_its_kernels():
    """``batch_invariant=true`` on a model without ``batch_invariant()`` (a table model here) is a
    one-line error naming the model's class, before any call; off, the same model decodes."""
    model = _model()
    with pytest.raises(ValueError) as err:
        decode(model, PROMPT, "threshold", gen_length=4, block_length=4, batch_invariant=True)
    assert str(err.value) == ("batch_invariant=true: the model (TableModel) has no batch-invariant "
                              "kernels (a loaded pvf_lmeval DiffusionLM has them)")
    assert model.nfe == 0
    decode(model, PROMPT, "threshold", gen_length=4, block_length=4, batch_invariant=False)
    assert model.nfe > 0
