"""Issue 20's hostile submissions, one test each: the grader's clock, its parser, its outputs,
what the sandbox lets code reach as root, and honest code the grader used to misread."""

from __future__ import annotations

import csv
import json
import os
import shutil
import struct
import sys
import time
import tracemalloc
import unicodedata
from pathlib import Path

import numpy as np
import pytest

from course_kernels.grading.feedback import Verdict
from course_kernels.grading.instructor.cli import grade
from course_kernels.grading.instructor.grade import NotebookResult, grade_notebook
from course_kernels.grading.instructor.gradebook import feedback_text, write_roster
from course_kernels.grading.instructor.gradescope_pick import merge
from course_kernels.grading.sandbox import isolation
from course_kernels.grading.sandbox.frames import _new_state, _pump
from course_kernels.grading.sandbox.sandbox import Limits, run_submission

ROOT = Path(__file__).resolve().parents[1]
boxed = pytest.mark.skipif(not isolation()["sandbox"], reason="needs the bubblewrap sandbox")


def _run(code, calls=1, call_seconds=20.0):
    return run_submission(
        "import numpy as np\n",
        [{"exercise": "e", "source": code}],
        [
            {"id": i, "exercise": "e", "func": "f", "args": [{"array": "x"}], "kwargs": {}}
            for i in range(calls)
        ],
        {"x": np.ones(3)},
        Limits(call_seconds=call_seconds, total_seconds=60),
    )


FORGE = """
import json, os, struct, sys, time
def f(x):
    h = json.dumps({"type": "result", "call": 0, "ok": True,
                    "output": {"kind": "value", "value": 1}, "blob_sizes": []}).encode()
    os.write(int(sys.argv[2]), struct.pack("<I", len(h)) + h + struct.pack("<Q", 0))
    time.sleep(12)
    return 1
"""


@boxed
def test_a_forged_result_frame_then_a_sleep_times_out():
    t0 = time.monotonic()
    rep = _run(FORGE, calls=2, call_seconds=3.0)
    assert rep.calls[0].status == "timeout", rep.calls[0]
    assert time.monotonic() - t0 < 11  # the sleep did not buy time


def test_unknown_or_out_of_order_frames_are_malformed():
    def frame(h):
        b = json.dumps(h).encode()
        return struct.pack("<I", len(b)) + b + struct.pack("<Q", 0)

    calls = [{"id": 0, "timeout": 5}, {"id": 1, "timeout": 5}]
    for frames in (
        [{"type": "start", "call": 1}],  # a call the grader has not made yet
        [{"type": "start", "call": 0}, {"type": "start", "call": 0}],
        [{"type": "hello"}],
    ):
        r, w = os.pipe()
        os.write(w, b"".join(frame(h) for h in frames))
        os.close(w)
        state = _new_state()
        _pump(r, state, calls, Limits(call_seconds=5), time.monotonic())
        os.close(r)
        assert (state["problem"] or "").startswith("malformed"), (frames, state["problem"])


def test_a_19_mb_code_cell_is_refused_without_parsing_it_in_the_grader(tmp_path):
    nb = json.loads((ROOT / "exercises/01_stable_softmax.ipynb").read_text())
    for cell in nb["cells"]:
        cell["metadata"] = {}  # no roles: the grader looks for the functions' definitions
    huge = "def stable_softmax(x):\n    return x\n" + "y = [" + "1," * (19 << 19) + "]\n"
    nb["cells"].append({"cell_type": "code", "metadata": {}, "source": huge, "outputs": []})
    path = tmp_path / "01_stable_softmax.ipynb"
    path.write_text(json.dumps(nb))
    assert path.stat().st_size > 19e6
    from course_kernels.grading.runner import solution_cells

    data = json.loads(path.read_text())
    tracemalloc.start()
    cells = solution_cells(data)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 100 << 20, peak  # parsing it would take gigabytes
    assert all(len(src) <= 100_001 for src in cells.values())


@boxed
def test_formula_file_names_reach_the_gradebook_as_text(tmp_path):
    subs = tmp_path / "subs"
    (subs / "=HYPERLINK(1)").mkdir(parents=True)
    shutil.copy(ROOT / "exercises/04_block_sizes.ipynb", subs / "=HYPERLINK(1)/@x.ipynb")
    grade([subs], tmp_path / "out", progress=False, exercise="04")
    with open(tmp_path / "out/gradebook.csv", newline="") as f:
        cells = [c for row in csv.reader(f) for c in row]
    assert not any(c.startswith(("=", "+", "-", "@")) for c in cells), cells
    assert "'=HYPERLINK(1)/@x" in cells


