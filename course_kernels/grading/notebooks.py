"""The exercise notebooks, built from the spec modules: their content, the shared setup cells,
and :func:`build`, which turns one spec into a notebook (stub or solved).

Each exercise is one module in ``course_kernels/grading/specs/`` (prose, solution as real code,
visible and hidden tests, points, feedback); this module adds the setup cells and the "how this
notebook works" paragraph. The release (``course-grade release``) builds the students' notebooks
here, from the installed package; ``python scripts/build_notebooks.py`` writes the committed
``exercises/NN_*.ipynb`` (stubs), ``solutions/NN_*.ipynb`` (solved and executed) and the hidden
tests' JSON (``course_kernels/grading/hidden_tests/``). Edit the spec modules, never the notebooks.
"""

import re

from course_kernels.colab import SETUP_CELL

# The one setup-cell template of chapters and exercises (install on Colab, report the device);
# the book build writes the repository URL into the Colab copies. Braces doubled: str.format below.
COLAB = SETUP_CELL.replace("{", "{{").replace("}", "}}")

NUMPY_SETUP = (
    COLAB
    + """
import math
from typing import Optional, Tuple

import numpy as np

from course_kernels.grading import check"""
)

TRITON_SETUP = (
    COLAB
    + """
import math
import os
from typing import Optional, Tuple

import numpy as np
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before any @triton.jit: run on the CPU
import triton
import triton.language as tl

from course_kernels.grading import check

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
print("Triton kernels run on", "the GPU" if DEVICE == "cuda" else "the CPU interpreter")"""
)

HOW = (
    "**How this notebook works.** Fill in each function in the cell marked `# YOUR CODE` (only "
    "those cells are graded: keep helpers there too), then run the check cell below it. The check "
    "runs the visible tests on your function and names the mistake when it recognises one. The "
    "instructor's grader runs the same checks plus hidden tests, in a sandbox, on your code "
    "cells only. Do not import `course_kernels` in your cells: the grader blocks it."
)

NOTEBOOKS = {}


def stub_from_solution(solution: str) -> str:
    """An exercise's stub: its solution's signature and docstring, then NotImplementedError.

    Exercises whose stub differs (a kernel skeleton to complete) give ``stub=`` explicitly.
    """
    end = re.search(r'\n    """.*?"""\n', solution, re.S).end()
    return solution[:end] + "    # YOUR CODE\n    raise NotImplementedError"


# --------------------------------------------------------------------------------------------
# Every exercise is one spec module (course_kernels/grading/specs/): prose, points, the solution as
# real code, visible and hidden tests, feedback. Only the notebook's setup cell is added here.
def _from_spec(spec, exercises):
    def points(name):  # the visible tests' points, as the grader counts them
        total = sum(c.points for c in exercises[name].cases())
        return int(total) if total == int(total) else total

    return dict(
        setup=TRITON_SETUP
        if getattr(spec, "SETUP", "triton" if spec.TRITON else "")
        else NUMPY_SETUP,
        intro=spec.INTRO,
        exercises=[
            dict(e, points=points(e["name"]), solution=spec.solution_source(e["name"]).rstrip("\n"))
            for e in spec.EXERCISES
        ],
        practice=getattr(spec, "PRACTICE", None),
    )


def _add_specs():
    from course_kernels.grading.exercises import EXERCISES, SPECS

    for name, spec in SPECS.items():
        NOTEBOOKS[name] = _from_spec(spec, EXERCISES)


def hidden_json(spec) -> str:
    """The hidden tests of a spec module as JSON (``hidden_tests/<notebook>.json``)."""
    import json

    tests = [dict(p, exercise=ex) for ex, ps in spec.HIDDEN.items() for p in ps]
    return (
        json.dumps(
            {
                "about": f"Hidden tests of exercises/{spec.NAME}.ipynb, generated from "
                f"course_kernels/grading/specs/ by scripts/build_notebooks.py: edit the "
                "spec, not this file.",
                "tests": tests,
            },
            indent=1,
        )
        + "\n"
    )


def _cell(kind, source, role=None, exercise=None):
    import nbformat

    cell = (
        nbformat.v4.new_code_cell(source)
        if kind == "code"
        else nbformat.v4.new_markdown_cell(source)
    )
    meta = {}
    if role:
        meta["role"] = role
    if exercise:
        meta["exercise"] = exercise
    if meta:
        cell.metadata["course_kernels"] = meta
    if role in ("setup", "check"):
        cell.metadata["editable"] = False
        cell.metadata["deletable"] = False
    return cell


def build(name: str, solved: bool, repo_url: str):
    """The notebook of exercise ``name`` (e.g. ``"01_stable_softmax"``) as an ``nbformat``
    notebook: stubs (``solved=False``) or the model solutions. ``repo_url`` is the course's
    repository address, written into the setup cell's install line."""
    import nbformat

    from course_kernels.grading.exercises import EXERCISES, hidden_params
    from course_kernels.grading.exercises import NOTEBOOKS as SPECS

    spec = NOTEBOOKS[name]
    nb_spec = SPECS[name]
    hidden = {
        ex: sum(c.points for c in EXERCISES[ex].cases(ps, hidden=True))
        for ex, ps in hidden_params(name).items()
    }
    total = sum(ex["points"] + hidden.get(ex["name"], 0) for ex in spec["exercises"])
    nb = nbformat.v4.new_notebook()
    nb.metadata["course_kernels"] = {"notebook": name}
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nb.metadata["language_info"] = {"name": "python"}
    title = f"# Exercise {name[:2]}: {nb_spec.title}" + (" (solution)" if solved else "")
    cells = [
        _cell(
            "md",
            f"{title}\n\n{spec['intro']}\n\n{HOW}\n\n**Points: {total:g}** (visible and hidden tests). "
            + (nb_spec.note or ""),
        ),
        _cell("code", spec["setup"].format(repo=repo_url), role="setup"),
    ]
    for ex in spec["exercises"]:
        h = hidden.get(ex["name"], 0)
        pts = (
            f"{ex['points'] + h:g} points: {ex['points']:g} in the visible tests below, {h:g} "
            "in hidden tests"
            if h
            else f"{ex['points']:g} points"
        )
        cells.append(_cell("md", f"## `{ex['name']}` ({pts})\n\n{ex['text']}"))
        stub = ex.get("stub") or stub_from_solution(ex["solution"])
        cells.append(
            _cell("code", ex["solution"] if solved else stub, role="solution", exercise=ex["name"])
        )
        cells.append(
            _cell("code", f'check("{ex["name"]}", {ex["name"]})', role="check", exercise=ex["name"])
        )
    if spec.get("practice"):
        cells.append(_cell("md", "## Try it (not graded)"))
        cells.append(_cell("code", spec["practice"], role="practice"))
    for i, cell in enumerate(cells):  # ids from the exercise and the cell's place: no churn
        cell.id = f"ex{name[:2]}-cell{i:02d}"
    nb.cells = cells
    nbformat.validator.normalize(nb)
    return nb


_add_specs()
