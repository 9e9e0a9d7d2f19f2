"""Parameter validation (one-line ValueErrors naming the argument), coercion and presets."""

import pytest

from pvf_lmeval.decoding import (DECODERS, PARAM_NAMES, DecodeParams, make_params, override,
                                 preset_defaults, task_family, validate_params)


@pytest.mark.parametrize("kw, needle", [
    (dict(decoder="foo"), "decoder='foo' is not one of static, threshold, eb, freedave, pvf, explore, "
     "subblock, hierarchy, credit, wino, joint, pvf-edit, renoise"),
    (dict(gen_length=100, block_length=32), "gen_length=100 must be a multiple of block_length=32"),
    (dict(gen_length=0), "gen_length=0"),
    (dict(block_length=0), "block_length=0"),
    (dict(threshold=1.5), "threshold=1.5 must be in (0, 1]"),
    (dict(threshold=0.0), "threshold=0.0 must be in (0, 1]"),
    (dict(decoder="pvf", plan_hi=0.95), "plan_hi=0.95 must not exceed threshold=0.9"),
    (dict(decoder="pvf", plan_lo=0.7, plan_hi=0.65), "plan_lo=0.7 must be < plan_hi=0.65"),
    (dict(decoder="pvf", threshold=0.5), "plan_hi=0.65 must not exceed threshold=0.5"),
    (dict(plan_lo=-0.1), "plan_lo=-0.1 must be in [0, 1]"),
    (dict(ar_lo=1.2), "ar_lo=1.2 must be in [0, 1]"),
    (dict(width=0), "width=0 must be >= 1"),
    (dict(routes="foo"), "routes='foo' must be one of plan+ar, plan, ar, none"),
    (dict(decoder="static", steps=10, gen_length=128, block_length=32),
     "steps=10 must be a multiple"),
    (dict(decoder="static", steps=256, gen_length=128, block_length=32), "at most gen_length=128"),
    (dict(decoder="static", steps=0, gen_length=128, block_length=32), "steps=0"),
    (dict(decoder="threshold", steps=4), "steps=4 applies only to decoder=static"),
    (dict(pick="best"), "pick='best' must be one of random, planning"),
    (dict(band="0.6:0.2"), "band='0.6:0.2' must be lo:hi with 0 <= lo <= hi <= 1"),
    (dict(band="0.2"), "band='0.2'"),
    (dict(band="a:b"), "band='a:b'"),
    (dict(band="0.2:1.5"), "band='0.2:1.5'"),
    (dict(temperature=-1), "temperature=-1.0 must be >= 0"),
    (dict(draft_steps=0), "draft_steps=0 must be >= 1"),
    (dict(base_rule="greedy"), "base_rule='greedy' must be one of static, threshold"),
    (dict(factor=0), "factor=0.0 must be > 0"),
    (dict(decoder="pvf", factor=1.0), "factor=1.0 applies only to decoder=threshold"),
    (dict(reveal_next=-1), "reveal_next=-1 must be >= 0"),
    (dict(gen_length="abc"), "gen_length='abc' must be an integer"),
    (dict(threshold="high"), "threshold='high' must be a number"),
    (dict(early_stop="maybe"), "early_stop='maybe' must be true or false"),
    (dict(width=True), "width=True must be an integer"),
    (dict(plan_vocab="Step"), "plan_vocab='Step' must be a collection of token ids "
                              "(resolve names/artifacts before decoding)"),
    (dict(plan_vocab=[1, -2]), "plan_vocab=[1, -2] must be a collection of token ids "
                               "(resolve names/artifacts before decoding)"),
    (dict(plan_vocab=b"ab"), "plan_vocab=b'ab' must be"),
    (dict(plan_vocab=3.5), "plan_vocab=3.5 must be"),
    (dict(plan_vocab=[2, True]), "plan_vocab=[2, True] must be"),
    (dict(plan_vocab=[2, 3.0]), "plan_vocab=[2, 3.0] must be"),
    # the value is shown up to 60 characters
    (dict(plan_vocab=list(range(30)) + [-1]),
     "plan_vocab=[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 1 must be"),
    (dict(preset="squad"), "preset='squad' is not one of gsm8k, arith, mmlu_pro, humaneval, math, llada21-quality, llada21-speed"),
    (dict(foo=1), "unknown decoding argument 'foo'; allowed: " + ", ".join(PARAM_NAMES)),
])
def test_bad_arguments(kw, needle):
    kw = dict(kw)
    dec = kw.pop("decoder", "threshold")
    with pytest.raises(ValueError) as ei:
        make_params(dec, **kw)
    msg = str(ei.value)
    assert needle in msg
    assert "\n" not in msg


