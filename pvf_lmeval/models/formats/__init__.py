"""Checkpoint formats: each family's ``config.json`` and weight names mapped onto the native
network (:mod:`.base` holds what a format is). One module per family group: :mod:`.llada`
(LLaDA, MMaDA), :mod:`.dream`, :mod:`.llada_moe`, :mod:`.llada2`, :mod:`.qwen3` (SDAR / TraDo,
SDAR-MoE, RND1), :mod:`.fast_dllm`, :mod:`.diffusion_gemma`; this package holds the registry and
:func:`format_for`.
"""

from __future__ import annotations

from .base import CheckpointFormat, UnsupportedCheckpoint
from .diffusion_gemma import DIFFUSION_GEMMA
from .dream import DREAM
from .fast_dllm import FAST_DLLM
from .llada import LLADA, MMADA
from .llada2 import LLADA2, LLADA21
from .llada_moe import LLADA_MOE
from .qwen3 import RND1, SDAR, SDAR_MOE

__all__ = ["CheckpointFormat", "DIFFUSION_GEMMA", "DREAM", "FAST_DLLM", "FORMATS", "LLADA",
           "LLADA2", "LLADA21", "LLADA_MOE", "MMADA", "MODEL_FAMILIES", "REFUSED", "RND1", "SDAR",
           "SDAR_MOE", "UnsupportedCheckpoint", "format_for"]

FORMATS = {f.model_type: f for f in (LLADA, MMADA, DREAM, LLADA_MOE, LLADA2, LLADA21, SDAR,
                                     SDAR_MOE, FAST_DLLM, RND1, DIFFUSION_GEMMA)}
#: the model families, in table order: a loaded model's ``family``, the ``model_family`` of a
#: planning-vocabulary artifact (a model of one family reads the artifacts made for it)
MODEL_FAMILIES = tuple(dict.fromkeys(f.family for f in FORMATS.values()))
#: ``architectures`` class names -> format, for configs whose ``model_type`` is not one of ours
ARCHITECTURES = {a: f for f in FORMATS.values() for a in f.architectures}
#: diffusion LMs recognised and refused: ``model_type`` -> why, in one sentence
REFUSED: dict[str, str] = {}


def format_for(config: dict, where: str = "config.json") -> CheckpointFormat:
    """The format of a checkpoint config, or a one-line error naming ``model_type``.

    Recognised by ``model_type``, else by the first of ``architectures`` that names a supported
    class (a fine-tune saved under another ``model_type`` loads as its architecture).
    LLaDA-MoE's released folders say ``model_type`` "llada" (their own modeling code is picked
    by ``auto_map``); a "llada" config with ``num_experts`` is read as LLaDA-MoE."""
    model_type = config.get("model_type")
    if model_type == LLADA.model_type and "num_experts" in config:
        return LLADA_MOE
    if isinstance(model_type, str) and model_type in REFUSED:
        raise UnsupportedCheckpoint(f"model_type={model_type!r} in {where} is not supported: "
                                    f"{REFUSED[model_type]}")
    fmt = FORMATS.get(model_type) if isinstance(model_type, str) else None
    if fmt is None:
        named = config.get("architectures")
        named = [a for a in named if isinstance(a, str) and a in ARCHITECTURES] \
            if isinstance(named, list) else []
        if named:
            return ARCHITECTURES[named[0]]
        raise UnsupportedCheckpoint(
            f"model_type={model_type!r} in {where} is not a supported diffusion LM; "
            f"supported model_type values: {', '.join(FORMATS)} (pvf-dlm models lists them)"
        )
    return fmt
