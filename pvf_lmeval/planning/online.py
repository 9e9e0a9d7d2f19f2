"""Online planning vocabulary (``vocab=online``): learn ``P_plan`` while decoding.

Per token id the vocabulary keeps the calibration statistics of SPEC "Planning vocabulary",
accumulated from the planning route's own calls instead of a separate calibration run:

    events   n_v   planning candidates with ŷ = v that were verified
    attempts m_v   ... of which had a non-empty impact set (S_imp minus the candidate)
    passes         sum of A over those events
    gain_sum       sum of VIG = A * mean over R of (H(z_base) - H(z_plan)) over those events

(the same quantities ``pvf-calibrate`` measures, so ``gamma_vig`` means the same thing in both
modes and an artifact can seed the counts). Token ``v`` is **eligible** when the ``level``
quantile of its Beta posterior on the pass rate, Beta(a0 + passes, b0 + attempts - passes),
clears ``rho_ver`` and its mean gain ``gain_sum / events`` clears ``gamma_vig``. Tokens that are
not eligible, have fewer than ``explore_max`` events and whose 99% upper bound still clears
``rho_ver`` are **explorable**: ``explore`` slots of the verification width K are reserved for
them (they fill unused slots too); they are ordinary planning candidates, verified the same way
and committed when they win.

Updates: the PVF step calls :meth:`record` with the outcome of every tried candidate; records
only go to a pending buffer. The owner (the lm-eval adapter, a benchmark) calls :meth:`update`
between requests / batches, which folds the pending records into the counts and recomputes the
eligible and explorable masks. So the vocabulary never changes inside a request or a batch, and
outputs depend on the order of requests (deterministic for a fixed seed, batch size and order).
With ``frozen=True`` nothing is recorded, nothing is explored, and every guarantee of a fixed
artifact (batch-size invariance) holds.
"""

from __future__ import annotations

import torch
from torch import Tensor

#: upper credible level that decides whether a token is still worth exploring
EXPLORE_UPPER = 0.99


def beta_quantile(a: Tensor, b: Tensor, q: float) -> Tensor:
    """The ``q`` quantile of Beta(a, b), elementwise (float64 CPU tensors)."""
    from scipy.special import betaincinv

    return torch.from_numpy(betaincinv(a.numpy(), b.numpy(), q))


