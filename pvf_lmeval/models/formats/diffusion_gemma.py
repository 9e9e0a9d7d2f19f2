"""DiffusionGemma (``diffusion_gemma``): transformers' ``DiffusionGemmaForBlockDiffusion`` (native
since transformers 5.11, ``models/diffusion_gemma``), a uniform-state block-diffusion model on
Gemma-4's mixture-of-experts network, loaded as its text part.

One stack of layers serves as a causal encoder over the context (prompt and committed canvases)
and as a bidirectional decoder over a canvas of ``canvas_length`` tokens (``models/canvas.py``);
the checkpoint holds the stack once, under ``model.decoder.*``, plus the encoder's own
``layer_scalar`` buffers (``model.encoder.language_model.layers.{i}.layer_scalar``) and the
vision tower (``model.encoder.vision_tower.*``, ``model.encoder.embed_vision.*``), which the text
network does not use. The head is the embedding (``tie_word_embeddings``, which also ties the
encoder to the decoder: false unties them, which one stack cannot hold, so it is refused).

Each layer (transformers' ``DiffusionGemma{Encoder,Decoder}TextLayer``): sandwich norms, a
GeGLU MLP of ``intermediate_size`` beside ``num_experts`` routed GeGLU experts of
``moe_intermediate_size`` (top ``top_k_experts``, softmax, renormalised, per-expert factors, the
router reading the normed layer input times a learned vector and ``hidden_size ** -0.5``), the
output times the layer's scalar. Attention: per-head RMSNorm on queries and keys, a weightless
RMSNorm on values, scale 1; ``layer_types`` interleaves ``sliding_attention`` layers (``head_dim``,
``num_key_value_heads``, a window of ``sliding_window``) and ``full_attention`` layers with their
own shape (``global_head_dim`` and ``num_global_key_value_heads`` as published, or
``per_layer_config`` as transformers 5.25 writes it; no value projection: values are the raw key
projection), each kind with its ``rope_parameters`` (``default``, or ``proportional``: a
``partial_rotary_factor`` of the frequencies turn). The embedding is scaled by
``sqrt(hidden_size)``, the logits softcapped (``final_logit_softcapping``), and the canvas input
takes the previous step's logits (self-conditioning).

Keys absent from config.json take the configuration classes' defaults (``DiffusionGemmaConfig``,
``DiffusionGemmaTextConfig``), as the reference does.
"""

from __future__ import annotations

import json

import torch

from ..moe import MoEConfig
from ..transformer import LayerAttention, TransformerConfig
from .base import (MAX_TABLE_LAYERS, CheckpointFormat, UnsupportedCheckpoint, check_flags, count,
                   positive)

MT = "diffusion_gemma"
DEC = r"model\.decoder\."
LAYER = DEC + r"layers\.(?P<i>\d+)\."

NAMES = (
    (DEC + r"embed_tokens\.weight", "embed.weight"),
    (LAYER + r"input_layernorm\.weight", "blocks.{i}.attn_norm.weight"),
    *((LAYER + rf"self_attn\.{p}_proj\.weight", f"blocks.{{i}}.attn.{p}_proj.weight")
      for p in "qkvo"),
    (LAYER + r"self_attn\.q_norm\.weight", "blocks.{i}.attn.q_norm.weight"),
    (LAYER + r"self_attn\.k_norm\.weight", "blocks.{i}.attn.k_norm.weight"),
    (LAYER + r"post_attention_layernorm\.weight", "blocks.{i}.post_attn_norm.weight"),
    (LAYER + r"pre_feedforward_layernorm\.weight", "blocks.{i}.mlp_norm.weight"),
    *((LAYER + rf"mlp\.{p}_proj\.weight", f"blocks.{{i}}.mlp.{p}_proj.weight")
      for p in ("gate", "up", "down")),
    (LAYER + r"post_feedforward_layernorm_1\.weight", "blocks.{i}.post_mlp_norm.weight"),
    (LAYER + r"pre_feedforward_layernorm_2\.weight", "blocks.{i}.moe_norm.weight"),
    (LAYER + r"router\.proj\.weight", "blocks.{i}.moe.router.weight"),
    (LAYER + r"router\.scale", "blocks.{i}.moe.router_scale"),
    (LAYER + r"router\.per_expert_scale", "blocks.{i}.moe.per_expert_scale"),
    (LAYER + r"experts\.gate_up_proj", "blocks.{i}.moe.gate_up_proj"),
    (LAYER + r"experts\.down_proj", "blocks.{i}.moe.down_proj"),
    (LAYER + r"post_feedforward_layernorm_2\.weight", "blocks.{i}.post_moe_norm.weight"),
    (LAYER + r"post_feedforward_layernorm\.weight", "blocks.{i}.post_ffn_norm.weight"),
    (LAYER + r"layer_scalar", "blocks.{i}.layer_scalar"),
    (r"model\.encoder\.language_model\.layers\.(?P<i>\d+)\.layer_scalar",
     "blocks.{i}.encoder_layer_scalar"),
    (DEC + r"norm\.weight", "norm.weight"),
    (DEC + r"self_conditioning\.pre_norm\.weight", "self_conditioning.pre_norm.weight"),
    *((DEC + rf"self_conditioning\.{p}_proj\.weight", f"self_conditioning.mlp.{p}_proj.weight")
      for p in ("gate", "up", "down")),
    (r"lm_head\.weight", "lm_head.weight"),
)
#: the vision tower and its projection: image inputs, which a text evaluation never has
VISION = (r"model\.encoder\.vision_tower\..+", r"model\.encoder\.embed_vision\..+")

