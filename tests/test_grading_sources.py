"""The exercise and solution notebooks are generated from the spec modules
(course_kernels/grading/specs/, built by course_kernels.grading.notebooks): the committed notebooks must be
exactly what the generator writes, cell ids included (specs and notebooks never drift)."""

import json
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import build_notebooks  # noqa: E402  (the script that writes the committed notebooks)

from course_kernels.grading.notebooks import NOTEBOOKS, build, stub_from_solution  # noqa: E402


def _sources(nb):
    return [(c.cell_type, c.get("id"), c.source) for c in nb.cells]


@pytest.mark.parametrize("name", sorted(NOTEBOOKS))
def test_exercise_notebook_matches_sources(name):
    built = build(name, False, build_notebooks.repository_url())
    on_disk = nbformat.read(ROOT / "exercises" / f"{name}.ipynb", as_version=4)
    assert _sources(on_disk) == _sources(built), "run: python scripts/build_notebooks.py"


@pytest.mark.parametrize("name", sorted(NOTEBOOKS))
def test_solution_notebook_matches_sources(name):
    built = build(name, True, build_notebooks.repository_url())
    on_disk = nbformat.read(ROOT / "solutions" / f"{name}.ipynb", as_version=4)
    assert _sources(on_disk) == _sources(built), "run: python scripts/build_notebooks.py"


def test_stub_keeps_signature_and_docstring_and_drops_the_body():
    solution = (
        'def f(x: int) -> int:\n    """Double x.\n\n    Args: x.\n    """\n    return 2 * x\n'
    )
    stub = stub_from_solution(solution)
    assert stub.startswith('def f(x: int) -> int:\n    """Double x.')
    assert "return 2 * x" not in stub
    assert stub.endswith("raise NotImplementedError")


def test_hidden_json_of_every_spec_is_generated_from_it():
    from course_kernels.grading.exercises import SPECS
    from course_kernels.grading.notebooks import hidden_json

    for name, spec in SPECS.items():
        on_disk = (
            ROOT / "course_kernels" / "grading" / "hidden_tests" / f"{name}.json"
        ).read_text()
        assert on_disk == hidden_json(spec), f"{name}: run python scripts/build_notebooks.py"
        assert json.loads(on_disk)["tests"], name


def _spec_solutions():
    from course_kernels.grading.exercises import SPECS

    return [spec for spec in SPECS.values() if hasattr(spec, "SOLUTIONS")]


@pytest.mark.parametrize("spec", _spec_solutions(), ids=lambda s: s.NAME)
def test_spec_solution_earns_every_point_of_its_own_cases(spec):
    """The solution in the spec module (real code, what the notebook's solution cell shows)
    passes its own visible and hidden cases in this process (visible tiling checks by
    tracemalloc, as in the check cell)."""
    from course_kernels.grading.exercises import EXERCISES
    from course_kernels.grading.runner import _call_in_process, judge

    assert [f.__name__ for f in spec.SOLUTIONS] == [e["name"] for e in spec.EXERCISES]
    for fn in spec.SOLUTIONS:
        ex = EXERCISES[fn.__name__]
        cases = ex.cases() + ex.cases(spec.HIDDEN.get(fn.__name__, []), hidden=True)
        assert cases, fn.__name__
        for case in cases:
            if case.hidden and case.probe == "memory":
                # tracemalloc here counts the outputs too (dk, dv of Nk = 32768 rows are 8 MiB);
                # the grader subtracts a stub's run (test_grading_notebooks: solutions, full marks)
                continue
            v = judge(case, _call_in_process(fn, case))
            assert v.passed, (case.name, v.message)


@pytest.mark.parametrize("name", ["07_triton_forward", "08_triton_causal_gqa"])
def test_triton_spec_solution_passes_its_visible_cases(name):
    """The Triton specs define their solution when asked (torch and Triton are imported then,
    never by grading); it runs (Triton's interpreter without a GPU) and passes."""
    import course_kernels.triton._env  # noqa: F401  (TRITON_INTERPRET before any @triton.jit)
    from course_kernels.grading.exercises import EXERCISES, SPECS
    from course_kernels.grading.runner import _call_in_process, judge

    spec = SPECS[name]
    for ex_name, fn in spec.define_solution().items():
        for case in EXERCISES[ex_name].cases():
            v = judge(case, _call_in_process(fn, case))
            assert v.passed, (case.name, v.message)
        assert spec.solution_source(ex_name).startswith("@triton.jit\ndef _attn_fwd")
