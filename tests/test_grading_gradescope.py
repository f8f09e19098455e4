"""The Gradescope autograder bundle's contents. Running it as Gradescope does (its own setup.sh
from a bare Python, then run_autograder on several uploads) is tests/test_grading_installed.py."""

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest


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


# -- which notebook of an upload is graded, and the one results.json (gradescope_pick.py) ----
def _nb(path: Path, text="{}") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_pick_grades_the_file_named_like_the_exercise_else_its_number_else_the_first(tmp_path):
    from course_kernels.grading.instructor.gradescope_pick import pick

    sub, dest = tmp_path / "sub", tmp_path / "dest"
    dest.mkdir()
    for name in ("01_x", "03_a", "notes"):
        _nb(sub / f"{name}.ipynb")
    _nb(sub / "03_tiled_forward.ipynb", '{"mine": 1}')
    assert pick(sub, "03_tiled_forward", dest) == {
        "graded": "03_tiled_forward.ipynb",
        "ignored": ["01_x.ipynb", "03_a.ipynb", "notes.ipynb"],
    }
    assert (dest / "03_tiled_forward.ipynb").read_text() == '{"mine": 1}'
    (sub / "03_tiled_forward.ipynb").unlink()
    assert pick(sub, "03_tiled_forward", dest)["graded"] == "03_a.ipynb"  # its number, 03
    assert pick(sub, "05_count_io", dest)["graded"] == "01_x.ipynb"  # else the first
    assert pick(tmp_path / "empty", "05_count_io", dest) == {"graded": None, "ignored": []}


def test_pick_ignores_checkpoints_hidden_files_and_links(tmp_path):
    from course_kernels.grading.instructor.gradescope_pick import candidates

    sub = tmp_path / "sub"
    _nb(sub / ".ipynb_checkpoints" / "01_stable_softmax-checkpoint.ipynb")
    _nb(sub / ".hidden.ipynb")
    real = _nb(sub / "b" / "real.ipynb")
    secret = _nb(tmp_path / "hidden_tests.ipynb")  # outside the upload
    (sub / "01_stable_softmax.ipynb").symlink_to(secret)
    assert candidates(sub) == [real]


def test_pick_copies_at_most_one_byte_over_the_size_limit(tmp_path, monkeypatch):
    from course_kernels.grading.instructor import gradescope_pick

    monkeypatch.setattr(gradescope_pick, "MAX_BYTES", 10)
    _nb(tmp_path / "sub" / "01_stable_softmax.ipynb", "x" * 100)
    gradescope_pick.pick(tmp_path / "sub", "01_stable_softmax", tmp_path)
    assert (tmp_path / "01_stable_softmax.ipynb").read_text() == "x" * 11  # refused as too big


def _picked(tmp_path, graded, ignored, results=None):
    out = tmp_path / "out"
    (out / "graded").mkdir(parents=True)
    (out / "pick.txt").write_text(json.dumps({"graded": graded, "ignored": ignored}))
    if results is not None:
        (out / "graded" / "results.json").write_text(json.dumps(results))
    return out


def test_merge_says_what_was_graded_what_was_not_and_how(tmp_path):
    from course_kernels.grading.instructor.gradebook import notebook_max
    from course_kernels.grading.instructor.gradescope_pick import merge

    tests = [{"name": "stable_softmax: small rows", "score": 2.0, "max_score": 2.0}]
    ignored = [f"n{i:02d}.ipynb" for i in range(25)]
    results = {"score": 2.0, "tests": tests, "output": "note of the grader"}
    out = _picked(tmp_path, "a.ipynb", ignored, results)
    target = tmp_path / "results.json"
    merged = merge(out, "01_stable_softmax", target, "graded without the bubblewrap sandbox")
    assert merged == {
        "score": 2.0,
        "tests": tests,
        "output": "graded without the bubblewrap sandbox\n"
        "graded: a.ipynb (as 01_stable_softmax)\n"
        "not graded (one notebook per exercise is graded): " + ", ".join(ignored[:20]) + "\n"
        "note of the grader",
        "extra_data": {"sandbox": "none", "max_score": notebook_max("01_stable_softmax")},
    }
    assert json.loads(target.read_text()) == merged
    assert merge(out, "01_stable_softmax", target, "")["extra_data"]["sandbox"] == "bubblewrap"
    (out / "graded" / "results.json").unlink()
    (out / "pick.txt").write_text(json.dumps({"graded": None, "ignored": []}))
    none = merge(out, "01_stable_softmax", target, "")
    assert (
        none["score"] == 0 and none["output"] == "no notebook (.ipynb) was found in the submission"
    )
    (out / "pick.txt").write_text(json.dumps({"graded": "a.ipynb", "ignored": []}))
    lost = merge(out, "01_stable_softmax", target, "")
    assert lost["score"] == 0 and lost["output"].startswith(
        "the grader wrote no result (a grader problem: tell the instructor)"
    )


