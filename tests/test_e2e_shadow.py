"""`bench/e2e.py --shadow`: the real decode loop with a fixture deciding and a random model of a
(reduced) real shape making every call too (``bench/shadow.py``).

Pins: the fixture decides (tokens, routes and NFE equal a plain fixture run), the shadow's cache
follows the loop's (same full and cached calls; a cached shadow call needs the twin's committed
keys), the statistics pass runs over the shadow's vocabulary, ``cache=dual_base`` is measured,
and the table's header names the shadow.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def e2e():
    import e2e as module

    return module


def _key(r):
    return (r.tokens, r.nfe, r.branch_rows, r.routes)


@pytest.mark.parametrize("dec,cache", [("pvf", "dual_base"), ("threshold", "dual")])
def test_fixture_decides_and_shadow_cache_follows(e2e, llada, monkeypatch, dec, cache):
    import shadow

    from pvf_lmeval.decoding import runner as runner_mod
    from pvf_lmeval.decoding import decode_batch

    import benchlib

    docs = benchlib.held_out(2, "arith")
    prompts = benchlib.prompt_ids(llada.tokenizer, docs)
    args = type("A", (), {"gen_length": 96, "block_length": 32})()
    params = e2e.params_for(dec, cache, args, llada, {})
    big = e2e.shadow_model("llada-8b/16", torch.device("cpu"), torch.float32)
    model = shadow.ShadowModel(llada, big)
    widths = []
    real = runner_mod.stats_from_logits

    def recording(logits, *a, **k):
        widths.append(logits.shape[-1])
        return real(logits, *a, **k)

    monkeypatch.setattr(runner_mod, "stats_from_logits", recording)
    got = decode_batch(model, prompts, params=params, request_indices=[0, 1])
    assert set(widths) == {126464 // 16} and len(widths) == model.calls
    twin, store = model._twin, model._store
    assert (twin.full_calls, twin.cached_calls) == (store.full_calls, store.cached_calls)
    assert store.cached_calls > 0
    assert torch.equal(twin.ref, store.ref) and torch.equal(twin.ok, store.ok)
    monkeypatch.setattr(runner_mod, "stats_from_logits", real)
    want = decode_batch(llada, prompts, params=params, request_indices=[0, 1])
    assert [_key(r) for r in got] == [_key(r) for r in want]


def test_shadow_table_on_two_items(e2e, tmp_path, capsys):
    out = tmp_path / "shadow.json"
    # something compiled before the run: the warm-ups must report only their own compiling
    torch.compile(lambda x: x + 1, backend="eager")(torch.ones(1))
    e2e.main(["--shadow", "llada-8b/16", "--fixtures", "tiny-llada", "--limit", "2",
              "--decoders", "pvf", "--caches", "dual_base", "--batch-sizes", "1", "2",
              "--json", str(out)])
    text = capsys.readouterr().out
    header = next(line for line in text.splitlines() if line.startswith("Decode loop"))
    assert "shadow" in header and "random llada-8b/16" in header and "arith" in header
    rows = json.loads(out.read_text())["shadow"]
    assert [(r["decoder"], r["cache"], r["batch"], r["requests"]) for r in rows] == \
           [("pvf", "dual_base", 1, 2), ("pvf", "dual_base", 2, 2)]
    assert rows[0]["rounds"] > rows[1]["rounds"]         # two requests share rounds at batch 2
    assert rows[0]["vs_batch_1"] == 1.0
    assert rows[0]["per_request_tps"] == pytest.approx(rows[0]["aggregate_tps"])
    assert rows[1]["per_request_tps"] == pytest.approx(rows[1]["aggregate_tps"] / 2)
    assert rows[0]["nfe"] == rows[1]["nfe"]
    # both sizes decode a warm-up batch first (size 1, and the first size above 1); eager:
    # nothing compiles during it
    assert [r["compile_s"] for r in rows] == [0.0, 0.0]
    assert all(r["warmup_s"] > 0 for r in rows)
    assert sum("| llada-8b/16 | pvf | dual_base |" in line for line in text.splitlines()) == 2


@pytest.mark.parametrize("argv,msg", [
    (["--shadow", "llada-8b/16", "--caches", "dual2"], "--caches 'dual2' must be one of"),
    (["--replay", "llada-8b/16", "--caches", "dual_base"], "--replay does not replay"),
    (["--shadow", "llada-8b/16", "--replay", "llada-8b/16"], "--shadow and --replay"),
    (["--shadow", "llada-8b/16", "--decoders", "pfv"], "--decoders 'pfv' must be one of"),
])
def test_shadow_arguments(e2e, capsys, argv, msg):
    with pytest.raises(SystemExit) as exc:
        e2e.main(argv)
    assert exc.value.code == 2 and msg in capsys.readouterr().err


def test_gpu_session_script_budget_and_arguments():
    """bench/gpu_session.sh: its parts' timeouts add up to at most 460 s (a device command of
    8 minutes keeps time to start and pack), every part has one, and an unknown argument is
    refused before any work."""
    import re
    import subprocess

    script = REPO / "bench" / "gpu_session.sh"
    text = script.read_text()
    gpu = next(line for line in text.splitlines() if line.split()[:1] == ["T_SYNC=30"])
    t = dict(re.findall(r"\b(T_[A-Z]+)=(\d+)", gpu))
    used = set(re.findall(r'^part \S+ "\$(T_[A-Z]+)"', text, re.M))
    assert used == set(t) and len(used) == 9
    assert sum(int(v) for v in t.values()) <= 460
    out = subprocess.run(["bash", str(script), "--all"], capture_output=True, text=True)
    assert out.returncode == 2
    assert out.stderr == "gpu_session.sh: unknown argument '--all'; allowed: --tiny (or nothing)\n"
