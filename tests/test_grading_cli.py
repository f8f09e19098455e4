"""The instructor's command: a folder of notebooks -> CSV gradebook, Gradescope results.json."""

import csv
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

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


# -- what the grader writes (course_kernels/grading/instructor/gradebook.py), in-process ------
def _result(verdicts, notes=()):
    from course_kernels.grading.instructor.grade import NotebookResult

    return NotebookResult("x.ipynb", "01_stable_softmax", list(verdicts), list(notes))


def test_gradescope_json_rounds_scores_and_publishes_hidden_tests_only_after_grades():
    from course_kernels.grading.feedback import Verdict
    from course_kernels.grading.instructor.gradebook import gradescope

    res = _result(
        [
            Verdict("small rows", "stable_softmax", 0.5, 0.5, "max error 1e-08"),
            Verdict("third", "stable_softmax", 1 / 3, 1.0, "partly"),
            Verdict("long rows", "logsumexp", 0.0, 2.0, "overflow", hidden=True),
        ],
        ["graded late"],
    )
    assert gradescope(res) == {
        "score": 0.8333,
        "tests": [
            {
                "name": "stable_softmax: small rows",
                "score": 0.5,
                "max_score": 0.5,
                "output": "max error 1e-08",
                "visibility": "visible",
            },
            {
                "name": "stable_softmax: third",
                "score": 0.3333,
                "max_score": 1.0,
                "output": "partly",
                "visibility": "visible",
            },
            {
                "name": "logsumexp: long rows (hidden)",
                "score": 0.0,
                "max_score": 2.0,
                "output": "overflow",
                "visibility": "after_published",
            },
        ],
        "output": "graded late",
    }


def test_feedback_text_marks_only_full_marks_as_pass_and_names_hidden_tests():
    from course_kernels.grading.feedback import Verdict
    from course_kernels.grading.instructor.gradebook import feedback_text

    res = _result(
        [
            Verdict("small rows", "stable_softmax", 2.0, 2.0, "ok"),
            Verdict("part", "stable_softmax", 0.5, 1.0, "half"),
            Verdict("long rows", "logsumexp", 0.0, 2.0, "overflow", hidden=True),
        ],
        ["late"],
    )
    assert feedback_text("alice/01_stable_softmax", res) == (
        "alice/01_stable_softmax: 01_stable_softmax  2.5/5\n"
        "  note: late\n"
        "  [PASS] stable_softmax / small rows (2/2): ok\n"
        "  [FAIL] stable_softmax / part (0.5/1): half\n"
        "  [FAIL] logsumexp / long rows (hidden) (0/2): overflow\n"
    )


def test_csv_cells_that_a_spreadsheet_would_run_get_an_apostrophe():
    from course_kernels.grading.instructor.gradebook import csv_row, csv_safe

    for text in ("=1+1", "+1", "-1", "@SUM(A1)", "\tx", "\rx", "\nx", "|x", "%x"):
        assert csv_safe(text) == "'" + text, text
    assert csv_safe("alice") == "alice" and csv_safe("a=b") == "a=b"
    assert csv_safe(-3) == -3 and csv_safe(2.5) == 2.5  # numbers stay numbers
    assert csv_row({"id": "=cmd()", "total": -1.0}) == {"id": "'=cmd()", "total": -1.0}


def test_ids_match_case_folded_and_trimmed():
    from course_kernels.grading.instructor.gradebook import same_id

    assert same_id("  Alice ") == same_id("alice") == "alice"
    assert same_id("STRASSE") == same_id("Straße")  # casefold, not lower()


def test_feedback_paths_stay_inside_the_output_folder():
    from course_kernels.grading.instructor.gradebook import _safe_rel

    assert _safe_rel("../../etc/cron.d/x") == Path("etc/cron.d/x")
    assert _safe_rel("/abs/alice/01") == Path("abs/alice/01")
    assert _safe_rel(".") == _safe_rel("..") == Path("submission")  # a file named "..ipynb"


def test_an_unwritable_feedback_file_is_reported_not_fatal(tmp_path, capsys):
    from course_kernels.grading.instructor.gradebook import _write

    _write(tmp_path / "out" / "alice" / "01.txt", "ok \ud800 done")  # a lone surrogate
    assert (tmp_path / "out/alice/01.txt").read_text() == "ok \\ud800 done"
    (tmp_path / "file").write_text("")
    _write(tmp_path / "file" / "alice.txt", "x")  # its folder is a file: OSError
    assert "could not write" in capsys.readouterr().err


def _roster_of(tmp_path, subs, roster_text, expect=("01_stable_softmax", "04_block_sizes")):
    """write_roster on ``subs`` (sid -> (notebook, points earned, points possible)); returns
    (rows written, the CSV's header, the CSV's rows by id)."""
    from course_kernels.grading.feedback import Verdict
    from course_kernels.grading.instructor.gradebook import write_roster

    results = {}
    for sid, (nb, got, of) in subs.items():
        res = _result([Verdict("t", "e", got, of, "")])
        res.notebook = nb
        results[sid] = res
    roster = tmp_path / "roster.csv"
    roster.write_bytes(roster_text.encode("utf-8-sig"))  # as Excel saves it: with a BOM
    target = tmp_path / "roster_out.csv"
    rows = write_roster(roster, [(s, None) for s in subs], results, target, list(expect))
    with open(target, newline="", encoding="utf-8") as f:
        header = next(csv.reader(f))
    with open(target, newline="", encoding="utf-8") as f:
        by_id = {r["id"]: r for r in csv.DictReader(f)}
    return rows, header, by_id


