"""The decoders this package ships, by name, and what each declares: plain Python, no torch.

The step classes (``pvf_lmeval/decoding/``) describe themselves (``name``, ``uses_vocab``,
``reveals``); ``decoding/registry.py`` orders them by this module and a test checks that the two
agree. This module exists so that code which must not import torch (the report, console tools)
can name the decoders without a list of its own.
"""

from __future__ import annotations

#: every decoder, in the order tables list them
DECODER_NAMES = ("static", "threshold", "freedave", "pvf", "explore")
#: decoders that read the planning vocabulary (``uses_vocab``)
PLANNING_DECODERS = ("pvf", "explore")
#: decoders that honour ``reveal_next`` (``reveals``)
REVEALING_DECODERS = ("pvf", "explore")
#: the decoders other decoders are compared with (the paper's bracketed speed-ups and deltas)
REFERENCE_DECODERS = ("static", "threshold")
#: what each decoder does, in one line (``pvf-dlm decoders``; docs/decoding.md has the rules)
DECODER_SUMMARIES = {
    "static": "LLaDA's low-confidence remasking: the most confident position(s) on a fixed schedule",
    "threshold": "Fast-dLLM: every position at or above threshold (or the factor rule), at least one",
    "freedave": "static's trajectory, several steps drafted and verified in one call",
    "pvf": "Plan-Verify-Fill: plans on planning-vocabulary tokens, verifies branches, AR fallback",
    "explore": "threshold plus one position from a band, at random or by planning (ablation)",
}
