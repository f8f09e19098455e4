"""The Gradescope autograder bundle's contents. Running it as Gradescope does (its own setup.sh
from a bare Python, then run_autograder on several uploads) is tests/test_grading_installed.py."""

import subprocess
import sys
import zipfile
from pathlib import Path


def test_gradescope_bundle_holds_a_wheel_scripts_and_hidden_tests(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "course_kernels.grading", "gradescope", "--exercise", "01"]
        + ["--out", str(tmp_path / "autograder.zip")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    with zipfile.ZipFile(tmp_path / "autograder.zip") as z:
        names = z.namelist()
        z.extractall(tmp_path / "source")
        wheel = next(n for n in names if n.startswith("wheels/course_kernels-"))
        with z.open(wheel) as w, zipfile.ZipFile(w) as whl:
            inside = whl.namelist()
    assert {
        "setup.sh",
        "run_autograder",
        "exercise.txt",
        "hidden_tests/01_stable_softmax.json",
    } <= set(names)
    assert "course_kernels/grading/hidden_tests/01_stable_softmax.json" in inside
    assert any(n.endswith(".dist-info/METADATA") for n in inside)
    for name in ("setup.sh", "run_autograder"):
        assert subprocess.run(["bash", "-n", str(tmp_path / "source" / name)]).returncode == 0
    assert Path(tmp_path / "source/exercise.txt").read_text().strip() == "01_stable_softmax"
