"""Adversarial submissions (tests/adversarial/*.py): none may pass, the grader never crashes or
hangs, the rest of the notebook keeps the score it earned, its feedback can be written, and
nothing of it (file, FIFO, folder, process, cgroup) outlives the grading. Honest controls
(tests/honest/*.py) must get full marks.

Each fixture replaces one exercise's solution cell in the solved notebook, graded next to a
classmate's solved notebook. Attacks that only the OS layers can stop (reading or writing the
repository or a classmate's folder, signalling the grader, a real fork bomb) run only where the
bubblewrap sandbox works; elsewhere they are skipped with the reason, which is exactly the
documented limit (README, notes/grading.md).
"""

import hashlib
import json
import os
import time
from pathlib import Path

import pytest

from course_kernels.grading.instructor.cli import _write, feedback_text, gradescope
from course_kernels.grading.instructor.grade import grade_notebook
from course_kernels.grading.runner import replace_solution
from course_kernels.grading.sandbox.sandbox import Limits, isolation, leftovers

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = sorted((Path(__file__).parent / "adversarial").glob("a*.py"))
HONEST = sorted((Path(__file__).parent / "honest").glob("h*.py"))
NEEDS_NAMESPACES = {
    "a10_fork_bomb",
    "a12_write_files",
    "a18_read_solutions",
    "a20_library_by_path",
    "a23_kill_grader",
    "a30_read_classmate",
    "a31_grandchild_dense",
    "a38_fifo_deep_dirs_dev",
}
TAG = f"adv{os.getpid()}"
LIMITS = Limits(call_seconds=5, total_seconds=90, memory_bytes=2 << 30, nproc=256)


def _header(path):
    meta = {}
    for line in path.read_text().splitlines():
        if line.startswith("# ") and ":" in line:
            key, _, value = line[2:].partition(":")
            meta[key.strip()] = value.strip()
    return meta


def _digest(paths):
    return {p: hashlib.sha256(Path(p).read_bytes()).hexdigest() for p in paths}


def _sleepers():
    found = []
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"1000.4242" in f.read():
                    found.append(int(pid))
        except (OSError, ValueError):
            pass
    return found


def _submission(fixture, tmp_path, meta):
    me = tmp_path / "me"
    me.mkdir()
    code = fixture.read_text().replace("{repo}", str(ROOT)).replace("{subdir}", str(me))
    code = code.replace("# {pad}", "#" * 3_000_000)
    if fixture.stem == "a09_fork_escape":
        code = code.replace(
            "time.sleep(1000)", 'getattr(os, "ex" + "ecv")("/bin/sleep", ["sleep", "1000.4242"])'
        )
    solved = json.loads((ROOT / "solutions" / f"{meta['notebook']}.ipynb").read_text())
    (tmp_path / "classmate").mkdir()
    (tmp_path / "classmate" / f"{meta['notebook']}.ipynb").write_text(json.dumps(solved))
    sub = me / f"{meta['notebook']}.ipynb"
    sub.write_text(json.dumps(replace_solution(solved, meta["exercise"], code)))
    return sub


@pytest.fixture(autouse=True)
def _tagged(monkeypatch):
    monkeypatch.setenv("COURSE_GRADING_TAG", TAG)


@pytest.mark.parametrize("fixture", HONEST, ids=[f.stem for f in HONEST])
def test_honest_submission_gets_full_marks(fixture, tmp_path):
    meta = _header(fixture)
    res = grade_notebook(_submission(fixture, tmp_path, meta), limits=LIMITS)
    assert res.verdicts and res.score == res.max_score, [
        (v.name, v.message) for v in res.verdicts if not v.passed
    ]


@pytest.mark.parametrize("fixture", FIXTURES, ids=[f.stem for f in FIXTURES])
def test_adversarial_submission_does_not_pass(fixture, tmp_path):
    meta = _header(fixture)
    if fixture.stem in NEEDS_NAMESPACES and not isolation()["sandbox"]:
        pytest.skip("only the bubblewrap sandbox stops this attack; see notes/grading.md")
    if fixture.stem == "a10_fork_bomb" and not isolation()["cgroup"]:
        pytest.skip("a real fork bomb is run only under a pids cgroup")
    sub = _submission(fixture, tmp_path, meta)
    shm_before = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    protected = [
        str(ROOT / "course_kernels/grading/hidden_tests/01_stable_softmax.json"),
        str(ROOT / "course_kernels/grading/feedback.py"),
        str(ROOT / "course_kernels/testing.py"),
    ]
    before = _digest(protected)
    t0 = time.monotonic()
    res = grade_notebook(sub, limits=LIMITS)
    took = time.monotonic() - t0
    target = [v for v in res.verdicts if v.exercise == meta["exercise"]]
    earned = sum(v.points for v in target)
    assert target and earned < sum(v.max_points for v in target), (
        f"{fixture.stem} passed: " + "; ".join(v.message for v in target)
    )
    assert all(v.message for v in target)
    # the rest of the notebook keeps what it earned (the fixture only breaks one exercise)
    others = [v for v in res.verdicts if v.exercise != meta["exercise"]]
    assert all(v.passed for v in others), [(v.name, v.message) for v in others if not v.passed]
    assert took < 80, f"grading took {took:.0f} s"
    assert _digest(protected) == before, "a submission changed the grader's files"
    if fixture.stem in ("a09_fork_escape", "a27_triton_fork_escape"):
        time.sleep(0.2)
        assert _sleepers() == [], "processes of a submission outlived its grading"
    # the feedback can be written whatever the submission sent (lone surrogates, huge text)
    out = tmp_path / "out"
    _write(out / "r.json", json.dumps(gradescope(res)))
    _write(out / "f.txt", feedback_text("me", res))
    assert (out / "f.txt").stat().st_size > 0 and (out / "r.json").stat().st_size > 0
    # nothing of the submission is left: files in /dev/shm, the classmate's folder untouched
    if os.path.isdir("/dev/shm"):
        assert not {n for n in set(os.listdir("/dev/shm")) - shm_before if "attack" in n}
    assert not os.path.exists("/dev/course-attack-file")
    assert sorted(p.name for p in (tmp_path / "classmate").iterdir()) == [
        f"{meta['notebook']}.ipynb"
    ]
    assert sorted(p.name for p in (tmp_path / "me").iterdir()) == [sub.name]
    left = leftovers(TAG)
    mine = [p for p in left["processes"] if _started_by_me(p)]
    assert not mine and not left["cgroups"], left


def _started_by_me(pid):
    """Processes of this test worker's gradings (another worker runs its own at the same time)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f"COURSE_GRADING_RUN={TAG}".encode() in f.read().split(b"\0")
    except OSError:
        return False