@pytest.mark.parametrize("fields, message", [
    (dict(width=0), "width=0 must be >= 1"),
    (dict(decoder="foo"), "decoder='foo' is not one of static, threshold, eb, freedave, pvf, explore, "
     "subblock, hierarchy, credit, wino, joint, pvf-edit, renoise"),
    (dict(gen_length=0), "gen_length=0 must be >= 1"),
    (dict(block_length=0), "block_length=0 must be >= 1"),
    (dict(decoder="static", steps=0), "steps=0 must be a multiple of the number of blocks (4) "
                                      "and at most gen_length=128"),
    (dict(decoder="static", steps=6), "steps=6 must be a multiple of the number of blocks (4) "
                                      "and at most gen_length=128"),
    (dict(decoder="static", steps=132), "steps=132 must be a multiple of the number of blocks "
                                        "(4) and at most gen_length=128"),
    (dict(factor=0.0), "factor=0.0 must be > 0"),
    (dict(decoder="static", factor=2.0),
     "factor=2.0 applies only to decoder=threshold (or freedave with base_rule=threshold)"),
    (dict(temperature=-0.5), "temperature=-0.5 must be >= 0"),
    (dict(draft_steps=0), "draft_steps=0 must be >= 1"),
    (dict(base_rule="greedy"), "base_rule='greedy' must be one of static, threshold"),
    (dict(ar_lo=1.5), "ar_lo=1.5 must be in [0, 1]"),
    (dict(plan_lo=-0.5), "plan_lo=-0.5 must be in [0, 1]"),
    (dict(reveal_next=-1), "reveal_next=-1 must be >= 0"),
    (dict(routes="foo"), "routes='foo' must be one of plan+ar, plan, ar, none"),
    (dict(pick="best"), "pick='best' must be one of random, planning"),
    (dict(cache="all"), "cache='all' must be one of none, prefix, dual, dual_base"),
    (dict(band=(0.6, 0.2)), "band=0.6:0.2 must be lo:hi with 0 <= lo <= hi <= 1"),
    (dict(preset="squad"), "preset='squad' is not one of gsm8k, arith, mmlu_pro, humaneval, math, llada21-quality, llada21-speed"),
])
def test_validate_params_direct(fields, message):
    """Parameters built without ``make_params`` (a dataclass) get the same one-line errors."""
    with pytest.raises(ValueError) as err:
        validate_params(DecodeParams(**{"gen_length": 128, "block_length": 32, **fields}))
    assert str(err.value) == message


def test_validate_params_boundaries():
    p = DecodeParams()
    assert validate_params(p) is p
    for fields in (dict(gen_length=1, block_length=1), dict(decoder="static", gen_length=32,
                                                            block_length=32, steps=1),
                   dict(decoder="static", gen_length=64, block_length=32, steps=64),
                   dict(ar_lo=1.0, plan_lo=0.0), dict(ar_lo=0.0, threshold=1.0),
                   dict(temperature=0.0), dict(reveal_next=0), dict(band=(0.3, 0.3))):
        assert validate_params(DecodeParams(**fields)) == DecodeParams(**fields)


def test_defaults_no_preset():
    p = make_params("pvf")
    assert (p.threshold, p.plan_lo, p.plan_hi, p.ar_lo, p.width, p.reveal_next) == \
        (0.9, 0.2, 0.65, 0.1, 3, 0)
    assert p.routes == "plan+ar" and p.band == (0.2, 0.6) and p.pick == "random"
    assert p.preset is None and p.family is None


M = 1 << 24      # the positions cap (docs/security.md), written out: 16,777,216


@pytest.mark.parametrize("decoder, kw", [
    ("threshold", dict(gen_length=M, block_length=32)),
    ("threshold", dict(gen_length=M, block_length=M)),
    ("static", dict(gen_length=M, block_length=M, steps=M)),
    ("pvf", dict(reveal_next=M)),
], ids=["gen_length", "block_length", "steps", "reveal_next"])
def test_the_positions_cap_is_inclusive(decoder, kw):
    """A position count of exactly the cap is accepted (block_length and steps above it are
    refused through gen_length, which they may not exceed)."""
    p = make_params(decoder, **kw)
    assert [getattr(p, k) for k in kw] == list(kw.values())


@pytest.mark.parametrize("kw", [dict(gen_length=M + 32, block_length=32), dict(reveal_next=M + 1)],
                         ids=["gen_length", "reveal_next"])
def test_one_position_past_the_cap_is_refused(kw):
    name, value = next(iter(kw.items()))
    with pytest.raises(ValueError, match=f"^{name}={value} must be at most {M} positions$"):
        make_params("pvf", **kw)


