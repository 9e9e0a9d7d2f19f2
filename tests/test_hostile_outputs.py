"""Hostile and broken outputs: writes that follow planted links or race, traces that are torn,
duplicated or crafted, terminal control sequences in model text."""

from __future__ import annotations

import json
import multiprocessing
import os
from pathlib import Path

import pytest

from pvf_lmeval.files import atomic
from pvf_lmeval.planning import calibrate, vocab

ART = {"format_version": 1, "kind": "hand-written", "model_family": "llada",
       "task_family": "math-word", "model": "m", "tokens": [{"id": 1, "string": "a"}]}


def _writers():
    """Every writer of a whole JSON output file, as (name, write(path, data))."""
    return [("atomic.write_json", atomic.write_json),
            ("calibrate._write_json", calibrate._write_json),
            ("vocab.save_artifact", lambda p, d: vocab.save_artifact(d, p))]


@pytest.mark.parametrize("name,write", _writers(), ids=[n for n, _ in _writers()])
def test_a_link_planted_at_a_temporary_name_is_not_followed(tmp_path, name, write):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    out = tmp_path / "out.json"
    for planted in (out.with_name(out.name + ".tmp"), out.with_name(out.name + ".part")):
        planted.symlink_to(victim)
    write(out, ART)
    assert victim.read_text() == "precious\n"
    assert json.loads(out.read_text())["tokens"] == [{"id": 1, "string": "a"}]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json", "out.json.part",
                                                          "out.json.tmp", "victim.txt"]


def test_a_link_at_the_target_is_replaced_not_written_through(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    out = tmp_path / "out.json"
    out.symlink_to(victim)
    atomic.write_json(out, {"a": 1})
    assert victim.read_text() == "precious\n"
    assert not out.is_symlink() and json.loads(out.read_text()) == {"a": 1}


def _hammer(args):
    path, k, n = args
    failures = 0
    for i in range(n):
        try:
            calibrate._write_json(Path(path), {"writer": k, "i": i, "pad": "x" * 4096})
        except OSError:
            failures += 1
    return failures


def test_concurrent_writers_of_one_output_all_succeed(tmp_path):
    out = tmp_path / "out.json"
    with multiprocessing.get_context("fork").Pool(2) as pool:
        failures = pool.map(_hammer, [(str(out), 0, 150), (str(out), 1, 150)])
    assert failures == [0, 0]
    last = json.loads(out.read_text())
    assert last["i"] == 149 and last["pad"] == "x" * 4096
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    out = tmp_path / "out.json"
    out.write_text('{"old": true}\n')
    with pytest.raises(TypeError):
        atomic.write_json(out, {"bad": object()})
    assert out.read_text() == '{"old": true}\n'
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]


def test_write_bytes_fsyncs_the_file_and_its_folder(tmp_path, monkeypatch):
    synced = []
    real = os.fsync

    def spy(fd):
        synced.append(os.path.realpath(f"/proc/self/fd/{fd}"))
        return real(fd)

    monkeypatch.setattr(os, "fsync", spy)
    atomic.write_text(tmp_path / "a.txt", "x")
    assert len(synced) == 2
    assert synced[0].startswith(str(tmp_path / ".a.txt.")) and synced[1] == str(tmp_path)


# --- traces: crafted fields, control sequences, torn and repeated files ---------------------------

def _record(**changes) -> dict:
    rec = {"request": "t/0/0", "decoder": "pvf", "model": "tiny-llada", "prompt_ids": [1],
           "tokens": [5, 6, 7], "routes": ["base", "plan", None], "pieces": ["a", "b"],
           "nfe": 2, "n_steps": 1,
           "steps": [{"step": 0, "committed": [[0, "base"], [1, "plan"]], "nfe": 2,
                      "route": "plan", "early_stop_at": 1}]}
    rec.update(changes)
    return rec


def _jsonl(path: Path, *records, tail: str = "") -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + tail)
    return path


PAYLOAD = '"><img src=x onerror=alert(1)><b x="'


