"""The decoders, by name. Each step class describes itself (``name``, ``uses_vocab``,
``reveals``, ``rows_per_call``); the torch-free :mod:`pvf_lmeval.decoder_names` declares the same
names (for code that must not import torch, the report) and a test checks that the two agree.
Every list of decoder names elsewhere derives from one of them."""

from __future__ import annotations

from ..decoder_names import DECODER_NAMES
from .explore import ExploreDecoder
from .freedave import FreeDaveDecoder
from .pvf import PVFDecoder
from .static import StaticDecoder
from .threshold import ThresholdDecoder

_STEPS = {cls.name: cls for cls in (StaticDecoder, ThresholdDecoder, FreeDaveDecoder,
                                    PVFDecoder, ExploreDecoder)}
#: decoder name -> step class (constructed once per batch from DecodeParams), in table order
DECODERS = {name: _STEPS[name] for name in DECODER_NAMES}
#: decoders that read the planning vocabulary
PLANNING_DECODERS = tuple(name for name, cls in DECODERS.items() if cls.uses_vocab)
