"""Errors that end a program in one line: a user's mistake (a bad model arg, a missing data
file, a prompt that does not fit) reaches the top of lm-eval's CLI, which catches nothing, as
one line without a traceback; the exit status stays 1. Used by the adapter, its launch across
processes and the data library (which the task utilities call inside lm-eval)."""

from __future__ import annotations

import functools
import sys


def _one_line(message: str) -> str:
    text = " ".join(str(message).split())
    return text if text.startswith(("pvf-dlm:", "pvf_lmeval:")) else f"pvf-dlm: {text}"


def exit_in_one_line(error: BaseException) -> None:
    """Make ``error``, if it reaches the top of the program uncaught (lm-eval's CLI catches
    nothing), print as one line without a traceback; the exit status stays 1. Callers that catch
    it (``simple_evaluate`` from Python) get the exception as usual."""
    error.pvf_one_line = True
    if getattr(sys.excepthook, "pvf_one_line", False):
        return
    sys.excepthook = one_line_hook(sys.excepthook)


def one_line_hook(previous):
    """A ``sys.excepthook`` that prints an error marked by :func:`exit_in_one_line` as one line
    and hands any other to ``previous``; marked itself, so that no second one is chained."""
    def hook(kind, value, tb):
        if getattr(value, "pvf_one_line", False):
            print(_one_line(value), file=sys.stderr)
        else:
            previous(kind, value, tb)

    hook.pvf_one_line = True
    return hook


def one_line_errors(method):
    """Decorate an lm-eval entry point (``generate_until``, ``loglikelihood``, ...): a
    ``ValueError`` it raises, the adapter's one-line report of bad input (a mistyped
    ``--gen_kwargs`` key, a prompt that does not fit), reaches the top of lm-eval's CLI as that
    one line, as a bad model arg does (:func:`exit_in_one_line`)."""
    @functools.wraps(method)
    def wrapper(*args, **kwargs):
        try:
            return method(*args, **kwargs)
        except ValueError as error:
            exit_in_one_line(error)
            raise

    return wrapper
