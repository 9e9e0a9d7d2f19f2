"""Block-diffusion models: decoding blocks aligned with the model's own blocks.

A model may carry ``block_size: int`` (absent or None: attention is bidirectional over the whole
canvas). Its attention is then block-causal: blocks of ``block_size`` positions aligned to
absolute position ids from 0 (prompt and generation together, as the model counts positions,
left padding excluded), and a position sees every position of its own and earlier blocks. The
model applies that mask itself, on every call. The decoders follow from it (docs/decoding.md,
"Block-diffusion models"):

- ``block_length`` is the model's block size by default and must equal it when given: a decoding
  block is exactly one model block. The parameters carry the model's block size
  (``model_block``, set by :func:`on_model`), so that they check it once, when they are made.
- The generation region of a request starts in the middle of a model block when its prompt
  length ``p`` is not a multiple of the block size ``B``. The canvas the decoders work on (the
  *region*, ``gen_length + B`` positions for every request) then begins at that block's start:
  its first ``start = p mod B`` positions hold the prompt's last tokens (never masked, never
  returned), so the first decoding block completes the prompt's partial block with
  ``B - start`` generated tokens, followed by ``gen_length / B`` whole blocks. A prompt whose
  length is a multiple of ``B`` puts its last whole block there (``start = B``); an empty prompt
  puts a block of filler after the generation instead (``start = 0``; a later block, which no
  decoded position can see). Every request thus has the same region geometry, alone or batched.
- The answer is the first ``gen_length`` generated tokens; the generated tokens after them
  complete the last block (the model was trained on whole blocks) and are decoded but dropped.
- A position can influence only positions of its own block and later ones (:func:`reach`).
"""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor


def block_size_of(model) -> int | None:
    """The model's attention block size (None: bidirectional attention)."""
    bs = getattr(model, "block_size", None)
    if bs is None:
        return None
    if isinstance(bs, bool) or not isinstance(bs, int) or bs < 1:
        raise ValueError(f"model block_size={bs!r} must be a positive integer or None")
    return bs


def on_model(params, model):
    """``params`` on ``model``'s attention blocks (``model_block``): themselves when they are
    already, else a copy, which checks ``block_length`` against them."""
    bs = block_size_of(model)
    return params if params.model_block == bs else dataclasses.replace(params, model_block=bs)


def default_block_length(model, default: int) -> int:
    """The block length when none is given: a block-diffusion model's block size, a
    uniform-state model's canvas, else ``default``."""
    bs = block_size_of(model)
    if bs is None:
        bs = getattr(model, "canvas_length", None)
    return default if bs is None else bs


def check_canvas(params, model, uniform_decoder: bool) -> None:
    """One-line errors, before any call, for a decoder on a model whose canvas it does not
    decode: a masked decoder on a uniform-state model (no mask token), ``renoise`` on a model
    with a mask token, or a block length other than a uniform-state model's canvas."""
    canvas = getattr(model, "canvas_length", None)
    who = getattr(model, "family", "") or getattr(model, "name", "") or "the model"
    if canvas is None and uniform_decoder:
        raise ValueError(f"decoder={params.decoder} denoises a uniform-state canvas "
                         f"(DiffusionGemma); {who} has a mask token: use a decoder that fills "
                         f"masked positions (threshold, pvf, ...)")
    if canvas is None:
        return
    if not uniform_decoder:
        raise ValueError(f"decoder={params.decoder} fills masked positions; {who} is a "
                         f"uniform-state diffusion model (no mask token: its canvas of {canvas} "
                         f"starts as random tokens): use decoder=renoise (docs/decoding.md, "
                         f"\"Uniform-state canvases\")")
    if params.block_length != canvas:
        raise ValueError(f"block_length={params.block_length} must equal the model's "
                         f"canvas_length={canvas} (decoder={params.decoder} denoises one "
                         f"canvas per block)")


def region_start(prompt_len: int, block: int) -> int:
    """Region positions before the first generated one: the prompt's tokens in the region's
    first block (see the module docstring)."""
    r = prompt_len % block
    if r == 0 and prompt_len >= block:
        return block
    return r


def region_layout(prompts: list[Tensor], block: int, gen_length: int, mask_id: int,
                  filler: int) -> tuple[list[Tensor], Tensor, list[int]]:
    """(prompts without the tokens that move into the region, initial regions [n, L + B],
    each request's ``start``). Region: the prompt's last ``start`` tokens, then masks over the
    ``B - start`` completing positions (when ``start`` < B) and the ``gen_length`` positions,
    then filler up to ``L + B`` (empty prompts only)."""
    width = gen_length + block
    heads, regions, starts = [], [], []
    for p in prompts:
        s = region_start(int(p.shape[0]), block)
        region = torch.full((width,), mask_id, dtype=torch.long, device=p.device)
        region[:s] = p[p.shape[0] - s:]
        n_masked = gen_length + (block - s if s else 0)
        region[s + n_masked:] = filler
        heads.append(p[:p.shape[0] - s])
        regions.append(region)
        starts.append(s)
    return heads, torch.stack(regions), starts


def reach(own: Tensor, block: int) -> Tensor:
    """[..., K, L] bool: region positions that each branch's own position (``own`` [..., K, L],
    one True per branch) can influence under block-causal attention: its block and later ones
    (region blocks are the model's blocks)."""
    L = own.shape[-1]
    blk = torch.arange(L, device=own.device) // block
    at = (own.long().argmax(-1) // block).unsqueeze(-1)                          # [..., K, 1]
    return blk >= at

