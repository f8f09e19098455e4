"""The sandbox's channel back to the grader carries data only, and is parsed defensively."""

import io
import json
import struct

import numpy as np

from course_kernels.grading.sandbox.sandbox import Limits, _outcome, _take_frame, run_submission
from course_kernels.grading.feedback import CallOutcome


def frame(header, payload=b""):
    h = json.dumps(header).encode()
    return struct.pack("<I", len(h)) + h + struct.pack("<Q", len(payload)) + payload


def npy(a, allow_pickle=False):
    buf = io.BytesIO()
    np.save(buf, a, allow_pickle=allow_pickle)
    return buf.getvalue()


def test_arrays_come_back_as_plain_ndarrays():
    blob = npy(np.arange(6.0).reshape(2, 3))
    buf = bytearray(
        frame(
            {
                "type": "result",
                "call": 0,
                "ok": True,
                "output": {"kind": "array"},
                "blob_sizes": [len(blob)],
            },
            blob,
        )
    )
    header, payload = _take_frame(buf)
    out = _outcome(header, payload)
    assert out.status == "ok" and type(out.output) is np.ndarray and out.output.shape == (2, 3)


def test_pickled_objects_are_refused():
    blob = npy(np.array([object()], dtype=object), allow_pickle=True)
    out = _outcome(
        {"type": "result", "ok": True, "output": {"kind": "array"}, "blob_sizes": [len(blob)]}, blob
    )
    assert out.status == "invalid"


def test_lying_sizes_and_garbage_are_refused():
    out = _outcome({"ok": True, "output": {"kind": "array"}, "blob_sizes": [10]}, b"x" * 3)
    assert out.status == "invalid"
    buf = bytearray(struct.pack("<I", 10**9) + b"{}")
    try:
        _take_frame(buf)
        raise AssertionError("a huge header was accepted")
    except ValueError:
        pass


def test_a_student_process_returns_data_not_objects():
    code = "def f(x):\n    return (x * 2, 3, None)\n"
    rep = run_submission(
        "import numpy as np\n",
        [{"exercise": "e", "source": code}],
        [{"id": 0, "exercise": "e", "func": "f", "args": [{"array": "x"}], "kwargs": {}}],
        {"x": np.ones(3)},
        Limits(call_seconds=20),
    )
    out = rep.calls[0]
    assert isinstance(out, CallOutcome) and out.status == "ok"
    assert np.array_equal(out.output[0], 2 * np.ones(3)) and out.output[1:] == (3, None)


def test_the_child_cannot_import_the_course_library():
    code = (
        "def f():\n    try:\n        import course_kernels.numpy.reference as r\n"
        "        return r.attention_reference\n    except ImportError as e:\n"
        "        return str(e)\n"
    )
    rep = run_submission(
        "",
        [{"exercise": "e", "source": code}],
        [{"id": 0, "exercise": "e", "func": "f", "args": [], "kwargs": {}}],
        {},
        Limits(call_seconds=20),
    )
    assert "while grading" in rep.calls[0].output


def test_npy_header_must_match_its_bytes():
    from course_kernels.grading.sandbox.sandbox import load_npy

    good = npy(np.arange(6.0).reshape(2, 3))
    assert load_npy(good).shape == (2, 3)
    header = b"{'descr': '<f8', 'fortran_order': False, 'shape': (35184372088832,), }".ljust(117)
    bomb = b"\x93NUMPY\x01\x00" + struct.pack("<H", 118) + header + b"\n" + b"\0" * 64
    for raw in (bomb, good[:-8], good + b"\0" * 8, npy(np.array([1 + 2j]))):
        try:
            load_npy(raw)
            raise AssertionError("a lying or non-real .npy blob was accepted")
        except ValueError:
            pass


def test_deep_json_and_deep_tuples_are_refused_not_fatal():
    from course_kernels.grading.sandbox.sandbox import _decode

    deep = b"[" * 100000 + b"]" * 100000
    buf = bytearray(struct.pack("<I", len(deep)) + deep + struct.pack("<Q", 0))
    try:
        _take_frame(buf)
        raise AssertionError("a 100000-deep header was accepted")
    except ValueError:
        pass
    desc = {"kind": "value", "value": 1}
    for _ in range(5000):
        desc = {"kind": "tuple", "items": [desc]}
    out = _outcome({"ok": True, "output": desc, "blob_sizes": []}, b"")
    assert out.status == "invalid"
    try:
        _decode(desc, iter(()))
        raise AssertionError("a 5000-deep tuple was decoded")
    except ValueError:
        pass


def test_feedback_text_from_a_child_is_escaped():
    out = _outcome({"ok": False, "error": {"type": "ValueError", "message": "bad \ud800"}}, b"")
    assert out.error["message"].encode("utf-8")  # no lone surrogate left


def test_a_fifo_or_a_huge_file_is_not_read_as_a_notebook(tmp_path):
    import os
    import threading

    from course_kernels.grading.instructor.grade import grade_notebook

    fifo = tmp_path / "01_stable_softmax.ipynb"
    os.mkfifo(fifo)
    done = []
    t = threading.Thread(target=lambda: done.append(grade_notebook(fifo)), daemon=True)
    t.start()
    t.join(30)
    assert done and "not a regular file" in done[0].notes[0]
    big = tmp_path / "03_tiled_forward.ipynb"
    with open(big, "wb") as f:
        f.truncate(21 << 20)
    assert "larger than" in grade_notebook(big).notes[0]


def test_deep_folders_are_removed(tmp_path):
    import os

    from course_kernels.grading.sandbox.sandbox import remove_tree

    top = tmp_path / "deep"
    top.mkdir()
    here = os.getcwd()
    try:
        os.chdir(top)
        for _ in range(3000):
            os.mkdir("d")
            os.chdir("d")
    finally:
        os.chdir(here)
    remove_tree(str(top))
    assert not top.exists()


def test_without_bubblewrap_the_grader_refuses_unless_unsafe(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, COURSE_GRADING_NO_SANDBOX="1")
    cmd = [
        sys.executable,
        "-m",
        "course_kernels.grading",
        "grade",
        str(root / "solutions/04_block_sizes.ipynb"),
        "--out",
        str(tmp_path),
        "--workers",
        "1",
        "--no-progress",
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 2 and "--unsafe" in r.stderr and "bubblewrap" in r.stderr
    assert not (tmp_path / "gradebook.csv").exists()
    r = subprocess.run(cmd + ["--unsafe"], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "results.json").exists()


def test_leftover_cgroups_are_found():
    import os

    import pytest

    from course_kernels.grading.sandbox.sandbox import Cgroup, leftovers

    os.environ["COURSE_GRADING_TAG"] = "leftovertest"
    try:
        g = Cgroup.create(Limits())
        if g is None:
            pytest.skip("no writable cgroup here")
        assert leftovers("leftovertest")["cgroups"]
        g.remove()
        assert leftovers("leftovertest")["cgroups"] == []
    finally:
        del os.environ["COURSE_GRADING_TAG"]
