"""The sandbox's channel back to the grader carries data only, and is parsed defensively."""

import io
import json
import struct

import numpy as np

from course_kernels.grading.sandbox import CallOutcome, Limits, _outcome, _take_frame, run_submission


def frame(header, payload=b""):
    h = json.dumps(header).encode()
    return struct.pack("<I", len(h)) + h + struct.pack("<Q", len(payload)) + payload


def npy(a, allow_pickle=False):
    buf = io.BytesIO()
    np.save(buf, a, allow_pickle=allow_pickle)
    return buf.getvalue()


def test_arrays_come_back_as_plain_ndarrays():
    blob = npy(np.arange(6.0).reshape(2, 3))
    buf = bytearray(frame({"type": "result", "call": 0, "ok": True,
                           "output": {"kind": "array"}, "blob_sizes": [len(blob)]}, blob))
    header, payload = _take_frame(buf)
    out = _outcome(header, payload)
    assert out.status == "ok" and type(out.output) is np.ndarray and out.output.shape == (2, 3)


def test_pickled_objects_are_refused():
    blob = npy(np.array([object()], dtype=object), allow_pickle=True)
    out = _outcome({"type": "result", "ok": True, "output": {"kind": "array"},
                    "blob_sizes": [len(blob)]}, blob)
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
    rep = run_submission("import numpy as np\n", [{"exercise": "e", "source": code}],
                         [{"id": 0, "exercise": "e", "func": "f", "args": [{"array": "x"}],
                           "kwargs": {}}], {"x": np.ones(3)}, Limits(call_seconds=20))
    out = rep.calls[0]
    assert isinstance(out, CallOutcome) and out.status == "ok"
    assert np.array_equal(out.output[0], 2 * np.ones(3)) and out.output[1:] == (3, None)


def test_the_child_cannot_import_the_course_library():
    code = ("def f():\n    try:\n        import course_kernels.reference as r\n"
            "        return r.attention_reference\n    except ImportError as e:\n"
            "        return str(e)\n")
    rep = run_submission("", [{"exercise": "e", "source": code}],
                         [{"id": 0, "exercise": "e", "func": "f", "args": [], "kwargs": {}}], {},
                         Limits(call_seconds=20))
    assert "while grading" in rep.calls[0].output
