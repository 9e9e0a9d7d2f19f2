"""``torch.compile`` under the package's dynamic-shape settings: the one helper for the compiled
network (``models/``), the statistics pass and the round's programs (``decoding/``)."""

from __future__ import annotations

import functools

import torch


def compiled(fn, options: dict, *, size_oblivious: bool = False):
    """``torch.compile(fn, **options)``, every call traced without duck shapes: two sizes that
    happen to be equal in one call (rows and positions, live requests and batch, head_dim and
    canvas) must not share a symbol, which would make that coincidence a guard, i.e. a
    recompile in the next call that breaks it, until dynamo's recompile limit runs the calls
    eager. ``size_oblivious``: a size of 1 is not specialised either (a batch of one shares the
    program of every batch)."""
    from torch.fx.experimental import _config as fx_config

    program = torch.compile(fn, **options)
    settings = dict(use_duck_shape=False)
    if size_oblivious:
        settings["backed_size_oblivious"] = True

    @functools.wraps(fn)
    def call(*args, **kwargs):
        with fx_config.patch(**settings):
            return program(*args, **kwargs)
    return call
