"""The code base passes the ruff rules configured in pyproject.toml (pyflakes, pycodestyle
errors, pyupgrade, bugbear, simplify, McCabe complexity) and is formatted by ``ruff format``:
unused imports, undefined names, loop-variable closures, functions too complex to read and
unformatted files fail the suite."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _ruff() -> str:
    return shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))


@pytest.mark.parametrize(
    "args",
    [["check", "--no-cache"], ["format", "--check", "--no-cache"]],
    ids=["check", "format"],
)
def test_ruff_is_clean(args):
    result = subprocess.run([_ruff(), *args, str(ROOT)], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
