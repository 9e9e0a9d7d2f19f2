"""Code-task scoring (HumanEval, MBPP): the unbiased pass@k estimator (:mod:`.pass_at_k`) and
the ``process_results`` core of the task utils (:mod:`.scoring`). The programs themselves are
checked by :mod:`pvf_lmeval.sandbox`."""

from .pass_at_k import pass_at_k

__all__ = ["pass_at_k"]
