"""The exercise notebooks' content, gathered from the spec modules, plus the shared setup cells.

Each exercise is one module in ``course_kernels/grading/specs/`` (prose, solution as real code,
visible and hidden tests, points, feedback); this file adds the setup cells and the "how this
notebook works" paragraph. ``python grading/build_notebooks.py`` writes ``exercises/NN_*.ipynb``
(stubs), ``solutions/NN_*.ipynb`` (solved and executed) and ``grading/hidden_tests/*.json``. Edit
the spec modules, never the notebooks.
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
    """grading/hidden_tests/<notebook>.json of a spec module (written by build_notebooks.py)."""
    import json

    tests = [dict(p, exercise=ex) for ex, ps in spec.HIDDEN.items() for p in ps]
    return (
        json.dumps(
            {
                "about": f"Hidden tests of exercises/{spec.NAME}.ipynb, generated from "
                f"course_kernels/grading/specs/ by grading/build_notebooks.py: edit the "
                "spec, not this file.",
                "tests": tests,
            },
            indent=1,
        )
        + "\n"
    )


_add_specs()