def test_roster_keeps_each_students_best_attempt_per_expected_notebook(tmp_path):
    rows, header, by_id = _roster_of(
        tmp_path,
        {
            "alice/01_stable_softmax": ("01_stable_softmax", 4.0, 15.0),
            "alice/retry/01_stable_softmax": ("01_stable_softmax", 12.0, 15.0),  # the best
            "alice/01_stable_softmax~2": ("01_stable_softmax", 10.0, 15.0),  # later, worse
            "alice/02_online_softmax": ("02_online_softmax", 9.0, 16.0),  # not expected
            "bob/04_block_sizes": ("04_block_sizes", 16.0, 16.0),
        },
        "name,id\nAlice,alice\n,   \nBob,bob\n",  # a blank id: not a student
    )
    assert header == [
        "name",
        "id",
        "01_stable_softmax",
        "04_block_sizes",
        "total",
        "max_total",
        "missing",
        "note",
    ]
    assert [r["id"] for r in rows] == ["alice", "bob"]
    assert by_id["alice"]["01_stable_softmax"] == "12.0"  # not the last (10) nor the sum (26)
    assert by_id["alice"]["total"] == "12.0"  # 02 is not expected: not counted
    assert by_id["alice"]["missing"] == "04_block_sizes"
    assert by_id["bob"]["total"] == "16.0" and by_id["bob"]["max_total"] == "31.0"


def test_roster_lists_unmatched_folders_with_their_scores_as_text(tmp_path):
    _, _, by_id = _roster_of(
        tmp_path,
        {
            "=evil()/01_stable_softmax": ("01_stable_softmax", 6.0, 15.0),
            "b\udcff/01_stable_softmax": ("01_stable_softmax", 1.0, 15.0),  # a non-UTF-8 name
            "01_stable_softmax": ("01_stable_softmax", 2.0, 15.0),  # outside any folder
        },
        "id,name\nalice,=HYPERLINK()\n",
    )
    assert by_id["alice"]["name"] == "'=HYPERLINK()"
    assert by_id["'=evil()"]["01_stable_softmax"] == "6.0" == by_id["'=evil()"]["total"]
    assert by_id["b\\udcff"]["total"] == "1.0"
    assert by_id["(files outside any student folder)"]["total"] == "2.0"
    assert all("not on the roster" in by_id[k]["note"] for k in by_id if k != "alice")


def test_a_roster_without_an_id_column_is_refused_with_what_is_needed(tmp_path):
    with pytest.raises(SystemExit, match="the roster needs a column named 'id'"):
        _roster_of(tmp_path, {}, "student,name\nalice,A\n")


def test_roster_maximum_counts_the_secret_hidden_tests_given(tmp_path):
    from course_kernels.grading.instructor.gradebook import notebook_max

    secret = tmp_path / "secret"
    secret.mkdir()
    no_hidden = notebook_max("01_stable_softmax", secret)  # the folder has no file for 01
    test = {"exercise": "stable_softmax", "name": "s", "shape": [2, 3], "seed": 9, "points": 7}
    (secret / "01_stable_softmax.json").write_text(json.dumps({"tests": [test]}))
    assert notebook_max("01_stable_softmax", secret) == no_hidden + 7


# -- the student release (course_kernels/grading/instructor/release.py) ------------------------
def _one_notebook(monkeypatch):
    """Release only exercise 01 (the release builds every notebook twice: this keeps it short)."""
    from course_kernels.grading import notebooks

    monkeypatch.setattr(
        notebooks, "NOTEBOOKS", {"01_stable_softmax": notebooks.NOTEBOOKS["01_stable_softmax"]}
    )
    return notebooks


def test_release_writes_stamped_stubs_into_a_folder_or_a_zip(tmp_path, monkeypatch):
    from course_kernels.colab import URL_LINE
    from course_kernels.grading.instructor.release import release

    _one_notebook(monkeypatch)
    url = "https://github.com/someone/their-course"
    target = release(str(tmp_path / "student"), as_zip=True, url=url)
    assert target == tmp_path / "student.zip"
    with zipfile.ZipFile(target) as z:
        assert z.namelist() == ["exercises/01_stable_softmax.ipynb"]
        text = z.read("exercises/01_stable_softmax.ipynb").decode()
    folder = release(str(tmp_path / "plain"), url=url)
    assert (folder / "01_stable_softmax.ipynb").read_text() == text
    setup = [
        "".join(c["source"])
        for c in json.loads(text)["cells"]
        if c["metadata"].get("course_kernels", {}).get("role") == "setup"
    ]
    assert len(setup) == 1 and f'COURSE_REPO_URL = "{url}"' in setup[0]
    assert URL_LINE not in setup[0]


def test_release_refuses_a_solution_in_an_exercise_cell_and_an_empty_install(monkeypatch):
    from course_kernels.grading.instructor.release import release_notebooks

    notebooks = _one_notebook(monkeypatch)
    build = notebooks.build
    monkeypatch.setattr(notebooks, "build", lambda name, solved, url: build(name, True, url))
    with pytest.raises(SystemExit, match="01_stable_softmax: the exercise cell of stable_softmax"):
        release_notebooks()
    monkeypatch.setattr(notebooks, "NOTEBOOKS", {})
    with pytest.raises(SystemExit, match="no exercises in this install of course_kernels"):
        release_notebooks()
