"""Exercises' tests and feedback (the student's side of grading).

In a notebook: ``from course_kernels.grading import check; check("stable_softmax", stable_softmax)``
runs the visible tests on your function and says what is wrong, in the algorithm's terms.

The instructor's grader (sandbox, hidden tests, gradebook, Gradescope) is the package
``course_grader`` next to this one: ``python -m course_grader grade PATH... --out DIR``. It uses
the tests and judges defined here. Design, and what the sandbox does and does not protect
against: notes/grading.md.
"""

from .exercises import EXERCISES, NOTEBOOKS
from .runner import check

__all__ = ["EXERCISES", "NOTEBOOKS", "check"]
