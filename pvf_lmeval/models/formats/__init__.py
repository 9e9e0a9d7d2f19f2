"""Checkpoint formats: each family's ``config.json`` and weight names mapped onto the native
network (:mod:`.base` holds what a format is). One module per family group: :mod:`.llada`,
:mod:`.dream`, :mod:`.llada_moe`, :mod:`.llada2`; this package holds the registry and
:func:`format_for`.
"""

from __future__ import annotations

from .base import CheckpointFormat, UnsupportedCheckpoint
from .dream import DREAM
from .llada import LLADA
from .llada2 import LLADA2, LLADA21
from .llada_moe import LLADA_MOE

__all__ = ["CheckpointFormat", "DREAM", "FORMATS", "LLADA", "LLADA2", "LLADA21", "LLADA_MOE",
           "UnsupportedCheckpoint", "format_for"]

FORMATS = {f.model_type: f for f in (LLADA, DREAM, LLADA_MOE, LLADA2, LLADA21)}


def format_for(config: dict, where: str = "config.json") -> CheckpointFormat:
    """The format of a checkpoint config, or a one-line error naming ``model_type``.

    LLaDA-MoE's released folders say ``model_type`` "llada" (their own modeling code is picked
    by ``auto_map``); a "llada" config with ``num_experts`` is read as LLaDA-MoE."""
    model_type = config.get("model_type")
    if model_type == LLADA.model_type and "num_experts" in config:
        return LLADA_MOE
    fmt = FORMATS.get(model_type)
    if fmt is None:
        raise UnsupportedCheckpoint(
            f"model_type={model_type!r} in {where} is not a supported diffusion LM; "
            f"supported model_type values: {', '.join(FORMATS)}"
        )
    return fmt
