"""HumanEval scoring helpers: the pass@k estimator, and the sandbox's entry points.

Model-written programs are checked by :mod:`pvf_lmeval.sandbox` (operating-system isolation
through bubblewrap; the verdict comes from a separate checker process). This module
re-exports what the HumanEval task uses from there, beside :func:`pass_at_k`.
"""

from __future__ import annotations

from pvf_lmeval.sandbox import (REASONS, ExecResult, IsolationUnavailable, SandboxError,
                                check_candidate, check_candidates, default_workers)

__all__ = ["ExecResult", "IsolationUnavailable", "REASONS", "SandboxError", "check_candidate",
           "check_candidates", "default_workers", "pass_at_k"]


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``n`` samples of which ``c`` are correct: 1 - C(n-c, k) / C(n, k).

    Computed as in Chen et al. (2021), ``1 - prod_{i=n-c+1}^{n} (1 - k / i)``. ``k > n`` is
    undefined (ValueError).
    """
    n, c, k = int(n), int(c), int(k)
    if not (0 <= c <= n) or k < 1:
        raise ValueError(f"pass@k needs 0 <= c <= n and k >= 1 (n={n}, c={c}, k={k})")
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples per problem, got n={n}")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod
