"""transformers' DiffusionGemma as a reference for the ``renoise`` decoder.

:func:`reference_generate` runs transformers' own ``generate`` right after
``torch.manual_seed(seed)`` and counts its denoising calls (the model's ``forward``; the
encoder's passes are not denoising calls). :class:`TransformersCanvas` puts the same
transformers network behind the model protocol of ``decoding/api.py`` (batch 1), computing what
``generate`` computes: the encoder reads the prompt, then each committed canvas, into its cache,
chunk by chunk, and the decoder reads the canvas against that cache. Decoding it with
``decoder=renoise`` therefore sees transformers' logits bit for bit, so the sampler alone is
compared (the native network's logits agree within 1e-4, which may flip a sample).
"""

from __future__ import annotations

import torch


def reference_generate(ref, prompt: list[int], seed: int, gen_length: int, eos_ids, pad_id: int,
                       **config) -> tuple[list[int], int]:
    """(generated tokens, denoising calls) of ``ref.generate`` after ``torch.manual_seed(seed)``;
    ``config``: generation config values by transformers' names."""
    calls = {"n": 0}
    forward = ref.forward

    def counted(*a, **kw):
        calls["n"] += 1
        return forward(*a, **kw)

    ref.forward = counted
    try:
        torch.manual_seed(seed)
        out = ref.generate(torch.tensor([prompt]), max_new_tokens=gen_length,
                           eos_token_id=list(eos_ids), pad_token_id=pad_id, **config)
    finally:
        ref.forward = forward
    return out.sequences[0, len(prompt):].tolist(), calls["n"]


class TransformersCanvas:
    """The model protocol over transformers' ``DiffusionGemmaForBlockDiffusion`` (batch 1)."""

    def __init__(self, ref, eos_ids, pad_id: int):
        from transformers.cache_utils import DynamicCache

        self._cache_class = DynamicCache
        self.ref = ref
        self.canvas_length = ref.config.canvas_length
        self.vocab_size = ref.config.text_config.vocab_size
        self.eos_ids = tuple(eos_ids)
        self.pad_id = pad_id
        self.dtype = ref.dtype
        self.name = "transformers DiffusionGemma"
        self._seen = None
        self._cache = None

    @torch.no_grad()
    def logits(self, tokens, positions, *, attention_mask=None, cache=None,
               self_conditioning=None):
        assert tokens.shape[0] == 1 and attention_mask is None and cache is None
        c = self.canvas_length
        t = tokens.shape[1]
        assert positions.tolist() == list(range(t - c, t))
        context = tokens[:, :t - c]
        if self._seen is None or not torch.equal(context[:, :self._seen.shape[1]], self._seen):
            self._cache = self._cache_class(config=self.ref.config.get_text_config(decoder=True))
            self._seen = context[:, :0]
        new = context[:, self._seen.shape[1]:]
        if new.shape[1]:
            start = self._seen.shape[1]
            self.ref.model.encoder(input_ids=new, cache=self._cache,
                                   position_ids=torch.arange(start, start + new.shape[1])[None])
            self._seen = context
        return self.ref(cache=self._cache, decoder_input_ids=tokens[:, t - c:],
                        decoder_position_ids=torch.arange(t - c, t)[None],
                        self_conditioning_logits=self_conditioning).logits.float()
