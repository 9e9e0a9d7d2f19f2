"""``lm_eval --model pvf-dlm`` end to end, offline, on the CPU with the bundled tiny models.

Every run is a real CLI subprocess (the venv's ``lm_eval``, ``python -m lm_eval``, ``torchrun -m
lm_eval``) writing to a temporary folder; the runs are started once per module, two at a time.
They pin: the results table and ``config.pvf.totals`` agree with the per-sample JSONL (means,
ratio-of-sums rates), static decoding without early stop costs exactly ``gen_length`` calls,
``--gen_kwargs`` overrides decoder parameters and ``max_gen_toks``, whose rounding up to whole
blocks is recorded,
``--apply_chat_template`` applies the model's template, data parallel on gloo matches one process
(padding copies not counted), tensor parallel on gloo gives one process's samples, and the CLI's
default ``cuda:0`` falls back to the CPU.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytest.importorskip("lm_eval")
torch = pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
LLADA = "tiny-llada"
#: the reference run and the data-parallel run decode with the dual KV cache: end to end through
#: the CLI, and per rank (each rank's requests must come out as in one process: nothing leaks)
BASE_ARGS = f"pretrained={LLADA},decoder=threshold,gen_length=96,block_length=32,cache=dual"
#: statistics that must agree exactly between runs (wall_s and tps are timings)
EXACT_KEYS = ("requests", "nfe", "branch_rows", "gen_length", "gen_tokens", "committed",
              "tokens_base", "tokens_plan", "tokens_ar", "tokens_forced", "tokens_explore", "tpf",
              "nfe_total")
LOOSE_THRESHOLD = 0.3


def _env() -> dict:
    # One thread per process: runs go two at a time on a small machine, and torchrun sets the
    # same for its workers, so single-process and data-parallel arithmetic match.
    return {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1",
            "TOKENIZERS_PARALLELISM": "false", "PYTHONWARNINGS": "ignore"}


def _lm_eval_args(model_args: str, out: Path, limit: int, *extra: str) -> list[str]:
    return ["--model", "pvf-dlm", "--model_args", model_args, "--include_path", str(REPO / "tasks"),
            "--tasks", "arith", "--limit", str(limit), "--output_path", str(out), "--log_samples",
            *extra]


class Run:
    def __init__(self, name: str, proc: subprocess.CompletedProcess, out: Path):
        self.name, self.proc, self.out = name, proc, out

    def check(self) -> "Run":
        assert self.proc.returncode == 0, f"{self.name}:\n{self.proc.stderr[-4000:]}"
        return self

    @property
    def results(self) -> dict:
        (path,) = glob.glob(str(self.out / "**" / "results_*.json"), recursive=True)
        return json.loads(Path(path).read_text())

    @property
    def samples(self) -> dict[int, dict]:
        (path,) = glob.glob(str(self.out / "**" / "samples_arith_*.jsonl"), recursive=True)
        rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
        by_id = {r["doc_id"]: r for r in rows}
        assert len(by_id) == len(rows), "a document was logged twice"
        return by_id

    @property
    def metrics(self) -> dict:
        return self.results["results"]["arith"]

    @property
    def totals(self) -> dict:
        return self.results["config"]["pvf"]["totals"]["arith"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Run]:
    root = tmp_path_factory.mktemp("lm_cli")
    lm_eval = [str(BIN / "lm_eval")]
    jobs = {
        # 1. the reference run; no --device, so the CLI's default cuda:0 must fall back
        "threshold": lm_eval + _lm_eval_args(BASE_ARGS, root / "threshold", 8),
        # 1. static without early stop, through `python -m lm_eval`, with the chat template (5.)
        "static": [sys.executable, "-m", "lm_eval"] + _lm_eval_args(
            f"pretrained={LLADA},decoder=static,gen_length=96,block_length=32,early_stop=false",
            root / "static", 2, "--apply_chat_template"),
        # 2. --gen_kwargs override of the model args' threshold (0.9) and of the task's
        # max_gen_toks (80, no gen_length in model args: rounded up to 96 = 3 blocks of 32);
        # batch_size inside model_args (4.) must not clash with the CLI's batch_size=1
        "gen_kwargs": lm_eval + _lm_eval_args(
            f"pretrained={LLADA},decoder=threshold,block_length=32,batch_size=4,cache=dual",
            root / "gen_kwargs",
            4, "--gen_kwargs", f"threshold={LOOSE_THRESHOLD},max_gen_toks=80"),
    }

    def run(item, env=None):
        name, cmd = item
        proc = subprocess.run(cmd, cwd=root, env={**_env(), **(env or {})}, capture_output=True,
                              text=True, timeout=400)
        return name, Run(name, proc, root / name)

    with ThreadPoolExecutor(max_workers=2) as pool:
        out = dict(pool.map(run, jobs.items()))
    # 3. data parallel: 2 gloo ranks, 5 documents -> rank 0 gets 3, rank 1 gets 2 (+1 padding copy)
    dp = [str(BIN / "torchrun"), "--standalone", "--nproc_per_node", "2", "-m", "lm_eval"]
    out["dp"] = run(("dp", dp + _lm_eval_args(BASE_ARGS, root / "dp", 5)))[1]
    # 6. tensor parallel: 2 gloo ranks, one model copy (the ranks compare every call's inputs)
    tp_args = f"{BASE_ARGS},tensor_parallel_size=2"
    out["tp"] = run(("tp", dp + _lm_eval_args(tp_args, root / "tp", 8)),
                    {"PVF_CHECK_RANKS": "1"})[1]
    return out


def _check_consistent(run: Run) -> None:
    """results table == mean/ratio over the samples JSONL == config.pvf.totals."""
    samples = list(run.samples.values())
    metrics, totals = run.metrics, run.totals
    n = len(samples)
    assert totals["requests"] == n == metrics["sample_len"]
    for key in ("nfe", "branch_rows", "gen_length", "gen_tokens", "committed", "tokens_base",
                "tokens_forced", "wall_s"):
        mean = sum(s[key] for s in samples) / n
        assert metrics[f"{key},none"] == pytest.approx(mean), key
        assert totals[key] == pytest.approx(mean), key
    tpf = sum(s["gen_tokens"] for s in samples) / sum(s["nfe"] for s in samples)
    assert metrics["tpf,none"] == pytest.approx(tpf) and totals["tpf"] == pytest.approx(tpf)
    tps = sum(s["gen_tokens"] for s in samples) / sum(s["wall_s"] for s in samples)
    assert metrics["tps,none"] == pytest.approx(tps) and totals["tps"] == pytest.approx(tps)
    assert totals["nfe_total"] == sum(s["nfe"] for s in samples)
    for s in samples:
        # the samples log shows each request's own rates (the sums aggregate them)
        assert s["tpf"] == pytest.approx(s["gen_tokens"] / s["nfe"])
        assert s["tps"] == pytest.approx(s["gen_tokens"] / s["wall_s"])
        assert 1 <= s["nfe"] <= s["branch_rows"] and s["gen_tokens"] <= s["gen_length"]


def test_threshold_run_end_to_end(runs):
    run = runs["threshold"].check()
    metrics = run.metrics
    for key in ("exact_match", "nfe", "tpf", "gen_tokens", "gen_length", "wall_s", "tps",
                "branch_rows", "committed"):
        assert f"{key},none" in metrics, key
    # a deterministic run of the bundled fixture: 7 of 8 answers right (document 4 wrong), and
    # each document's exact NFE (the trained fixture commits several tokens per call)
    assert metrics["exact_match,none"] == 0.875
    assert [run.samples[i]["exact_match"] for i in range(8)] == [1.0] * 4 + [0.0] + [1.0] * 3
    assert [run.samples[i]["nfe"] for i in range(8)] == [4, 3, 5, 3, 8, 3, 5, 5]
    assert metrics["nfe,none"] == 4.5
    assert metrics["gen_length,none"] == 96
    assert set(run.samples) == set(range(8))
    _check_consistent(run)
    pvf = run.results["config"]["pvf"]
    assert pvf["pretrained"] == LLADA and pvf["decoder"] == "threshold"
    assert pvf["params"]["gen_length"] == 96 and pvf["params"]["threshold"] == 0.9
    assert pvf["params"]["cache"] == "dual"
    for s in run.samples.values():
        assert "Question:" not in s["filtered_resps"][0]


def test_cli_default_device_falls_back_to_cpu(runs):
    run = runs["threshold"].check()
    assert "no CUDA GPU; using the CPU instead of the default device 'cuda:0'" in run.proc.stderr
    # lm-eval's own config keeps the CLI's default; ours says what actually ran
    pvf = run.results["config"]["pvf"]
    if not torch.cuda.is_available():
        assert pvf["device"] == "cpu" and pvf["dtype"] == "float32"
    assert pvf["totals"]["arith"]["truncated_prompts"] == 0 and pvf["truncation"] == "left"


def test_static_without_early_stop_costs_gen_length_calls(runs):
    run = runs["static"].check()        # also: `python -m lm_eval` works
    _check_consistent(run)
    assert run.totals["nfe_total"] == 96 * 2
    for s in run.samples.values():
        assert s["nfe"] == 96 and s["branch_rows"] == 96 and s["gen_length"] == 96
        assert s["committed"] == 96 and s["tokens_forced"] == 0
    assert run.results["config"]["pvf"]["early_stop"] is False


def test_apply_chat_template_is_applied(runs):
    run = runs["static"].check()
    for s in run.samples.values():
        prompt = s["arguments"]["gen_args_0"]["arg_0"]
        assert prompt.startswith("<|startoftext|><|start_header_id|>user"), prompt[:80]
        assert prompt.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")
        assert s["doc"]["question"] in prompt
    assert run.results["chat_template"]


def test_gen_kwargs_override_and_max_gen_toks_rounding(runs):
    run, base = runs["gen_kwargs"].check(), runs["threshold"].check()
    _check_consistent(run)
    pvf = run.results["config"]["pvf"]
    assert pvf["params"]["threshold"] == 0.9          # the model args are untouched ...
    samples = run.samples
    for s in samples.values():
        kwargs = s["arguments"]["gen_args_0"]["arg_1"]
        assert kwargs["threshold"] == LOOSE_THRESHOLD and kwargs["max_gen_toks"] == 80
        assert s["gen_length"] == 96                   # ... 80 rounded up to blocks of 32
    assert run.metrics["gen_length,none"] == 96 and run.totals["gen_length"] == 96
    assert "gen_length=96 (the task's max_gen_toks=80 rounded up to whole blocks of 32)" in run.proc.stderr
    # ... and each request decodes with the looser threshold: fewer calls than the 0.9 run
    loose = sum(s["nfe"] for s in samples.values())
    strict = sum(base.samples[d]["nfe"] for d in samples)
    assert loose < strict, (loose, strict)
    assert run.results["config"]["batch_size"] == 1   # the CLI's own, recorded; ours was 4


def test_data_parallel_matches_one_process(runs):
    dp, one = runs["dp"].check(), runs["threshold"].check()
    samples = dp.samples
    assert sorted(samples) == [0, 1, 2, 3, 4]
    _check_consistent(dp)
    assert dp.totals["requests"] == 5      # rank 1's padding copy is not counted
    for doc_id, s in samples.items():
        ref = one.samples[doc_id]
        assert s["filtered_resps"] == ref["filtered_resps"], doc_id
        for key in ("nfe", "branch_rows", "gen_tokens", "committed", "gen_length", "exact_match"):
            assert s[key] == ref[key], (doc_id, key)
    # the totals one process would report for the same 5 documents
    ref = [one.samples[d] for d in range(5)]
    for key in EXACT_KEYS:
        if key == "requests":
            want = 5
        elif key == "nfe_total":
            want = sum(r["nfe"] for r in ref)
        elif key == "tpf":
            want = sum(r["gen_tokens"] for r in ref) / sum(r["nfe"] for r in ref)
        else:
            want = sum(r[key] for r in ref) / 5
        assert dp.totals[key] == pytest.approx(want), key
    assert dp.metrics["exact_match,none"] == pytest.approx(sum(r["exact_match"] for r in ref) / 5)
    assert dp.results["config"]["pvf"]["parallel"] == {
        "tensor_parallel_size": 1, "data_parallel_size": 2, "parallel_layers": None, "notes": []}


def test_runs_print_no_noise(runs):
    """Outside a git checkout, on our task: no git error, no advice about --metadata, and the
    adapter's notices on lines of their own, not inside the progress bar's line."""
    for name in ("threshold", "gen_kwargs"):
        err = runs[name].check().proc.stderr
        assert "not a git repository" not in err and "Custom kwargs" not in err, name
    err = runs["gen_kwargs"].proc.stderr
    (line,) = [ln for ln in err.split("\n") if "rounded up to whole blocks" in ln]
    assert "it/s" not in line.split("\r")[-1]


def test_tensor_parallel_run_gives_the_samples_of_one_process(runs):
    """torchrun --nproc_per_node 2 ... tensor_parallel_size=2: lm-eval sees one model copy, the
    run writes one results file, and every document's answer, NFE and statistics are those of
    the single-process run (tiny-llada's logits differ in the last bits only)."""
    tp, one = runs["tp"].check(), runs["threshold"].check()
    assert set(tp.samples) == set(one.samples) == set(range(8))
    for i in range(8):
        assert tp.samples[i]["resps"] == one.samples[i]["resps"], i
        assert {k: tp.samples[i][k] for k in EXACT_KEYS if k in one.samples[i]} == \
            {k: one.samples[i][k] for k in EXACT_KEYS if k in one.samples[i]}, i
    assert tp.metrics["exact_match,none"] == one.metrics["exact_match,none"]
    assert tp.results["config"]["pvf"]["parallel"] == {
        "tensor_parallel_size": 2, "data_parallel_size": 1, "parallel_layers": "all",
        "notes": []}
    _check_consistent(tp)
