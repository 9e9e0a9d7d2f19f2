"""The model object decoders see: the model protocol over the native network.

    mask_id: int
    eos_ids: tuple[int, ...]
    logits(tokens, positions, *, attention_mask=None, cache=None, shadow=None)
        -> FloatTensor[N, P, V], or [N, P + S, V] with a shadow of S rows

plus the optional extras ``pad_id``, ``vocab_size``, ``device``, ``tokenizer``, ``family`` and
``block_size`` (block diffusion: the network applies the block-causal mask itself).

A uniform-state model (DiffusionGemma: ``canvas_length`` set) has no mask token: its ``mask_id``
raises a one-line :class:`NoMaskToken` (the decoders here fill masked positions, and read it
before any model call), and its ``logits`` take ``self_conditioning`` (see :meth:`DiffusionLM.logits`).
Logit shifting (Dream) and ids the tokenizer cannot decode are handled here, so decoders never
see either.
"""

from __future__ import annotations

import torch

from ..tensors.compiling import compiled
from . import ops
from .batch_invariant import batch_invariant_ops, support_error
from .kv import cache_segments, cached_rows, is_cached_call, keep_pending
from .parallel import call_fingerprint, same_on_every_rank
from .transformer import BidirectionalTransformer, take_rows


#: what ``compile=true`` compiles on each device type: the fastest option measured there
#: (docs/speed.md, "compile=true"). One place to change when a measurement says otherwise.
COMPILE_TRUE = {"cuda": "blocks", "cpu": "blocks"}


def compile_seconds() -> float | None:
    """Seconds ``torch.compile`` has spent compiling in this process so far (dynamo's own
    record of its frame compiles: capture, code generation, guards; every backend), or None
    where this torch does not keep that record. A compiled model pays it during its first
    calls of each new shape class: the warm-up of ``compile``."""
    try:
        from torch._dynamo.utils import compilation_time_metrics
    except ImportError:
        return None
    times = compilation_time_metrics.get("_compile.compile_inner")
    return None if times is None and compilation_time_metrics else float(sum(times or ()))


class NoMaskToken(ValueError):
    """A uniform-state model asked for its mask token (a one-line message)."""


