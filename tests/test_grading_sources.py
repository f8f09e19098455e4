"""The exercise and solution notebooks are generated from the spec modules
(course_kernels/grading/specs/, gathered by grading/sources.py): the committed notebooks must be
exactly what the generator writes, cell ids included (specs and notebooks never drift)."""

import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "grading"))

import build_notebooks  # noqa: E402
from sources import NOTEBOOKS, stub_from_solution  # noqa: E402


def _sources(nb):
    return [(c.cell_type, c.get("id"), c.source) for c in nb.cells]


@pytest.mark.parametrize("name", sorted(NOTEBOOKS))
def test_exercise_notebook_matches_sources(name):
    built = build_notebooks.build(name, NOTEBOOKS[name], solved=False)
    on_disk = nbformat.read(ROOT / "exercises" / f"{name}.ipynb", as_version=4)
    assert _sources(on_disk) == _sources(built), "run: python grading/build_notebooks.py"


@pytest.mark.parametrize("name", sorted(NOTEBOOKS))
def test_solution_notebook_matches_sources(name):
    built = build_notebooks.build(name, NOTEBOOKS[name], solved=True)
    on_disk = nbformat.read(ROOT / "solutions" / f"{name}.ipynb", as_version=4)
    assert _sources(on_disk) == _sources(built), "run: python grading/build_notebooks.py"


def test_stub_keeps_signature_and_docstring_and_drops_the_body():
    solution = (
        'def f(x: int) -> int:\n    """Double x.\n\n    Args: x.\n    """\n    return 2 * x\n'
    )
    stub = stub_from_solution(solution)
    assert stub.startswith('def f(x: int) -> int:\n    """Double x.')
    assert "return 2 * x" not in stub
    assert stub.endswith("raise NotImplementedError")