SLIDING, FULL = "sliding_attention", "full_attention"
#: where the text model's keys are, as errors name them
AT = "text_config."
#: the largest ``final_logit_softcapping``: the cap is applied in float32 (logits / cap, then
#: times cap), where a larger one is infinite and every logit NaN
MAX_SOFTCAP = torch.finfo(torch.float32).max
#: ``DiffusionGemmaTextConfig``'s defaults of the keys read here
TEXT_DEFAULTS = {
    "vocab_size": 262144, "hidden_size": 2304, "intermediate_size": 9216,
    "num_hidden_layers": 30, "num_attention_heads": 8, "num_key_value_heads": 4,
    "head_dim": 256, "max_position_embeddings": 131072, "rms_norm_eps": 1e-6,
    "sliding_window": 512, "final_logit_softcapping": 30.0, "global_head_dim": 512,
    "eos_token_id": 1, "pad_token_id": 0, "bos_token_id": 2,
}
DEFAULT_ROPE = {SLIDING: {"rope_type": "default", "rope_theta": 10000.0},
                FULL: {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                       "rope_theta": 1000000.0}}
#: every ``sliding_window_pattern``-th layer is global when ``layer_types`` is absent
PATTERN = 6
#: ``DiffusionGemmaConfig``'s default canvas
CANVAS_LENGTH = 256

#: (key, the reference's default when absent, values the native network implements)
TEXT_FLAGS = (
    ("hidden_activation", "gelu_pytorch_tanh", ("gelu_pytorch_tanh",)),
    ("attention_bias", False, (False,)),
    # "all": a bidirectional encoder whose window the config class halves
    ("use_bidirectional_attention", None, (None, "vision")),
    ("attention_k_eq_v", True, (True, False)),
)
TOP_FLAGS = (("tie_word_embeddings", True, (True,)),)
#: per-layer overrides the network implements (``per_layer_config``)
LAYER_KEYS = ("head_dim", "num_key_value_heads")
ROPE_KEYS = ("rope_type", "rope_theta", "partial_rotary_factor", "factor")


def _fail(text: str):
    raise UnsupportedCheckpoint(f"config.json: {text}")


def _only(d: dict, allowed: tuple[str, ...], where: str) -> None:
    """The keys of ``d`` are among ``allowed``, else a one-line error naming the first other."""
    odd = [k for k in d if k not in allowed]
    if odd:
        _fail(f"{where}.{odd[0]} is not supported by the native network; supported: "
              f"{', '.join(allowed)}")


def _text(cfg: dict) -> dict:
    text = cfg.get("text_config")
    if not isinstance(text, dict):
        _fail(f"text_config={json.dumps(text) if text is None else type(text).__name__}; a "
              f"{MT} checkpoint needs its text model's keys there")
    return text


