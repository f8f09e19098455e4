"""Grading, in one place: the exercises' specs, tests and feedback, the sandbox, and the
instructor's command line.

In a notebook: ``from course_kernels.grading import check; check("stable_softmax", stable_softmax)``
runs the visible tests on your function and says what is wrong, in the algorithm's terms.

The student's side (what a check cell runs):

- :mod:`.specs`      one module per exercise: prose, solution, visible and hidden tests, points
- :mod:`.exercises`  the tables built from the specs (which notebook holds which function)
- :mod:`.builders`   the test builders and the mistakes they name; :mod:`.variants` their inputs
- :mod:`.runner`     ``check``: run the tests on a function and judge the results
- :mod:`.feedback`   the messages; :mod:`.lint` the source checks (forbidden calls)
- :mod:`.notebooks`  the exercise notebooks, built from the specs

The instructor's side: :mod:`.sandbox` (bubblewrap, cgroups) and :mod:`.instructor` (grade,
release, gradebook, Gradescope), with the hidden tests as package data (``hidden_tests/``):
``course-grade grade PATH... --out DIR``. Design, and what the sandbox does and does not protect
against: notes/grading.md.
"""

from .exercises import EXERCISES, NOTEBOOKS
from .runner import check

__all__ = ["EXERCISES", "NOTEBOOKS", "check"]
