"""Checkpoint formats: LLaDA, Dream, LLaDA-MoE and LLaDA 2.x configs and weight names, mapped onto
the native network.

A format knows how to read its ``config.json`` into a ``TransformerConfig``, how its weight names
map to the native parameter names (both ways, so the tiny fixtures are written in the real
formats), and whether its logits are shifted (Dream: the output at ``i-1`` predicts ``i``).
Per-expert weights (``...experts.{e}.gate_proj.weight``) are slices ``[e]`` of one stacked
native parameter (``blocks.{i}.mlp.gate_proj`` [E, F, d]): a name-map pattern with an ``e``
group says so.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Callable

from .transformer import TransformerConfig


class UnsupportedCheckpoint(ValueError):
    """The folder holds something other than a supported diffusion LM."""


@dataclass(frozen=True)
class CheckpointFormat:
    model_type: str
    family: str                      # "llada" | "dream": the key used by vocabulary artifacts
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


def _need(cfg: dict, key: str, model_type: str):
    """A shape key the weights depend on: present, a positive integer."""
    value = cfg.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        got = "absent" if key not in cfg else f"{json.dumps(value)}"
        raise UnsupportedCheckpoint(f"config.json: {key} is {got}; a {model_type} checkpoint needs "
                                    f"it as a positive integer")
    return value


# --- LLaDA (OLMo-style names, model_type "llada") -------------------------------------------

_LLADA_BLOCK = r"model\.transformer\.blocks\.(?P<i>\d+)\."
LLADA_NAMES = (
    (r"model\.transformer\.wte\.weight", "embed.weight"),
    (_LLADA_BLOCK + r"attn_norm\.weight", "blocks.{i}.attn_norm.weight"),
    (_LLADA_BLOCK + r"q_proj\.weight", "blocks.{i}.attn.q_proj.weight"),
    (_LLADA_BLOCK + r"k_proj\.weight", "blocks.{i}.attn.k_proj.weight"),
    (_LLADA_BLOCK + r"v_proj\.weight", "blocks.{i}.attn.v_proj.weight"),
    (_LLADA_BLOCK + r"q_proj\.bias", "blocks.{i}.attn.q_proj.bias"),
    (_LLADA_BLOCK + r"k_proj\.bias", "blocks.{i}.attn.k_proj.bias"),
    (_LLADA_BLOCK + r"v_proj\.bias", "blocks.{i}.attn.v_proj.bias"),
    (_LLADA_BLOCK + r"attn_out\.weight", "blocks.{i}.attn.o_proj.weight"),
    (_LLADA_BLOCK + r"ff_norm\.weight", "blocks.{i}.mlp_norm.weight"),
    (_LLADA_BLOCK + r"ff_proj\.weight", "blocks.{i}.mlp.gate_proj.weight"),
    (_LLADA_BLOCK + r"up_proj\.weight", "blocks.{i}.mlp.up_proj.weight"),
    (_LLADA_BLOCK + r"ff_out\.weight", "blocks.{i}.mlp.down_proj.weight"),
    (r"model\.transformer\.ln_f\.weight", "norm.weight"),
    (r"model\.transformer\.ff_out\.weight", "lm_head.weight"),
)


#: (key, LLaDA's default when absent, values the native network implements). The defaults are
#: those of LLaDA's model config class, which differ from the released checkpoint's values: an
#: OLMo "sequential" block, LayerNorm, SwiGLU-by-halves, no rotary, a tied head.
LLADA_FLAGS = (
    ("block_type", "sequential", ("llama",)),
    ("activation_type", "swiglu", ("silu",)),
    ("layer_norm_type", "default", ("rms",)),
    ("layer_norm_with_affine", True, (True,)),
    ("bias_for_layer_norm", None, (None, False)),
    ("attention_layer_norm", False, (False,)),
    ("rope", False, (True,)),
    ("rope_full_precision", True, (True, False)),
    ("alibi", False, (False,)),
    ("input_emb_norm", False, (False,)),
    ("scale_logits", False, (False,)),
    ("include_bias", False, (False,)),
    ("include_qkv_bias", False, (False, True)),
    ("weight_tying", True, (True, False)),
    ("block_group_size", 1, (1,)),
)


def _llada_kv_heads(cfg: dict, n_heads: int) -> int:
    """LLaDA's effective key/value head count (``n_kv_heads``, or ``multi_query_attention``)."""
    n_kv, mqa = cfg.get("n_kv_heads"), cfg.get("multi_query_attention")
    implied = None if mqa is None else (1 if mqa else n_heads)
    if n_kv is None:
        return implied or n_heads
    if implied is not None and n_kv != implied:
        raise UnsupportedCheckpoint(f"config.json: n_kv_heads={n_kv} contradicts "
                                    f"multi_query_attention={json.dumps(mqa)}")
    return n_kv


