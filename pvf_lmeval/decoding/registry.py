"""The decoders, by name. Each step class describes itself (``name``, ``uses_vocab``,
``reveals``, ``rows_per_call``); every list of decoder names elsewhere derives from this one."""

from __future__ import annotations

from .explore import ExploreDecoder
from .freedave import FreeDaveDecoder
from .pvf import PVFDecoder
from .static import StaticDecoder
from .threshold import ThresholdDecoder

#: decoder name -> step class (constructed once per batch from DecodeParams)
DECODERS = {cls.name: cls for cls in (StaticDecoder, ThresholdDecoder, FreeDaveDecoder,
                                      PVFDecoder, ExploreDecoder)}
#: decoders that read the planning vocabulary
PLANNING_DECODERS = tuple(name for name, cls in DECODERS.items() if cls.uses_vocab)
