"""Property-based tests over the files pvf-lmeval reads: ``config.json``, safetensors headers,
planning-vocabulary artifacts and trace records. Every generated file either loads or fails
with one line (a ``ValueError`` subclass with a one-line message); none runs for more than
60 s (on a loaded machine; a load takes under a second once warm) or raises the process's peak resident memory by 1 GiB. Derandomized (the same examples
on every run) and bounded in examples, so the module takes well under half a minute."""

from __future__ import annotations

import json
import math
import shutil
import struct
from pathlib import Path

import pytest
from helpers.bounds import bounded

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

from pvf_lmeval.models.loader import FIXTURES_DIR, load_model, load_tokenizer  # noqa: E402
from pvf_lmeval.models.validation import read_header  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

def fuzz(examples: int) -> settings:
    """Deterministic (CI runs the same examples), no per-example deadline, nothing stored."""
    return settings(derandomize=True, deadline=None, database=None, print_blob=False,
                    max_examples=examples, suppress_health_check=list(HealthCheck))


def loads_or_one_line(fn):
    """``fn()``'s result, or None when it failed the allowed way (asserted here)."""
    try:
        with bounded():
            return fn()
    except ValueError as exc:
        msg = str(exc)
        assert msg.strip() and "\n" not in msg, f"not one line: {msg!r}"
        return None


# --- values a hostile or broken file may hold where a number or a flag is expected ----------------

WEIRD = st.one_of(
    st.integers(min_value=-2, max_value=4), st.sampled_from([0, -1, 10 ** 6, 10 ** 9, 10 ** 12,
                                                           2 ** 63, -(2 ** 63)]),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from(["abc", "", "128", "1e-5"]),
    st.none(), st.booleans(), st.lists(st.integers(-1, 1000), max_size=3),
    st.dictionaries(st.sampled_from(["a", "type"]), st.integers(0, 3), max_size=2),
)


def _config(family: str) -> dict:
    return json.loads((FIXTURES_DIR / f"tiny-{family}" / "config.json").read_text())


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz")
    out = {f: Path(shutil.copytree(FIXTURES_DIR / f"tiny-{f}", root / f)) for f in ("llada", "dream")}
    load_model(str(out["llada"]), device="cpu")     # imports done before any example is timed
    return out


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_any_config_loads_or_fails_in_one_line(folders, family):
    base = _config(family)
    keys = sorted(base) + ["max_position_embeddings", "layer_norm_eps", "bos_token_id",
                           "num_key_value_heads", "embedding_size", "multi_query_attention"]
    folder = folders[family]

    @fuzz(40)
    @given(changes=st.dictionaries(st.sampled_from(keys), WEIRD, min_size=1, max_size=3))
    def run(changes):
        config = dict(base, **changes)
        try:
            text = json.dumps(config)
        except ValueError:
            return
        (folder / "config.json").write_text(text)
        loads_or_one_line(lambda: load_model(str(folder), device="cpu"))

    run()


@fuzz(60)
@given(header=st.one_of(
    st.binary(max_size=64),
    st.dictionaries(st.text(max_size=8), st.fixed_dictionaries({
        "dtype": st.sampled_from(["F32", "BF16", "I64", "XX", 3]),
        "shape": st.one_of(st.lists(st.integers(-2, 10 ** 13), max_size=3), st.text(max_size=3)),
        "data_offsets": st.lists(st.integers(-5, 2 ** 64), min_size=0, max_size=3)}), max_size=3)),
    length=st.one_of(st.none(), st.integers(0, 2 ** 64 - 1)), data=st.binary(max_size=64))
def test_any_safetensors_header_reads_or_fails_in_one_line(tmp_path_factory, header, length, data):
    path = tmp_path_factory.mktemp("h", numbered=True) / "x.safetensors"
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw) if length is None else length) + raw + data)
    got = loads_or_one_line(lambda: read_header(path))
    for dtype, shape in (got or {}).values():
        assert isinstance(dtype, str) and all(isinstance(d, int) and d >= 0 for d in shape)


