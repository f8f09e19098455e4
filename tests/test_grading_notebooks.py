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


# -- the lint, by reading the cell (course_kernels/grading/lint.py) ---------------------------
def test_magics_are_commented_only_where_a_logical_line_starts():
    from course_kernels.grading.lint import MAX_CELL_CHARS, _strip_magics

    assert _strip_magics("%time x = 1\n  !ls\ny = 2\n") == "# %time x = 1\n#   !ls\ny = 2"
    code = [
        "x = 1  # a comment (with a bracket\n%time y = 2",  # the bracket is in a comment
        's = """\n%d items\n"""\n%time z = 3',  # inside a triple-quoted string, then a magic
        "t = '\\'('\n%time z = 3",  # an escaped quote and a bracket inside a string
        "u = (1\n     % 3)\n%time z = 3",  # a continuation line inside brackets
        "v = 1 \\\n    % 3\n%time z = 3",  # after a backslash
    ]
    for src in code:
        head, magic = src.rsplit("\n", 1)
        assert _strip_magics(src) == head + "\n# " + magic, src
    huge = "%time x = 1\n" + "#" * MAX_CELL_CHARS  # refused unread by the lint: left as it is
    assert _strip_magics(huge) == huge


def test_lint_refuses_escapes_and_library_answers_by_name_and_line():
    from course_kernels.grading.lint import MAX_CELL_CHARS, forbidden_use

    numpy_cases = {
        "import sys\nsys.exit(0)": "uses sys (sys.exit, sys.modules) (`sys`, line 2)",
        "import sys as s\ns.exit(0)": "uses sys (sys.exit, sys.modules) (`sys`, line 1)",
        "from sys import float_info, exit": "uses sys (sys.exit, sys.modules) (`sys`, line 1)",
        "from os import system": "runs shell commands (`system`, line 1)",
        "import importlib.util": "uses importlib (`importlib`, line 1)",
        "from scipy.special import logsumexp": "uses SciPy (scipy.special.softmax / logsumexp do "
        "the exercise for you) (`scipy`, line 1)",
        "y = x.softmax(-1)": "calls a library softmax (`.softmax`, line 1)",
        "y = x.logsumexp(-1)": "calls a library logsumexp (`.logsumexp`, line 1)",
        "f = open('answers.json')": "opens files (`open`, line 1)",
        "import course_kernels": "imports the course's own implementation (`course_kernels`, line 1)",
        "import torch": "uses PyTorch in a NumPy exercise (torch.softmax / torch's attention do "
        "it for you) (`torch`, line 1)",
    }
    for src, why in numpy_cases.items():
        assert forbidden_use(src, torch_rules=False) == why, src
    for harmless in ("import sys\neps = sys.float_info.epsilon", "from sys import float_info"):
        assert forbidden_use(harmless, torch_rules=False) is None
    assert forbidden_use("x = 1\n" + "#" * MAX_CELL_CHARS, False) == (
        f"is {MAX_CELL_CHARS + 6} characters long (more than {MAX_CELL_CHARS}; not read)"
    )


def test_lint_allows_torch_in_triton_exercises_and_its_answers_only_inside_kernels():
    from course_kernels.grading.lint import forbidden_use

    kernels = (
        "import torch\nimport triton\nimport triton.language as tl\nfrom triton import jit\n\n"
        "@triton.autotune(configs=[], key=[])\n@triton.jit\ndef k1(x):\n"
        "    s = tl.dot(x, x)\n    return tl.softmax(s)\n\n"  # its last line
        "@jit\ndef k2(x):\n    return x @ x\n"
    )
    assert forbidden_use(kernels, torch_rules=True) is None
    assert forbidden_use("y = torch.softmax(x, -1)", True) == (
        "calls a library softmax outside a Triton kernel (`softmax`, line 1)"
    )
    assert forbidden_use("y = torch.matmul(q, k)", True) == (
        "calls torch.matmul outside a Triton kernel (`matmul`, line 1)"
    )
    assert forbidden_use("x = 1\ny = q @ k", True) == (
        "multiplies matrices with @ outside a Triton kernel (line 2)"
    )
