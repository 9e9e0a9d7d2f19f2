"""Decoders for diffusion LMs: static, threshold, freedave, pvf, explore (rules: docs/decoding.md).

Pure torch and device-agnostic; sees only the model protocol described in :mod:`.api`.
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
