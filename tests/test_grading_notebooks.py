"""Every solution notebook gets full marks (visible + hidden tests, in the sandbox); every untouched
exercise notebook gets zero, with a "not yet implemented" message and no errors."""

import io
import json
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from course_kernels.grading.instructor import grade_notebook
from course_kernels.grading import NOTEBOOKS, check
from course_kernels.grading.runner import solution_cells

ROOT = Path(__file__).resolve().parents[1]
NAMES = sorted(NOTEBOOKS)


def test_every_notebook_exists_in_both_versions():
    for name in NAMES:
        for folder in ("exercises", "solutions"):
            nb = json.loads((ROOT / folder / f"{name}.ipynb").read_text())
            assert set(solution_cells(nb)) == set(NOTEBOOKS[name].exercises)


@pytest.mark.parametrize("name", NAMES)
def test_solution_gets_full_marks(name):
    res = grade_notebook(ROOT / "solutions" / f"{name}.ipynb")
    failed = [(v.exercise, v.name, v.message) for v in res.verdicts if not v.passed]
    assert not failed
    assert res.score == res.max_score > 0
    assert any(v.hidden for v in res.verdicts), "hidden tests were not run"


@pytest.mark.parametrize("name", NAMES)
def test_untouched_exercise_gets_zero_and_says_not_implemented(name):
    res = grade_notebook(ROOT / "exercises" / f"{name}.ipynb")
    assert res.score == 0 and res.max_score > 0
    for v in res.verdicts:
        assert v.status == "not_implemented", (v.name, v.status, v.message)
        assert "not yet implemented" in v.message


def test_check_cell_on_a_stub_reports_not_implemented():
    def stable_softmax(x):
        raise NotImplementedError

    out = io.StringIO()
    with redirect_stdout(out):
        check("stable_softmax", stable_softmax)
    assert "not yet implemented" in out.getvalue()


def _cell_function(source, name):
    """Define ``name`` as a Jupyter cell would (ipykernel's file name, source in linecache)."""
    import linecache

    filename = "/tmp/ipykernel_0/123456.py"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    ns = {"np": __import__("numpy")}
    exec(compile(source, filename, "exec"), ns)  # noqa: S102 - a student's cell, in a test
    return ns[name]


def test_check_cell_runs_the_graders_lint():
    """What the grader refuses, the check cell refuses first; harmless sys constants pass."""
    bad = _cell_function(
        "import torch\n\ndef stable_softmax(x):\n"
        "    return torch.softmax(torch.from_numpy(x), -1).numpy()\n",
        "stable_softmax",
    )
    out = io.StringIO()
    with redirect_stdout(out):
        check("stable_softmax", bad)
    assert "will not grade" in out.getvalue() and "PyTorch" in out.getvalue()
    good = _cell_function(
        "import sys\n\ndef stable_softmax(x):\n"
        "    e = np.exp(x - x.max(-1, keepdims=True))\n"
        "    return e / np.maximum(e.sum(-1, keepdims=True), sys.float_info.min)\n",
        "stable_softmax",
    )
    out = io.StringIO()
    with redirect_stdout(out):
        check("stable_softmax", good)
    assert "all visible tests pass" in out.getvalue(), out.getvalue()