class DiffusionLM:
    """A loaded diffusion LM.

    ``logits`` returns float32 logits for the requested canvas positions only: row ``p`` predicts
    canvas position ``positions[p]`` (the shift of Dream-style checkpoints is applied here), and
    ids at or beyond ``decodable`` (ids the tokenizer cannot turn into text) get ``-inf``.
    """

    def __init__(self, net: BidirectionalTransformer, *, mask_id: int | None,
                 eos_ids: tuple[int, ...],
                 pad_id: int | None, logit_shift: int, decodable: int, tokenizer=None,
                 family: str = "", name: str = "", config: dict | None = None,
                 weights_fingerprint: str | None = None, shard=None, comm=None,
                 invariant_checked: bool = False):
        if (mask_id is None) != (net.cfg.canvas_length is not None):
            raise ValueError("mask_id is None exactly for a uniform-state network (canvas_length)")
        self.net = net.eval()
        self._mask_id = None if mask_id is None else int(mask_id)
        self.eos_ids = tuple(int(e) for e in eos_ids)
        self.pad_id = pad_id
        self.logit_shift = logit_shift
        self.vocab_size = net.cfg.vocab_size
        self.decodable = min(int(decodable), self.vocab_size)
        self.tokenizer = tokenizer
        self.family = family
        self.name = name
        self.config = config or {}
        #: :func:`.loader.weights_fingerprint` of the checkpoint it was loaded from (None: built
        #: in memory); calibrated vocabularies record it, and vocab=auto skips one of other weights
        self.weights_fingerprint = weights_fingerprint
        self.compile_scope: str | None = None      # what ``compile`` compiled: blocks or model
        #: tensor parallel: this rank's part of the network (``parallel.Shard``) and its group's
        #: collectives (``parallel.Comm``); None on one process
        self.shard, self.comm = shard, comm
        #: compare every call's inputs across the tensor-parallel ranks (see :meth:`logits`)
        self.check_ranks = False
        self._calls = 0
        #: the batch-invariant kernels run on this device and dtype (checked at most once: by
        #: the loader when asked, else when first entered)
        self._invariant_checked = invariant_checked

    @property
    def mask_id(self) -> int:
        """The mask token; a uniform-state model has none (a one-line :class:`NoMaskToken`)."""
        if self._mask_id is None:
            raise NoMaskToken(
                f"{self.name or self.family}: a uniform-state diffusion model (no mask token: its "
                f"canvas of {self.canvas_length} starts as random tokens); decode it with "
                f"decoder=renoise, the decoders that fill masked positions do not apply")
        return self._mask_id

    @property
    def canvas_length(self) -> int | None:
        """The canvas of a uniform-state model (DiffusionGemma, config.json's
        ``canvas_length``): the last ``canvas_length`` columns of a call; None otherwise."""
        return self.net.cfg.canvas_length

    @property
    def sliding_windows(self) -> tuple[int | None, ...]:
        """Per layer, its sliding window (a query sees the keys of fewer than that many
        positions back; None: every position): what a uniform-state model's context cache
        keeps of each layer (``decoding.cache.ContextKV``)."""
        cfg = self.net.cfg
        return tuple(cfg.window_of(i) for i in range(cfg.n_layers))

    @property
    def block_size(self) -> int | None:
        """Block diffusion's block size: attention sees the query's own block and the blocks
        before it, blocks of ``block_size`` positions counted from position id 0 (real tokens:
        left padding does not move them), on every path (full, ``out_index``, cached calls).
        None: fully bidirectional."""
        return self.net.block_size

    @block_size.setter
    def block_size(self, value: int | None) -> None:
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"block_size={value!r} must be a positive integer or None")
        self.net.block_size = value

    @property
    def device(self) -> torch.device:
        return self.net.embed.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.net.embed.weight.dtype

    @property
    def max_length(self) -> int:
        return self.net.cfg.max_seq_len

    def compile(self, scope: str = "blocks", **options) -> "DiffusionLM":
        """torch.compile the network's forward passes (full and cached), dynamic shapes by default;
        ``options`` go to ``torch.compile`` (e.g. ``mode="reduce-overhead"`` for CUDA graphs).

        ``scope="model"``: the whole stack of layers as one graph per path (the most fusion; the
        compile grows with the depth: about a minute on a CPU for 32 layers).
        ``scope="blocks"``: each transformer block (every block shares one compiled graph, so
        the compile takes seconds whatever the depth); the layers are still called from Python.
        ``scope="true"``: :data:`COMPILE_TRUE` of the model's device type.
        Every size is dynamic (the package's settings, :func:`..tensors.compiling.compiled`):
        what remains specialised is a size of 1 (one row, one request) and whether there is an
        attention mask, a handful of graphs per function. The decode loop's own tensor work is
        compiled by ``decode_batch``'s ``compile_step`` and ``compile_round``. Off unless asked
        for (``compile=true``)."""
        options.setdefault("dynamic", True)
        if scope == "true":
            scope = COMPILE_TRUE.get(self.device.type, "blocks")
        if scope == "model":
            names, owners = ("hidden", "hidden_cached", "canvas_cached"), [self.net]
        elif scope == "blocks":
            names, owners = ("forward", "forward_rows", "forward_cached"), list(self.net.blocks)
        else:
            raise ValueError(f"compile scope={scope!r} must be one of model, blocks, true")
        for owner in owners:
            for name in names:
                setattr(owner, name, compiled(getattr(owner, name), options))
        self.compile_scope = scope
        return self

    def batch_invariant(self):
        """A context manager inside which every call computes each row the same way whatever
        the batch: the network's products, attention and norms in the batch-invariant
        implementation of the model's device (``models/batch_invariant``: fixed-shape products
        on the CPU, Triton kernels on CUDA). A device or dtype without one is a one-line
        ValueError naming ``batch_invariant`` (the CPU in float32; CUDA in
        bfloat16/float16/float32)."""
        if not self._invariant_checked:
            err = support_error(self.device, self.dtype)
            if err:
                raise ValueError(err)
            self._invariant_checked = True
        return ops.use(batch_invariant_ops(self.device))

    @torch.no_grad()
    def logits(self, tokens: torch.Tensor, positions: torch.Tensor, *, attention_mask=None,
               cache=None, self_conditioning=None, shadow=None):
        """Logits [N, P, V] (float32) predicting canvas ``positions`` ([P] or [N, P]) of ``tokens`` [N, T].

        ``cache``: None, a per-request KV cache object, or ``[(cache_or_None, n_rows), ...]`` for
        batched requests (see ``kv.py``). The LM head runs on the requested positions only.

        A uniform-state model (``canvas_length`` set): ``tokens`` = context + canvas, the canvas
        the last ``canvas_length`` columns (never padding); ``positions`` name canvas columns;
        the context (left padding allowed) is read causally, as DiffusionGemma's encoder reads
        it, and the canvas bidirectionally, as its decoder does. ``self_conditioning``
        [N, canvas_length, V]: the previous denoising step's processed logits over the whole
        canvas (transformers' ``generate`` hands over these logits divided by the step's
        temperature, rounded to the model's dtype, which this network does itself); None at a
        canvas's first step. Its logits are softcapped (float32). ``cache`` (``decoding.cache.ContextCall``): a full
        call keeps the context's keys and values, a cached one computes the canvas only on them
        (``tokens`` still context + canvas: the context columns are then not read).

        ``shadow`` (``tensors.shadow.Shadow(start [N], length)``, WINO's verification rows):
        ``length`` mask tokens appended to every row as a shadow copy of canvas columns
        ``start .. start + length - 1`` (who sees whom: ``tensors/shadow.py``); the result is
        [N, P + length, V], the canvas rows as without a shadow followed by the shadow rows.
        Refused in one line on a logit-shifted family (Dream, Fast-dLLM v2, RND1), on a
        uniform-state one, and with a ``cache``.
        """
        if shadow is not None:
            self._check_shadow(tokens, attention_mask, cache, shadow)
        if self.check_ranks and self.comm is not None:
            self._same_call_on_every_rank(tokens, positions, attention_mask, shadow)
        if self.canvas_length is not None:
            return self._canvas_logits(tokens, positions, attention_mask, cache, self_conditioning)
        if self_conditioning is not None:
            raise ValueError("self_conditioning= is for a uniform-state model (canvas_length); "
                             f"{self.name or self.family} has a mask token")
        segs = cache_segments(cache, tokens.shape[0])
        if is_cached_call(segs):
            rows = cached_rows(self.net, tokens, positions, attention_mask, segs, self.logit_shift)
            return self._head(rows)
        kv_out = [] if segs is not None else None
        # Shifted checkpoints (Dream) read position i from output i-1; position 0 has no left
        # neighbour and reads output 0, as upstream Dream does (cat([logits[:, :1], logits[:, :-1]])).
        # Without the clamp, [P] positions wrapped to the last row and [N, P] positions raised.
        src = (positions.to(tokens.device) - self.logit_shift).clamp(min=0)
        if shadow is not None:
            tokens = torch.cat([tokens, tokens.new_full((tokens.shape[0], shadow.length),
                                                        self.mask_id)], dim=1)
        rows = self.net.hidden(tokens, attention_mask, kv_out=kv_out, out_index=src, shadow=shadow)
        if segs is not None:
            keep_pending(segs, kv_out)
        return self._head(rows)

    def _canvas_logits(self, tokens, positions, attention_mask, cache, self_conditioning):
        """:meth:`logits` of a uniform-state model; one-line errors for calls it cannot take."""
        n, t = tokens.shape
        c = self.canvas_length
        if cache is not None and not callable(getattr(cache, "context", None)):
            raise ValueError(f"cache: {self.family} (a uniform-state model) takes a context "
                             f"cache (decoding.cache.ContextKV), not {type(cache).__name__}")
        if t < c:
            raise ValueError(f"tokens hold {t} columns; {self.family} needs the context followed "
                             f"by its canvas of {c}")
        pos = positions.to(tokens.device)
        if bool(((pos < t - c) | (pos >= t)).any()):
            raise ValueError(f"positions must name canvas columns ({t - c}..{t - 1} of {t}): "
                             f"{self.family} predicts its canvas only")
        if attention_mask is not None and not bool(attention_mask[:, t - c:].all()):
            raise ValueError(f"attention_mask: the canvas (the last {c} columns) holds padding; "
                             f"only the context may be left-padded")
        if self_conditioning is not None and tuple(self_conditioning.shape) != (n, c, self.vocab_size):
            raise ValueError(f"self_conditioning of shape {tuple(self_conditioning.shape)}; "
                             f"expected [N, canvas, V] = {[n, c, self.vocab_size]}")
        segs = cache_segments(cache, n)
        if is_cached_call(segs):
            start, key_pos, key_keep = segs.context()
            rows = self.net.canvas_cached(tokens[:, t - c:], start, segs.layer_kv(), key_pos,
                                          key_keep, self_conditioning)
            return self._head(take_rows(rows, pos - (t - c)))
        kv_out = [] if segs is not None else None
        rows = self.net.hidden(tokens, attention_mask, kv_out=kv_out, out_index=pos,
                               self_conditioning=self_conditioning)
        if segs is not None:
            keep_pending(segs, kv_out)
        return self._head(rows)

    def _check_shadow(self, tokens, attention_mask, cache, shadow) -> None:
        """One-line errors for a ``shadow`` the call cannot take, before any work. The values of
        ``shadow.start`` are checked on the device (no host read): out of range, or a shadowed
        column that is padding, stops the call with a RuntimeError naming ``shadow.start`` (on
        CUDA, a device-side assert)."""
        who = self.family
        if self.canvas_length is not None:
            raise ValueError(f"shadow: {who} is a uniform-state model (no mask token to fill "
                             f"the shadow rows); call without shadow")
        if self.logit_shift:
            raise ValueError(f"shadow: {who} shifts its logits (position j is read from the row "
                             f"at j - 1, which a shadow row does not hide), so no shadow row "
                             f"predicts a position without seeing its token; shadow is for "
                             f"unshifted families; call without shadow")
        if cache is not None:
            raise ValueError("cache: a call with a shadow takes no KV cache (cache=None)")
        n, t = tokens.shape
        length, start = shadow.length, shadow.start
        if isinstance(length, bool) or not isinstance(length, int) or not 1 <= length <= t:
            raise ValueError(f"shadow.length={length!r} must be an integer from 1 to the call's "
                             f"{t} canvas columns")
        if (not isinstance(start, torch.Tensor) or start.dtype not in (torch.int64, torch.int32)
                or tuple(start.shape) != (n,)):
            what = (f"{start.dtype} of shape {tuple(start.shape)}" if isinstance(start, torch.Tensor)
                    else type(start).__name__)
            raise ValueError(f"shadow.start must be an int64 or int32 tensor [N] = [{n}] (one "
                             f"start column per row); got {what}")
        inside = (start >= 0) & (start <= t - length)
        torch._assert_async(inside.all(), f"shadow.start: every start must lie in 0..{t - length} "
                                          f"(the {t} canvas columns minus shadow.length={length})")
        if attention_mask is not None:
            real = attention_mask.to(torch.bool).gather(
                1, (start.clamp(0, t - length)[:, None]
                    + torch.arange(length, device=start.device)))
            torch._assert_async(real.all(), "shadow.start: a shadowed column is padding "
                                            "(attention_mask 0); shadow real canvas columns")

    def _same_call_on_every_rank(self, tokens, positions, attention_mask, shadow=None) -> None:
        """With ``check_ranks``: a fingerprint of the call's tokens, positions, mask and shadow,
        compared across the tensor-parallel ranks before any of them computes (one gather and
        one host read): ranks whose decoding took different turns stop here with
        ``parallel.RanksDiverged``, never waiting on each other in a collective."""
        self._calls += 1
        rows = None if shadow is None else torch.cat(
            [shadow.start.long().reshape(-1), shadow.start.new_tensor([shadow.length]).long()])
        same_on_every_rank(self.comm, call_fingerprint(tokens, positions, attention_mask, rows),
                           f"the inputs of model call {self._calls}")

    def _head(self, rows: torch.Tensor) -> torch.Tensor:
        out = self.net.head(rows).float()
        if self.decodable < self.vocab_size:
            out[..., self.decodable:] = float("-inf")
        return out

    def __repr__(self) -> str:
        c = self.net.cfg
        return (f"DiffusionLM({self.name!r}, family={self.family}, d_model={c.d_model}, "
                f"layers={c.n_layers}, vocab={c.vocab_size}, mask_id={self._mask_id}, eos_ids={self.eos_ids})")
