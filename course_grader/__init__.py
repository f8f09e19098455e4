"""The instructor's grader for the course's exercise notebooks.

    python -m course_grader release --out DIR [--zip]
    python -m course_grader grade PATH... --out DIR [--roster CSV] [--workers N] [--unsafe]
    python -m course_grader gradescope --exercise NN --out autograder.zip

Student code runs under bubblewrap (:mod:`.sandbox`); the tests, references and judges are
``course_kernels.grading``'s (the same ones the notebooks' check cells run). See the README's
"For instructors" and notes/grading.md.
"""

from .grade import NotebookResult, grade_notebook
from .sandbox import Limits, SandboxUnavailable, isolation

__all__ = ["Limits", "NotebookResult", "SandboxUnavailable", "grade_notebook", "isolation"]
