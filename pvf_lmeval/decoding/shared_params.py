"""The parameters several decoders read, declared once; a decoder lists the ones it reads in its
``Step.reads`` (``THRESHOLD``, or ``THRESHOLD.when(base_rule="threshold")``)."""

from __future__ import annotations

from .param_spec import POSITIONS, Param

THRESHOLD = Param("threshold", float, 0.9, "confidence that commits a position (tau_high)",
                  bounds="(0, 1]")
FACTOR = Param("factor", float, None, "Fast-dLLM's factor rule (freedave with "
               "base_rule=threshold)", bounds="> 0", finite=True, exclusive=True)
REVEAL_NEXT = Param("reveal_next", int, 0, "early cross-block revelation N_s", bounds=">= 0",
                    cap=POSITIONS, preset=True)