class OnlineVocab:
    """Per-token planning statistics, eligibility and exploration for ``vocab=online``.

    ``size``: number of token ids (the model's logit width). Thresholds: ``rho_ver`` (pass-rate
    bound), ``gamma_vig`` (mean gain), ``level`` (quantile of the lower bound), ``prior`` (a0, b0).
    ``explore``: verification slots reserved for explorable tokens (0 = no exploration);
    ``explore_max``: events after which a token is no longer explored.
    """

    def __init__(self, size: int, *, rho_ver: float = 0.9, gamma_vig: float = 0.03,
                 level: float = 0.2, prior: tuple[float, float] = (1.0, 1.0), explore: int = 1,
                 explore_max: int = 30, frozen: bool = False, device="cpu"):
        if size < 1:
            raise ValueError(f"online vocabulary: size={size} must be >= 1")
        if not 0.0 <= rho_ver <= 1.0:
            raise ValueError(f"rho_ver={rho_ver} must be in [0, 1]")
        if not 0.0 < level < 1.0:
            raise ValueError(f"online_level={level} must be in (0, 1)")
        if explore < 0:
            raise ValueError(f"online_explore={explore} must be >= 0")
        if explore_max < 0:
            raise ValueError(f"online_explore_max={explore_max} must be >= 0")
        if not (prior[0] > 0 and prior[1] > 0):
            raise ValueError(f"online prior={prior} must be positive")
        self.size = int(size)
        self.rho_ver = float(rho_ver)
        self.gamma_vig = float(gamma_vig)
        self.level = float(level)
        self.prior = (float(prior[0]), float(prior[1]))
        self.explore = int(explore)
        self.explore_max = int(explore_max)
        self.frozen = bool(frozen)
        self.device = torch.device(device)
        z = torch.zeros(self.size, dtype=torch.float64)
        self.events, self.attempts, self.passes, self.gain_sum = z.clone(), z.clone(), z.clone(), z
        self._pending: list[tuple[Tensor, Tensor, Tensor, Tensor]] = []
        self.updates = 0           # number of update() calls that changed something
        self._refresh()

    # ------------------------------------------------------------ what the PVF step reads

    @property
    def learning(self) -> bool:
        """Whether outcomes are recorded (and entropies computed for them)."""
        return not self.frozen

    @property
    def explore_slots(self) -> int:
        return 0 if self.frozen else self.explore

    def eligible_mask(self, tok: Tensor) -> Tensor:
        """Bool mask of the same shape: ``tok`` is currently eligible."""
        return self.eligible[tok.to(self.eligible.device)].to(tok.device)

    def explorable_mask(self, tok: Tensor) -> Tensor:
        """Bool mask: ``tok`` may take an exploration slot (never an eligible token)."""
        return self.explorable[tok.to(self.explorable.device)].to(tok.device)

    def record(self, tok: Tensor, nonvacuous: Tensor, passed: Tensor, vig: Tensor,
               keep: Tensor | None = None) -> None:
        """Queue the outcomes of planning candidates (tensors of one shape; ``keep``: which of
        them were really tried, all by default); applied by update(). No host read here. The
        decode loop calls it after each round with what the step's choice returned (a compiled
        round's programs never append to this list)."""
        if self.frozen:
            return
        if keep is None:
            keep = torch.ones_like(nonvacuous, dtype=torch.bool)
        self._pending.append(tuple(t.detach() for t in (tok, nonvacuous, passed, vig, keep)))

    # ------------------------------------------------------------ between requests / batches

    def take_pending(self) -> dict:
        """Remove and return the queued records as one CPU delta {tok, nonvac, passed, vig}."""
        if not self._pending:
            e = torch.zeros(0, dtype=torch.float64)
            return {"tok": torch.zeros(0, dtype=torch.long), "nonvac": e, "passed": e, "vig": e}
        tok, nv, ok, vig, keep = (torch.cat([r[i].reshape(-1) for r in self._pending]).cpu()
                                  for i in range(5))
        tok, nv, ok, vig = tok[keep], nv[keep], ok[keep], vig[keep]
        self._pending = []
        return {"tok": tok.long(), "nonvac": nv.double(), "passed": ok.double(),
                "vig": vig.double()}

    def apply(self, deltas: list[dict]) -> None:
        """Fold deltas (from :meth:`take_pending`, possibly of several ranks, in order) in."""
        changed = False
        for d in deltas:
            tok = d["tok"]
            if tok.numel() == 0:
                continue
            changed = True
            self.events.index_add_(0, tok, torch.ones_like(d["nonvac"]))
            self.attempts.index_add_(0, tok, d["nonvac"])
            self.passes.index_add_(0, tok, d["passed"])
            self.gain_sum.index_add_(0, tok, d["vig"])
        if changed:
            self.updates += 1
            self._refresh()

    def update(self) -> None:
        """Fold this process's pending records into the statistics (between batches only)."""
        self.apply([self.take_pending()])

    @property
    def pending(self) -> int:
        return sum(int(r[4].sum()) for r in self._pending)

    def _refresh(self) -> None:
        a0, b0 = self.prior
        seen = torch.nonzero(self.events > 0).flatten()
        lb = torch.zeros(self.size, dtype=torch.float64)
        ub = torch.ones(self.size, dtype=torch.float64)
        if seen.numel():
            a = a0 + self.passes[seen]
            b = b0 + (self.attempts[seen] - self.passes[seen]).clamp(min=0)
            lb[seen] = beta_quantile(a, b, self.level)
            ub[seen] = beta_quantile(a, b, EXPLORE_UPPER)
        gain = self.gain_sum / self.events.clamp(min=1)
        elig = (self.events > 0) & (lb >= self.rho_ver) & (gain >= self.gamma_vig)
        expl = ~elig & (self.events < self.explore_max) & (ub >= self.rho_ver)
        self.lower_bound = lb
        self.eligible = elig.to(self.device)
        self.explorable = (expl & torch.tensor(self.explore_slots > 0)).to(self.device)

    # ------------------------------------------------------------ inspection, save, seed

    def eligible_ids(self) -> list[int]:
        return torch.nonzero(self.eligible.cpu()).flatten().tolist()

    def token_stats(self, ids: list[int] | None = None) -> list[dict]:
        """Statistics of the given ids (default: every id with an event), by id."""
        if ids is None:
            ids = torch.nonzero(self.events > 0).flatten().tolist()
        elig = self.eligible.cpu()
        out = []
        for i in ids:
            n, m, a, g = (float(t[i]) for t in (self.events, self.attempts, self.passes,
                                                 self.gain_sum))
            out.append({"id": int(i), "n": int(n), "m": int(m), "a_sum": a, "vig_sum": g,
                        "r": a / m if m else 0.0, "vig": g / n if n else 0.0,
                        "lower_bound": float(self.lower_bound[i]), "eligible": bool(elig[i])})
        return out

    def seed(self, records: list[dict]) -> int:
        """Add per-token statistics {id, n, m, a_sum|r, vig_sum|vig} (an artifact's records,
        resolved to ids) to the counts; returns how many records were used."""
        used = 0
        for rec in records:
            i = rec.get("id")
            if i is None or not 0 <= int(i) < self.size or "n" not in rec:
                continue
            n, m = float(rec["n"]), float(rec.get("m", 0))
            a = float(rec["a_sum"]) if "a_sum" in rec else float(rec.get("r", 0.0)) * m
            g = float(rec["vig_sum"]) if "vig_sum" in rec else float(rec.get("vig", 0.0)) * n
            i = int(i)
            self.events[i] += n
            self.attempts[i] += m
            self.passes[i] += a
            self.gain_sum[i] += g
            used += 1
        self._refresh()
        return used

    def settings(self) -> dict:
        return {"rho_ver": self.rho_ver, "gamma_vig": self.gamma_vig, "level": self.level,
                "prior": list(self.prior), "explore": self.explore,
                "explore_max": self.explore_max, "frozen": self.frozen}
