"""Checkpoint loading into one model protocol (see ``diffusion_lm.DiffusionLM``)."""

from .diffusion_lm import DiffusionLM
from .loader import BUNDLED, load_model

__all__ = ["DiffusionLM", "load_model", "BUNDLED"]
