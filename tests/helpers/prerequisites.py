"""What the suite needs from its environment, and how a missing piece is reported.

A missing bundled weight file, browser or required library is a *failure*: a broken install must
not turn into a green run. A developer who lacks a piece on purpose opts out by naming it in
``PVF_ALLOW_MISSING`` (comma-separated: ``weights``, ``browser``, ``plot``, ``math``); the test then skips
with a reason that names the variable. Under CI (``CI=true``) and with ``PVF_REQUIRE_BROWSER=1``
(the browser) an opt-out is ignored.

Tests that reach the network are opt-in: ``PVF_NETWORK_TESTS=1``.
"""

from __future__ import annotations

import importlib
import os

import pytest

PIECES = ("weights", "browser", "plot", "math")


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def opted_out(piece: str) -> bool:
    """Whether the developer allowed ``piece`` to be missing (never under CI)."""
    assert piece in PIECES, piece
    if in_ci() or (piece == "browser" and os.environ.get("PVF_REQUIRE_BROWSER") == "1"):
        return False
    allowed = {p.strip() for p in os.environ.get("PVF_ALLOW_MISSING", "").split(",")}
    return piece in allowed


def missing(piece: str, what: str) -> None:
    """Report a missing ``piece`` (``what`` says what and how to get it): skip when opted out,
    else fail."""
    if opted_out(piece):
        pytest.skip(f"{what} (allowed by PVF_ALLOW_MISSING={os.environ['PVF_ALLOW_MISSING']})")
    pytest.fail(f"{what}; set PVF_ALLOW_MISSING={piece} to skip this test on purpose",
                pytrace=False)


def require_bundled_weights(name: str) -> None:
    """The bundled fixture ``name`` (pvf_lmeval/fixtures/NAME) has its config and weights."""
    from pvf_lmeval.models.loader import FIXTURES_DIR

    folder = FIXTURES_DIR / name
    if not ((folder / "config.json").exists() and (folder / "model.safetensors").exists()):
        missing("weights", f"bundled fixture {name} has no config.json/model.safetensors in "
                           f"{folder} (scripts/tiny_fixtures builds them)")


def require_module(module: str, piece: str, install: str):
    """Import ``module`` or report the missing ``piece`` (``install``: how to get it)."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        missing(piece, f"{module} is not importable ({e}); {install}")


network = pytest.mark.skipif(os.environ.get("PVF_NETWORK_TESTS") != "1",
                             reason="reaches the network: set PVF_NETWORK_TESTS=1 to run it")

#: the slow tier of the compiled round's tests (tests/test_compiled_round.py): inductor's
#: generated code (about 2 minutes of C++ compiling per configuration on 2 cores) and the rest
#: of the decoder x cache matrix
compile_tier = pytest.mark.skipif(os.environ.get("PVF_COMPILE_TESTS") != "1",
                                  reason="slow compile tier: set PVF_COMPILE_TESTS=1 to run it")

#: the rest of the new families' decoder x family matrix (tests/test_family_decoding.py) and
#: their runs through the lm_eval CLI (tests/test_family_cli.py): a 152k-id LM head per call
family_tier = pytest.mark.skipif(os.environ.get("PVF_FAMILY_TESTS") != "1",
                                 reason="family tier: set PVF_FAMILY_TESTS=1 to run it")


def require_math_extra() -> None:
    """lm-eval's math extra as the MATH rows' scorers need it (in the test extra): math_verify,
    latex2sympy2_extended, sympy and antlr 4.11, lm-eval's pin (4.13 parses some LaTeX answers
    otherwise, so the published scores would not be reproduced)."""
    from importlib.metadata import version

    for module in ("math_verify", "latex2sympy2_extended", "sympy", "antlr4"):
        require_module(module, "math", "pip install -e .[test] (lm-eval's math extra)")
    got = version("antlr4-python3-runtime")
    if not got.startswith("4.11"):
        missing("math", f"antlr4-python3-runtime is {got}, not 4.11 (lm-eval[math]'s pin); "
                        "pip install antlr4-python3-runtime==4.11")
