"""``renoise``: DiffusionGemma's sampler as released (transformers' ``generate`` for
``DiffusionGemmaForBlockDiffusion``), on a uniform-state canvas (docs/decoding.md, "renoise").

The region is ``gen_length / canvas_length`` canvases, denoised one after the other. A canvas
starts as uniform random tokens; every denoising step is one model call on the context
(prompt and committed canvases) and the canvas, with the previous step's processed logits as
self-conditioning (none at a canvas's first step), and then, with ``z`` = logits / T (T linear
from ``t_max`` at the first step to ``t_min + (t_max - t_min) / N`` at step N):

- a sample per position from softmax(z) (the race ``argmax(p / E)``, E exponential draws: the
  arithmetic of ``torch.multinomial``), the argmax, the entropy;
- the accepted set: the lowest-entropy positions while the entropies before each sum to at most
  ``entropy_bound`` (at least the lowest one); they keep their sample, every other position
  gets a new uniform random token (every step; acceptance is not a commit);
- the stop rule: the argmax canvas equal to the last ``stability_threshold`` ones and the mean
  entropy below ``confidence_threshold``, or ``max_denoising_steps`` calls; the canvas's argmax
  is then committed, and the next canvas starts (none after the last, or after a canvas holding
  an end-of-text id under early stop).

Every call is a denoising call (NFE). Draws per request, in transformers' order: the first
canvas, then per step the exponentials (at the call) and the re-noise tokens, then the next
canvas's tokens when one starts. ``rules=reference`` seeds the generator with ``seed`` itself
(``torch_seed``): at batch 1 on the CPU the tokens and calls are ``generate``'s after
``torch.manual_seed(seed)``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from .draws import Draw
from .hooks import CallView, HookOut
from .param_spec import POSITIONS, Param, Rule
from .stats import Stats
from .step import BASE, NONE, Branches, Choice, Step

MAX_DENOISING_STEPS = Param("max_denoising_steps", int, 48, "denoising calls per canvas at most",
                            bounds=">= 1", cap=POSITIONS)
ENTROPY_BOUND = Param("entropy_bound", float, 0.1, "entropy a step accepts, summed over the "
                      "accepted positions before the last", bounds="> 0", finite=True)
T_MIN = Param("t_min", float, 0.4, "temperature the schedule ends at", bounds="> 0", finite=True)
T_MAX = Param("t_max", float, 0.8, "temperature of a canvas's first step", bounds="> 0",
              finite=True)
STABILITY = Param("stability_threshold", int, 1, "steps the argmax canvas must repeat to stop "
                  "(0: no stability test)", bounds=">= 0", cap=POSITIONS)
CONFIDENCE = Param("confidence_threshold", float, 0.005, "mean entropy a canvas must fall "
                   "below to stop", bounds=">= 0", finite=True)


def _own_schedule(p) -> str | None:
    if p.temperature == 0 and p.top_k is None and p.top_p is None:
        return None
    return ("temperature, top_k, top_p: renoise samples on its own schedule (t_max to t_min, "
            "no filter); leave them unset")


def _no_guidance(p) -> str | None:
    if not p.cfg_scale:
        return None
    return (f"cfg_scale={p.cfg_scale}: guidance masks the prompt, and a uniform-state model has no "
            "mask token; leave cfg_scale unset with decoder=renoise")


class Decision(NamedTuple):
    """What a round decides from the last call on each request's canvas ([R] each)."""

    ended: Tensor       # the canvas is final (stop rule or step budget)
    start_next: Tensor  # a next canvas starts (its noise is drawn)
    done: Tensor        # nothing left to denoise (last canvas, or an end id under early stop)


