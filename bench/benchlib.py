"""What the benchmark scripts (and their tests) share.

- the repository's paths, and the tiny-fixture tasks: the held-out `arith` (or `arith_var`)
  items, their prompts (the task's ``doc_to_text``), the task's answer extraction, and the
  arguments that select them;
- the real shapes (:data:`SHAPES`, one table) and :func:`random_model`, a randomly initialised
  model of one of them (:func:`random_split_model`: also a tensor-parallel rank's part of it);
- the device clock helpers (:func:`sync`, :func:`reset_peak`, :func:`peak_mib`) and the paper's
  call counts (:data:`PAPER_CALLS_PER_512`);
- one request's KV cache outside the decode loop (:class:`KVCache`, :func:`call_view`: the
  model-level cache API the call-cost benchmarks replay schedules with) and
  :class:`CacheDriftProbe` (the cache's approximation error). The decode loop's own cache is
  ``pvf_lmeval.decoding.cache.BatchKV``.

- the package as the scripts use it: each script imports the package's functions from here
  (:data:`PACKAGE`, imported on first use), so that a change of the package's layout is one
  change here.

Scripts run as ``python bench/x.py`` find this module beside them (``bench/`` is on their
``sys.path``); the package is installed.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import json
import resource
from pathlib import Path

import torch
from torch import Tensor

from pvf_lmeval.decoding.cache import full_call_flags, revealed
from pvf_lmeval.decoding.select import first_true
from pvf_lmeval.models.diffusion_lm import DiffusionLM
from pvf_lmeval.models.kv import cache_segments, is_cached_call
from pvf_lmeval.models.moe import MoEConfig
from pvf_lmeval.models.transformer import BidirectionalTransformer, TransformerConfig

#: what the scripts use of the package: name -> (module, attribute); ``from benchlib import
#: NAME`` imports it on first use (so a script pays for what it uses: the report and its
#: plotting, the sandbox, the process groups)
PACKAGE = {
    **{name: ("pvf_lmeval.decoding", name) for name in (
        "DECODERS", "PLANNING_DECODERS", "decode", "decode_batch", "make_params")},
    "pvf_step": ("pvf_lmeval.decoding", "pvf"),
    "rounds": ("pvf_lmeval.decoding", "rounds"),
    "runner": ("pvf_lmeval.decoding", "runner"),
    "Batch": ("pvf_lmeval.decoding.batch", "Batch"),
    "DecodeResult": ("pvf_lmeval.decoding.loop", "DecodeResult"),
    "BatchKV": ("pvf_lmeval.decoding.cache", "BatchKV"),
    "KVCall": ("pvf_lmeval.decoding.cache", "KVCall"),
    **{name: ("pvf_lmeval.decoding.likelihood", name) for name in (
        "Continuation", "Estimator", "elbo", "elbo_batch", "loglikelihoods", "suffix_greedy")},
    "invariant_mode": ("pvf_lmeval.decoding.options", "invariant_mode"),
    "DECODER_NAMES": ("pvf_lmeval.decoding.registry", "DECODER_NAMES"),
    "Shadow": ("pvf_lmeval.tensors.shadow", "Shadow"),
    "SWITCHES": ("pvf_lmeval.decoding.rules", "SWITCHES"),
    "rules_for": ("pvf_lmeval.decoding.rules", "rules_for"),
    "Runner": ("pvf_lmeval.decoding.runner", "Runner"),
    "vocab_artifacts_dir": ("pvf_lmeval.files.paths", "vocab_artifacts_dir"),
    "batches": ("pvf_lmeval.lmeval.batching", "batches"),
    "RunSettings": ("pvf_lmeval.lmeval.settings", "RunSettings"),
    "padding_share": ("pvf_lmeval.lmeval.batching", "padding_share"),
    "load_model": ("pvf_lmeval.models", "load_model"),
    "compile_seconds": ("pvf_lmeval.models.diffusion_lm", "compile_seconds"),
    "FIXTURES_DIR": ("pvf_lmeval.models.loader", "FIXTURES_DIR"),
    "Comm": ("pvf_lmeval.models.parallel", "Comm"),
    "Shard": ("pvf_lmeval.models.parallel", "Shard"),
    "MLP": ("pvf_lmeval.models.transformer", "MLP"),
    "DIFFUSION_GEMMA": ("pvf_lmeval.models.formats.diffusion_gemma", "DIFFUSION_GEMMA"),
    "OnlineVocab": ("pvf_lmeval.planning.online", "OnlineVocab"),
    **{name: ("pvf_lmeval.planning.vocab", name) for name in (
        "artifact_statistics", "capitalised_ids", "load_artifact", "online_artifact",
        "resolve_artifact", "resolve_vocab_for", "save_artifact")},
    "check_candidates": ("pvf_lmeval.sandbox", "check_candidates"),
    "default_workers": ("pvf_lmeval.sandbox", "default_workers"),
    "dataset_file": ("pvf_lmeval.data", "dataset_file"),
    "report": ("pvf_lmeval.cli", "report"),
    "plot": ("pvf_lmeval.cli.report.plot", "plot"),
}


def __getattr__(name: str):
    """``from benchlib import NAME`` of :data:`PACKAGE`: imported now, kept."""
    if name not in PACKAGE:
        raise AttributeError(f"module 'benchlib' has no attribute {name!r}")
    module, attr = PACKAGE[name]
    found = importlib.import_module(module)
    value = getattr(found, attr) if hasattr(found, attr) else \
        importlib.import_module(f"{module}.{attr}")
    globals()[name] = value
    return value


REPO = Path(__file__).resolve().parent.parent
ARITH = REPO / "tasks" / "arith"
#: the offline tasks of the tiny fixtures: folder and generation length (the YAML's max_gen_toks)
TASKS = {"arith": (ARITH, 96), "arith_var": (REPO / "tasks" / "arith_var", 256)}
FIXTURES = ("tiny-llada", "tiny-dream")


def add_arguments(ap, *, fixtures_default=list(FIXTURES), fixtures_help=None, limit_default=None,
                  limit_help="first N held-out items (default: all)", task_option=False) -> None:
    """``--fixtures``, ``--limit``, ``--gen-length`` (96) and ``--block-length`` (32); with
    ``task_option``, also ``--task`` (arith, arith_var), and ``--gen-length`` defaults to the
    task's (call ``task_gen_length(args)`` after parsing)."""
    ap.add_argument("--fixtures", nargs="+", default=fixtures_default, help=fixtures_help)
    ap.add_argument("--limit", type=int, default=limit_default, help=limit_help)
    if task_option:
        ap.add_argument("--task", choices=list(TASKS), default="arith")
        ap.add_argument("--gen-length", type=int, default=None, help="default: the task's (96, 256)")
    else:
        ap.add_argument("--gen-length", type=int, default=96)
    ap.add_argument("--block-length", type=int, default=32)


