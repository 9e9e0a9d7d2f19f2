"""The loop's seams for revocable, holding and hooked decoders (docs/design.md, "Seams of the
loop"): edits and remasks counted once in settle, held blocks, calls counted without being made,
settled-position early stop, the block-granular stop switch, the call hook's carry, draw plans,
the seed switch and the cache modes a decoder allows. Each test drives a small step of its own
through the one loop over a hand-written probability table."""

import pytest
import torch
from helpers.decoding_tables import EOS, MASK, PROMPT, TableModel, filled

from pvf_lmeval.decoding import make_params
from pvf_lmeval.decoding.batch import Batch, mix_seed
from pvf_lmeval.decoding.draws import Draw
from pvf_lmeval.decoding.hooks import HookOut
from pvf_lmeval.decoding.loop import run
from pvf_lmeval.decoding.stats import stats_from_logits
from pvf_lmeval.decoding.step import BASE, NONE, Choice, Step, single_row
from pvf_lmeval.decoding.threshold import ThresholdDecoder


def _decode(step_cls, table, *, rules="paper", **kw):
    """(result, model) of ``step_cls`` decoding PROMPT over ``table`` (gen 8, blocks 4)."""
    kw.setdefault("gen_length", 8)
    kw.setdefault("block_length", 4)
    m = TableModel(table)
    params = make_params("threshold", rules=rules, **kw)
    [r] = run(m, [torch.tensor(PROMPT)], params, step_cls(params))
    assert r.nfe >= m.nfe
    return r, m


class Scripted(Step):
    """A single-row step that follows ``script[t]`` in round t (its last entry after that):
    {position: token} writes (a token, MASK, or None: the model's token where the position is
    open), labelled base where they fill an open position, unlabelled otherwise."""

    name = "scripted"
    script: list = []

    def start(self, b):
        return {"t": torch.zeros(b.n, dtype=torch.long, device=b.device)}

    def branches(self, b, y, st, state=None, draws=()):
        z, lab = y.clone(), torch.zeros_like(y, dtype=torch.int8)
        t = int(state["t"][0])     # a test step: one request, read on the host
        for j, tok in self.script[min(t, len(self.script) - 1)].items():
            if tok is None and int(y[0, j]) != MASK:
                continue
            tok = int(st.tok[0, j]) if tok is None else tok
            if int(y[0, j]) == MASK and tok != MASK:
                lab[0, j] = BASE
            z[0, j] = tok
        br = single_row(b, z, lab, settled=self.settled(b, z == MASK, state))
        br.memo["t"] = state["t"]
        return br

    def choose(self, b, y, st, br, out):
        return Choice(torch.zeros_like(br.n), br.labels, state={"t": br.memo["t"] + 1})


def scripted(script, **attrs):
    """A :class:`Scripted` step class over ``script`` with class attributes ``attrs``."""
    return type("S", (Scripted,), dict(attrs, script=script))


# ------------------------------------------------------------ revocable commits


def test_edits_and_remasks_are_counted_and_routed():
    # round 0 fills 0, 1; round 1 edits 0 (10 -> 20), remasks 1 and fills 2; round 2 fills the
    # rest with the model's tokens
    script = [{0: 10, 1: 11}, {0: 20, 1: MASK, 2: 12}, {j: None for j in range(8)}]
    table = lambda g: {j: (30 + j, .9) for j in range(8)}
    r, m = _decode(scripted(script, revocable=True), table, early_stop=False)
    assert r.tokens == [20, 31, 12, 33, 34, 35, 36, 37]
    assert (r.edits, r.remasks, r.tokens_edit) == (1, 1, 1)
    assert r.routes == ["edit"] + ["base"] * 7           # 1: re-filled after its remask
    assert r.committed == 8 and r.nfe == m.nfe == 3


def test_a_step_that_is_not_revocable_keeps_its_routes_and_still_counts_edits():
    script = [{0: 10, 1: 11}, {0: 20, 2: 12}, {j: None for j in range(8)}]
    table = lambda g: {j: (30 + j, .9) for j in range(8)}
    r, _ = _decode(scripted(script), table, early_stop=False)
    assert (r.edits, r.remasks, r.tokens_edit) == (1, 0, 0)
    assert r.routes == ["base"] * 8


def test_a_remask_after_the_last_fill_keeps_the_request_live():
    # round 1 fills every open position but remasks 0: not finished, one more round fills it
    script = [{0: 10}, {0: MASK, **{j: 11 for j in range(1, 8)}}, {0: 9}]
    r, m = _decode(scripted(script, revocable=True), lambda g: {}, early_stop=False)
    assert r.tokens == [9] + [11] * 7 and (r.remasks, r.edits) == (1, 0)
    assert m.nfe == 3


