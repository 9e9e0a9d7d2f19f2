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
import math
import re
from dataclasses import dataclass
from typing import Callable

from ..transformer import TransformerConfig

#: the layer prefix of Qwen-style weight names (Dream, LLaDA-MoE, LLaDA 2.x, the Qwen3 families)
QWEN_LAYER = r"model\.layers\.(?P<i>\d+)\."

#: the most layers a per-layer routed/dense table is built for (real checkpoints hold < 200); the
#: weights' layer count is checked later, so a config claiming 10**9 layers must fail before a table
MAX_TABLE_LAYERS = 1 << 16
#: the largest integer a config count may hold: torch takes sizes as 64-bit integers
MAX_COUNT = (1 << 63) - 1
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
    #: checkpoint tensors the network does not use (regexes), skipped when loading: the vision
    #: tower of a multimodal checkpoint whose text part is loaded
    ignored: tuple[str, ...] = ()
    #: False for a uniform-state diffusion model: no mask token (its canvas starts as noise)
    masked: bool = True
    #: ``config.json`` as one flat dict of the keys the checks read (a config nesting its text
    #: model's keys under ``text_config`` flattens them); None = ``config.json`` itself
    flatten: Callable[[dict], dict] | None = None

    def ignores(self, name: str) -> bool:
        """Whether checkpoint tensor ``name`` is one the network does not use (``ignored``)."""
        return any(re.fullmatch(p, name) for p in self.ignored)

    def values(self, config: dict) -> dict:
        """The flat view of ``config`` (``flatten``)."""
        return config if self.flatten is None else self.flatten(config)

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


def count(cfg: dict, key: str, model_type: str, default: int | None = None, *, low: int = 1,
          high: int | None = None, high_says: str = "", at: str = "") -> int:
    """``cfg[key]`` as an integer from ``low`` to ``high`` (None: no bound), ``default`` when the
    key is absent (None: the key is required); else a one-line error naming the key (after
    ``at``, the path of a nested ``cfg`` such as "text_config.").

    A float (even 16.0), a string or a bool is refused: the reference modeling code passes these
    values to ``nn.Linear``, ``topk`` or ``view``, which take integers only, and 64-bit ones
    (without ``high``, :data:`MAX_COUNT` bounds it). ``high_says`` names the bound in the error
    (e.g. "num_experts=8")."""
    value = cfg.get(key, default) if default is not None else cfg.get(key)
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= low
    if ok and value <= (MAX_COUNT if high is None else high):
        return value
    got = "absent" if key not in cfg and default is None else json.dumps(value)
    if high is not None:
        what = f"an integer from {low} to {high_says or high}"
    else:
        what = ("a positive integer" if low == 1 else f"an integer >= {low}") + " below 2^63"
    raise UnsupportedCheckpoint(f"config.json: {at}{key} is {got}; a {model_type} checkpoint "
                                f"needs it as {what}")


def need(cfg: dict, key: str, model_type: str, at: str = "") -> int:
    """A shape key the weights depend on: present, a positive integer."""
    return count(cfg, key, model_type, at=at)


def expert_counts(cfg: dict, model_type: str, top_k_default: int | None = None) -> tuple[int, int]:
    """(``num_experts``, ``num_experts_per_tok``): positive integers, the second at most the first
    (the reference's ``topk`` over the experts); ``top_k_default`` when the second is absent."""
    n_experts = need(cfg, "num_experts", model_type)
    return n_experts, count(cfg, "num_experts_per_tok", model_type, default=top_k_default,
                            high=n_experts, high_says=f"num_experts={n_experts}")


def null_or_count(cfg: dict, key: str, model_type: str, null: int) -> int:
    """``cfg[key]`` as a positive integer, or ``null`` when the key is absent or null: the
    reference's config class maps None to that value (e.g. ``num_key_value_heads``: one per
    attention head); 0 is refused (the reference divides by it)."""
    return null if cfg.get(key) is None else count(cfg, key, model_type)


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


def finite_number(value) -> bool:
    """A JSON number the network can compute with: a finite float, or an integer torch takes as
    a 64-bit scalar (2**64 overflows ``theta ** positions``; 10**400 no float holds)."""
    if isinstance(value, float):
        return math.isfinite(value)
    return isinstance(value, int) and not isinstance(value, bool) and -(1 << 63) <= value < 1 << 63


def positive(cfg: dict, key: str, default, model_type: str, high: float = math.inf,
             at: str = "") -> float:
    """``cfg[key]`` (``default`` when absent): a finite number in (0, ``high``], else a one-line
    error naming the key (after ``at``, as :func:`count`). An integer is taken as it is (the
    reference multiplies by it); a string is refused (the reference's product with a string
    raises)."""
    value = cfg.get(key, default)
    if not finite_number(value) or not 0 < value <= high:
        bound = "a positive number" if high == math.inf else f"a finite number in (0, {high:g}]"
        raise UnsupportedCheckpoint(f"config.json: {at}{key}={json.dumps(value)}; a {model_type} "
                                    f"checkpoint needs it as {bound}")
    return value
