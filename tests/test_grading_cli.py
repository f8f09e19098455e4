"""The instructor's command: a folder of notebooks -> CSV gradebook, Gradescope results.json."""

import csv
import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_grade_folder_writes_gradebook_and_gradescope_json(tmp_path):
    subs = tmp_path / "class"
    (subs / "alice").mkdir(parents=True)
    (subs / "bob").mkdir()
    shutil.copy(ROOT / "solutions/01_stable_softmax.ipynb", subs / "alice")
    shutil.copy(ROOT / "exercises/01_stable_softmax.ipynb", subs / "bob")
    (subs / "bob" / "04_block_sizes.ipynb").write_text("{ this is not a notebook")
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-m", "course_kernels.grading", "grade", str(subs),
                        "--out", str(out), "--workers", "2", "--no-progress"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    rows = {row["submission"]: row for row in csv.DictReader(open(out / "gradebook.csv"))}
    assert set(rows) == {"alice/01_stable_softmax", "bob/01_stable_softmax", "bob/04_block_sizes"}
    assert float(rows["alice/01_stable_softmax"]["score"]) == float(
        rows["alice/01_stable_softmax"]["max_score"]) > 0
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
    r = subprocess.run([sys.executable, "-m", "course_kernels.grading", "grade",
                        str(ROOT / "solutions/04_block_sizes.ipynb"), "--out", str(tmp_path),
                        "--workers", "1", "--no-progress"], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    res = json.loads((tmp_path / "results.json").read_text())
    assert res["score"] == sum(t["max_score"] for t in res["tests"])
