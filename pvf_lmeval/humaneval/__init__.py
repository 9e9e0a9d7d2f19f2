"""HumanEval scoring: the unbiased pass@k estimator (:mod:`.pass_at_k`). The programs themselves
are checked by :mod:`pvf_lmeval.sandbox`, whose entry points the task utils import directly."""

from .pass_at_k import pass_at_k

__all__ = ["pass_at_k"]
