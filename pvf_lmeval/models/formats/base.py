"""What every checkpoint format is made of: :class:`CheckpointFormat` (how a family's
``config.json`` reads into a ``TransformerConfig`` and how its weight names map onto the native
network's, both ways, so the tiny fixtures are written in the real formats; whether its logits are
shifted: Dream's output at ``i-1`` predicts ``i``), :class:`UnsupportedCheckpoint`, and the config
helpers the family modules share (one-line errors naming the key).

Per-expert weights (``...experts.{e}.gate_proj.weight``) are slices ``[e]`` of one stacked native
parameter (``blocks.{i}.mlp.gate_proj`` [E, F, d]): a name-map pattern with an ``e`` group says so.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Callable

from ..transformer import TransformerConfig

#: the layer prefix of Qwen-style weight names (Dream, LLaDA-MoE, LLaDA 2.x, the Qwen3 families)
QWEN_LAYER = r"model\.layers\.(?P<i>\d+)\."

#: the most layers a per-layer routed/dense table is built for (real checkpoints hold < 200); the
#: weights' layer count is checked later, so a config claiming 10**9 layers must fail before a table
MAX_TABLE_LAYERS = 1 << 16
#: the expert index of a routed expert's weight name
EXPERT = r"experts\.(?P<e>\d+)\."


def qwen_names(biases: str = "", qk_norm: bool = False) -> tuple[tuple[str, str], ...]:
    """The name map of the Qwen layout (Qwen2/Qwen3 and their diffusion descendants): embedding,
    per layer the q/k/v/o projections (a bias on each of ``biases``, e.g. "qkv"), per-head
    ``q_norm``/``k_norm`` with ``qk_norm``, the two norms and a dense SwiGLU MLP; final norm, head."""
    return (
        (r"model\.embed_tokens\.weight", "embed.weight"),
        (QWEN_LAYER + r"input_layernorm\.weight", "blocks.{i}.attn_norm.weight"),
        *((QWEN_LAYER + rf"self_attn\.{p}_proj\.weight", f"blocks.{{i}}.attn.{p}_proj.weight")
          for p in "qkvo"),
        *((QWEN_LAYER + rf"self_attn\.{p}_proj\.bias", f"blocks.{{i}}.attn.{p}_proj.bias")
          for p in biases),
        *(((QWEN_LAYER + r"self_attn\.q_norm\.weight", "blocks.{i}.attn.q_norm.weight"),
           (QWEN_LAYER + r"self_attn\.k_norm\.weight", "blocks.{i}.attn.k_norm.weight"))
          if qk_norm else ()),
        (QWEN_LAYER + r"post_attention_layernorm\.weight", "blocks.{i}.mlp_norm.weight"),
        *((QWEN_LAYER + rf"mlp\.{p}_proj\.weight", f"blocks.{{i}}.mlp.{p}_proj.weight")
          for p in ("gate", "up", "down")),
        (r"model\.norm\.weight", "norm.weight"),
        (r"lm_head\.weight", "lm_head.weight"),
    )


class UnsupportedCheckpoint(ValueError):
    """The folder holds something other than a supported diffusion LM."""


@dataclass(frozen=True)
class CheckpointFormat:
    model_type: str
    family: str                      # the model family (formats.MODEL_FAMILIES): artifacts' key
    logit_shift: int                 # 1 when the output at i-1 predicts position i
    name_map: tuple[tuple[str, str], ...]   # (checkpoint regex, native template) with {i} = layer
    read_config: Callable[[dict], TransformerConfig]
    write_config: Callable[[TransformerConfig, dict], dict]
    tied_names: tuple[str, str]      # (checkpoint head name, checkpoint embedding name)
    tie_flag: str                    # config key that says the head is the embedding
    tie_default: bool                # what the reference assumes when ``tie_flag`` is absent
    #: transformers' built-in tokenizer class for folders whose own class is remote code
    #: (Dream's DreamTokenizer is a Qwen2 byte-level BPE); None = only a tokenizer.json will do
    tokenizer_class: str | None = None
    #: token ids the reference generate uses when neither config.json nor the tokenizer names
    #: them (keys ``mask_token_id``, ``eos_token_id``)
    generate_defaults: tuple[tuple[str, int], ...] = ()
    #: the family as users name it (``pvf-dlm models``, README)
    title: str = ""
    #: ``architectures`` class names that identify the format when ``model_type`` does not
    architectures: tuple[str, ...] = ()
    #: the attention the network applies, in words (``pvf-dlm models``)
    attention: str = "bidirectional"

    def ties_head(self, config: dict) -> bool:
        """Whether the LM head is the input embedding (an absent flag means the reference's default)."""
        return bool(config.get(self.tie_flag, self.tie_default))

    def slot(self, name: str) -> tuple[str, int | None] | None:
        """(native parameter, expert index or None) that checkpoint tensor ``name`` fills; None
        for a name the format does not know."""
        for pattern, native in self.name_map:
            m = re.fullmatch(pattern, name)
            if m:
                groups = m.groupdict()
                e = groups.pop("e", None)
                return native.format(**groups), None if e is None else int(e)
        return None

    def to_native(self, name: str) -> str | None:
        """The native parameter checkpoint tensor ``name`` fills (a stacked one for an expert)."""
        found = self.slot(name)
        return None if found is None else found[0]

    def _native_match(self, name: str):
        for pattern, native in self.name_map:
            native_re = re.escape(native).replace(r"\{i\}", r"(?P<i>\d+)")
            m = re.fullmatch(native_re, name)
            if m:
                plain = (pattern.replace(r"(?P<i>\d+)", "{i}").replace(r"(?P<e>\d+)", "{e}")
                         .replace("\\.", "."))
                return plain, m.groupdict()
        raise KeyError(f"native parameter {name!r} has no {self.model_type} name")

    def stacked(self, name: str) -> bool:
        """Whether native parameter ``name`` is stacked over experts (one checkpoint tensor per
        expert fills one slice of it)."""
        return "{e}" in self._native_match(name)[0]

    def checkpoint_name(self, name: str, expert: int | None = None) -> str:
        """The checkpoint name of native parameter ``name``, or of expert ``expert``'s slice of a
        stacked one."""
        plain, groups = self._native_match(name)
        return plain.format(**groups) if expert is None else plain.format(e=expert, **groups)

    def from_native(self, name: str) -> str:
        """The checkpoint name of native parameter ``name`` (not a stacked one: see
        :meth:`checkpoint_tensors`)."""
        plain, groups = self._native_match(name)
        if "{e}" in plain:
            raise KeyError(f"native parameter {name!r} is stacked over experts; use checkpoint_tensors")
        return plain.format(**groups)

    def checkpoint_tensors(self, name: str, tensor) -> list[tuple[str, object]]:
        """[(checkpoint name, tensor)] for native parameter ``name``: one pair, or one per expert
        for a stacked parameter."""
        plain, groups = self._native_match(name)
        if "{e}" not in plain:
            return [(plain.format(**groups), tensor)]
        return [(plain.format(e=e, **groups), tensor[e]) for e in range(tensor.shape[0])]


def check_flags(cfg: dict, flags: tuple, model_type: str) -> None:
    """Reject configurations the native network does not implement, in one line naming the key.

    ``flags``: (key, the reference code's default when the key is absent, supported values). The
    reference default matters: an absent ``block_type`` means LLaDA's "sequential" block, not ours.
    """
    for key, default, supported in flags:
        value = cfg.get(key, default)
        if value not in supported:
            absent = f" (absent: the {model_type} reference default)" if key not in cfg else ""
            allowed = " or ".join(json.dumps(v) for v in supported)
            raise UnsupportedCheckpoint(
                f"config.json: {key}={json.dumps(value)}{absent} is not supported by the native "
                f"network; supported: {allowed}")


def need(cfg: dict, key: str, model_type: str):
    """A shape key the weights depend on: present, a positive integer."""
    value = cfg.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        got = "absent" if key not in cfg else f"{json.dumps(value)}"
        raise UnsupportedCheckpoint(f"config.json: {key} is {got}; a {model_type} checkpoint needs "
                                    f"it as a positive integer")
    return value


def rotary_dim(head_dim: int, factor, model_type: str) -> int:
    """``int(head_dim * partial_rotary_factor)``, as the reference's rotary tables are sized."""
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not 0 < factor <= 1:
        raise UnsupportedCheckpoint(f"config.json: partial_rotary_factor={json.dumps(factor)}; a "
                                    f"{model_type} checkpoint needs it in (0, 1]")
    dim = int(head_dim * factor)
    if dim < 2 or dim % 2:
        raise UnsupportedCheckpoint(f"config.json: partial_rotary_factor={factor} rotates {dim} of "
                                    f"{head_dim} head dimensions; rotary needs an even number >= 2")
    return dim


def positive(cfg: dict, key: str, default, model_type: str) -> float:
    """``cfg[key]`` (``default`` when absent): a positive number, else a one-line error."""
    value = cfg.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise UnsupportedCheckpoint(f"config.json: {key}={json.dumps(value)}; a {model_type} "
                                    f"checkpoint needs it as a positive number")
    return value
