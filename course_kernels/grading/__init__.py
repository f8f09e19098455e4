"""Exercises' feedback and the instructor's grader.

- In a notebook: ``from course_kernels.grading import check; check("stable_softmax", stable_softmax)``
  runs the visible tests on your function and says what is wrong, in the algorithm's terms.
- For an instructor: ``python -m course_kernels.grading grade PATH... --out DIR --workers N``
  grades notebooks in a sandbox (see :mod:`.sandbox`) with hidden tests, writes a CSV gradebook
  and Gradescope's ``results.json``.

Design, and what the sandbox does and does not protect against: notes/grading.md.
"""

from .exercises import EXERCISES, NOTEBOOKS
from .runner import check, grade_notebook

__all__ = ["EXERCISES", "NOTEBOOKS", "check", "grade_notebook"]
