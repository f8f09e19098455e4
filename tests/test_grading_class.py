"""A class of 200 mixed submissions graded by the command line on 2 workers: no false pass, no
false fail, and nothing left behind (temp dirs, processes, cgroups).

The class (tests/generate_class.py): every notebook, solved (full marks), untouched (zero), a
classic mistake or an infinite loop (less than full marks). Loops are capped at 5 s per test
(--call-seconds) so that they cost CI little; that is the only thing changed from a real run.
"""

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from course_kernels.grading.sandbox.sandbox import isolation, leftovers

ROOT = Path(__file__).resolve().parents[1]
# one worker with the other machine-loading tests (./dev runs pytest with --dist loadgroup)
pytestmark = pytest.mark.xdist_group("heavy_grading")


@pytest.mark.skipif(not isolation()["sandbox"], reason="needs the bubblewrap sandbox")
def test_a_class_of_200_is_graded_right_and_leaves_nothing(tmp_path):
    cls = tmp_path / "class"
    subprocess.run(
        [sys.executable, str(ROOT / "tests/generate_class.py"), str(cls), "--n", "200"],
        check=True,
        timeout=300,
    )
    answers = json.loads((tmp_path / "class-answers.json").read_text())
    assert len(answers) == 200 and set(answers.values()) == {"solved", "untouched", "wrong", "loop"}
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
    wrong = []
    for sid, kind in answers.items():
        score, top = float(rows[sid]["score"]), float(rows[sid]["max_score"])
        ok = {
            "solved": score == top > 0,
            "untouched": score == 0,
            "wrong": score < top,
            "loop": score < top,
        }[kind]
        if not ok:
            wrong.append((sid, kind, score, top))
    assert not wrong, wrong
    assert list(tmpdir.iterdir()) == [], "temporary folders of the grader were left behind"
    left = leftovers(tag)
    assert left == {"processes": [], "cgroups": []}, left
