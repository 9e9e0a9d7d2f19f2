"""The lm-eval model ``pvf-dlm``: diffusion LMs decoded by PVF and the baseline decoders.

    lm_eval --model pvf-dlm --model_args pretrained=tiny-llada,decoder=pvf --tasks ...

This module owns the lm-eval side only: arguments, prompts and chat templates, ``until`` and
``max_gen_toks``, data parallel, statistics. Decoding lives in ``pvf_lmeval.decoding``, model
loading in ``pvf_lmeval.models``.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import zlib
from collections import defaultdict

import lm_eval.models  # noqa: F401  (fills the registry with the built-ins before we register)
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model
from lm_eval.utils import simple_parse_args_string
from tqdm import tqdm

from .decoding import PARAM_NAMES, STAT_KEYS, decode, make_params
from .decoding.params import override
from .generation import GenerationText, cut_at_stop, tokens_before
from .stats import StatTotals

log = logging.getLogger("pvf_lmeval")

#: the ``--model_args`` keys that are not decoder parameters
LM_KEYS = ("pretrained", "dtype", "device", "batch_size", "max_batch_size", "trust_remote_code",
           "vocab", "trace")
DECODER_KEYS = tuple(k for k in PARAM_NAMES if k != "plan_vocab")
#: decoders that read the planning vocabulary
PLANNING_DECODERS = ("pvf", "explore")
#: what the CLI passes as ``--device`` when the user said nothing
CLI_DEFAULT_DEVICE = "cuda:0"


def _notice(msg: str) -> None:
    log.warning(msg)


@register_model("pvf-dlm")
class PVFDiffusionLM(LM):
    """lm-eval adapter for masked diffusion LMs (LLaDA, Dream, the bundled tiny fixtures).

    ``--model_args``: ``pretrained`` (checkpoint folder, hub id, ``tiny-llada`` or ``tiny-dream``),
    ``dtype`` (auto|float32|bfloat16|float16), ``device``, ``batch_size``, ``vocab`` (planning
    vocabulary: auto|none|PATH|bundled name) and every decoder parameter (``decoder``,
    ``gen_length``, ``block_length``, ``threshold``, ...; see ``pvf_lmeval.decoding.params``).
    Task ``generation_kwargs`` and ``--gen_kwargs`` override decoder parameters per request.
    """

    def __init__(self, pretrained: str = "tiny-llada", dtype: str = "auto", device: str | None = None,
                 batch_size: int | str = 1, max_batch_size: int | None = None,
                 trust_remote_code: bool | None = None, vocab="auto", trace: str | None = None,
                 _device_is_cli_default: bool = False, **decoder_args):
        super().__init__()
        unknown = sorted(set(decoder_args) - set(DECODER_KEYS))
        if unknown:
            raise ValueError(f"pvf-dlm: unknown model arg {unknown[0]!r}; allowed: "
                             f"{', '.join(LM_KEYS + DECODER_KEYS)}")
        # Validate every decoder argument before touching the model: bad input fails fast.
        self._explicit = {k: v for k, v in decoder_args.items() if v is not None}
        self.params = make_params(self._explicit.pop("decoder", "threshold"),
                                  preset=self._explicit.pop("preset", None), **self._explicit)
        self.batch_size = self._batch_size(batch_size)
        if trust_remote_code is not None:
            _notice("pvf-dlm: trust_remote_code is ignored: checkpoints load into the native network, "
                    "no remote code runs")

        import torch

        from .models import load_model
        from .models.loader import resolve_device

        self.accelerator = None
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            from accelerate import Accelerator

            self.accelerator = Accelerator()
            self._rank = self.accelerator.process_index
            self._world_size = self.accelerator.num_processes
            dev = self.accelerator.device
        elif _device_is_cli_default and not torch.cuda.is_available():
            _notice(f"pvf-dlm: no CUDA GPU; using the CPU instead of the default device {device!r}")
            dev = torch.device("cpu")
        else:
            dev = resolve_device(device)
        self.model = load_model(pretrained, device=dev, dtype=dtype)
        self._device = self.model.device
        self.tokenizer = self.model.tokenizer
        self.pretrained = str(pretrained)

        self._vocab_spec = vocab
        self.plan_vocab, self.vocab_source = None, "unused"
        if self.params.decoder in PLANNING_DECODERS:
            self.params = self._with_vocab(self.params)
        self.trace_path = trace
        self.local_totals = StatTotals()   # this rank's requests
        self.totals = self.local_totals    # every rank's, merged after each generate_until
        self._length_notices: set = set()

    # ------------------------------------------------------------------ construction

    def _with_vocab(self, params):
        """``params`` carrying the planning vocabulary, resolved once on first need."""
        if self.vocab_source == "unused":
            from .vocab import resolve_vocab

            self.plan_vocab, self.vocab_source = resolve_vocab(
                self._vocab_spec, tokenizer=self.tokenizer, model_family=self.model.family,
                model_name=self.pretrained, task_family=params.family)
            log.info("pvf-dlm: planning vocabulary %s (%d tokens)", self.vocab_source,
                     len(self.plan_vocab or ()))
        return override(params, plan_vocab=self.plan_vocab) if self.plan_vocab else params

    @staticmethod
    def _batch_size(value) -> int:
        try:
            size = int(value)
        except (TypeError, ValueError):
            raise ValueError(f"batch_size={value!r} must be a positive integer") from None
        if size < 1:
            raise ValueError(f"batch_size={value!r} must be a positive integer")
        return size

    @classmethod
    def _merge(cls, args: dict, additional_config: dict | None) -> dict:
        """``--model_args`` win over the CLI's ``batch_size``/``device`` defaults."""
        merged = dict(args)
        for key, value in (additional_config or {}).items():
            if value is None or key in merged:
                continue
            merged[key] = value
            if key == "device" and value == CLI_DEFAULT_DEVICE:
                merged["_device_is_cli_default"] = True
        return merged

    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: dict | None = None):
        return cls(**cls._merge(simple_parse_args_string(arg_string), additional_config))

    @classmethod
    def create_from_arg_obj(cls, arg_dict: dict, additional_config: dict | None = None):
        return cls(**cls._merge(arg_dict, additional_config))

    # ------------------------------------------------------------------ lm-eval plumbing

    @property
    def device(self):
        return self._device

    @property
    def tokenizer_name(self) -> str:
        return self.pretrained.replace("/", "__")

    def chat_template(self, chat_template=False) -> str | None:
        return getattr(self.tokenizer, "chat_template", None)

    def apply_chat_template(self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        if not getattr(self.tokenizer, "chat_template", None):
            raise ValueError(f"--apply_chat_template: the tokenizer of {self.pretrained!r} has no chat template")
        return self.tokenizer.apply_chat_template(
            chat_history, tokenize=False, add_generation_prompt=add_generation_prompt,
            continue_final_message=not add_generation_prompt)

    def all_gather(self, tensor):
        return self.accelerator.gather(tensor)

    def gather_object(self, obj) -> list:
        import torch.distributed as dist

        out = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def barrier(self) -> None:
        if self.accelerator is not None:
            self.accelerator.wait_for_everyone()

    def get_model_info(self) -> dict:
        return {"pvf": {
            "pretrained": self.pretrained,
            "model_family": self.model.family,
            "decoder": self.params.decoder,
            "params": {k: v for k, v in self._public_params(self.params).items()},
            "early_stop": self.params.early_stop,
            "vocab": self.vocab_source,
            "vocab_size": len(self.plan_vocab or ()),
            "totals": self.totals.summary(),
        }}

    @staticmethod
    def _public_params(params) -> dict:
        out = {}
        for k in DECODER_KEYS:
            v = getattr(params, k)
            out[k] = list(v) if isinstance(v, tuple) else v
        return out

    # ------------------------------------------------------------------ requests

    def loglikelihood(self, requests, disable_tqdm: bool = False):
        raise NotImplementedError("pvf-dlm: loglikelihood requests (multiple-choice tasks) are not "
                                  "supported yet; use generation tasks (generate_until)")

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False):
        raise NotImplementedError("pvf-dlm: loglikelihood_rolling requests (perplexity tasks) are "
                                  "not supported yet; use generation tasks (generate_until)")

    def _request_params(self, gen_kwargs: dict):
        """Decoder parameters for one request: model args, then the request's own overrides."""
        kwargs = dict(gen_kwargs)
        for alias in ("max_new_tokens", "max_tokens"):
            if alias in kwargs:
                kwargs.setdefault("max_gen_toks", kwargs.pop(alias))
        until = kwargs.pop("until", None) or []
        if isinstance(until, str):
            until = [until]
        max_gen_toks = kwargs.pop("max_gen_toks", None)
        do_sample = kwargs.pop("do_sample", None)
        overrides = {k: kwargs.pop(k) for k in list(kwargs) if k in DECODER_KEYS}
        if do_sample is False:
            overrides["temperature"] = 0.0
        ignored = sorted(kwargs)
        params = override(self.params, **overrides) if overrides else self.params
        if params.decoder in PLANNING_DECODERS:
            params = self._with_vocab(params)
        if "gen_length" not in overrides and "gen_length" not in self._explicit and max_gen_toks:
            blocks = -(-int(max_gen_toks) // params.block_length)
            length = blocks * params.block_length
            key = (int(max_gen_toks), length)
            if key not in self._length_notices:
                self._length_notices.add(key)
                _notice(f"pvf-dlm: gen_length={length} (the task's max_gen_toks={max_gen_toks} rounded "
                        f"up to whole blocks of {params.block_length}); pass gen_length to fix it")
            params = override(params, gen_length=length)
        return params, until, ignored

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        import torch

        results: list = [None] * len(requests)
        seen: dict[int, list[int]] = defaultdict(list)
        trace_file = None
        if self.trace_path:
            path = self.trace_path if self.world_size == 1 else f"{self.trace_path}.rank{self.rank}"
            trace_file = open(path, "a")
        bar = tqdm(total=len(requests), disable=disable_tqdm or self.rank != 0, desc="pvf-dlm")
        nfe_sum = 0
        done = 0
        try:
            for i, req in enumerate(requests):
                occurrences = seen[id(req)]
                repeats = max(1, int(getattr(req, "repeats", 1) or 1))
                if len(occurrences) >= repeats:
                    # The evaluator pads the last rank with copies of its last request: answer
                    # them without decoding again and without counting them.
                    results[i] = results[occurrences[len(occurrences) % repeats]]
                    occurrences.append(i)
                    bar.update(1)
                    continue
                repeat_index = len(occurrences)
                occurrences.append(i)
                context, gen_kwargs = req.args
                params, until, _ = self._request_params(copy.deepcopy(gen_kwargs))
                prompt_ids = self.tokenizer.encode(context, add_special_tokens=False)
                limit = self.model.max_length
                if len(prompt_ids) + params.gen_length > limit:
                    raise ValueError(f"prompt of {len(prompt_ids)} tokens + gen_length={params.gen_length} "
                                     f"exceeds the model's context of {limit} tokens")
                task = getattr(req, "task_name", None) or "unknown"
                key = f"{task}/{getattr(req, 'doc_id', i)}/{getattr(req, 'idx', 0)}"
                out = decode(self.model, torch.tensor(prompt_ids), params=params,
                             request_index=zlib.crc32(key.encode()), repeat_index=repeat_index,
                             trace=trace_file is not None)
                text, stats = self._finish(out, until)
                results[i] = GenerationText(text, meta=stats)
                self.local_totals.add(task, stats)
                if trace_file is not None:
                    trace_file.write(json.dumps({"request": key, "decoder": params.decoder,
                                                 "prompt_ids": prompt_ids, "tokens": out.tokens,
                                                 "routes": out.routes, "nfe": out.nfe,
                                                 "steps": out.steps}) + "\n")
                nfe_sum += out.nfe
                done += 1
                bar.set_postfix(nfe=f"{nfe_sum / done:.1f}")
                bar.update(1)
        finally:
            bar.close()
            if trace_file is not None:
                trace_file.close()
        if self.world_size > 1:
            self.totals = StatTotals.merged(self.gather_object(self.local_totals.state()))
        return results

    def _finish(self, out, until: list[str]) -> tuple[str, dict]:
        """Text of a decode result, cut at end-of-text and the first ``until`` string, and its
        statistics with ``gen_tokens`` counting only the tokens before that cut."""
        eos = set(self.model.eos_ids)
        ids = out.tokens
        n = next((k for k, t in enumerate(ids) if t in eos), len(ids))
        ids = ids[:n]
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        cut = cut_at_stop(text, until)
        stats = out.stats()
        if cut < len(text):
            stats["gen_tokens"] = tokens_before(ids, cut, self.tokenizer)
            text = text[:cut]
        stats["tpf"] = stats["gen_tokens"] / stats["nfe"] if stats["nfe"] else 0.0
        stats["tps"] = stats["gen_tokens"] / stats["wall_s"] if stats["wall_s"] > 0 else 0.0
        assert tuple(stats) == STAT_KEYS
        return text, stats
