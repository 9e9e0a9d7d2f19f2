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


def _no_cache(p) -> str | None:
    if p.cache == "none":
        return None
    return (f"cache={p.cache}: renoise reads the context through the model on every call (no "
            f"encoder KV cache); use cache=none")


class Decision(NamedTuple):
    """What a round decides from the last call on each request's canvas (all [R] or [R, L])."""

    ended: Tensor       # the canvas is final (stop rule or step budget)
    committed: Tensor   # [R, L] the state with an ended canvas's argmax written
    open: Tensor        # [R, L] positions not committed after this round
    start_next: Tensor  # a next canvas starts (its noise is drawn)
    done: Tensor        # nothing left to denoise (last canvas, or early stop)


class RenoiseDecoder(Step):
    name = "renoise"
    summary = ("DiffusionGemma's sampler: entropy-bound acceptance on a uniform-state canvas, "
               "the rest re-noised, until stable and confident")
    reads = (MAX_DENOISING_STEPS, ENTROPY_BOUND, T_MIN, T_MAX, STABILITY, CONFIDENCE)
    checks = (Rule(_own_schedule, "temperature", "renoise: 0"),
              Rule(_no_cache, "cache", "renoise: none"))
    uniform_state = True

    def start(self, b) -> dict:
        """Per request: its canvas (block), the calls made on it, the argmax history."""
        zeros = torch.zeros(b.n, dtype=torch.long, device=b.device)
        return {"block": zeros, "k": zeros.clone(),
                "history": torch.full((b.n, self.p.stability_threshold, b.B), -1,
                                      dtype=torch.long, device=b.device)}

    # ------------------------------------------------------------ the call

    def call_hook(self, b, logits: Tensor, cur: Tensor, k: Tensor, requests: list[int]):
        """Stats of a denoising call (logits [N, C, V]; ``k`` [N] calls made on the canvas
        before): tok = argmax of z, conf = pmax = its probability, pcur, ent = entropy of
        softmax(z), extra ``sample``; the carry is z. z and T as transformers computes them
        (float32 0-dim arithmetic, elementwise here)."""
        n_steps = self.p.max_denoising_steps
        cur_step = (n_steps - k).to(torch.int32)
        temp = self.p.t_min + ((self.p.t_max - self.p.t_min) * (cur_step / n_steps))
        z = logits / temp[:, None, None]
        probs = torch.softmax(z, dim=-1, dtype=torch.float32)
        sample = torch.stack([self._race(probs[r], b.generator(i)) for r, i in enumerate(requests)])
        tok = z.argmax(-1)
        ent = torch.distributions.Categorical(logits=z, validate_args=False).entropy()
        pmax = probs.gather(-1, tok[..., None])[..., 0]
        pcur = probs.gather(-1, cur[..., None])[..., 0]
        return Stats(tok, pmax, pmax, pcur, ent, extra={"sample": sample.to(tok.device)}), z

    @staticmethod
    def _race(probs: Tensor, g: torch.Generator) -> Tensor:
        """One sample per row of ``probs`` [C, V]: ``argmax(probs / E)``, E [C, V] standard
        exponential draws from ``g`` (``torch.multinomial``'s own arithmetic, bit for bit)."""
        e = torch.empty(probs.shape, dtype=torch.float32, device=g.device).exponential_(1, generator=g)
        return (probs / e.to(probs.device)).argmax(-1)

    # ------------------------------------------------------------ the round

    def _canvas(self, b, x: Tensor, a: Tensor) -> Tensor:
        """[R, C] values of ``x`` [R, L] on each request's canvas ``a`` [R]."""
        return x.gather(1, a[:, None] * b.B + torch.arange(b.B, device=x.device))

    def decide(self, b, y: Tensor, st: Stats, state: dict) -> Decision:
        """The stop rule on each request's canvas from the stats of its last call (a request
        that finished this round, past its last canvas, reads its last one: its branches are
        dropped)."""
        a = state["block"].clamp(max=b.nb - 1)
        ent, tok = self._canvas(b, st.ent, a), self._canvas(b, st.tok, a)
        confident = ent.mean(-1) < self.p.confidence_threshold
        stable = (state["history"] == tok[:, None]).all(-1).all(-1)     # no history: True
        ended = (stable & confident) | (state["k"] + 1 >= self.p.max_denoising_steps)
        committed = torch.where((b.blk == a[:, None]) & ended[:, None], st.tok, y)
        open = b.blk >= (a + ended.long())[:, None]
        stop = b.stop_index(committed, open) >= 0
        last = a + 1 >= b.nb
        return Decision(ended, committed, open, ended & ~last & ~stop, ended & (last | stop))

    def draw(self, b, y: Tensor, st: Stats, state: dict) -> dict:
        """Every live request's re-noise tokens, then a next canvas's tokens where one starts
        (one host read: which ones)."""
        start_next = self.decide(b, y, st, state).start_next.tolist()
        noise = b.noise(b.ids)
        fresh = torch.zeros_like(noise)
        rows = [r for r, s in enumerate(start_next) if s]
        if rows:
            fresh[rows] = b.noise([b.ids[r] for r in rows])
        return {"noise": noise, "fresh": fresh}

    def accepted(self, ent: Tensor) -> Tensor:
        """[R, C] bool: the entropy bound's accepted set over each canvas's entropies."""
        ordered, order = torch.sort(ent, dim=-1)
        keep = ordered.cumsum(-1) - ordered <= self.p.entropy_bound
        return torch.zeros_like(keep).scatter(-1, order, keep)

    def branches(self, b, y: Tensor, st: Stats, state: dict | None = None,
                 draws: dict | None = None) -> Branches:
        d = self.decide(b, y, st, state)
        a = state["block"].clamp(max=b.nb - 1)
        ent, tok = self._canvas(b, st.ent, a), self._canvas(b, st.tok, a)
        # no extra: no request made a call this round, so every one is finished (dropped)
        sample = st.tok if st.extra is None else st.extra["sample"]
        kept = torch.where(self.accepted(ent), self._canvas(b, sample, a), draws["noise"])
        block = a + d.ended.long()
        at = block.clamp(max=b.nb - 1)
        canvas = torch.where(d.ended[:, None], draws["fresh"], kept)
        cols = at[:, None] * b.B + torch.arange(b.B, device=y.device)
        row = torch.where(d.done[:, None], d.committed, d.committed.scatter(1, cols, canvas))
        history = state["history"]
        if history.shape[1]:            # stability_threshold 0 keeps no history
            history = torch.cat([history[:, 1:], tok[:, None]], 1)
        state = {"block": block, "k": torch.where(d.ended, 0, state["k"] + 1),
                 "history": torch.where(d.ended[:, None, None], -1, history)}
        labels = torch.where((b.blk == a[:, None]) & d.ended[:, None], BASE, NONE).to(torch.int8)
        return Branches(row.unsqueeze(1), (~d.done).long(), labels, cover=at * b.B,
                        memo={"state": state, "open": d.open})

    def choose(self, b, y: Tensor, st: Stats, br: Branches, out: Stats) -> Choice:
        return Choice(torch.zeros_like(br.n), br.labels, state=br.memo["state"],
                      open=br.memo["open"])