@pytest.mark.parametrize("preset, fam, band, ar, ns", [
    ("gsm8k", "math-word", (0.2, 0.65), 0.1, 5),
    ("arith", "math-word", (0.2, 0.65), 0.1, 5),
    ("mmlu_pro", "knowledge", (0.2, 0.65), 0.1, 5),
    ("humaneval", "code", (0.8, 0.9), 0.3, 0),
    ("math", "math", (0.8, 0.9), 0.3, 0),
])
def test_presets(preset, fam, band, ar, ns):
    assert task_family(preset) == fam
    p = make_params("pvf", preset=preset)
    assert (p.plan_lo, p.plan_hi) == band and p.ar_lo == ar and p.reveal_next == ns
    assert p.threshold == 0.9 and p.width == 3 and p.family == fam
    # explicit arguments override the preset
    q = make_params("pvf", preset=preset, reveal_next=1, ar_lo=0.05, plan_lo=0.3)
    assert (q.reveal_next, q.ar_lo, q.plan_lo) == (1, 0.05, 0.3)


def test_sweep_band_for_code_and_math():
    assert preset_defaults("humaneval", 0.8)["plan_lo"] == 0.4
    p = make_params("pvf", preset="math", threshold=0.7)
    assert (p.plan_lo, p.plan_hi) == (0.4, 0.6)
    p = make_params("pvf", preset="math", threshold=0.7, plan_lo=0.5, plan_hi=0.65)
    assert (p.plan_lo, p.plan_hi) == (0.5, 0.65)
    p = make_params("pvf", preset="gsm8k", threshold=0.7)  # math-word keeps its band
    assert (p.plan_lo, p.plan_hi) == (0.2, 0.65)
    assert task_family(None) is None


@pytest.mark.parametrize("text, value", [("true", True), ("True", True), (" 1 ", True),
                                         ("yes", True), ("YES", True), ("false", False),
                                         ("0", False), ("no", False), (" No", False)])
def test_boolean_spellings(text, value):
    assert make_params("pvf", early_stop=text).early_stop is value
    assert make_params("pvf", early_stop=int(value)).early_stop is value


def test_coercion_from_strings():
    p = make_params("pvf", gen_length="64", block_length="16", threshold="0.95", width="2",
                    early_stop="false", plan_self_check="true", band="0.1:0.5",
                    plan_vocab=[5, 3, 5], routes="ar", temperature="0")
    assert p.gen_length == 64 and p.block_length == 16 and p.threshold == 0.95
    assert p.width == 2 and p.early_stop is False and p.plan_self_check is True
    assert p.band == (0.1, 0.5) and p.plan_vocab == (3, 5) and p.routes == "ar"
    # None means "default"
    assert make_params(None, threshold=None, width=None) == make_params("threshold")


def test_scalars_of_tensors_and_spelled_out_no_preset():
    import torch
    p = make_params(gen_length=torch.tensor(64), block_length=torch.tensor(32.0), seed=3.0)
    assert (p.gen_length, p.block_length, p.seed) == (64, 32, 3)
    assert type(p.gen_length) is int and type(p.block_length) is int
    with pytest.raises(ValueError) as err:
        make_params(gen_length=torch.tensor(64.5))
    assert str(err.value) == "gen_length=64.5 must be an integer"
    for none in ("", "none"):
        assert make_params("pvf", preset=none) == make_params("pvf")
        assert make_params("pvf", preset=none).preset is None
    assert task_family("") is None and task_family(None) is None
    assert task_family("gsm8k") == "math-word"


def test_plan_vocab_tensor_and_set():
    import torch
    assert make_params(plan_vocab=torch.tensor([4, 2])).plan_vocab == (2, 4)
    assert make_params(plan_vocab={7}).plan_vocab == (7,)
    assert make_params(plan_vocab=torch.tensor(4)).plan_vocab == (4,)
    assert make_params(plan_vocab=[]).plan_vocab == ()
    assert make_params(plan_vocab=None).plan_vocab is None


def test_static_steps_ok():
    p = make_params("static", steps=8, gen_length=128, block_length=32)
    assert p.steps == 8 and p.num_blocks == 4


def test_factor_ok_for_freedave_threshold_rule():
    assert make_params("freedave", base_rule="threshold", factor=1.0).factor == 1.0


def test_override():
    p = make_params("pvf", preset="gsm8k")
    q = override(p, gen_length=64, block_length=16, band="0.3:0.4")
    assert q.gen_length == 64 and q.band == (0.3, 0.4) and q.reveal_next == 5
    with pytest.raises(ValueError, match="gen_length=63"):
        override(p, gen_length=63)


def test_names():
    assert tuple(DECODERS) == ("static", "threshold", "eb", "freedave", "pvf", "explore",
                               "subblock", "hierarchy", "credit", "wino", "joint", "pvf-edit",
                               "renoise")
    assert "plan_vocab" in PARAM_NAMES and "band" in PARAM_NAMES
