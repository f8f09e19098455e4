"""The instructor's command: a folder of notebooks -> CSV gradebook, Gradescope results.json."""

import csv
import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def grader(*args, timeout=300):
    """``python -m course_kernels.grading ARGS``, as an instructor runs it; the finished process."""
    return subprocess.run(
        [sys.executable, "-m", "course_kernels.grading", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_grade_folder_writes_gradebook_and_gradescope_json(tmp_path):
    subs = tmp_path / "class"
    (subs / "alice").mkdir(parents=True)
    (subs / "bob").mkdir()
    shutil.copy(ROOT / "solutions/01_stable_softmax.ipynb", subs / "alice")
    shutil.copy(ROOT / "exercises/01_stable_softmax.ipynb", subs / "bob")
    (subs / "bob" / "04_block_sizes.ipynb").write_text("{ this is not a notebook")
    out = tmp_path / "out"
    r = grader("grade", str(subs), "--out", str(out), "--workers", "2", "--no-progress")
    assert r.returncode == 0, r.stderr
    with open(out / "gradebook.csv") as f:
        rows = {row["submission"]: row for row in csv.DictReader(f)}
    assert set(rows) == {"alice/01_stable_softmax", "bob/01_stable_softmax", "bob/04_block_sizes"}
    assert (
        float(rows["alice/01_stable_softmax"]["score"])
        == float(rows["alice/01_stable_softmax"]["max_score"])
        > 0
    )
    assert float(rows["bob/01_stable_softmax"]["score"]) == 0
    res = json.loads((out / "results/alice/01_stable_softmax.json").read_text())
    assert set(res) >= {"score", "tests"}
    for t in res["tests"]:
        assert set(t) >= {"name", "score", "max_score", "output"}
    assert res["score"] == sum(t["score"] for t in res["tests"])
    broken = json.loads((out / "results/bob/04_block_sizes.json").read_text())
    assert broken["score"] == 0 and "could not read" in broken["output"]
    assert "not yet implemented" in (out / "feedback/bob/01_stable_softmax.txt").read_text()


def test_single_notebook_writes_results_json(tmp_path):
    r = grader(
        "grade",
        str(ROOT / "solutions/04_block_sizes.ipynb"),
        "--out",
        str(tmp_path),
        "--workers",
        "1",
        "--no-progress",
    )
    assert r.returncode == 0, r.stderr
    res = json.loads((tmp_path / "results.json").read_text())
    assert res["score"] == sum(t["max_score"] for t in res["tests"])


def test_notebook_points_equal_gradebook_points():
    """Each exercise heading states visible + hidden points: what the gradebook's maximum is."""
    import re

    from course_kernels.grading.instructor.cli import notebook_max
    from course_kernels.grading.exercises import NOTEBOOKS, notebook_of
    from course_kernels.grading.runner import build_cases

    for name in NOTEBOOKS:
        nb = json.loads((ROOT / "exercises" / f"{name}.ipynb").read_text())
        text = "".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")
        stated = float(re.search(r"\*\*Points: ([0-9.]+)\*\*", text).group(1))
        assert stated == notebook_max(name), name
        for ex in notebook_of(name).exercises:
            got = re.search(rf"## `{ex}` \(([0-9.]+) points", text)
            want = sum(c.points for c in build_cases(NOTEBOOKS[name]) if c.exercise == ex)
            assert got and float(got.group(1)) == want, (name, ex)


def test_release_has_no_solutions_and_roster_lists_missing(tmp_path):
    import zipfile

    r = grader("release", "--out", str(tmp_path / "student"), "--zip", timeout=120)
    assert r.returncode == 0, r.stderr
    with zipfile.ZipFile(tmp_path / "student.zip") as z:
        names = z.namelist()
        body = "".join(z.read(n).decode() for n in names)
    assert len(names) == len(list((ROOT / "exercises").glob("*.ipynb")))
    assert "hidden_tests" not in body and "raise NotImplementedError" in body
    solved = json.loads((ROOT / "solutions/01_stable_softmax.ipynb").read_text())
    sol = [
        c
        for c in solved["cells"]
        if c.get("metadata", {}).get("course_kernels", {}).get("role") == "solution"
    ]
    assert sol and all("".join(c["source"]).strip() not in body for c in sol)
    # a roster: alice complete, bob an untouched notebook, carol nothing, eve the wrong notebook
    # under the right name (graded as the file name says: zero, and the mismatch is reported)
    cls = tmp_path / "class"
    for who in ("alice", "bob", "eve"):
        (cls / who).mkdir(parents=True)
    shutil.copy(ROOT / "solutions/01_stable_softmax.ipynb", cls / "alice")
    shutil.copy(ROOT / "solutions/04_block_sizes.ipynb", cls / "alice")
    shutil.copy(ROOT / "exercises/01_stable_softmax.ipynb", cls / "bob")
    shutil.copy(ROOT / "solutions/04_block_sizes.ipynb", cls / "eve" / "01_stable_softmax.ipynb")
    roster = tmp_path / "roster.csv"
    roster.write_text("id,name\nalice,A\nbob,B\ncarol,C\neve,E\n")
    out = tmp_path / "out"
    r = grader(
        "grade",
        str(cls),
        "--roster",
        str(roster),
        "--expect",
        "01,04",
        "--out",
        str(out),
        "--workers",
        "2",
        "--no-progress",
    )
    assert r.returncode == 0, r.stderr
    with open(out / "roster.csv") as f:
        rows = {row["id"]: row for row in csv.DictReader(f)}
    assert list(rows) == ["alice", "bob", "carol", "eve"]
    assert float(rows["alice"]["total"]) == float(rows["alice"]["max_total"]) > 0
    assert rows["alice"]["missing"] == ""
    assert float(rows["bob"]["total"]) == 0 and rows["bob"]["missing"] == "04_block_sizes"
    assert rows["carol"]["missing"] == "01_stable_softmax 04_block_sizes"
    assert float(rows["eve"]["total"]) == 0
    assert "says it is '04_block_sizes'" in (out / "feedback/eve/01_stable_softmax.txt").read_text()
