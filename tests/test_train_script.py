"""scripts/tiny_fixtures/train.py: bad shapes and option clashes are one-line errors before any
data is prepared (the training itself runs on a GPU; see gpu_run.sh)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts" / "tiny_fixtures"))

import train  # noqa: E402


@pytest.mark.parametrize("argv, message", [
    (["--heads", "3"], "--heads must be even and divide --d-model, got 3 and 128"),
    (["--heads", "6"], "--heads must be even and divide --d-model, got 6 and 128"),
    (["--d-model", "0"], "--heads must be even and divide --d-model, got 4 and 0"),
    (["--layers", "0"], "--layers must be at least 1, got 0"),
    (["--var-share", "1.5"], "--var-share must lie in [0, 1], got 1.5"),
    (["--init-from", "x", "--tokenizer-from", "y"], "--init-from keeps its checkpoint's tokenizer"),
])
def test_bad_options_are_one_line_errors(tmp_path, capsys, argv, message):
    with pytest.raises(SystemExit) as exc:
        train.main(["--family", "llada", "--out", str(tmp_path / "m")] + argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert message in err[-1] and err[-1].startswith("train.py: error: ")
    assert not (tmp_path / "m").exists()


def test_an_init_from_of_another_shape_fails_before_the_data_is_prepared(tmp_path, capsys):
    fixture = REPO / "pvf_lmeval" / "fixtures" / "tiny-llada"
    with pytest.raises(SystemExit) as exc:
        train.main(["--family", "llada", "--out", str(tmp_path / "m"), "--init-from", str(fixture),
                    "--d-model", "64", "--heads", "2", "--var-share", "0.5"])
    assert exc.value.code == 2
    err = capsys.readouterr()
    assert err.err.strip().splitlines()[-1] == (
        f"train.py: error: --init-from {fixture} has d_model 128, 4 layers, 4 heads: give the "
        "same --d-model/--layers/--heads")
    assert "train rows" not in err.out       # no training data was drawn
