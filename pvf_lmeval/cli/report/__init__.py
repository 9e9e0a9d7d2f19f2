"""``pvf-report``: leaderboards, Pareto plots and a CI regression gate from lm-eval output.

Modules by job: :mod:`.runs` reads results files, :mod:`.identity` says what a run is,
:mod:`.compare` builds the table and the comparisons with reference decoders, :mod:`.render`
prints it, :mod:`.gate` saves baselines and checks against them, :mod:`.plot` draws, :mod:`.cli`
is the command line.
"""

from .cli import build, main
from .runs import ReportError

__all__ = ["build", "main", "ReportError"]
