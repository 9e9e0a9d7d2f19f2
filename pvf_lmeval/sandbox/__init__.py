"""Checking model-written programs: isolated by the operating system, with a verdict the
program cannot forge.

- :mod:`.bubblewrap`: bubblewrap namespaces, read-only system, private tmpfs; refuses to run
  without them unless ``PVF_UNSAFE_NO_SANDBOX=1``;
- :mod:`.run`: the candidate and the checker in two sandboxes, the verdict from the checker
  (``check_candidate``: one entry point; ``check_asserts``: assert lines over top-level names);
- :mod:`.inside`: the two programs that run in the sandboxes;
- :mod:`.literals`: the plain-literal protocol between them.
"""

from .bubblewrap import (UNSAFE_ENV, IsolationUnavailable, SandboxError, isolation,
                        unsafe_opt_out)
from .run import (REASONS, ExecResult, assert_names, check_asserts, check_candidate,
                  check_candidates, default_workers)

__all__ = ["ExecResult", "IsolationUnavailable", "REASONS", "SandboxError", "UNSAFE_ENV",
           "assert_names", "check_asserts", "check_candidate", "check_candidates",
           "default_workers", "isolation", "unsafe_opt_out"]
