"""The Gradescope autograder bundle, run in a temporary tree laid out like /autograder."""

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _bundle(tmp_path, exercise):
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "course_kernels.grading",
            "gradescope",
            "--exercise",
            exercise,
            "--out",
            str(tmp_path / "autograder.zip"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    root = tmp_path / "autograder"
    with zipfile.ZipFile(tmp_path / "autograder.zip") as z:
        names = z.namelist()
        z.extractall(root / "source")
    assert {"setup.sh", "run_autograder", "exercise.txt"} <= set(names)
    for name in ("setup.sh", "run_autograder"):
        (root / "source" / name).chmod(0o755)
        assert subprocess.run(["bash", "-n", str(root / "source" / name)]).returncode == 0
    return root


def _run(root, notebook):
    sub = root / "submission"
    shutil.rmtree(sub, ignore_errors=True)
    sub.mkdir()
    shutil.copy(notebook, sub / "my_work.ipynb")  # students upload under any name
    env = dict(
        os.environ,
        AUTOGRADER_ROOT=str(root),
        PYTHON=sys.executable,
        PYTHONPATH=str(root / "source" / "course"),
    )
    r = subprocess.run(
        ["bash", str(root / "source" / "run_autograder")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    return json.loads((root / "results" / "results.json").read_text())


def test_gradescope_bundle_grades_a_submission(tmp_path):
    root = _bundle(tmp_path, "01")
    assert (root / "source/hidden_tests/01_stable_softmax.json").is_file()
    assert (root / "source/course/course_kernels/grading/runner.py").is_file()
    solved = _run(root, ROOT / "solutions/01_stable_softmax.ipynb")
    assert solved["tests"] and solved["score"] == sum(t["max_score"] for t in solved["tests"])
    assert any(t["visibility"] == "after_published" for t in solved["tests"])  # hidden tests ran
    untouched = _run(root, ROOT / "exercises/01_stable_softmax.ipynb")
    assert untouched["score"] == 0 and untouched["tests"]
    wrong = _run(root, ROOT / "solutions/04_block_sizes.ipynb")  # another exercise's notebook
    assert wrong["score"] == 0 and "04_block_sizes" in wrong["output"]