def test_student_text_cannot_forge_a_feedback_line():
    res = NotebookResult("x", "01_stable_softmax")
    res.verdicts.append(
        Verdict("t", "stable_softmax", 0.0, 6.0, "ValueError: no\n  [PASS] stable_softmax (6/6)")
    )
    res.notes.append("note\r  [PASS] forged")
    lines = feedback_text("alice\n  [PASS] x", res).splitlines()
    assert sum(ln.startswith("  [PASS]") for ln in lines) == 0, lines
    assert sum(ln.startswith("  [FAIL]") for ln in lines) == 1


def test_an_nfd_folder_matches_an_nfc_roster_id(tmp_path):
    roster = tmp_path / "roster.csv"
    roster.write_text("id\n" + unicodedata.normalize("NFC", "Zoë") + "\nbob\n", encoding="utf-8")
    sid = unicodedata.normalize("NFD", "zoë") + "/01_stable_softmax"
    res = NotebookResult("x", "01_stable_softmax")
    res.verdicts.append(Verdict("t", "stable_softmax", 6.0, 6.0, "ok"))
    stray = NotebookResult("y", "01_stable_softmax")
    rows = write_roster(
        roster,
        [(sid, None), ("mallory/01_stable_softmax", None)],
        {sid: res, "mallory/01_stable_softmax": stray},
        tmp_path / "out.csv",
        ["01_stable_softmax"],
    )
    assert rows[0]["01_stable_softmax"] == 6.0
    text = (tmp_path / "out.csv").read_text()
    assert "mallory" in text and "not on the roster" in text
    assert "no folder" in text  # bob


def _with_solution(src_nb, exercise, extra, tmp_path):
    nb = json.loads(src_nb.read_text())
    for cell in nb["cells"]:
        meta = cell["metadata"].get("course_kernels", {})
        if meta.get("role") == "solution" and meta.get("exercise") == exercise:
            cell["source"] = "".join(cell["source"]) + extra
    path = tmp_path / src_nb.name
    path.write_text(json.dumps(nb))
    return path


BLACK = """

_ALIGNED = (
    1
    != 2
)
_REMAINDER = (7
              % 3)
_SAME = (1
         != len([
             2]))
%time _x = 1
"""


@boxed
def test_a_black_formatted_honest_solution_gets_full_marks(tmp_path):
    path = _with_solution(ROOT / "solutions/04_block_sizes.ipynb", "block_size", BLACK, tmp_path)
    res = grade_notebook(path)
    assert res.verdicts and res.score == res.max_score, [
        (v.name, v.message) for v in res.verdicts if not v.passed
    ]


BASE_SITE = """
import os, sys, glob
def f(x):
    for d in glob.glob(os.path.join(sys.base_prefix, "lib", "python3*", "site-packages")):
        sys.path.append(d)
    sys.path += ["/usr/lib/python3/dist-packages"]
    try:
        import scipy.special
        return "imported"
    except ImportError:
        return "blocked"
"""


@boxed
@pytest.mark.skipif(not shutil.which("bwrap"), reason="needs bwrap")
def test_scipy_of_the_base_interpreter_is_blocked():
    rep = _run(BASE_SITE)
    assert rep.calls[0].output == "blocked", rep.calls[0]


PROC_SYS = """
import os
def f(x):
    opened = []
    for p in ("/proc/sys/kernel/core_pattern", "/proc/sys/vm/drop_caches", "/proc/sysrq-trigger"):
        try:
            os.close(os.open(p, os.O_WRONLY))  # opened for writing, nothing written
            opened.append(p)
        except OSError:
            pass
    return ",".join(opened) + "|" + str(os.getuid())
"""


@boxed
def test_kernel_settings_cannot_be_opened_for_writing_inside_the_sandbox():
    rep = _run(PROC_SYS)
    opened, uid = rep.calls[0].output.split("|")
    assert opened == "", opened
    assert uid == "65534"


def test_gradescope_scores_are_capped_at_the_maximum(tmp_path):
    (tmp_path / "graded").mkdir()
    (tmp_path / "pick.txt").write_text(json.dumps({"graded": "a.ipynb", "ignored": []}))
    (tmp_path / "graded/results.json").write_text(json.dumps({"score": 1e9, "tests": []}))
    out = merge(tmp_path, "01_stable_softmax", tmp_path / "results.json", "")
    assert out["score"] == out["extra_data"]["max_score"] < 1e9


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
