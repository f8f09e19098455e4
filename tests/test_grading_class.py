"""A class of 200 mixed submissions graded by the command line on 2 workers: no false pass, no
false fail, and nothing left behind (temp dirs, processes, cgroups). Root grades the even
students here (100: every notebook, every kind of submission); a non-root user in a delegated
cgroup grades all 200 (tests/test_grading_nonroot.py). ``COURSE_TEST_FULL_CLASS=1``: root grades
all 200 too (two more minutes; tests/generate_class.py's ``share``).

The class (tests/generate_class.py, the session fixture ``class_of_200``): every notebook,
solved (full marks), untouched (zero), a classic mistake or an infinite loop (less than full
marks). Loops are capped at 5 s per test (--call-seconds) so that they cost CI little; that is
the only thing changed from a real run.
"""

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from generate_class import misgraded, share  # noqa: E402

from course_kernels.grading.sandbox.sandbox import isolation, leftovers  # noqa: E402

# one worker with the other machine-loading tests (./dev runs pytest with --dist loadgroup)
pytestmark = pytest.mark.xdist_group("heavy_grading")


@pytest.mark.skipif(not isolation()["sandbox"], reason="needs the bubblewrap sandbox")
def test_a_class_of_200_is_graded_right_and_leaves_nothing(tmp_path, class_of_200):
    cls = tmp_path / "class"
    answers = share(*class_of_200, cls, half=0)  # the even students (the user's test: all)
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    tag = f"class{os.getpid()}"
    env = dict(os.environ, TMPDIR=str(tmpdir), COURSE_GRADING_TAG=tag)
    out = tmp_path / "out"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "course_kernels.grading",
            "grade",
            str(cls),
            "--out",
            str(out),
            "--workers",
            "2",
            "--call-seconds",
            "5",
            "--no-progress",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    with open(out / "gradebook.csv") as f:
        rows = {row["submission"]: row for row in csv.DictReader(f)}
    assert set(rows) == set(answers)
    wrong = misgraded(rows, answers)
    assert not wrong, wrong
    assert all((out / "feedback" / f"{sid}.txt").stat().st_size > 0 for sid in answers)
    assert list(tmpdir.iterdir()) == [], "temporary folders of the grader were left behind"
    left = leftovers(tag)
    assert left == {"processes": [], "cgroups": []}, left
