"""`--model pvf-dlm` reaches the stock lm_eval CLI through the installed .pth hook.

Every check that depends on interpreter start-up runs in a fresh interpreter (the venv's
python, i.e. sys.executable) started outside the repo, so the repo folder itself is not
what makes the imports work.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import site
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
HOOK_SOURCE = REPO / "pvf_lmeval" / "_site_hook" / "pvf_lmeval_hook.py"
NAME = "pvf-dlm"
TARGET = "pvf_lmeval.lmeval.lm:PVFDiffusionLM"
BIN = Path(sys.executable).parent


def run_py(code: str, tmp_path: Path, timeout: float = 60) -> dict:
    """Run `code` in a fresh interpreter; it must print one JSON line last."""
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=tmp_path, capture_output=True, text=True, timeout=timeout,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def site_dirs() -> list[Path]:
    return [Path(p) for p in site.getsitepackages()]


def test_hook_is_cheap_and_lazy_at_startup(tmp_path):
    out = run_py(
        """
        import json, sys
        print(json.dumps({
            "hook": "pvf_lmeval_hook" in sys.modules,
            "finders": sum(bool(getattr(f, "_pvf_lmeval_hook", False)) for f in sys.meta_path),
            "heavy": sorted(m for m in ("lm_eval", "torch", "pvf_lmeval", "transformers")
                            if m in sys.modules),
        }))
        """,
        tmp_path,
    )
    assert out == {"hook": True, "finders": 1, "heavy": []}


def test_hook_imports_nothing_heavy_at_startup(tmp_path):
    """The .pth hook runs in every interpreter of the venv: at startup it may import neither
    the package nor torch, lm-eval or transformers (its cost is that of the hook module alone)."""
    code = ("import sys; print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('pvf_lmeval', 'torch', 'lm_eval', 'transformers')))")
    proc = subprocess.run([sys.executable, "-X", "importtime", "-c", code],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert [ln for ln in proc.stderr.splitlines() if ln.rstrip().endswith("pvf_lmeval_hook")]
    assert proc.stdout == "[]\n", proc.stdout


def test_registry_holds_lazy_string_and_builtins(tmp_path):
    out = run_py(
        f"""
        import json, sys
        import lm_eval.models
        from lm_eval.api.registry import model_registry
        loader = sys.modules["lm_eval.models"].__spec__.loader
        print(json.dumps({{
            "value": model_registry._objs.get({NAME!r}),
            "keys": list(model_registry.keys()),
            "builtins": list(lm_eval.models.MODEL_MAPPING),
            "finders_left": sum(bool(getattr(f, "_pvf_lmeval_hook", False))
                                for f in sys.meta_path),
            "loader_patched": "exec_module" in vars(loader),
            "plugin_imported": "pvf_lmeval.lmeval.lm" in sys.modules,
        }}))
        """,
        tmp_path,
    )
    assert out["value"] == TARGET
    assert out["keys"].count(NAME) == 1
    assert "hf" in out["keys"] and "dummy" in out["keys"]
    assert set(out["builtins"]) <= set(out["keys"])
    assert out["finders_left"] == 0  # one-shot
    assert not out["loader_patched"]
    assert not out["plugin_imported"]  # lazy: the plugin loads only when asked for


def test_cli_lookup_path_sees_plugin(tmp_path):
    # lm_eval's get_model() imports lm_eval.models itself when the registry is empty.
    out = run_py(
        f"""
        import json
        from lm_eval.api.registry import get_model, model_registry
        cls = get_model("dummy")
        print(json.dumps({{"dummy": cls.__name__, "keys": list(model_registry.keys()),
                           "value": model_registry._objs.get({NAME!r})}}))
        """,
        tmp_path,
    )
    assert out["dummy"] == "DummyLM"
    assert out["value"] == TARGET and "hf" in out["keys"]


def test_hook_is_idempotent(tmp_path):
    out = run_py(
        f"""
        import importlib.util, json, site, sys
        import pvf_lmeval_hook

        def finders():
            return sum(bool(getattr(f, "_pvf_lmeval_hook", False)) for f in sys.meta_path)

        # The .pth processed again (as with a venv's lib64 -> lib link) ...
        for d in site.getsitepackages():
            site.addsitedir(d)
        # ... and a second copy of the hook module executed from scratch.
        spec = importlib.util.spec_from_file_location("hook_copy", pvf_lmeval_hook.__file__)
        copy = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(copy)
        pvf_lmeval_hook.install(); copy.install()
        before = finders()

        import lm_eval.models
        from lm_eval.api.model import LM
        from lm_eval.api.registry import model_registry, register_model
        results = [pvf_lmeval_hook.register(), copy.register(), pvf_lmeval_hook.register()]
        pvf_lmeval_hook.install()  # after the trigger: registers directly, no new finder
        value = model_registry._objs.get({NAME!r})

        # The lead's @register_model({NAME!r}) on pvf_lmeval.lmeval.lm.PVFDiffusionLM upgrades
        # the lazy string in place; registering again afterwards stays a no-op.
        Fake = type("PVFDiffusionLM", (LM,), {{"__module__": "pvf_lmeval.lmeval.lm"}})
        register_model({NAME!r})(Fake)
        upgraded = model_registry._objs.get({NAME!r}) is Fake
        results.append(pvf_lmeval_hook.register())
        print(json.dumps({{
            "before": before, "after": finders(), "results": results, "value": value,
            "upgraded": upgraded, "still_class": model_registry._objs.get({NAME!r}) is Fake,
            "count": list(model_registry.keys()).count({NAME!r}),
            "hf": "hf" in model_registry,
        }}))
        """,
        tmp_path,
    )
    assert out == {
        "before": 1, "after": 0, "results": [True] * 4, "value": TARGET,
        "upgraded": True, "still_class": True, "count": 1, "hf": True,
    }


def test_pth_file_installed_in_site_packages():
    hits = [d / "pvf_lmeval_hook.pth" for d in site_dirs() if (d / "pvf_lmeval_hook.pth").is_file()]
    assert hits, f"pvf_lmeval_hook.pth not in {site_dirs()}: run `pip install -e .`"
    pth = hits[0]
    assert pth.read_text().strip() == "import pvf_lmeval_hook"
    installed = pth.with_name("pvf_lmeval_hook.py")
    assert installed.is_file()
    if HOOK_SOURCE.is_file():  # the installed copy is not live: catch a stale one
        assert installed.read_text() == HOOK_SOURCE.read_text(), (
            "installed pvf_lmeval_hook.py differs from the source: re-run `pip install -e .`"
        )


def test_lm_eval_cli_still_works(tmp_path):
    for cmd in ([sys.executable, "-m", "lm_eval", "--help"], [str(BIN / "lm_eval"), "--help"]):
        proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert "usage" in proc.stdout.lower()


def test_entry_points_declared():
    eps = md.entry_points(group="lm_eval.models")
    assert [ep.value for ep in eps if ep.name == NAME] == [TARGET]
    scripts = md.entry_points(group="console_scripts")
    assert [ep.value for ep in scripts if ep.name == "pvf-tasks-path"] == ["pvf_lmeval.cli.tasks_path:main"]
    assert md.version("pvf-lmeval") == __import__("pvf_lmeval").__version__


def test_pvf_tasks_path(tmp_path):
    if not (REPO / "tasks").is_dir():
        pytest.skip("no tasks/ folder in this checkout yet (git keeps no empty folders)")
    proc = subprocess.run(
        [str(BIN / "pvf-tasks-path")], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    tasks = Path(proc.stdout.strip())
    assert tasks.is_dir()
    if any((REPO / "tasks" / "arith").glob("*.yaml")):
        assert (tasks / "arith").is_dir()


def test_paths_in_process():
    from pvf_lmeval.files import paths

    if (REPO / "tasks").is_dir():
        assert paths.tasks_dir().is_dir()
    assert paths.vocab_artifacts_dir().is_dir()


def test_old_import_path_still_gives_the_class():
    from pvf_lmeval.lm import PVFDiffusionLM as old
    from pvf_lmeval.lmeval.lm import PVFDiffusionLM as new

    assert old is new


def test_lazy_string_resolves_to_the_class(tmp_path):
    out = run_py(
        f"""
        import json
        from lm_eval.api.model import LM
        from lm_eval.api.registry import get_model, model_registry
        cls = get_model({NAME!r})
        print(json.dumps({{"name": f"{{cls.__module__}}:{{cls.__name__}}",
                           "is_lm": issubclass(cls, LM), "hf": "hf" in model_registry}}))
        """,
        tmp_path,
    )
    assert out == {"name": TARGET, "is_lm": True, "hf": True}


HINT = ("pvf-lmeval: arith: a task of pvf-lmeval, which lm-eval finds only through "
        "--include_path: add --include_path \"$(pvf-tasks-path)\" (from Python: "
        "TaskManager(include_path=pvf_lmeval.tasks_path()))")


def test_a_package_task_without_include_path_is_one_line(tmp_path):
    """lm-eval 0.4.13 finds tasks only in its own folder and ``--include_path`` (no entry
    points): ``lm_eval --tasks arith`` without it ends with one line naming
    ``$(pvf-tasks-path)``, before the model loads; ``simple_evaluate`` in a script too."""
    import os

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    proc = subprocess.run([str(BIN / "lm_eval"), "--model", NAME, "--tasks", "arith,nosuchtask",
                           "--limit", "1"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1] == HINT + " (not found either: nosuchtask)"
    script = ("from lm_eval.tasks import TaskManager\n"
              "TaskManager(include_defaults=False).load(['arith'])\n")
    proc = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1] == HINT


def test_the_task_hint_keeps_every_other_error():
    import pvf_lmeval_hook as hook

    assert hook.missing_tasks(ValueError("Tasks not found: a, b")) == ["a", "b"]
    assert hook.missing_tasks(KeyError("Spec 'arith' is not a registered task/group/tag name or "
                                       "valid YAML path")) == ["arith"]
    assert hook.missing_tasks(ValueError("Tasks not found")) == []
    assert hook.missing_tasks(RuntimeError("Tasks not found: arith")) == []
    assert hook.package_tasks(["gsm8k", "arith", "arith_var"]) == ["arith", "arith_var"]
