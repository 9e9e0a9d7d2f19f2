"""The decoders, by name, one line each, in the order tables list them. A step class describes
itself (``name``, ``summary``, the parameters it ``reads``, its ``checks``, ``uses_vocab``,
``reveals``, ``baseline``, ``rows_per_call``): every list of decoders or of their parameters
elsewhere (the parameters' fields and checks, ``pvf-dlm args`` and ``decoders``, the report's run
identity) derives from these classes."""

from __future__ import annotations

from .dinfer import CreditDecoder, HierarchyDecoder
from .eb import EntropyBoundDecoder
from .explore import ExploreDecoder
from .freedave import FreeDaveDecoder
from .joint import JointDecoder
from .pvf import PVFDecoder
from .pvf_edit import PVFEditDecoder
from .renoise import RenoiseDecoder
from .static import StaticDecoder
from .subblock import SubBlockDecoder
from .threshold import ThresholdDecoder
from .wino import WinoDecoder

#: decoder name -> step class (constructed once per batch from DecodeParams), in table order
DECODERS = {cls.name: cls for cls in (
    StaticDecoder,
    ThresholdDecoder,
    EntropyBoundDecoder,
    FreeDaveDecoder,
    PVFDecoder,
    ExploreDecoder,
    SubBlockDecoder,
    HierarchyDecoder,
    CreditDecoder,
    WinoDecoder,
    JointDecoder,
    PVFEditDecoder,
    RenoiseDecoder,
)}
DECODER_NAMES = tuple(DECODERS)
#: decoders that read the planning vocabulary
PLANNING_DECODERS = tuple(name for name, cls in DECODERS.items() if cls.uses_vocab)
#: decoders that honour ``reveal_next``
REVEALING_DECODERS = tuple(name for name, cls in DECODERS.items() if cls.reveals)
#: decoders of a uniform-state canvas (DiffusionGemma); the others fill masked positions
UNIFORM_STATE_DECODERS = tuple(name for name, cls in DECODERS.items() if cls.uniform_state)
#: the decoders the others are compared with (the paper's bracketed speed-ups and deltas)
REFERENCE_DECODERS = tuple(name for name, cls in DECODERS.items() if cls.baseline)
