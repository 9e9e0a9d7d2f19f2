"""Decoders for diffusion LMs: static, threshold, freedave, pvf, explore (rules: docs/decoding.md).

Pure torch and device-agnostic; sees only the model protocol described in :mod:`.api`. The
loop (:mod:`.loop`) runs rounds of call (:mod:`.runner`), settle and prepare (:mod:`.rounds`)
over the requests' state (:mod:`.batch`); each decoder is a :class:`.step.Step`.

The planning vocabulary a decoder reads is a token-id set decided before decoding
(:mod:`.plan_vocab`: ``FixedVocab``), or an online one that learns between batches: decoding
holds only what a round reads (eligible ids as a tensor), never files. Where the ids come from
(artifacts on disk, calibration, the online mode's statistics) is :mod:`pvf_lmeval.planning`'s:
it reads and writes files and tokenizers, which a decoder must not depend on.
"""

from .api import DECODERS, decode, decode_batch
from .loop import STAT_KEYS, DecodeResult
from .registry import PLANNING_DECODERS
from .params import (DECODER_NAMES, PARAM_NAMES, PRESETS, DecodeParams, make_params,
                     override, preset_defaults, task_family, validate_params)

__all__ = [
    "decode", "decode_batch", "DecodeResult", "DecodeParams", "DECODERS", "DECODER_NAMES", "PARAM_NAMES",
    "PRESETS", "STAT_KEYS", "make_params", "override", "validate_params", "preset_defaults",
    "task_family", "PLANNING_DECODERS",
]