def _llada_read(cfg: dict) -> TransformerConfig:
    check_flags(cfg, LLADA_FLAGS, "LLaDA")
    d_model, n_heads = _need(cfg, "d_model", "LLaDA"), _need(cfg, "n_heads", "LLaDA")
    ffn = cfg.get("mlp_hidden_size") or cfg.get("mlp_ratio", 4) * d_model
    vocab = cfg.get("embedding_size") or _need(cfg, "vocab_size", "LLaDA")
    return TransformerConfig(
        vocab_size=vocab,
        d_model=d_model,
        n_layers=_need(cfg, "n_layers", "LLaDA"),
        n_heads=n_heads,
        n_kv_heads=_llada_kv_heads(cfg, n_heads),
        ffn_hidden=ffn,
        norm_eps=cfg.get("rms_norm_eps", 1e-5),
        rope_theta=cfg.get("rope_theta", 10000.0),
        qkv_bias=bool(cfg.get("include_qkv_bias", False)),
        max_seq_len=cfg.get("max_sequence_length", 1024),
        rope_full_precision=bool(cfg.get("rope_full_precision", True)),
    )


def _llada_write(c: TransformerConfig, special: dict) -> dict:
    return {
        "architectures": ["LLaDAModelLM"],
        "model_type": "llada",
        "d_model": c.d_model,
        "n_layers": c.n_layers,
        "n_heads": c.n_heads,
        "n_kv_heads": c.n_kv_heads,
        "mlp_hidden_size": c.ffn_hidden,
        "mlp_ratio": c.ffn_hidden // c.d_model,
        "vocab_size": c.vocab_size,
        "embedding_size": c.vocab_size,
        "max_sequence_length": c.max_seq_len,
        "rope": True,
        "rope_theta": c.rope_theta,
        "rope_full_precision": c.rope_full_precision,
        "rms_norm_eps": c.norm_eps,
        "layer_norm_type": "rms",
        "layer_norm_with_affine": True,
        "activation_type": "silu",
        "block_type": "llama",
        "include_bias": False,
        "include_qkv_bias": c.qkv_bias,
        "weight_tying": False,
        "scale_logits": False,
        "alibi": False,
        "use_cache": False,
        "torch_dtype": "float32",
        **special,
    }


LLADA = CheckpointFormat(
    model_type="llada", family="llada", logit_shift=0, name_map=LLADA_NAMES,
    read_config=_llada_read, write_config=_llada_write,
    tied_names=("model.transformer.ff_out.weight", "model.transformer.wte.weight"),
    tie_flag="weight_tying", tie_default=True,
)

# --- Dream (Qwen2 names, model_type "Dream") ----------------------------------------------

