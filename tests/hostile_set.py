"""The project's hostile set, shared by the tests that grade it (as root in-process,
tests/test_grading_adversarial.py; as a non-root user through ``course-grade grade``,
tests/test_grading_nonroot.py).

``tests/adversarial/a*.py`` are attacks, ``tests/honest/h*.py`` honest controls. Each is one
exercise's solution cell; its header names the notebook and the exercise (``# notebook: ...``,
``# exercise: ...``). :func:`injected` puts it into the solved notebook, filling the
placeholders: ``{repo}`` (where the attack looks for the repository), ``{subdir}`` (the folder the
submission lies in), ``# {pad}`` (3 MB of comment); a09's sleep becomes an ``exec`` of
``/bin/sleep 1000.4242`` so that leftovers can be found by their command line.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from course_kernels.grading.runner import replace_solution

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = sorted((Path(__file__).parent / "adversarial").glob("a*.py"))
HONEST = sorted((Path(__file__).parent / "honest").glob("h*.py"))
# attacks that only the OS layers (the bubblewrap sandbox) stop
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
# files of the grader that a12 rewrites, relative to the repository or the installed package's
# site-packages; their digests must not change
PROTECTED = (
    "course_kernels/grading/hidden_tests/01_stable_softmax.json",
    "course_kernels/grading/feedback.py",
    "course_kernels/testing.py",
)
SLEEPER = b"1000.4242"  # a09's leftovers: /bin/sleep 1000.4242


def header(path) -> dict:
    """The ``# key: value`` lines of a fixture (notebook, exercise, attack or honest)."""
    meta = {}
    for line in Path(path).read_text().splitlines():
        if line.startswith("# ") and ":" in line:
            key, _, value = line[2:].partition(":")
            meta[key.strip()] = value.strip()
    return meta


def solved(notebook: str) -> dict:
    return json.loads((ROOT / "solutions" / f"{notebook}.ipynb").read_text())


def injected(fixture, subdir, repo=ROOT) -> dict:
    """The solved notebook of ``fixture``'s header with the fixture in place of its exercise's
    solution cell, the placeholders filled (``subdir``: the folder the notebook will lie in)."""
    meta = header(fixture)
    code = Path(fixture).read_text().replace("{repo}", str(repo)).replace("{subdir}", str(subdir))
    code = code.replace("# {pad}", "#" * 3_000_000)
    if Path(fixture).stem == "a09_fork_escape":
        code = code.replace(
            "time.sleep(1000)", 'getattr(os, "ex" + "ecv")("/bin/sleep", ["sleep", "1000.4242"])'
        )
    return replace_solution(solved(meta["notebook"]), meta["exercise"], code)


def digest(paths) -> dict:
    return {p: hashlib.sha256(Path(p).read_bytes()).hexdigest() for p in paths}


def sleepers() -> list[int]:
    """Processes left by a09 (its ``/bin/sleep 1000.4242``), anyone's."""
    found = []
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if SLEEPER in f.read():
                    found.append(int(pid))
        except (OSError, ValueError):
            pass
    return found
