"""Make ``--model pvf-dlm`` visible to the stock ``lm_eval`` CLI (lm-eval 0.4.x).

lm-eval 0.4.13 resolves ``--model NAME`` only from its in-process model registry, which
``lm_eval.models`` fills with lazy ``"module:Class"`` strings; it reads no entry points.
``pvf_lmeval_hook.pth`` (installed into site-packages) imports this module at interpreter
start. It installs a one-shot ``sys.meta_path`` finder that waits for ``lm_eval.models``
to be imported and, right after the module has run (so the built-ins are registered
first), registers ``"pvf-dlm"`` as the lazy string ``"pvf_lmeval.lmeval.lm:PVFDiffusionLM"``.
The plugin itself (torch, ...) is imported only when lm-eval asks for that model.

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


class _Finder:
    """One-shot meta path finder: patches the loader of ``lm_eval.models`` so that,
    once the module has executed, MODEL_NAME is registered; then removes itself."""

    _pvf_lmeval_hook = True

    def find_spec(self, fullname, path=None, target=None):
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