def task_gen_length(args) -> None:
    """Fills ``args.gen_length`` with the task's generation length when it was not given."""
    if args.gen_length is None:
        args.gen_length = TASKS[args.task][1]


def held_out(limit: int | None = None, task: str = "arith") -> list[dict]:
    """The first ``limit`` (all when None) held-out items of ``task``: question, answer, target."""
    with open(TASKS[task][0] / "data" / "test.jsonl") as f:
        docs = [json.loads(line) for line in f]
    return docs[:limit] if limit else docs


def prompt_ids(tokenizer, docs: list[dict]) -> list[list[int]]:
    """Token ids of each item's prompt, as the `arith` tasks render it (no chat template)."""
    return [tokenizer.encode(f"Question: {d['question']}\nAnswer:", add_special_tokens=False)
            for d in docs]


def extract_answer(task: str = "arith"):
    """The task's answer extraction (``tasks/<task>/utils.py``), loaded from its file."""
    spec = importlib.util.spec_from_file_location(f"{task}_utils", TASKS[task][0] / "utils.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.extract_answer


# ---------------------------------------------------------------- real shapes, random weights

_LLADA_8B = dict(vocab_size=126464, d_model=4096, n_layers=32, n_heads=32, n_kv_heads=32,
                 ffn_hidden=12288, norm_eps=1e-5, rope_theta=500000.0, max_seq_len=4096)
#: real shapes (docs/models.md): name -> (config, logit shift). ``/8`` and ``/16``: LLaDA-8B with
#: width, depth and vocabulary divided by 8 or 16 (CPU-sized: their call costs keep the 8B's
#: proportions, not its figures); ``tiny-random`` smoke-tests the replay paths on a CPU.
SHAPES = {
    "llada-8b": (TransformerConfig(**_LLADA_8B), 0),
    "llada-8b/8": (TransformerConfig(**dict(
        _LLADA_8B, vocab_size=126464 // 8, d_model=512, n_layers=4, n_heads=4, n_kv_heads=4,
        ffn_hidden=1536)), 0),
    "llada-8b/16": (TransformerConfig(**dict(
        _LLADA_8B, vocab_size=126464 // 16, d_model=256, n_layers=2, n_heads=2, n_kv_heads=2,
        ffn_hidden=768)), 0),
    "dream-7b": (TransformerConfig(vocab_size=152064, d_model=3584, n_layers=28, n_heads=28,
                                   n_kv_heads=4, ffn_hidden=18944, norm_eps=1e-6,
                                   rope_theta=1e6, qkv_bias=True, max_seq_len=4096), 1),
    "tiny-random": (TransformerConfig(vocab_size=640, d_model=128, n_layers=4, n_heads=4,
                                      n_kv_heads=2, ffn_hidden=384, qkv_bias=True), 1),
    "llada-moe-7b-a1b": (TransformerConfig(
        vocab_size=157184, d_model=2048, n_layers=16, n_heads=16, n_kv_heads=16, ffn_hidden=0,
        rope_theta=50000.0, qk_norm=True,
        moe=MoEConfig(n_experts=64, top_k=8, expert_hidden=1024, bias_in_weight=True)), 0),
    "llada2-mini": (TransformerConfig(
        vocab_size=157184, d_model=2048, n_layers=20, n_heads=16, n_kv_heads=4, ffn_hidden=5120,
        norm_eps=1e-6, rope_theta=600000.0, head_size=128, rotary_dim=64, qk_norm=True,
        fused_qkv=True, block_size=32,
        moe=MoEConfig(n_experts=256, top_k=8, expert_hidden=512, shared_hidden=512,
                      score="sigmoid", expert_bias=True, normalize=True, scaling=2.5, n_groups=8,
                      topk_groups=4, router_fp32=True, layers=(False,) + (True,) * 19)), 0),
    # Qwen3-30B-A3B's network as RND1-Base-30B-A3B and SDAR-30B-A3B run it (RND1's config class
    # values): every layer routed, softmax top 8 of 128 renormalised, no shared expert
    "qwen3-moe-30b-a3b": (TransformerConfig(
        vocab_size=151936, d_model=2048, n_layers=48, n_heads=32, n_kv_heads=4, ffn_hidden=0,
        norm_eps=1e-6, rope_theta=1e6, head_size=128, qk_norm=True,
        moe=MoEConfig(n_experts=128, top_k=8, expert_hidden=768, normalize=True,
                      normalize_single=True)), 1),
}
_MINI = SHAPES["llada2-mini"][0]
#: LLaDA2.0-flash: the mini's layout at its published widths (hidden 4096, 32 layers, 32 query
#: heads, a dense first layer of 9216, experts and the shared expert of 1024)
SHAPES["llada2-flash"] = (dataclasses.replace(
    _MINI, d_model=4096, n_layers=32, n_heads=32, ffn_hidden=9216,
    moe=dataclasses.replace(_MINI.moe, expert_hidden=1024, shared_hidden=1024,
                            layers=(False,) + (True,) * 31)), 0)
#: the paper's Table 1 (LLaDA-8B-Instruct, GSM8K, L=512, B=64): calls per 512 tokens
PAPER_CALLS_PER_512 = {"static": 512, "threshold": 89.77, "freedave": 135.65, "pvf": 31.34}


def random_model(shape: str, device, dtype, *, config: TransformerConfig | None = None
                 ) -> DiffusionLM:
    """A DiffusionLM of :data:`SHAPES`\\ ``[shape]`` (or ``config``, e.g. a reduced copy of it)
    with seeded random weights (:func:`random_split_model`), allocated directly on ``device`` in
    ``dtype``."""
    cfg, shift = SHAPES[shape]
    return random_split_model(config or cfg, device, dtype, name=f"random {shape}",
                              logit_shift=shift, family=shape.split("-")[0])


def random_split_model(cfg: TransformerConfig, device, dtype, shard=None, comm=None,
                       name: str = "random", logit_shift: int = 0,
                       family: str = "random") -> DiffusionLM:
    """A DiffusionLM of ``cfg`` with random weights, whole (``shard`` None) or rank
    ``shard.rank``'s part of it (``models.parallel.Shard``, ``comm``: its group), allocated on
    ``device`` in ``dtype``. Every tensor (every expert's, one by one) is drawn from a
    generator seeded by its name, then the rank takes its part: the ranks' parts are slices of
    the whole model's tensors, and a rank never draws another rank's experts. Norms 1, biases
    0; the last three ids serve as mask, pad and end of text (a uniform-state network, with a
    ``canvas_length``, has no mask)."""
    import zlib

    with torch.device("meta"):
        whole = dict(BidirectionalTransformer(cfg).named_parameters())
        net = BidirectionalTransformer(cfg, shard, comm)
    net = net.to(dtype).to_empty(device=device)

    def draw(key: str, out: Tensor) -> Tensor:
        gen = torch.Generator(device=device).manual_seed(zlib.crc32(key.encode()))
        return out.normal_(0.0, 0.02, generator=gen)

    with torch.no_grad():
        for pname, p in net.named_parameters():
            if pname.endswith("norm.weight"):
                p.fill_(1.0)
            elif pname.endswith(".bias"):
                p.zero_()
            elif pname.endswith(("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")):
                lo = shard.experts[0] if shard is not None else 0
                for i in range(p.shape[0]):
                    draw(f"{pname}/{lo + i}", p[i])
            elif shard is None:
                draw(pname, p)
            else:
                full = torch.empty(whole[pname].shape, dtype=dtype, device=device)
                p.copy_(shard.part(pname, None).take(draw(pname, full)))
        for buffer in net.buffers():            # the experts' selection bias
            buffer.zero_()
    V = cfg.vocab_size
    mask_id = None if cfg.canvas_length is not None else V - 1
    return DiffusionLM(net, mask_id=mask_id, eos_ids=(V - 3,), pad_id=V - 2,
                       logit_shift=logit_shift, decodable=V, family=family, name=name,
                       shard=shard, comm=comm)


# ---------------------------------------------------------------- the device's clock


def sync(device) -> None:
    """Wait for the device's queued work (CUDA); nothing on the CPU."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def reset_peak(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_mib(device) -> float:
    """Peak memory: CUDA peak allocated since the last reset, else the process's max RSS
    (monotone over the run on a CPU)."""
    if torch.device(device).type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# ---------------------------------------------------------------- one request's KV cache


class KVCache:
    """Cache state of one request, outside the decode loop: the same rules as the loop's
    ``BatchKV`` (``pvf_lmeval.decoding.cache``), for one request. The model fills ``pending``
    and reads ``kv`` and ``span`` through :func:`call_view`."""

    def __init__(self, mode: str, *, prompt_len: int, gen_length: int, block_length: int,
                 mask_id: int, reveal_next: int, device):
        if mode not in ("prefix", "dual"):
            raise ValueError(f"cache={mode!r} must be one of prefix, dual")
        self.mode = mode
        self.P0, self.L, self.B = prompt_len, gen_length, block_length
        self.nb = gen_length // block_length
        self.mask_id = mask_id
        self.reveal = reveal_next
        self.blk = torch.arange(gen_length, device=device) // block_length
        self.kv: list | None = None        # model-owned: committed canvas's keys/values per layer
        self.pending: list | None = None   # model-owned: every row's, after a full call
        self.span: tuple[int, int] | None = None   # this call: None = full, else canvas [s0, s1)
        self._rows: Tensor | None = None   # generation regions of the last full call's rows
        self._ref: Tensor | None = None    # generation region of the cached canvas
        self._ok: Tensor | None = None     # the committed canvas matched a row of the full call
        self.full_calls = 0
        self.cached_calls = 0

    @property
    def ref(self) -> Tensor | None:
        """The cached canvas's generation region [L] (None before the first full call)."""
        return self._ref

    def flags(self, rg: Tensor, a: Tensor) -> list[Tensor]:
        """0-d long tensors (need_full, cached active block, cached reveal) for rows ``rg`` [N, L] with
        active blocks ``a`` [N]; the caller reads them back with its own scalars (one sync)."""
        if self.kv is None:
            one = torch.ones((), dtype=torch.long, device=rg.device)
            return [one, 0 * one, 0 * one]
        out = full_call_flags(self._ref[None], self._ok.reshape(1), a[None],
                              torch.ones_like(a, dtype=torch.bool)[None],
                              self._revealed(rg, a)[None], B=self.B, nb=self.nb,
                              reveal=self.reveal, mask_id=self.mask_id)
        return list(out[0])

    def _revealed(self, zg: Tensor, a: Tensor) -> Tensor:
        return revealed(zg, a, self.blk, reveal=self.reveal, nb=self.nb, mask_id=self.mask_id)

    def plan(self, flags: list[int], rg: Tensor, lo: int, hi: int) -> tuple[int, int]:
        """Set ``span`` for this call from the read-back ``flags``; returns the generation
        positions [lo, hi) the call's logits cover."""
        need, a_ref, rev = flags
        if need:
            self.start_full(rg)
            return lo, hi
        s0 = a_ref * self.B
        s1 = self.L if self.mode == "prefix" else min(self.L, (a_ref + 1 + rev) * self.B)
        self.span = (self.P0 + s0, self.P0 + s1)
        self.cached_calls += 1
        return lo, min(hi, s1)

    def start_full(self, rg: Tensor) -> None:
        """Make the next call a full one over rows whose generation regions are ``rg`` [N, L]."""
        self.span = None
        self._rows = rg
        # A full call reads no cache and its commit replaces it: free the old one now, so that
        # it does not sit beside the full call's activations and pending rows.
        self.kv = None
        self.full_calls += 1

    def commit(self, yg: Tensor) -> None:
        """After a step committed generation region ``yg`` [L]: if the step's call was full, the
        cache keeps the committed row's keys/values (no host read-back)."""
        if self.pending is None:
            return
        match = (self._rows == yg).all(-1)
        idx = first_true(match).clamp(max=self._rows.shape[0] - 1).reshape(1)
        self._ok = match.any()
        # Layer by layer, dropping each layer's pending rows once its committed row is copied:
        # the peak is the pending rows plus one layer, not plus a whole second cache.
        pending, self.pending, kv = self.pending, None, []
        for i in range(len(pending)):
            k, v = pending[i]
            pending[i] = None
            kv.append((k.index_select(0, idx), v.index_select(0, idx)))
            del k, v
        self.kv = kv
        self._ref = yg.clone()
        self._rows = None


class Segments:
    """The call view (``pvf_lmeval.models.kv``'s protocol) of ``[(KVCache_or_None, n_rows), ...]``."""

    def __init__(self, segs: list):
        self.segs = segs
        self.rows = [int(n) for _, n in segs]
        spans = [c is not None and c.span is not None for c, _ in segs]
        if any(spans) and not all(spans):
            raise ValueError("a model call mixes cached and full rows; split it into two calls")
        self.spans = [c.span for c, _ in segs] if all(spans) else None

    @property
    def span(self):
        return None if self.spans is None else self.spans[0]

    def layer_kv(self) -> list:
        if len(self.segs) == 1:
            return self.segs[0][0].kv
        return [(torch.cat([c.kv[layer][0] for c, _ in self.segs]),
                 torch.cat([c.kv[layer][1] for c, _ in self.segs]))
                for layer in range(len(self.segs[0][0].kv))]

    def keep(self, kv_out: list) -> None:
        a = 0
        for c, n in self.segs:
            if c is not None:
                c.pending = [(k[a:a + n], v[a:a + n]) for k, v in kv_out]
            a += n


def call_view(cache, n_rows: int):
    """The ``cache`` argument of ``model.logits`` for one-request caches: ``cache`` is one
    :class:`KVCache` (all ``n_rows`` rows its own) or ``[(KVCache_or_None, n_rows), ...]``
    segments; None when no segment holds a cache (a plain call)."""
    segs = list(cache) if isinstance(cache, (list, tuple)) else [(cache, n_rows)]
    total = sum(int(n) for _, n in segs)
    if total != n_rows:
        raise ValueError(f"cache segments cover {total} rows, the call has {n_rows}")
    if all(c is None for c, _ in segs):
        return None
    return Segments(segs)


class CacheDriftProbe:
    """A model wrapper that measures the cache's approximation error (SPEC "Cache modes").

    Every cached call is also run without the cache on the same rows; per call it records the
    max and mean absolute logit difference (over the decodable ids) and the fraction of
    requested positions whose argmax agrees. The cached logits are what the decoder gets.
    Attributes other than ``logits`` come from the wrapped model.
    """

    def __init__(self, model):
        self.model = model
        self.records: list[dict] = []
        self.full_calls = 0

    def __getattr__(self, name):
        return getattr(self.model, name)

    def logits(self, tokens, positions, *, attention_mask=None, cache=None):
        out = self.model.logits(tokens, positions, attention_mask=attention_mask, cache=cache)
        if not is_cached_call(cache_segments(cache, tokens.shape[0])):
            self.full_calls += 1
            return out
        ref = self.model.logits(tokens, positions, attention_mask=attention_mask)
        ok = torch.isfinite(ref) & torch.isfinite(out)
        diff = torch.where(ok, (out - ref).abs(), torch.zeros_like(out))
        self.records.append({
            "max_abs": float(diff.max()), "mean_abs": float(diff.sum() / ok.sum().clamp(min=1)),
            "agree": float((out.argmax(-1) == ref.argmax(-1)).float().mean()),
            "positions": int(out.shape[0] * out.shape[1])})
        return out

    def summary(self) -> dict:
        """Drift over every cached call so far: max/mean absolute difference, argmax agreement
        (position-weighted), and the numbers of cached and full calls."""
        r = self.records
        n = sum(x["positions"] for x in r)
        return {"cached_calls": len(r), "full_calls": self.full_calls,
                "max_abs": max((x["max_abs"] for x in r), default=0.0),
                "mean_abs": sum(x["mean_abs"] * x["positions"] for x in r) / n if n else 0.0,
                "argmax_agree": sum(x["agree"] * x["positions"] for x in r) / n if n else 1.0}