@pytest.mark.parametrize("field", ["nfe", "decoder", "request", "prompt_text", "n_steps_str",
                                   "step_nfe", "step_route", "piece"])
def test_no_record_field_reaches_the_page_as_markup(tmp_path, field):
    from pvf_lmeval.cli import trace as tr

    changes = {"piece": {"pieces": [PAYLOAD, "b"]},
               "step_nfe": {"steps": [dict(_record()["steps"][0], nfe=PAYLOAD)]},
               "step_route": {"steps": [dict(_record()["steps"][0], route=PAYLOAD)]},
               "n_steps_str": {"n_steps": None, "steps": None, "nfe": PAYLOAD}}.get(field,
                                                                                     {field: PAYLOAD})
    src = _jsonl(tmp_path / "t.jsonl", _record(**changes))
    out = tmp_path / "page.html"
    assert tr.main([str(src), "--html", str(out), "--no-color"]) == 0
    page = out.read_text()
    assert "<img" not in page and "<b x=" not in page
    assert "&lt;img src=x onerror=alert(1)&gt;" in page


@pytest.mark.parametrize("bad,problem", [
    ({"routes": ["base", "<script>", None]}, "routes must list one of"),
    ({"tokens": ["<x>", 6, 7]}, "tokens must be a list of token ids"),
    ({"pieces": [1, 2]}, "pieces must be a list of strings"),
    ({"n_steps": "5", "steps": None}, "n_steps must be an integer"),
    ({"steps": [{"committed": [["x", "base"]]}]}, "a step's committed must be a list of [position, route]"),
])
def test_malformed_records_are_one_line_errors(tmp_path, capsys, bad, problem):
    from pvf_lmeval.cli import trace as tr

    src = _jsonl(tmp_path / "t.jsonl", _record(**bad))
    assert tr.main([str(src), "--ansi"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"pvf-trace: {src}:1: {problem}") and err.count("\n") == 1


CONTROL = ("\x1b]0;pwned\x07\x1b[2J\x1b[31mred\x1b[0m\x1bPdcs\x1b\\\x9b2J\x07\x08\x7f\x85"
           "tab\tnew\nline")


def test_terminal_output_strips_control_sequences_from_model_text(tmp_path, capsys):
    from pvf_lmeval.cli import trace as tr

    src = _jsonl(tmp_path / "t.jsonl", _record(pieces=[CONTROL, "b"], request="r\x1b[2J",
                                               decoder="pvf\x1b]0;x\x07"))
    for color in ("always", "never"):
        assert tr.main([str(src), "--ansi", f"--color={color}"]) == 0
        out = capsys.readouterr().out
        text = out.replace("\x1b[0m", "").replace("\x1b[48;5;227m", "").replace("\x1b[48;5;153m", "")
        text = text.replace("\x1b[48;5;218m", "").replace("\x1b[48;5;157m", "").replace("\x1b[2m", "")
        assert "\x1b" not in text and "\x07" not in text and "\x9b" not in text
        assert "\x08" not in text and "\x7f" not in text and "\x85" not in text
        assert "redtab\tnew\nline" in text and "== r · pvf:" in text
    assert tr.terminal_safe(CONTROL) == "redtab\tnew\nline"


def test_a_torn_last_record_is_reported_and_the_others_render(tmp_path, capsys):
    from pvf_lmeval.cli import trace as tr

    whole = json.dumps(_record(request="t/1/0"))
    src = _jsonl(tmp_path / "t.jsonl", _record(), tail=whole[: len(whole) // 2])
    assert tr.main([str(src), "--ansi", "--no-color"]) == 0
    cap = capsys.readouterr()
    assert cap.err == (f"pvf-trace: {src}:2: torn last record skipped (incomplete JSON: "
                       f"Expecting value); the other records are shown\n")
    assert "== t/0/0 · pvf:" in cap.out and "t/1/0" not in cap.out


def test_a_torn_record_before_the_last_is_still_an_error(tmp_path, capsys):
    from pvf_lmeval.cli import trace as tr

    src = _jsonl(tmp_path / "t.jsonl", _record(), tail='{"request": \n' + json.dumps(_record()) + "\n")
    assert tr.main([str(src), "--ansi"]) == 2
    assert capsys.readouterr().err.startswith(f"pvf-trace: {src}:2: not a JSON record")


def test_a_record_without_pieces_asks_the_hub_for_tokenizer_files_only(tmp_path, monkeypatch,
                                                                       capsys):
    import huggingface_hub

    from pvf_lmeval.cli import trace as tr
    from pvf_lmeval.models.tokenizer_files import DATA_FILES

    asked = []

    def fake(repo_id, allow_patterns=None, **kw):
        asked.append((repo_id, tuple(allow_patterns)))
        raise RuntimeError("gated repo: ask the owner for access\nsecond line")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake)
    monkeypatch.chdir(tmp_path)
    src = _jsonl(tmp_path / "t.jsonl", _record(pieces=None, model="someone/llada-ft"))
    assert tr.main([str(src), "--ansi", "--no-color"]) == 0
    assert asked == [("someone/llada-ft", DATA_FILES)]
    assert not any(p.endswith(".safetensors") for p in asked[0][1])
    cap = capsys.readouterr()
    assert cap.err == ("pvf-trace: no tokenizer for 'someone/llada-ft' (pretrained="
                       "'someone/llada-ft': could not fetch from the hub (RuntimeError: gated "
                       "repo: ask the owner for access)); showing ids\n")
    assert "<5>{plan:<6>}" in cap.out


def test_a_run_starts_its_trace_afresh_unless_told_to_append(tmp_path):
    pytest.importorskip("lm_eval")
    from lm_eval.api.instance import Instance

    from pvf_lmeval.cli import trace as tr
    from pvf_lmeval.lmeval.lm import PVFDiffusionLM

    path = tmp_path / "trace.jsonl"
    _jsonl(path, _record(request="old/0/0"))

    def run(**kw):
        lm = PVFDiffusionLM(pretrained="tiny-llada", device="cpu", decoder="threshold",
                            gen_length=8, block_length=8, trace=str(path), vocab="none", **kw)
        inst = Instance(request_type="generate_until", doc={}, idx=0, metadata=("arith", 3, 1),
                        arguments=("Question: 1 + 2?\nAnswer:", {"until": ["Question:"]}))
        lm.generate_until([inst], disable_tqdm=True)
        return lm, inst

    def requests():
        return [r["request"] for r in tr.load_records([path])]

    lm, inst = run()
    assert requests() == ["arith/3/0"]                  # the old record is gone
    lm.generate_until([inst], disable_tqdm=True)        # a second call of the same run appends
    assert requests() == ["arith/3/0", "arith/3/0"]
    run()                                               # a rerun starts afresh
    assert requests() == ["arith/3/0"]
    run(trace_append="true")
    assert requests() == ["arith/3/0", "arith/3/0"]
    with pytest.raises(ValueError) as exc:
        run(trace_append="sometimes")
    assert str(exc.value) == "trace_append='sometimes' must be true or false"


def test_trace_refuses_links_fifos_and_missing_folders_before_the_model_loads(tmp_path):
    pytest.importorskip("lm_eval")
    import os

    from lm_eval.api.instance import Instance

    from pvf_lmeval.lmeval.lm import PVFDiffusionLM

    target = tmp_path / "precious.txt"
    target.write_text("keep me")
    link = tmp_path / "trace.jsonl"
    link.symlink_to(target)
    os.mkfifo(tmp_path / "fifo.jsonl")
    missing = tmp_path / "no-folder" / "trace.jsonl"
    for trace, message in [
            (link, f"trace={str(link)!r} is a symbolic link (to {target}); name the file itself"),
            (missing, f"trace={str(missing)!r}: the folder {missing.parent} does not exist"),
            (tmp_path / "fifo.jsonl", f"trace={str(tmp_path / 'fifo.jsonl')!r} exists and is not "
                                      f"a regular file"),
            (tmp_path, f"trace={str(tmp_path)!r} exists and is not a regular file")]:
        with pytest.raises(ValueError) as exc:      # a model that does not exist: never reached
            PVFDiffusionLM(pretrained="no-such-model", device="cpu", trace=str(trace))
        assert str(exc.value) == message
    # a link planted after the run started is refused when the trace opens; its target is kept
    path = tmp_path / "late.jsonl"
    lm = PVFDiffusionLM(pretrained="tiny-llada", device="cpu", decoder="threshold", gen_length=8,
                        block_length=8, trace=str(path), vocab="none")
    path.symlink_to(target)
    inst = Instance(request_type="generate_until", doc={}, idx=0, metadata=("arith", 3, 1),
                    arguments=("Question: 1 + 2?\nAnswer:", {"until": ["Question:"]}))
    with pytest.raises(ValueError) as exc:
        lm.generate_until([inst], disable_tqdm=True)
    assert str(exc.value) == (f"trace={str(path)!r}: cannot open it for writing (Too many levels "
                              f"of symbolic links; a symbolic link is refused)")
    assert target.read_text() == "keep me"


# --- planning-vocabulary artifacts: written to the user's folder, read defensively ----------------

def _tree(folder: Path) -> dict:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_calibrate_without_out_writes_to_the_user_folder_not_the_package(tmp_path, monkeypatch,
                                                                         capsys):
    from pvf_lmeval.cli import calibrate as cli
    from pvf_lmeval.files.paths import vocab_artifacts_dir

    monkeypatch.setenv("PVF_LMEVAL_HOME", str(tmp_path / "home"))
    shipped = _tree(vocab_artifacts_dir())
    assert cli.main(["--model", "tiny-llada", "--data", "arith", "--family", "math-word",
                     "--limit", "2", "--gen-length", "32", "--block-length", "32",
                     "--no-progress"]) == 0
    assert _tree(vocab_artifacts_dir()) == shipped
    out = tmp_path / "home" / "vocab" / "tiny-llada.math-word.calibrated.json"
    assert json.loads(out.read_text())["calibration"]["prompts"] == 2
    assert [p.name for p in out.parent.iterdir()] == [out.name]


def test_the_default_output_folder_is_stated_in_help(monkeypatch):
    from pvf_lmeval.cli import calibrate as cli
    from pvf_lmeval.files.paths import user_vocab_dir

    help_text = " ".join(cli.parser().format_help().split())
    assert ("default: <model>.<family>.calibrated.json in $PVF_LMEVAL_HOME/vocab, else "
            "$XDG_CACHE_HOME/pvf_lmeval/vocab, else ~/.cache/pvf_lmeval/vocab") in help_text
    monkeypatch.delenv("PVF_LMEVAL_HOME", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", "/x/cache")
    assert user_vocab_dir() == Path("/x/cache/pvf_lmeval/vocab")
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", "/home/u")
    assert user_vocab_dir() == Path("/home/u/.cache/pvf_lmeval/vocab")
    assert cli.default_out("GSAI-ML/LLaDA-8B-Instruct", "code") == \
        Path("/home/u/.cache/pvf_lmeval/vocab/llada-8b-instruct.code.calibrated.json")


@pytest.fixture
def llada_tok():
    from pvf_lmeval.models.loader import FIXTURES_DIR, load_tokenizer

    return load_tokenizer(FIXTURES_DIR / "tiny-llada")


def _art(tok, **kw) -> dict:
    vocab = tok.get_vocab()
    strings = kw.pop("strings", ["Ġ="])
    return dict(ART, tokenizer={"name": "t", "vocab_hash": None},
                tokens=[{"id": vocab[s], "string": s} for s in strings], **kw)


@pytest.mark.parametrize("where", ["user", "bundled"])
@pytest.mark.parametrize("content", [b"{not json", b"\xff\xfe\x00", b'{"format_version": 1}',
                                     b'[]', b'{"format_version": 1, "kind": "calibrated", '
                                     b'"model_family": "llada", "task_family": "math-word", '
                                     b'"tokens": [{"id": "7", "string": "a"}]}'])
def test_an_unreadable_artifact_is_skipped_with_a_warning_naming_it(tmp_path, monkeypatch,
                                                                    caplog, llada_tok, where,
                                                                    content):
    user, bundled = tmp_path / "home" / "vocab", tmp_path / "bundled"
    user.mkdir(parents=True)
    bundled.mkdir()
    monkeypatch.setenv("PVF_LMEVAL_HOME", str(tmp_path / "home"))
    monkeypatch.setattr("pvf_lmeval.planning.vocab.vocab_artifacts_dir", lambda: bundled)
    vocab.save_artifact(_art(llada_tok), bundled / "good.json")
    bad = (user if where == "user" else bundled) / "broken.json"
    bad.write_bytes(content)
    ids, source = vocab.resolve_vocab("auto", tokenizer=llada_tok, model_family="llada",
                                      task_family="math-word")
    assert ids == (llada_tok.get_vocab()["Ġ="],) and source == f"auto:{bundled / 'good.json'}"
    skipped = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert len(skipped) == 1 and skipped[0].startswith(f"vocab=auto: skipped {bad}: ")
    assert "\n" not in skipped[0]


def test_auto_prefers_the_users_calibration_over_an_equal_bundled_one(tmp_path, monkeypatch,
                                                                      llada_tok):
    user, bundled = tmp_path / "home" / "vocab", tmp_path / "bundled"
    monkeypatch.setenv("PVF_LMEVAL_HOME", str(tmp_path / "home"))
    monkeypatch.setattr("pvf_lmeval.planning.vocab.vocab_artifacts_dir", lambda: bundled)
    vocab.save_artifact(_art(llada_tok, kind="calibrated"), bundled / "a.json")
    vocab.save_artifact(_art(llada_tok, kind="calibrated", strings=["####"]), user / "z.json")
    vocab.save_artifact(_art(llada_tok, kind="hand-written", strings=["ĠStep"]), user / "b.json")
    ids, source = vocab.resolve_vocab("auto", tokenizer=llada_tok, model_family="llada",
                                      task_family="math-word")
    assert ids == (llada_tok.get_vocab()["####"],) and source == f"auto:{user / 'z.json'}"
    assert vocab.find_artifact("z") == user / "z.json" and vocab.find_artifact("a") == bundled / "a.json"


# --- pvf-report on malformed results files ---------------------------------------------------------

def _results(**changes) -> dict:
    res = {"results": {"t": {"exact_match,none": 0.5}}, "n-samples": {"t": {"effective": 4}},
           "config": {"model": "pvf-dlm", "model_args": {"pretrained": "m", "decoder": "pvf"}},
           "date": 1.0}
    res.update(changes)
    return res


@pytest.mark.parametrize("n_samples", [{"t": 5}, {"t": [4]}, [1, 2], "x", {"t": {"effective": "x"}}])
def test_an_n_samples_field_of_another_shape_is_no_count(tmp_path, n_samples):
    from pvf_lmeval.cli import report

    (tmp_path / "results_a.json").write_text(json.dumps(_results(**{"n-samples": n_samples})))
    (e,) = report.build([tmp_path]).rows[0].entries.values()
    assert (e.acc, e.n) == (50.0, None)
    assert report.main([str(tmp_path)]) == 0


def test_a_field_of_an_unexpected_shape_is_one_line(tmp_path, capsys):
    from pvf_lmeval.cli import report

    path = tmp_path / "results_a.json"
    path.write_text(json.dumps(_results(group_subtasks=[["t"]])))
    assert report.main([str(tmp_path)]) == 3
    err = capsys.readouterr().err
    assert err == (f"pvf-report: {path}: malformed lm-eval results file (TypeError: unhashable "
                   f"type: 'list')\n")