# --- planning-vocabulary artifacts --------------------------------------------------------------

TOKEN = st.fixed_dictionaries({"string": st.one_of(st.sampled_from(["Ġ=", "####", "ĠStep", "zz"]), WEIRD)},
                              optional={"id": st.one_of(st.integers(-3, 700), WEIRD), "n": WEIRD})
ARTIFACT = st.fixed_dictionaries({}, optional={
    "format_version": st.one_of(st.just(1), WEIRD),
    "kind": st.sampled_from(["calibrated", "hand-written", "heuristic", "online", "x", 1]),
    "model_family": st.sampled_from(["llada", "dream", None]),
    "task_family": st.sampled_from(["math-word", "code", "?"]),
    "model": st.one_of(st.just("tiny-llada"), WEIRD),
    "model_weights": st.one_of(st.just("sha256:x"), WEIRD),
    "tokenizer": st.one_of(st.fixed_dictionaries({"vocab_hash": st.one_of(st.just(None), WEIRD)}),
                           WEIRD),
    "tokens": st.one_of(st.lists(TOKEN, max_size=4), WEIRD),
    "rejected_near": st.one_of(st.lists(TOKEN, max_size=2), WEIRD),
})


@pytest.fixture(scope="module")
def llada_tok():
    return load_tokenizer(FIXTURES_DIR / "tiny-llada")


def test_any_artifact_resolves_or_fails_in_one_line(tmp_path_factory, llada_tok, monkeypatch):
    from pvf_lmeval.planning import vocab

    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("PVF_LMEVAL_HOME", str(home))
    (home / "vocab").mkdir()
    size = len(llada_tok)

    @fuzz(80)
    @given(art=ARTIFACT, raw=st.one_of(st.none(), st.binary(max_size=16)))
    def run(art, raw):
        path = home / "vocab" / "fuzz.json"
        path.write_bytes(raw if raw is not None else json.dumps(art).encode())
        got = loads_or_one_line(lambda: vocab.resolve_vocab(
            str(path), tokenizer=llada_tok, model_family="llada"))
        if got is not None:
            ids, _ = got
            assert all(isinstance(i, int) and 0 <= i < size for i in ids)
        # the same file in the user's folder never breaks vocab=auto
        loads_or_one_line(lambda: vocab.pick_artifact("llada", "math-word", "tiny-llada",
                                                      llada_tok))

    run()


# --- trace records --------------------------------------------------------------------------------

RECORD = st.fixed_dictionaries({
    "tokens": st.one_of(st.lists(st.integers(0, 700), max_size=4), WEIRD),
    "routes": st.one_of(st.lists(st.sampled_from(["base", "plan", "ar", None, "x"]), max_size=4),
                        WEIRD)}, optional={
    "pieces": st.one_of(st.lists(st.text(max_size=4), max_size=4), WEIRD),
    "nfe": WEIRD, "n_steps": WEIRD, "request": st.one_of(st.text(max_size=6), WEIRD),
    "steps": st.one_of(st.lists(st.fixed_dictionaries({}, optional={
        "committed": st.one_of(st.lists(st.lists(WEIRD, max_size=2), max_size=2), WEIRD),
        "early_stop_at": WEIRD, "nfe": WEIRD}), max_size=2), WEIRD)})


@fuzz(80)
@given(rec=RECORD)
def test_any_trace_record_renders_or_fails_in_one_line(tmp_path_factory, rec):
    from pvf_lmeval.cli import trace as tr

    rec.setdefault("pieces", None)
    if rec["pieces"] is None:
        rec["pieces"] = []              # never ask for a tokenizer
    path = tmp_path_factory.mktemp("t", numbered=True) / "t.jsonl"
    try:
        path.write_text(json.dumps(rec) + "\n")
    except ValueError:
        return
    records = loads_or_one_line(lambda: tr.load_records([path]))
    if records:
        groups = tr.group_records(records)
        page = tr.render_html(groups)
        text = tr.render_ansi(groups, color=False)
        assert "<img" not in page and "\x1b" not in text and math.isfinite(len(page))
