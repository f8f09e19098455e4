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


# -- the tables the grader reads (course_kernels/grading/exercises.py) -------------------------
def test_notebook_tables_carry_each_specs_settings():
    from course_kernels.grading.exercises import EXERCISES, NOTEBOOKS, SPECS, preamble

    assert list(NOTEBOOKS) == list(SPECS)
    for name, spec in SPECS.items():
        nb = NOTEBOOKS[name]
        assert (nb.title, nb.triton, nb.timeout) == (spec.TITLE, spec.TRITON, spec.TIMEOUT)
        assert nb.exercises == tuple(e["name"] for e in spec.EXERCISES)
        assert all(EXERCISES[ex].torch_rules == spec.TRITON for ex in nb.exercises)
    assert NOTEBOOKS["06_tiled_backward"].timeout == 60.0  # the slowest exercise's own limit
    assert "import torch" not in preamble(NOTEBOOKS["01_stable_softmax"])
    assert "import triton.language as tl" in preamble(NOTEBOOKS["07_triton_forward"])


def test_notebook_of_matches_the_number_prefix_and_lists_the_known_ones():
    from course_kernels.grading.exercises import NOTEBOOKS, notebook_of

    assert notebook_of("03") is NOTEBOOKS["03_tiled_forward"]
    assert notebook_of("03_my_copy").name == "03_tiled_forward"
    assert notebook_of("10_ring_attention").name == "10_ring_attention"
    for stem in ("010_x", "3_tiled_forward", "99"):
        with pytest.raises(KeyError, match=rf"no exercise notebook matches '{stem}'; known: \["):
            notebook_of(stem)


def test_hidden_params_group_tests_by_exercise_and_a_missing_file_has_none(tmp_path):
    from course_kernels.grading.exercises import EXERCISES, hidden_params

    a, b, c = ({"exercise": ex, "seed": i} for i, ex in enumerate(["e1", "e2", "e1"]))
    (tmp_path / "01_stable_softmax.json").write_text(json.dumps({"tests": [a, b, c]}))
    assert hidden_params("01_stable_softmax", tmp_path) == {"e1": [a, c], "e2": [b]}
    assert hidden_params("02_online_softmax", tmp_path) == {}
    ex = EXERCISES["stable_softmax"]
    assert ex.cases([], hidden=True) == []  # no hidden test given: none, not the visible ones
    hidden = ex.cases([{"name": "h", "shape": [2, 3], "seed": 9, "points": 2}], hidden=True)
    assert [(c.name, c.points, c.hidden) for c in hidden] == [("h", 2.0, True)]


def test_built_notebook_marks_its_cells_for_the_grader_and_locks_setup_and_checks():
    """What the grader and Jupyter read besides the sources: the notebook's name, each cell's
    role and exercise, and setup/check cells that cannot be edited or deleted."""
    from course_kernels.grading.runner import solution_cells

    nb = build("04_block_sizes", False, build_notebooks.repository_url())
    assert nb.metadata["course_kernels"] == {"notebook": "04_block_sizes"}
    roles = {}
    for cell in nb.cells:
        meta = cell.metadata.get("course_kernels", {})
        roles.setdefault(meta.get("role"), []).append(meta.get("exercise"))
        locked = (cell.metadata.get("editable"), cell.metadata.get("deletable"))
        assert locked == (
            (False, False) if meta.get("role") in ("setup", "check") else (None, None)
        )
    exercises = ["block_size", "tile_sizes", "fits_in_sram"]
    assert roles["solution"] == roles["check"] == exercises
    assert roles["setup"] == [None]
    assert list(solution_cells(json.loads(nbformat.writes(nb)))) == exercises


def test_stub_ends_at_the_functions_own_docstring():
    solution = (
        'def f(x):\n    """Outer."""\n\n    def g():\n        """Inner."""\n        return x\n'
        "    return g()\n"
    )
    assert stub_from_solution(solution) == (
        'def f(x):\n    """Outer."""\n    # YOUR CODE\n    raise NotImplementedError'
    )