def test_merge_maximum_counts_the_bundles_hidden_tests(tmp_path):
    from course_kernels.grading.instructor.gradebook import notebook_max
    from course_kernels.grading.instructor.gradescope_pick import main

    secret = tmp_path / "hidden"
    test = {"exercise": "stable_softmax", "name": "s", "shape": [2, 3], "seed": 9, "points": 7}
    _nb(secret / "01_stable_softmax.json", json.dumps({"tests": [test]}))
    out = _picked(tmp_path, "a.ipynb", [], {"score": 1e9, "tests": []})
    target = tmp_path / "results.json"
    args = ["--merge", str(out), "01_stable_softmax", str(target), "", "--hidden", str(secret)]
    assert main(args) == 0
    got = json.loads(target.read_text())
    assert (
        got["score"] == got["extra_data"]["max_score"] == notebook_max("01_stable_softmax", secret)
    )
    assert notebook_max("01_stable_softmax", secret) != notebook_max("01_stable_softmax")


# -- the wheel and the bundle (course_kernels/grading/instructor/release.py) -------------------
def _small_package(tmp_path, monkeypatch, entry="[console_scripts]\ncourse-grade = m:main\n"):
    """release.py working on a tiny stand-in for the course_kernels folder (and its metadata)."""
    from course_kernels.grading.instructor import release

    pkg = tmp_path / "src" / "course_kernels"
    _nb(pkg / "__init__.py", "x = 1\n")
    _nb(pkg / "data" / "t.json", "{}")
    _nb(pkg / "__pycache__" / "m.cpython-311.pyc", "compiled")
    _nb(pkg / "old.pyc", "compiled")
    monkeypatch.setattr(release, "PACKAGE", pkg)
    meta = "Metadata-Version: 2.1\nName: course_kernels\n"
    monkeypatch.setattr(release, "_metadata", lambda: ("1.0-dev+local", meta, entry))
    return release


def test_the_wheel_holds_the_package_files_and_a_valid_record(tmp_path, monkeypatch):
    release = _small_package(tmp_path, monkeypatch)
    whl = release.package_wheel(tmp_path / "dist")
    assert whl == tmp_path / "dist" / "course_kernels-1.0_dev_local-py3-none-any.whl"
    info = "course_kernels-1.0_dev_local.dist-info"
    with zipfile.ZipFile(whl) as z:
        assert sorted(z.namelist()) == sorted(
            ["course_kernels/__init__.py", "course_kernels/data/t.json"]
            + [f"{info}/{n}" for n in ("METADATA", "WHEEL", "entry_points.txt", "RECORD")]
        )
        record = z.read(f"{info}/RECORD").decode().splitlines()
        assert z.read(f"{info}/entry_points.txt").decode().startswith("[console_scripts]")
    assert (
        record[0]
        == "course_kernels/__init__.py,sha256=nia_NpkRxFwkPGhBR7I_yeHc_PJX0pmhxjIBam_NM_Q,6"
    )
    assert record[-1] == f"{info}/RECORD,,"
    _small_package(tmp_path / "again", monkeypatch, entry="")
    with zipfile.ZipFile(release.package_wheel(tmp_path / "dist2")) as z:
        assert not any(n.endswith("entry_points.txt") for n in z.namelist())


def test_the_wheels_metadata_names_the_dependencies_and_the_command():
    from course_kernels.grading.instructor.release import _metadata

    version, metadata, entry = _metadata()
    assert f"Version: {version}\n" in metadata
    assert "Requires-Dist: numpy" in metadata
    assert "course-grade = " in entry


def test_the_bundle_has_runnable_scripts_its_exercise_and_the_hidden_tests_given(
    tmp_path, monkeypatch
):
    release = _small_package(tmp_path, monkeypatch)
    secret = _nb(tmp_path / "secret" / "07_triton_forward.json", '{"tests": ["secret"]}')
    target = release.gradescope_bundle("07", str(tmp_path / "ag"), hidden=str(secret.parent))
    assert target == tmp_path / "ag.zip"
    with zipfile.ZipFile(target) as z:
        modes = {i.filename: i.external_attr >> 16 for i in z.infolist()}
        assert z.read("exercise.txt") == b"07_triton_forward\n"
        assert z.read("triton.txt") == b"1\n"
        assert z.read("hidden_tests/07_triton_forward.json") == secret.read_bytes()
    assert modes["setup.sh"] == modes["run_autograder"] == 0o755
    assert modes["exercise.txt"] == 0o644
    with zipfile.ZipFile(release.gradescope_bundle("01", str(tmp_path / "ag01.zip"))) as z:
        assert z.read("triton.txt") == b"0\n"
    with pytest.raises(SystemExit, match="no hidden tests 01_stable_softmax.json in"):
        release.gradescope_bundle("01", str(tmp_path / "x.zip"), hidden=str(secret.parent))