_QWEN_LAYER = r"model\.layers\.(?P<i>\d+)\."
DREAM_NAMES = (
    (r"model\.embed_tokens\.weight", "embed.weight"),
    (_QWEN_LAYER + r"input_layernorm\.weight", "blocks.{i}.attn_norm.weight"),
    (_QWEN_LAYER + r"self_attn\.q_proj\.weight", "blocks.{i}.attn.q_proj.weight"),
    (_QWEN_LAYER + r"self_attn\.k_proj\.weight", "blocks.{i}.attn.k_proj.weight"),
    (_QWEN_LAYER + r"self_attn\.v_proj\.weight", "blocks.{i}.attn.v_proj.weight"),
    (_QWEN_LAYER + r"self_attn\.q_proj\.bias", "blocks.{i}.attn.q_proj.bias"),
    (_QWEN_LAYER + r"self_attn\.k_proj\.bias", "blocks.{i}.attn.k_proj.bias"),
    (_QWEN_LAYER + r"self_attn\.v_proj\.bias", "blocks.{i}.attn.v_proj.bias"),
    (_QWEN_LAYER + r"self_attn\.o_proj\.weight", "blocks.{i}.attn.o_proj.weight"),
    (_QWEN_LAYER + r"post_attention_layernorm\.weight", "blocks.{i}.mlp_norm.weight"),
    (_QWEN_LAYER + r"mlp\.gate_proj\.weight", "blocks.{i}.mlp.gate_proj.weight"),
    (_QWEN_LAYER + r"mlp\.up_proj\.weight", "blocks.{i}.mlp.up_proj.weight"),
    (_QWEN_LAYER + r"mlp\.down_proj\.weight", "blocks.{i}.mlp.down_proj.weight"),
    (r"model\.norm\.weight", "norm.weight"),
    (r"lm_head\.weight", "lm_head.weight"),
)


#: (key, Dream's default when absent, values the native network implements). Dream is Qwen2
#: with bidirectional attention: q/k/v always carry a bias, o_proj and the MLP never do.
DREAM_FLAGS = (
    ("hidden_act", "silu", ("silu",)),
    ("rope_scaling", None, (None,)),
    ("use_sliding_window", False, (False,)),
    ("tie_word_embeddings", False, (False, True)),
)


def _dream_read(cfg: dict) -> TransformerConfig:
    check_flags(cfg, DREAM_FLAGS, "Dream")
    n_heads = _need(cfg, "num_attention_heads", "Dream")
    return TransformerConfig(
        vocab_size=_need(cfg, "vocab_size", "Dream"),
        d_model=_need(cfg, "hidden_size", "Dream"),
        n_layers=_need(cfg, "num_hidden_layers", "Dream"),
        n_heads=n_heads,
        n_kv_heads=cfg.get("num_key_value_heads") or n_heads,
        ffn_hidden=_need(cfg, "intermediate_size", "Dream"),
        norm_eps=cfg.get("rms_norm_eps", 1e-6),
        rope_theta=cfg.get("rope_theta", 10000.0),
        qkv_bias=True,
        max_seq_len=cfg.get("max_position_embeddings", 32768),
    )


def _dream_write(c: TransformerConfig, special: dict) -> dict:
    return {
        "architectures": ["DreamModel"],
        "model_type": "Dream",
        "hidden_size": c.d_model,
        "num_hidden_layers": c.n_layers,
        "num_attention_heads": c.n_heads,
        "num_key_value_heads": c.n_kv_heads,
        "intermediate_size": c.ffn_hidden,
        "vocab_size": c.vocab_size,
        "rms_norm_eps": c.norm_eps,
        "rope_theta": c.rope_theta,
        "hidden_act": "silu",
        "max_position_embeddings": c.max_seq_len,
        "tie_word_embeddings": False,
        "use_cache": False,
        "torch_dtype": "float32",
        **special,
    }


DREAM = CheckpointFormat(
    model_type="Dream", family="dream", logit_shift=1, name_map=DREAM_NAMES,
    read_config=_dream_read, write_config=_dream_write,
    tied_names=("lm_head.weight", "model.embed_tokens.weight"),
    tie_flag="tie_word_embeddings", tie_default=False, tokenizer_class="Qwen2Tokenizer",
)

from .moe_formats import LLADA2, LLADA21, LLADA_MOE  # noqa: E402  (they use the helpers above)

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