def flatten(cfg: dict) -> dict:
    """The text model's keys with the top level's over them (``eos_token_id``,
    ``tie_word_embeddings``, ``canvas_length``), the vision keys left out; the text keys the top
    level hides and the per-layer overrides also under their paths
    (``text_config.eos_token_id``, ``text_config.per_layer_config["5"].head_dim``), so that the
    value checks see them and their errors name them."""
    text = cfg.get("text_config")
    text = text if isinstance(text, dict) else {}
    top = {k: v for k, v in cfg.items() if k not in ("text_config", "vision_config")}
    hidden = {AT + k: v for k, v in text.items() if k in top}
    plc = text.get("per_layer_config")
    layers = {f"{AT}per_layer_config[{json.dumps(i)}].{k}": v
              for i, over in (plc.items() if isinstance(plc, dict) else ())
              if isinstance(over, dict) for k, v in over.items()}
    return {**text, **top, **hidden, **layers}


def _size(text: dict, key: str, **bounds) -> int:
    """``text_config[key]`` as a positive integer (``base.count``; absent: the configuration
    class's default, a key without one is required). ``DiffusionGemmaTextConfig`` types these
    ``int`` in a strict dataclass: it refuses a float (even 16.0), a string or a bool."""
    return count(text, key, MT, TEXT_DEFAULTS.get(key), at=AT, **bounds)


def _layer_index(key) -> int:
    """A ``per_layer_config`` key as the configuration class reads it (``int(key)``: "05" and
    "+5" are layer 5); -1 for one ``int`` refuses."""
    try:
        return int(key)
    except (TypeError, ValueError):
        return -1


def _per_layer(d: dict, key: str, glob: int, at: str, default: int | None = None) -> int:
    """A per-layer value ``d[key]`` (``default`` when absent) over the global one ``glob``:
    ``glob`` when equal to it (the configuration class drops an override equal to the global
    value before its strict type check, so 16.0 beside a ``head_dim`` of 16 is 16), else a
    positive integer."""
    return glob if d.get(key, default) == glob else count(d, key, MT, default, at=at)


def layer_types(text: dict, n_layers: int) -> tuple[str, ...]:
    """``layer_types`` as the config class leaves it: absent, every sixth layer global; the last
    layer forced to ``full_attention``. ``n_layers``: at most ``MAX_TABLE_LAYERS``."""
    types = text.get("layer_types")
    if types is None:
        types = [SLIDING if (i + 1) % PATTERN else FULL for i in range(n_layers)]
    if (not isinstance(types, list) or len(types) != n_layers
            or not all(t in (SLIDING, FULL) for t in types)):
        shown = json.dumps(types)
        _fail(f"text_config.layer_types={shown if len(shown) <= 80 else shown[:77] + '...'}; a "
              f"{MT} checkpoint needs {n_layers} of \"{SLIDING}\" / \"{FULL}\"")
    return (*types[:-1], FULL)


#: per layer type: ((head_dim, the key it is read from), (key/value heads, the key))
Shape = tuple[tuple[int, str], tuple[int, str]]


def _layer_shapes(text: dict, types: tuple[str, ...]) -> dict[str, Shape]:
    """{layer type: its :data:`Shape`}, the same for every layer of a type."""
    n_layers = len(types)
    base = {k: (_size(text, k), AT + k) for k in LAYER_KEYS}
    overrides: dict[int, dict[str, tuple[int, str]]] = {}
    if "per_layer_config" in text:
        plc = text["per_layer_config"]
        if not isinstance(plc, dict):
            _fail(f"text_config.per_layer_config={json.dumps(plc)}; a {MT} checkpoint needs an "
                  f"object of layer index -> overrides")
        for key, value in plc.items():
            where = f"{AT}per_layer_config[{json.dumps(key)}]"
            if not 0 <= _layer_index(key) < n_layers or not isinstance(value, dict):
                _fail(f"{where} is not an object for a layer index below {n_layers}")
            _only(value, LAYER_KEYS, where)
            overrides[_layer_index(key)] = {
                k: (_per_layer(value, k, base[k][0], where + "."), f"{where}.{k}") for k in value}
    else:       # the published form: one shape for the global layers
        glob = {"head_dim": (_per_layer(text, "global_head_dim", base["head_dim"][0], AT,
                                        TEXT_DEFAULTS["global_head_dim"]), AT + "global_head_dim")}
        if text.get("num_global_key_value_heads") is not None and text.get("attention_k_eq_v",
                                                                            True):
            glob["num_key_value_heads"] = (
                _per_layer(text, "num_global_key_value_heads", base["num_key_value_heads"][0], AT),
                AT + "num_global_key_value_heads")
        overrides = {i: glob for i, t in enumerate(types) if t == FULL}
    shapes: dict[str, Shape] = {}
    for i, t in enumerate(types):
        layer = {**base, **overrides.get(i, {})}
        shape = (layer["head_dim"], layer["num_key_value_heads"])
        first = shapes.setdefault(t, shape)
        if (first[0][0], first[1][0]) != (shape[0][0], shape[1][0]):
            _fail(f"text_config: the {t} layers differ in head_dim / num_key_value_heads (layer "
                  f"{i}: {[shape[0][0], shape[1][0]]}, before: {[first[0][0], first[1][0]]}); "
                  f"the reference needs one shape per layer type")
    return shapes


