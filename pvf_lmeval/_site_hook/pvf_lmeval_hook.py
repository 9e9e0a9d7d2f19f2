"""Make ``--model pvf-dlm`` visible to the stock ``lm_eval`` CLI (lm-eval 0.4.x).

lm-eval 0.4.13 resolves ``--model NAME`` only from its in-process model registry, which
``lm_eval.models`` fills with lazy ``"module:Class"`` strings; it reads no entry points.
``pvf_lmeval_hook.pth`` (installed into site-packages) imports this module at interpreter
start. It installs a one-shot ``sys.meta_path`` finder that waits for ``lm_eval.models``
to be imported and, right after the module has run (so the built-ins are registered
first), registers ``"pvf-dlm"`` as the lazy string ``"pvf_lmeval.lmeval.lm:PVFDiffusionLM"``.
The plugin itself (torch, ...) is imported only when lm-eval asks for that model.

lm-eval 0.4.13 finds tasks only in its own folder and in ``--include_path`` (``TaskManager``
reads no entry points either), so the package's tasks need ``--include_path
"$(pvf-tasks-path)"``. When ``lm_eval`` is imported the finder also chains a ``sys.excepthook``
that turns lm-eval's uncaught "task not found" error for one of those tasks (the CLI's
``ValueError: Tasks not found: ...``, ``TaskManager``'s ``KeyError: "Spec ... is not a
registered task ..."``) into one line saying so; any other error keeps its traceback.

Rules this module keeps:
- It imports nothing but ``sys`` at start-up (cost: well under a millisecond), and never
  imports lm_eval itself: registering anything before ``lm_eval.models`` has run would
  leave the registry non-empty, and lm-eval would then never load its built-in models.
- It is idempotent: ``.pth`` files can be processed twice (venv ``lib64 -> lib``), and a
  second copy of this module must not add a second finder or a second entry.
- It never raises into the importing program: a failure only means "pvf-dlm" is missing.

The source of truth is ``pvf_lmeval/_site_hook/pvf_lmeval_hook.py``; the wheel (normal and
editable) carries a copy at the top of site-packages, so after editing it re-run
``pip install -e .``.
"""

import sys

MODEL_NAME = "pvf-dlm"
TARGET = "pvf_lmeval.lmeval.lm:PVFDiffusionLM"
TRIGGER = "lm_eval.models"
#: the import that installs the missing-task hint
HINT_TRIGGER = "lm_eval"

# Attribute that marks our finder on sys.meta_path, whichever copy of this module made it.
_MARK = "_pvf_lmeval_hook"


def register(registry=None):
    """Register MODEL_NAME -> TARGET in lm-eval's model registry, once.

    Safe to call any number of times, also after the lazy string was materialised into
    the class (then it is left alone). Returns True if "pvf-dlm" is registered afterwards.
    """
    try:
        if registry is None:
            # Make sure the built-ins are registered before us (see module docstring).
            import lm_eval.models  # noqa: F401
            from lm_eval.api.registry import model_registry as registry
        if MODEL_NAME not in registry:
            registry.register(MODEL_NAME, target=TARGET)
        return MODEL_NAME in registry
    except Exception:  # a frozen registry, an lm-eval without one, ...
        return False


def missing_tasks(error) -> list:
    """The task names of lm-eval's "task not found" errors (0.4.13), else []."""
    text = str(error.args[0]) if getattr(error, "args", None) else ""
    if isinstance(error, ValueError) and text.startswith("Tasks not found: "):
        return [t.strip() for t in text[len("Tasks not found: "):].split(",") if t.strip()]
    if isinstance(error, KeyError) and text.startswith("Spec '") and "not a registered task" in text:
        return [text.split("'")[1]]
    return []


def package_tasks(names) -> list:
    """Those of ``names`` that are tasks of this package (read from its task YAMLs)."""
    try:
        from pvf_lmeval.files.paths import tasks_dir
        from pvf_lmeval.lmeval.task_loading import task_names

        ours = set()
        for folder in tasks_dir().iterdir():
            if folder.is_dir():
                ours |= task_names(folder)
        return [n for n in names if n in ours]
    except Exception:  # an install without its tasks: no hint
        return []


def hint_line(ours, missing) -> str:
    """The one line for missing tasks ``missing``, ``ours`` of them the package's."""
    what = "a task" if len(ours) == 1 else "tasks"
    others = [n for n in missing if n not in ours]
    rest = f" (not found either: {', '.join(others)})" if others else ""
    return (f"pvf-lmeval: {', '.join(ours)}: {what} of pvf-lmeval, which lm-eval finds only "
            f"through --include_path: add --include_path \"$(pvf-tasks-path)\" (from Python: "
            f"TaskManager(include_path=pvf_lmeval.tasks_path())){rest}")


def install_task_hint():
    """Chain the missing-task hint onto ``sys.excepthook`` (once)."""
    if getattr(sys.excepthook, _MARK, False):
        return
    previous = sys.excepthook

    def hook(kind, value, tb):
        missing = missing_tasks(value)
        ours = package_tasks(missing)
        if ours:
            sys.stderr.write(hint_line(ours, missing) + "\n")
        else:
            previous(kind, value, tb)

    setattr(hook, _MARK, True)
    sys.excepthook = hook


class _Finder:
    """One-shot meta path finder: patches the loader of ``lm_eval.models`` so that,
    once the module has executed, MODEL_NAME is registered; then removes itself. On the
    way it sees ``lm_eval`` imported, and installs the missing-task hint."""

    _pvf_lmeval_hook = True

    def find_spec(self, fullname, path=None, target=None):
        if fullname == HINT_TRIGGER:
            try:
                install_task_hint()
            except Exception:
                pass
            return None
        if fullname != TRIGGER:
            return None
        try:
            return self._patched_spec(fullname, path, target)
        except Exception:
            return None  # let the normal machinery (and its errors) take over

    def _patched_spec(self, fullname, path, target):
        spec = None
        for finder in list(sys.meta_path):
            if getattr(finder, _MARK, False) or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        loader = getattr(spec, "loader", None)
        exec_module = getattr(loader, "exec_module", None)
        if exec_module is None:
            return None
        own = vars(loader).get("exec_module") if hasattr(loader, "__dict__") else None

        def exec_then_register(module):
            try:
                exec_module(module)
            finally:
                # Put the loader back as it was: it stays the module's __loader__.
                if own is None:
                    vars(loader).pop("exec_module", None)
                else:
                    loader.exec_module = own
            uninstall()
            register()

        loader.exec_module = exec_then_register  # on this spec's loader instance only
        return spec


def installed():
    """True if a hook finder (from any copy of this module) is on sys.meta_path."""
    return any(getattr(f, _MARK, False) for f in sys.meta_path)


def install():
    """Install the finder, or register at once if lm_eval.models is already imported."""
    if TRIGGER in sys.modules:
        register()
    elif not installed():
        sys.meta_path.insert(0, _Finder())


def uninstall():
    sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, _MARK, False)]


try:
    install()
except Exception:  # never break interpreter start-up
    pass