class RenoiseDecoder(Step):
    name = "renoise"
    summary = ("DiffusionGemma's sampler: entropy-bound acceptance on a uniform-state canvas, "
               "the rest re-noised, until stable and confident")
    reads = (MAX_DENOISING_STEPS, ENTROPY_BOUND, T_MIN, T_MAX, STABILITY, CONFIDENCE)
    checks = (Rule(_own_schedule, "temperature", "renoise: 0"),
              Rule(_no_guidance, "cfg_scale", "renoise: unset"))
    uniform_state = True
    caches = ("none", "prefix")     # prefix: the context's keys once per canvas (ContextKV)
    loop_switches = ("torch_seed",)

    def start(self, b) -> dict:
        """Per request: its canvas (block), the calls made on it, the argmax history."""
        zeros = torch.zeros(b.n, dtype=torch.long, device=b.device)
        return {"block": zeros, "k": zeros.clone(),
                "history": torch.full((b.n, self.p.stability_threshold, b.B), -1,
                                      dtype=torch.long, device=b.device)}

    def open(self, b, rows: Tensor, state: dict | None = None) -> Tensor:
        """Every position of the canvas being denoised and of the canvases after it."""
        block = state["block"] if state is not None else torch.zeros(
            rows.shape[:-1], dtype=torch.long, device=rows.device)
        return b.blk >= block.view(*block.shape, *([1] * (rows.dim() - block.dim())))

    # ------------------------------------------------------------ draws and the call

    def first_draws(self, b, state: dict | None = None) -> tuple[Draw, ...]:
        """The initial call's exponentials (its sample); the first canvas is ``Batch.initial``'s."""
        return (Draw("exponential", (b.B, b.vocab_size)),)

    def draw_plan(self, b, state: dict | None = None, st: Stats | None = None
                  ) -> tuple[Draw, ...]:
        """Every live request's re-noise tokens, a next canvas's tokens where one starts (one
        host read), the next call's exponentials where a call follows."""
        d = self.decide(b, st, state)
        return (Draw("randint", (b.B,), b.vocab_size),
                Draw("randint", (b.B,), b.vocab_size, when=d.start_next),
                Draw("exponential", (b.B, b.vocab_size), when=~d.done))

    def call_hook(self, b, view: CallView) -> HookOut:
        """A denoising call: z = logits / T (T as transformers computes it: float32 0-dim
        arithmetic, elementwise here; ``k`` calls made on the canvas before), the sample
        ``argmax(softmax(z) / E)`` with the round's exponentials E (``torch.multinomial``'s
        own arithmetic, bit for bit) and the entropy of softmax(z) as extras; the statistics
        pass reads z (its tok: the argmax), and z is the carry (the next call's
        self-conditioning)."""
        n_steps = self.p.max_denoising_steps
        k = view.args.get("k", torch.zeros(view.logits.shape[0], dtype=torch.long,
                                           device=view.logits.device))
        cur_step = (n_steps - k).to(torch.int32)
        temp = self.p.t_min + ((self.p.t_max - self.p.t_min) * (cur_step / n_steps))
        z = view.logits / temp[:, None, None]
        probs = torch.softmax(z, dim=-1, dtype=torch.float32)
        sample = (probs / view.draws[-1].to(probs.device)).argmax(-1)
        ent = torch.distributions.Categorical(logits=z, validate_args=False).entropy()
        return HookOut(z, carry=z.clone(), extra={"sample": sample, "ent": ent})

    # ------------------------------------------------------------ the round

    def _canvas(self, b, x: Tensor, a: Tensor) -> Tensor:
        """[R, C] values of ``x`` [R, L] on each request's canvas ``a`` [R]."""
        return x.gather(1, a[:, None] * b.B + torch.arange(b.B, device=x.device))

    def decide(self, b, st: Stats, state: dict) -> Decision:
        """The stop rule on each request's canvas from the stats of its last call (a request
        that finished this round, past its last canvas, reads its last one: its branches are
        dropped)."""
        a = state["block"].clamp(max=b.nb - 1)
        ent, tok = self._canvas(b, st.extra["ent"], a), self._canvas(b, st.tok, a)
        confident = ent.mean(-1) < self.p.confidence_threshold
        stable = (state["history"] == tok[:, None]).all(-1).all(-1)     # no history: True
        ended = (stable & confident) | (state["k"] + 1 >= self.p.max_denoising_steps)
        stop = b.early_stop & torch.isin(tok, b.eos).any(-1)
        last = a + 1 >= b.nb
        return Decision(ended, ended & ~last & ~stop, ended & (last | stop))

    def accepted(self, ent: Tensor) -> Tensor:
        """[R, C] bool: the entropy bound's accepted set over each canvas's entropies."""
        ordered, order = torch.sort(ent, dim=-1)
        keep = ordered.cumsum(-1) - ordered <= self.p.entropy_bound
        return torch.zeros_like(keep).scatter(-1, order, keep)

    def branches(self, b, y: Tensor, st: Stats, state: dict | None = None,
                 draws: tuple = ()) -> Branches:
        d = self.decide(b, st, state)
        noise, fresh = draws[0], draws[1]
        a = state["block"].clamp(max=b.nb - 1)
        inblk = b.blk == a[:, None]
        committed = torch.where(inblk & d.ended[:, None], st.tok, y)
        ent, tok = self._canvas(b, st.extra["ent"], a), self._canvas(b, st.tok, a)
        kept = torch.where(self.accepted(ent), self._canvas(b, st.extra["sample"], a), noise)
        block = a + d.ended.long()
        at = block.clamp(max=b.nb - 1)
        canvas = torch.where(d.ended[:, None], fresh, kept)
        cols = at[:, None] * b.B + torch.arange(b.B, device=y.device)
        row = torch.where(d.done[:, None], committed, committed.scatter(1, cols, canvas))
        history = state["history"]
        if history.shape[1]:            # stability_threshold 0 keeps no history
            history = torch.cat([history[:, 1:], tok[:, None]], 1)
        k = torch.where(d.ended, 0, state["k"] + 1)
        state = {"block": block, "k": k,
                 "history": torch.where(d.ended[:, None, None], -1, history)}
        labels = torch.where(inblk & d.ended[:, None], BASE, NONE).to(torch.int8)
        return Branches(row.unsqueeze(1), (~d.done).long(), labels,
                        open=self.open(b, row, state).unsqueeze(1), hook={"k": k},
                        memo={"state": state})

    def choose(self, b, y: Tensor, st: Stats, br: Branches, out: Stats) -> Choice:
        return Choice(torch.zeros_like(br.n), br.labels, state=br.memo["state"])
