"""pvf-lmeval: Plan-Verify-Fill and baseline decoders for diffusion LMs, as an lm-eval plugin."""

__version__ = "0.1.0"


def tasks_path() -> str:
    """The folder of the package's task YAMLs, for ``lm_eval --include_path`` and
    ``TaskManager(include_path=...)`` (what ``pvf-tasks-path`` prints)."""
    from .files.paths import tasks_dir

    return str(tasks_dir())
