"""The instructor's side of grading: grade a class in the sandbox, release notebooks, export a
gradebook, build a Gradescope bundle.

    course-grade release --out DIR [--zip]
    course-grade grade PATH... --out DIR [--roster CSV] [--workers N] [--hidden DIR]
    course-grade gradescope --exercise NN --out autograder.zip

(``python -m course_kernels.grading ...`` is the same command.)

- :mod:`.cli`        the command line
- :mod:`.grade`      one notebook: identify it, run its cells and the tests in the sandbox, score it
- :mod:`.gradebook`  the class's results as CSV and per-student feedback files
- :mod:`.release`    the students' notebooks and the Gradescope bundle (``gradescope/``)
"""

from .grade import NotebookResult, grade_notebook

__all__ = ["NotebookResult", "grade_notebook"]
