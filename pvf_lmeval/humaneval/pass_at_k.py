"""The unbiased pass@k estimator of HumanEval scoring (Chen et al., 2021)."""

from __future__ import annotations


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