def test_revoking_a_settled_position_is_a_decoder_bug_the_loop_names():
    # round 0 fills block 0, so block 1 is active; round 1 edits 0, in the settled block 0
    script = [{j: 10 + j for j in range(4)}, {0: 20, 4: 14}, {j: None for j in range(8)}]
    with pytest.raises(RuntimeError, match="decoder 'scripted' remasked or edited a settled "
                                           "position"):
        _decode(scripted(script, revocable=True), lambda g: {}, early_stop=False)
    script[1] = {0: MASK, 4: 14}
    with pytest.raises(RuntimeError, match="remasked or edited a settled position"):
        _decode(scripted(script, revocable=True), lambda g: {}, early_stop=False)
    script[1] = {3: 20, 4: 14}          # not revocable: its own business (pvf's reference)
    r, _ = _decode(scripted(script), lambda g: {}, early_stop=False)
    assert r.edits == 1


# ------------------------------------------------------------ settled early stop


def test_early_stop_reads_only_settled_positions_of_a_revocable_step():
    # EOS at 0 in round 0; the rest of block 0 in round 1, block 1 in rounds 2 and 3
    script = [{0: EOS}, {1: 11, 2: 12, 3: 13}, {4: 14}, {5: 15, 6: 16, 7: 17}]
    table = lambda g: {}
    plain, _ = _decode(scripted(script), table)
    assert plain.tokens == [EOS] * 8 and plain.nfe == 1         # stops at once
    rev, _ = _decode(scripted(script, revocable=True), table)
    # block 0 settles when block 1 becomes the active block (round 1's commit)
    assert rev.tokens == [EOS] * 8 and rev.nfe == 2
    assert rev.routes == ["base"] + [None] * 7


def test_stop_after_block_keeps_the_block_and_fills_after_it():
    script = [{0: 10, 1: EOS}, {2: 12, 3: 13}, {4: 14}, {5: 15, 6: 16, 7: 17}]
    cls = scripted(script, loop_switches=("stop_after_block",))
    r, _ = _decode(cls, lambda g: {}, rules="reference")
    assert r.tokens == [10, EOS, 12, 13] + [EOS] * 4
    assert r.routes == ["base"] * 4 + [None] * 4 and r.nfe == 2 and r.gen_tokens == 1
    # under the paper's rules the switch is off: the stop at EOS itself
    r, _ = _decode(cls, lambda g: {}, rules="paper")
    assert r.tokens == [10, EOS] + [EOS] * 6 and r.nfe == 1


# ------------------------------------------------------------ held blocks, unmade calls


def test_a_held_block_keeps_calling_and_unmade_calls_count_for_finished_requests():
    class H(Step):
        name = "h"

        def start(self, b):
            return {"held": torch.zeros(b.n, dtype=torch.long, device=b.device)}

        def branches(self, b, y, st, state=None, draws=()):
            z = torch.where(b.working_set(y), st.tok, y)
            full = ~(z == MASK).any(-1)
            hold = full & (state["held"] < 2)           # two rounds on the filled canvas
            br = single_row(b, z, torch.where(z != y, BASE, NONE).to(torch.int8), hold=hold)
            br.cover = torch.zeros_like(br.n)
            br.memo.update(hold=hold, full=full, held=state["held"])
            return br

        def choose(self, b, y, st, br, out):
            m = br.memo
            return Choice(torch.zeros_like(br.n), br.labels, hold=m["hold"],
                          unmade=(m["full"] & ~m["hold"]).long() * 3,
                          state={"held": m["held"] + m["full"].long()})

    table = lambda g: {j: (30 + j, .9) for j in range(4)}
    r, m = _decode(H, table, gen_length=4, block_length=4)
    # initial call; round 0 fills everything (call on the full canvas, held), round 1 holds
    # (call), round 2 releases without a call and counts 3 unmade calls
    assert m.nfe == 3 and r.nfe == 3 + 3
    assert r.tokens == [30, 31, 32, 33] and (r.edits, r.remasks) == (0, 0)


# ------------------------------------------------------------ call hook and carry


def test_the_call_hook_carry_follows_the_committed_row_from_call_to_call():
    class Counted(Step):
        """Commits the leftmost open position with token 10 + the number of calls that covered
        it so far (the hook's carry, 1 after the initial call)."""

        name = "counted"

        def call_hook(self, b, view):
            n = (view.carry[..., 0] if view.carry is not None
                 else torch.zeros_like(view.gpos, dtype=torch.float32)) + 1
            return HookOut(view.logits, carry=n[..., None], extra={"n": n})

        def branches(self, b, y, st, state=None, draws=()):
            W = b.working_set(y)
            first = W & (W.cumsum(-1) == 1)
            z = torch.where(first, 10 + st.extra["n"].long(), y)
            return single_row(b, z, torch.where(first, BASE, NONE).to(torch.int8))

    r, m = _decode(Counted, lambda g: {}, gen_length=4, block_length=4)
    assert r.tokens == [11, 12, 13, 14] and m.nfe == 4


# ------------------------------------------------------------ draws, seeds, statistics


def test_a_draw_plan_draws_per_request_in_order_and_when_asked():
    m = TableModel(lambda g: {})
    params = make_params("threshold", gen_length=4, block_length=4, seed=3)
    b = Batch(m, [torch.tensor(PROMPT)] * 2, params, request_indices=[0, 1],
              repeat_indices=[0, 0])
    when = torch.tensor([True, False])
    u, e, k = b.draw((Draw("uniform", (2,)), Draw("exponential", (3,), when=when),
                      Draw("randint", (2,), high=7)))
    g0 = torch.Generator().manual_seed(mix_seed(3, 0, 0))
    assert torch.equal(u[0], torch.rand(2, generator=g0))
    assert torch.equal(e[0], torch.empty(3).exponential_(generator=g0))
    assert torch.equal(k[0], torch.randint(0, 7, (2,), generator=g0))
    g1 = torch.Generator().manual_seed(mix_seed(3, 1, 0))
    assert torch.equal(u[1], torch.rand(2, generator=g1))
    assert torch.equal(e[1], torch.zeros(3))                    # request 1 did not draw it
    assert torch.equal(k[1], torch.randint(0, 7, (2,), generator=g1))


def test_exponential_draws_sample_as_multinomial_does():
    p = torch.softmax(torch.randn(5, 11, generator=torch.Generator().manual_seed(0)), -1)
    for seed in range(20):
        g = torch.Generator().manual_seed(seed)
        want = torch.multinomial(p, 1, generator=g)[:, 0]
        g = torch.Generator().manual_seed(seed)
        e = torch.empty_like(p).exponential_(generator=g)
        assert torch.equal((p / e).argmax(-1), want)


def test_the_torch_seed_switch_seeds_every_request_with_the_seed_itself():
    m = TableModel(lambda g: {})
    params = make_params("threshold", gen_length=4, block_length=4, seed=5, rules="reference")
    b = Batch(m, [torch.tensor(PROMPT)] * 2, params, request_indices=[0, 1],
              repeat_indices=[0, 0], switches={"torch_seed"})
    want = torch.rand(4, generator=torch.Generator().manual_seed(5))
    [u] = b.draw((Draw("uniform", (4,)),))
    assert torch.equal(u[0], want) and torch.equal(u[1], want)
    b = Batch(m, [torch.tensor(PROMPT)], params, request_indices=[0], repeat_indices=[0])
    [u] = b.draw((Draw("uniform", (4,)),))
    assert not torch.equal(u[0], want)


def test_statistics_switches_mask_in_the_argmax_and_float64():
    logits = torch.tensor([[[0.0, 1.0, 3.0], [2.0, 0.5, 1.0]]])      # mask id 2
    cur = torch.full((1, 2), 2)
    tok, conf, _, _ = stats_from_logits(logits.clone(), cur, 2)
    assert tok.tolist() == [[1, 0]] and conf.dtype == torch.float32
    tok, conf, _, _ = stats_from_logits(logits.clone(), cur, None, float64=True)
    assert tok.tolist() == [[2, 0]] and conf.dtype == torch.float64
    lg = logits.double()
    assert torch.equal(conf, torch.exp(lg.max(-1).values - torch.logsumexp(lg, -1)))


class MaskFavoured:
    """Every position's logits: the mask id highest (3.0), token 7 next (2.0), the rest 0."""

    mask_id, eos_ids = MASK, (EOS,)

    def logits(self, tokens, positions, *, attention_mask=None, cache=None):
        out = torch.zeros(tokens.shape[0], positions.shape[-1], MASK + 1)
        out[..., MASK], out[..., 7] = 3.0, 2.0
        return out


def test_the_runner_applies_the_statistics_switches_a_step_names():
    from pvf_lmeval.decoding.runner import Runner

    m = MaskFavoured()
    params = make_params("threshold", gen_length=4, block_length=4, rules="reference")
    rows = torch.full((1, 1, 4), MASK)
    for switches, tok, dtype in ((set(), 7, torch.float32),
                                 ({"argmax_over_mask", "softmax64"}, MASK, torch.float64)):
        b = Batch(m, [torch.tensor(PROMPT)], params, request_indices=[0], repeat_indices=[0],
                  switches=switches)
        st = Runner(m, b).call(rows, torch.ones(1, dtype=torch.long))
        assert st.tok[0, 0].tolist() == [tok] * 4 and st.conf.dtype == dtype


def test_a_loop_switch_the_loop_does_not_know_is_refused():
    class Bad(Step):
        loop_switches = ("stop_after_blocks",)

    with pytest.raises(TypeError, match="stop_after_blocks"):
        Bad(make_params("threshold"))


def test_a_cache_mode_the_decoder_does_not_allow_is_refused_in_one_line(monkeypatch):
    monkeypatch.setattr(ThresholdDecoder, "caches", ("none", "prefix"))
    make_params("threshold", cache="prefix")
    with pytest.raises(ValueError) as e:
        make_params("threshold", cache="dual")
    assert str(e.value) == "cache=dual: decoder=threshold allows cache=none|prefix"
