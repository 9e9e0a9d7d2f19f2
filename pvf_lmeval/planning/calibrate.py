"""``pvf-calibrate``: build a calibrated planning vocabulary (SPEC "Planning vocabulary").

    pvf-calibrate --model tiny-llada --data arith --family math-word \\
        --gen-length 96 --block-length 32 --out vocab_artifacts/tiny-llada.math-word.calibrated.json

Runs threshold decoding (the base rule) on unlabeled calibration prompts. At every step, for every
position i of W_t \\ S_base whose confidence lies in the calibration band [0.15, 0.25), it builds
z_plan = z_base + ŷ_i (never committed) and measures, from the same batched call that yields the
stats of z_base (further calls of at most ``--width`` rows when there are more candidates):

    A   = 1 iff S_imp \\ {i} is non-empty and argmax(z_plan) = argmax(z_base) on it, where
          S_imp = positions of W_t masked in z_base with max prob under z_base >= tau_high
    VIG = A * mean over R of (H_r(z_base) - H_r(z_plan)), R = W_t masked in z_base minus i

and aggregates per token v = ŷ_i: n_v events, m_v events with a non-empty S_imp \\ {i},
r_v = sum A / m_v (0 if m_v = 0), VIG_v = sum VIG / n_v. Tokens with n_v >= 50, m_v >= 20,
r_v >= 0.9 and VIG_v >= 0.03 (all options) are kept.

Resumable: the running totals are written to ``OUT.partial`` every ``--save-every`` prompts and
on Ctrl-C; the same command continues from there (prompts are independent and processed in
order, so a resumed run gives exactly the result of an uninterrupted one). ``--restart``
discards a partial state.

Data: ``--data FILE.jsonl`` (field ``prompt``, or ``question`` formatted as
``Question: {question}\\nAnswer:``, or ``--template``/``--prompt-field``) or ``--data TASK``: a task
folder of this package with ``data/calibration.jsonl`` (prompts via the task's ``doc_to_text``),
else an lm-eval task's training (or validation) split, never its test split.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from ..files.atomic import write_json
from .vocab import FORMAT_VERSION, tokenizer_hash

DEFAULT_TEMPLATE = "Question: {question}\nAnswer:"


class CalibrationError(ValueError):
    """Bad input to the calibration; the message is one line naming the file and the problem."""


@dataclass(frozen=True)
class CalibConfig:
    """What a calibration measures (part of the resume fingerprint) and how it filters (not).
    Its decoding (:meth:`params`: threshold decoding of ``gen_length`` positions in blocks of
    ``block_length``) is checked when it is made, with the decoding parameters' one-line
    errors."""

    gen_length: int = 256
    block_length: int = 32
    threshold: float = 0.9
    band: tuple[float, float] = (0.15, 0.25)
    reveal_next: int = 0
    early_stop: bool = True
    width: int = 16              # rows per model call (z_base + candidates)
    min_n: int = 50
    min_m: int = 20
    rho_ver: float = 0.9
    gamma_vig: float = 0.03

    def __post_init__(self) -> None:
        self.params()

    def params(self, model_block: int | None = None):
        """The base rule's decoding parameters (threshold decoding), on a model with attention
        blocks of ``model_block`` positions (None: bidirectional)."""
        from ..decoding.params import make_params

        return make_params("threshold", gen_length=self.gen_length,
                           block_length=self.block_length, threshold=self.threshold,
                           early_stop=self.early_stop, model_block=model_block)

    def measurement(self) -> dict:
        d = asdict(self)
        for k in ("min_n", "min_m", "rho_ver", "gamma_vig"):
            d.pop(k)
        d["band"] = list(self.band)
        return d

    def filters(self) -> dict:
        return {"min_n": self.min_n, "min_m": self.min_m, "rho_ver": self.rho_ver,
                "gamma_vig": self.gamma_vig}


# ---------------------------------------------------------------- tallies


@dataclass
class Tally:
    """Per-token sums: ``stats[id] = [n, m, sum A, sum VIG]`` plus run counters."""

    stats: dict[int, list[float]] = field(default_factory=dict)
    counters: dict[str, float] = field(default_factory=lambda: {
        "prompts": 0, "steps": 0, "calls": 0, "rows": 0, "events": 0, "nonvacuous": 0,
        "passed": 0})

    def add(self, other: "Tally") -> None:
        for tok, vals in other.stats.items():
            cur = self.stats.setdefault(tok, [0.0, 0.0, 0.0, 0.0])
            for i in range(4):
                cur[i] += vals[i]
        for k, v in other.counters.items():
            self.counters[k] = self.counters.get(k, 0) + v

    def to_json(self) -> dict:
        return {"stats": {str(k): v for k, v in sorted(self.stats.items())},
                "counters": self.counters}

    @classmethod
    def from_json(cls, d: dict) -> "Tally":
        return cls({int(k): [float(x) for x in v] for k, v in d["stats"].items()},
                   dict(d["counters"]))


def calibrate_prompt(model, prompt_ids, cfg: CalibConfig) -> Tally:
    """Threshold-decode one prompt and measure every in-band candidate of every step (the
    calibration step run by the one decode loop)."""
    return calibrate_prompts(model, [prompt_ids], cfg)[0]


def calibrate_prompts(model, prompts: list, cfg: CalibConfig) -> list[Tally]:
    """Threshold-decode ``prompts`` as one batch of the decode loop and measure every in-band
    candidate of every step; one Tally per prompt, in order.

    Each prompt decodes and is measured as it would be alone (the loop's batching guarantee),
    except for float rounding in model calls of other shapes. ``cfg.width`` caps the rows of one
    physical call across the whole batch, so a prompt's ``calls`` counter is the number of
    physical calls its rows took part in.
    """
    from ..decoding.blocks import block_size_of
    from ..decoding.calibration import CalibrationStep
    from ..decoding.loop import run

    canvas = getattr(model, "canvas_length", None)
    if canvas is not None:
        raise ValueError(f"{getattr(model, 'name', None) or model.family}: a uniform-state "
                         f"diffusion model (no mask token: its canvas of {canvas} starts as "
                         f"random tokens); planning vocabularies are measured at masked "
                         f"positions, which its canvases do not have")
    params = cfg.params(block_size_of(model))
    dev = torch.device(getattr(model, "device", None) or "cpu")
    batch = [torch.as_tensor(list(p), dtype=torch.long, device=dev).reshape(-1) for p in prompts]
    step = CalibrationStep(params, cfg.band, cfg.reveal_next, cfg.width)
    results = run(model, batch, params, step)
    if step.events:
        req, tok, nonvac, passed, vig, kept = (torch.cat([getattr(e, f).reshape(-1)
                                                          for e in step.events]).cpu()
                                               for f in ("req", "tok", "nonvacuous", "passed",
                                                         "vig", "tried"))
    tallies = []
    for r, res in enumerate(results):
        out = Tally()
        out.counters.update(prompts=1, steps=step.rounds.get(r, 0), calls=res.nfe,
                            rows=res.branch_rows)
        if step.events:
            mine = kept & (req == r)          # this prompt's events, in the order it made them
            t = tok[mine]
            vals = torch.stack([torch.ones(t.numel(), dtype=torch.float64), nonvac[mine].double(),
                                passed[mine].double(), vig[mine].double()], dim=1)     # [E, 4]
            if t.numel():
                uniq, inv = torch.unique(t, return_inverse=True)
                sums = torch.zeros((uniq.numel(), 4), dtype=torch.float64).index_add_(0, inv, vals)
                out.stats = {int(v): s for v, s in zip(uniq.tolist(), sums.tolist())}
                tot = vals.sum(0).tolist()
                out.counters.update(events=tot[0], nonvacuous=tot[1], passed=tot[2])
        tallies.append(out)
    return tallies


def token_records(tally: Tally, tokenizer) -> list[dict]:
    """Every measured token with its statistics, by id."""
    ids = sorted(tally.stats)
    strings = tokenizer.convert_ids_to_tokens(ids) if ids else []
    out = []
    for i, s in zip(ids, strings):
        n, m, a, g = tally.stats[i]
        out.append({"id": i, "string": s, "n": int(n), "m": int(m), "r": a / m if m else 0.0,
                    "vig": g / n if n else 0.0, "a_sum": a, "vig_sum": g})
    return out


def apply_filters(records: list[dict], cfg: CalibConfig, near: float = 0.5
                  ) -> tuple[list[dict], list[dict]]:
    """(kept, rejected near the thresholds). A rejected token is "near" when it fails at least one
    filter but reaches ``near`` of every count/gain threshold and ``rho_ver - (1 - near) / 5`` of
    the pass-rate one; its record lists the filters it failed."""
    kept, close = [], []
    for r in records:
        failed = [name for name, ok in (("n", r["n"] >= cfg.min_n), ("m", r["m"] >= cfg.min_m),
                                        ("r", r["r"] >= cfg.rho_ver),
                                        ("vig", r["vig"] >= cfg.gamma_vig)) if not ok]
        if not failed:
            kept.append(r)
        elif (r["n"] >= near * cfg.min_n and r["m"] >= near * cfg.min_m
              and r["r"] >= cfg.rho_ver - (1 - near) / 5 and r["vig"] >= near * cfg.gamma_vig):
            close.append(dict(r, failed=failed))
    return kept, close


# ---------------------------------------------------------------- data


def _read_jsonl(path: Path) -> list[dict]:
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise CalibrationError(f"calibration data {path}: unreadable ({exc.strerror or exc})") from None
    docs = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            doc = json.loads(line)
        except json.JSONDecodeError as exc:
            raise CalibrationError(f"calibration data {path}: line {n} is not JSON ({exc.msg})") from None
        if not isinstance(doc, dict):
            raise CalibrationError(f"calibration data {path}: line {n} is not a JSON object")
        docs.append(doc)
    if not docs:
        raise CalibrationError(f"calibration data {path}: no records")
    return docs


def prompts_from_docs(docs: list[dict], where: str, *, template: str | None = None,
                      prompt_field: str | None = None) -> tuple[list[str], str]:
    """Prompt strings of JSONL records and the description of how they were made."""
    if prompt_field is None and template is None:
        if "prompt" in docs[0]:
            prompt_field = "prompt"
        elif "question" in docs[0]:
            template = DEFAULT_TEMPLATE
        else:
            raise CalibrationError(f"calibration data {where}: records have no prompts (no 'prompt' "
                                   f"or 'question' field; pass --prompt-field or --template)")
    out = []
    for n, doc in enumerate(docs, 1):
        try:
            text = doc[prompt_field] if prompt_field else template.format(**doc)
        except KeyError as exc:
            raise CalibrationError(f"calibration data {where}: record {n} has no {exc.args[0]!r} "
                                   "field (no prompt)") from None
        if not isinstance(text, str) or not text.strip():
            raise CalibrationError(f"calibration data {where}: record {n} has an empty prompt")
        out.append(text)
    how = f"field {prompt_field!r}" if prompt_field else f"template {template!r}"
    return out, how


def _sha256(path: Path) -> str:
    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


def load_prompts(data: str, *, template: str | None = None, prompt_field: str | None = None
                 ) -> tuple[list[str], dict]:
    """Calibration prompts and a description of the data (for the artifact and the fingerprint)."""
    path = Path(data).expanduser()
    if data.endswith(".jsonl") or path.is_file():
        if not path.is_file():
            raise CalibrationError(f"calibration data {path}: no such file")
        prompts, how = prompts_from_docs(_read_jsonl(path), str(path), template=template,
                                         prompt_field=prompt_field)
        return prompts, {"source": "file", "path": str(path), "sha256": _sha256(path),
                         "prompt": how}
    from ..files.paths import tasks_dir

    folder = tasks_dir() / data
    cal = folder / "data" / "calibration.jsonl"
    if cal.is_file():
        docs = _read_jsonl(cal)
        if template is None and prompt_field is None:
            prompts, how = _task_prompts(folder, docs, str(cal))
        else:
            prompts, how = prompts_from_docs(docs, str(cal), template=template,
                                             prompt_field=prompt_field)
        rel = f"tasks/{data}/data/calibration.jsonl"
        return prompts, {"source": f"task:{data}", "path": rel, "sha256": _sha256(cal),
                         "prompt": how}
    return _lm_eval_prompts(data)


def _task_prompts(folder: Path, docs: list[dict], where: str) -> tuple[list[str], str]:
    import jinja2
    import yaml

    text = None
    for y in sorted(folder.glob("*.yaml")):
        for line in y.read_text().splitlines():
            if line.startswith("doc_to_text:"):
                text = yaml.safe_load(line.split(":", 1)[1])
    if not text:
        return prompts_from_docs(docs, where)
    tpl = jinja2.Environment(undefined=jinja2.StrictUndefined).from_string(text)
    out = []
    for n, doc in enumerate(docs, 1):
        try:
            out.append(tpl.render(**doc))
        except jinja2.UndefinedError as exc:
            raise CalibrationError(f"calibration data {where}: record {n}: {exc.message} "
                                   "(no prompt)") from None
    return out, f"task doc_to_text {text!r}"


def _tasks_of(obj) -> list:
    """Task objects of an lm-eval task or (nested) group, in order."""
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in _tasks_of(v)]
    return [obj]


def _lm_eval_prompts(spec: str) -> tuple[list[str], dict]:
    """Prompts of an lm-eval task or group ``TASK`` or ``TASK:SPLIT``: its training split, else its
    validation split, or SPLIT; never the split the task evaluates on (its test split)."""
    task, _, split = spec.partition(":")
    try:
        from lm_eval.tasks import TaskManager

        tm = TaskManager()
        if task not in tm.all_subtasks and task not in tm.all_groups:
            raise CalibrationError(f"--data {spec!r}: neither a .jsonl file, a task folder of "
                                   "pvf-lmeval with data/calibration.jsonl, nor an lm-eval task")
        tasks = _tasks_of(tm.load_task_or_group([task]))
    except CalibrationError:
        raise
    except Exception as exc:  # network, dataset scripts: one line
        raise CalibrationError(f"--data {spec!r}: could not load the lm-eval task "
                               f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
                               ) from None
    prompts, used = [], []
    for t in tasks:
        cfg = t.config
        # lm-eval evaluates on the test split, or on the validation split when there is none
        test = getattr(cfg, "test_split", None) or getattr(cfg, "validation_split", None)
        if split:
            if split == test:
                raise CalibrationError(f"--data {spec!r}: {split!r} is the split {t.config.task} is "
                                       "evaluated on; calibration never uses evaluation data")
            if split not in t.dataset:
                raise CalibrationError(f"--data {spec!r}: {t.config.task} has no split {split!r} "
                                       f"(has {', '.join(t.dataset)})")
            name, docs = split, t.dataset[split]
        elif t.has_training_docs():
            name, docs = "train", t.training_docs()
        elif t.has_validation_docs() and getattr(cfg, "validation_split", None) != test:
            name, docs = "validation", t.validation_docs()
        else:
            raise CalibrationError(f"--data {spec!r}: {t.config.task} has no training split and no "
                                   "validation split apart from its evaluation split; pass TASK:SPLIT "
                                   "or a .jsonl file (calibration never uses evaluation data)")
        prompts += [t.doc_to_text(d) for d in docs]
        used.append(f"{t.config.task}:{name}")
    if not prompts or not all(isinstance(p, str) and p.strip() for p in prompts):
        raise CalibrationError(f"--data {spec!r}: the chosen split yields no prompts")
    return prompts, {"source": f"lm-eval:{spec}", "splits": used, "prompt": "task doc_to_text"}


# ---------------------------------------------------------------- the run


def config_hash(model) -> str:
    cfg = getattr(model, "config", None) or {}
    return "sha256:" + hashlib.sha256(json.dumps(cfg, sort_keys=True).encode()).hexdigest()


def fingerprint(model_desc: dict, data_desc: dict, n_prompts: int, cfg: CalibConfig,
                chat: bool, batch_size: int = 1) -> str:
    """What a partial state must match to be resumed. The batch size is part of it (above 1
    only, so that earlier states stay valid): batches of other sizes round differently."""
    parts = [model_desc, data_desc, n_prompts, cfg.measurement(), chat]
    if batch_size != 1:
        parts.append({"batch_size": batch_size})
    blob = json.dumps(parts, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def _write_json(path: Path, data: dict) -> None:
    """``data`` as JSON, written atomically (:mod:`pvf_lmeval.files.atomic`)."""
    write_json(path, data)


def load_state(state_path: Path, fp: str) -> tuple[int, Tally, float]:
    """(prompts done, totals, seconds spent) from a partial state, or a fresh start."""
    if not state_path.exists():
        return 0, Tally(), 0.0
    try:
        st = json.loads(state_path.read_text())
        done, tally, spent = int(st["done"]), Tally.from_json(st["tally"]), float(st["elapsed_s"])
        stored = st["fingerprint"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CalibrationError(f"partial state {state_path}: unreadable ({type(exc).__name__}); "
                               "delete it or pass --restart") from None
    if stored != fp:
        raise CalibrationError(f"partial state {state_path}: written for another model, data, "
                               "measurement settings or --batch-size; delete it or pass --restart")
    return done, tally, spent


def run_calibration(model, prompts_ids: list[list[int]], cfg: CalibConfig, *,
                    state_path: Path | None = None, fp: str = "", save_every: int = 20,
                    stop_after: int | None = None, progress: bool = True,
                    batch_size: int = 1) -> tuple[Tally, bool, float]:
    """Calibrate over ``prompts_ids`` in order, ``batch_size`` prompts per batch of the decode
    loop, resuming from ``state_path`` if it holds a state.

    Returns (totals, finished, seconds spent in total). ``stop_after``: stop (as if interrupted)
    once at least that many prompts are done in this call; the state is saved. The state is
    saved after whole batches only (every ``save_every`` prompts, rounded up to a batch), so a
    resumed run decodes the same batches as an uninterrupted one and gives its result exactly.
    """
    from tqdm import tqdm

    done, tally, spent = (load_state(state_path, fp) if state_path else (0, Tally(), 0.0))
    t0 = time.perf_counter()

    def save():
        if state_path is not None:
            _write_json(state_path, {"fingerprint": fp, "done": done, "tally": tally.to_json(),
                                     "elapsed_s": spent + time.perf_counter() - t0})

    bar = tqdm(total=len(prompts_ids), initial=done, disable=not progress, desc="pvf-calibrate",
               unit="prompt", dynamic_ncols=True)
    this_call = 0
    try:
        with torch.no_grad():
            while done < len(prompts_ids):
                if stop_after is not None and this_call >= stop_after:
                    save()
                    return tally, False, spent + time.perf_counter() - t0
                chunk = prompts_ids[done:done + batch_size]
                for t in calibrate_prompts(model, chunk, cfg):
                    tally.add(t)
                before, done = done, done + len(chunk)
                this_call += len(chunk)
                bar.update(len(chunk))
                c = tally.counters
                bar.set_postfix(events=int(c["events"]), tokens=len(tally.stats),
                                pass_rate=f"{c['passed'] / max(c['nonvacuous'], 1):.2f}")
                if done // save_every > before // save_every:
                    save()
    except KeyboardInterrupt:
        save()
        bar.close()
        raise
    bar.close()
    return tally, True, spent + time.perf_counter() - t0


def build_artifact(tally: Tally, cfg: CalibConfig, *, tokenizer, model_family: str,
                   task_family: str, model_name: str, model_config_hash: str,
                   data_desc: dict, n_prompts: int, chat: bool, runtime_s: float,
                   command: str = "", model_weights: str | None = None) -> dict:
    records = token_records(tally, tokenizer)
    kept, near = apply_filters(records, cfg)
    c = tally.counters
    return {
        "format_version": FORMAT_VERSION,
        "kind": "calibrated",
        "model_family": model_family,
        "task_family": task_family,
        "model": model_name,
        "model_config_hash": model_config_hash,
        # vocab=auto skips the artifact for a checkpoint of other weights (retrained, fine-tuned)
        "model_weights": model_weights,
        "tokenizer": {"name": getattr(tokenizer, "name_or_path", "") or model_name,
                      "vocab_hash": tokenizer_hash(tokenizer), "size": len(tokenizer)},
        "calibration": {"data": data_desc, "prompts": n_prompts, "chat_template": chat,
                        "decoding": dict(cfg.measurement(), rule="threshold"),
                        "steps": int(c["steps"]), "model_calls": int(c["calls"]),
                        "branch_rows": int(c["rows"]), "events": int(c["events"]),
                        "nonvacuous_events": int(c["nonvacuous"]), "passed": int(c["passed"]),
                        "tokens_seen": len(records), "runtime_s": round(runtime_s, 1)},
        "thresholds": dict(cfg.filters(), band=list(cfg.band), tau_high=cfg.threshold),
        "built_by": command or "pvf-calibrate",
        "note": ("calibrated: per-token statistics measured by pvf-calibrate; 'tokens' passed every "
                 "filter, 'rejected_near' failed at least one ('failed') but came close"),
        "tokens": kept,
        "rejected_near": near,
    }