def _rope(text: dict, kind: str, head_dim: int) -> tuple[float, int | None]:
    """(theta, rope_pairs or None) of layer type ``kind``."""
    rope = text.get("rope_parameters", DEFAULT_ROPE)
    params = rope.get(kind) if isinstance(rope, dict) else None
    where = f"{AT}rope_parameters.{kind}"
    if not isinstance(params, dict):
        _fail(f"{where} is {json.dumps(params)}; a {MT} checkpoint needs an object with "
              f"rope_type and rope_theta")
    _only(params, ROPE_KEYS, where)
    kind_of = params.get("rope_type")
    if kind_of not in ("default", "proportional"):
        _fail(f"{where}.rope_type={json.dumps(kind_of)} is not supported by the native network; "
              f"supported: \"default\", \"proportional\"")
    if params.get("factor", 1.0) != 1.0:
        _fail(f"{where}.factor={json.dumps(params['factor'])} is not supported by the native "
              f"network; supported: 1.0")
    theta = float(positive(params, "rope_theta", None, MT, at=where + "."))
    if kind_of == "default":
        # the reference sizes its tables by int(head_dim * factor) but rotates the whole head:
        # its forward raises for any factor but 1
        factor = params.get("partial_rotary_factor", 1.0)
        if factor != 1:
            _fail(f"{where}.partial_rotary_factor={json.dumps(factor)} is not supported: the "
                  f"reference's default rotary turns the whole head; supported: 1")
        return theta, None
    # proportional: the first int(factor * head_dim // 2) frequency pairs turn, over the head
    pairs = int(positive(params, "partial_rotary_factor", 1.0, MT, high=1, at=where + ".")
                * head_dim // 2)
    if pairs < 1:
        _fail(f"{where}.partial_rotary_factor={params['partial_rotary_factor']} turns no "
              f"frequency of a head of {head_dim}")
    return theta, (pairs if pairs < head_dim // 2 else None)


def _read(cfg: dict) -> TransformerConfig:
    text = _text(cfg)
    check_flags(text, TEXT_FLAGS, MT)
    check_flags(cfg, TOP_FLAGS, MT)
    # the weights' layer count is checked later: no 10**9-entry table before that
    n_layers = _size(text, "num_hidden_layers", high=MAX_TABLE_LAYERS)
    n_heads = _size(text, "num_attention_heads")
    types = layer_types(text, n_layers)
    shapes = _layer_shapes(text, types)
    for (head_dim, head_key), (kv, kv_key) in shapes.values():
        if n_heads % kv:
            _fail(f"{kv_key}={kv} key/value heads do not divide num_attention_heads={n_heads}")
        if head_dim % 2:
            _fail(f"{head_key}={head_dim} is odd; rotary embeddings need it even")
    local = shapes.get(SLIDING, shapes[FULL])
    (local_dim, _), (local_kv, _) = local
    (full_dim, _), (full_kv, _) = shapes[FULL]
    local_theta, local_pairs = _rope(text, SLIDING if SLIDING in shapes else FULL, local_dim)
    full_theta, full_pairs = _rope(text, FULL, full_dim)
    n_experts = _size(text, "num_experts")
    moe = MoEConfig(
        n_experts=n_experts,
        top_k=_size(text, "top_k_experts", high=n_experts, high_says=f"num_experts={n_experts}"),
        expert_hidden=_size(text, "moe_intermediate_size"), score="softmax", normalize=True,
        normalize_single=True, activation="gelu_tanh", fused_gate_up=True,
        router_input_norm=True, per_expert_scale=True)
    d_model = _size(text, "hidden_size")
    return TransformerConfig(
        vocab_size=_size(text, "vocab_size"), d_model=d_model, n_layers=n_layers,
        n_heads=n_heads, n_kv_heads=local_kv, ffn_hidden=_size(text, "intermediate_size"),
        norm_eps=positive(text, "rms_norm_eps", TEXT_DEFAULTS["rms_norm_eps"], MT, at=AT),
        rope_theta=local_theta, max_seq_len=_size(text, "max_position_embeddings"),
        head_size=local_dim if local_dim != d_model // n_heads else None,
        rope_pairs=local_pairs, qk_norm=True, norm_weight_fp32=True,
        moe=moe, activation="gelu_tanh", embed_scale=True, attn_scale=1.0, v_norm=True,
        sandwich=True,
        logit_softcap=float(positive(text, "final_logit_softcapping",
                                     TEXT_DEFAULTS["final_logit_softcapping"], MT,
                                     high=MAX_SOFTCAP, at=AT)),
        global_layers=tuple(t == FULL for t in types),
        global_attention=LayerAttention(
            head_dim=full_dim, n_kv_heads=full_kv, rope_theta=full_theta, rope_pairs=full_pairs,
            values_from_keys=True),
        sliding_window=_size(text, "sliding_window"),
        canvas_length=count(cfg, "canvas_length", MT, CANVAS_LENGTH), self_conditioning=True)


def _rope_params(theta: float, head_dim: int, pairs: int | None) -> dict:
    if pairs is not None:
        return {"rope_type": "proportional", "partial_rotary_factor": 2 * pairs / head_dim,
                "rope_theta": theta}
    return {"rope_type": "default", "rope_theta": theta}


def _write(c: TransformerConfig, special: dict) -> dict:
    """The published config.json layout of network ``c`` (``special``: the token-id keys, at
    the top level as published)."""
    g, m = c.global_attention, c.moe
    text = {
        "model_type": "diffusion_gemma_text", "vocab_size": c.vocab_size,
        "hidden_size": c.d_model, "intermediate_size": c.ffn_hidden,
        "num_hidden_layers": c.n_layers, "num_attention_heads": c.n_heads,
        "num_key_value_heads": c.n_kv_heads, "head_dim": c.head_dim,
        "global_head_dim": g.head_dim, "num_global_key_value_heads": g.n_kv_heads,
        "hidden_activation": "gelu_pytorch_tanh", "max_position_embeddings": c.max_seq_len,
        "rms_norm_eps": c.norm_eps, "sliding_window": c.sliding_window,
        "layer_types": [FULL if x else SLIDING for x in c.global_layers],
        "rope_parameters": {
            SLIDING: _rope_params(c.rope_theta, c.head_dim, c.rope_pairs),
            FULL: _rope_params(g.rope_theta, g.head_dim, g.rope_pairs)},
        "final_logit_softcapping": c.logit_softcap, "use_bidirectional_attention": "vision",
        "attention_bias": False, "attention_dropout": 0.0, "num_experts": m.n_experts,
        "top_k_experts": m.top_k, "moe_intermediate_size": m.expert_hidden,
        "tie_word_embeddings": True,
    }
    return {"architectures": ["DiffusionGemmaForBlockDiffusion"], "model_type": MT,
            "canvas_length": c.canvas_length, "text_config": text, "tie_word_embeddings": True,
            "dtype": "float32", **special}


DIFFUSION_GEMMA = CheckpointFormat(
    model_type=MT, family="diffusion_gemma", logit_shift=0, name_map=NAMES, read_config=_read,
    write_config=_write, tied_names=("lm_head.weight", "model.decoder.embed_tokens.weight"),
    tie_flag="tie_word_embeddings", tie_default=True,
    generate_defaults=(("eos_token_id", TEXT_DEFAULTS["eos_token_id"]),
                       ("pad_token_id", TEXT_DEFAULTS["pad_token_id"])),
    title="DiffusionGemma", architectures=("DiffusionGemmaForBlockDiffusion",),
    attention=f"causal on the context, bidirectional on a canvas of canvas_length "
              f"({CANVAS_LENGTH} if absent)",
    ignored=VISION, masked=False, flatten=flatten,
)
