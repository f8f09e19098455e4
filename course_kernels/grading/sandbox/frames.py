"""Bounded reading of the child's results: length-prefixed frames (JSON header + ``.npy`` bytes)
read from a pipe within the time limits, bounded in size and depth, parsed without ever executing
or unpickling anything (protocol: course_kernels/grading/sandbox/_child.py)."""

from __future__ import annotations

import io
import json
import math
import os
import select
import struct
import time

import numpy as np

from course_kernels.grading.feedback import CallOutcome, clean_text

MAX_HEADER = 1 << 20  # bytes per frame header
MAX_RESULT_BYTES = 64 << 20  # everything a child may send back
MAX_DEPTH = 8  # nesting of returned tuples


def _new_state():
    return {
        "cells": {},
        "results": {},
        "in_cell": None,
        "in_call": None,
        "done": False,
        "problem": None,
        "frames": 0,
        "returncode": None,
        "stdout": "",
        "printed_too_much": False,
        "peak_bytes": None,
    }


STARTUP_SECONDS = 30.0  # a fresh child imports numpy (torch, Triton) before its first frame


def _plan(cells, calls) -> list:
    """The frames the grader expects, in order: what the child's protocol sends. Anything else
    (an unknown type, a frame out of order, a call the grader never made) is malformed."""
    plan = []
    for cell in cells:
        plan += [("cell_start", cell["exercise"]), ("cell", cell["exercise"])]
    for call in calls:
        plan += [("start", call["id"]), ("result", call["id"])]
    return plan + [("done", None)]


def _pump(rfd, state, calls, limits, start, cells=()):
    """Read frames until the child says it is done, closes the pipe, or a limit is hit.

    The grader keeps the clock: from each accepted frame, the next expected one must come within
    its step's limit (a call's own timeout, a cell's, the start-up allowance), so a frame the
    child forges cannot give it more time, and an unexpected frame ends the run as malformed."""
    buf = bytearray()
    total = 0
    deadline = start + limits.total_seconds
    timeouts = {c["id"]: c.get("timeout", limits.call_seconds) for c in calls}
    state["plan"] = _plan(cells, calls)
    state["step"] = 0
    state["step_deadline"] = time.monotonic() + max(STARTUP_SECONDS, limits.call_seconds)
    state["timeouts"] = timeouts
    try:
        while not state["done"]:
            now = time.monotonic()
            limit = min(deadline, state["step_deadline"])
            if now >= limit:
                _blame_timeout(state)
                return
            ready, _, _ = select.select([rfd], [], [], min(0.5, limit - now))
            if not ready:
                continue
            chunk = os.read(rfd, 1 << 20)
            if not chunk:
                return  # the child closed its end: finished or died
            total += len(chunk)
            if total > MAX_RESULT_BYTES:
                state["problem"] = "too_much_output"
                return
            buf += chunk
            _frames(buf, state, limits)
    except (ValueError, RecursionError, MemoryError, TypeError, KeyError) as e:
        state["problem"] = f"malformed: {clean_text(e, 200)}"
        _blame(state)


def _blame_timeout(state):
    state["problem"] = "timeout"
    _blame(state)


def _blame(state):
    """A step ran out of time, or a frame was not the expected one: the call (or cell) in
    progress is to blame, or else the last one, whose frames came back but after which the child
    did not go on as the grader expects (a forged result, then a sleep or more forged frames):
    its result is dropped."""
    last = state.get("last")
    if state["in_call"] is None and state["in_cell"] is None and last is not None:
        kind, key = last
        if kind == "result":
            state["results"].pop(key, None)
            state["in_call"] = key
        elif kind == "cell":
            state["cells"].pop(key, None)
            state["in_cell"] = key


def _frames(buf, state, limits):
    plan = state["plan"]
    while True:
        frame = _take_frame(buf)
        if frame is None:
            return
        header, payload = frame
        kind = header.get("type")
        key = header.get("call") if kind in ("start", "result") else header.get("exercise")
        if kind == "done":
            key = None
        step = state["step"]
        if step >= len(plan) or (kind, key) != plan[step]:
            want = plan[step] if step < len(plan) else "nothing"
            raise ValueError(f"unexpected frame {clean_text((kind, key), 80)}; expected {want}")
        state["step"] += 1
        state["frames"] += 1
        now = time.monotonic()
        nxt = plan[state["step"]] if state["step"] < len(plan) else ("done", None)
        step_seconds = (
            state["timeouts"].get(nxt[1], limits.call_seconds)
            if nxt[0] in ("start", "result")
            else limits.call_seconds
        )
        state["step_deadline"] = now + step_seconds
        if kind == "cell_start":
            state["in_cell"] = _key(key)
        elif kind == "cell":
            err = header.get("error")
            err = (
                {k: clean_text(err.get(k, ""), 1500) for k in ("type", "message", "traceback")}
                if isinstance(err, dict)
                else None
            )
            state["cells"][_key(key)] = {"ok": header.get("ok") is True, "error": err}
            state["in_cell"] = None
            state["last"] = ("cell", _key(key))
        elif kind == "start":
            state["in_call"] = key
            state["call_started"] = now
        elif kind == "result":
            outcome = _outcome(header, payload)
            outcome.seconds = now - state.get("call_started", now)  # the grader's clock
            state["results"][key] = outcome
            state["in_call"] = None
            state["last"] = ("result", key)
        elif kind == "done":
            state["done"] = True
            return


def _key(x):
    return x if isinstance(x, str) and len(x) < 100 else "?"


def _take_frame(buf: bytearray):
    if len(buf) < 4:
        return None
    (hlen,) = struct.unpack_from("<I", buf, 0)
    if hlen > MAX_HEADER:
        raise ValueError("header too large")
    if len(buf) < 4 + hlen + 8:
        return None
    (plen,) = struct.unpack_from("<Q", buf, 4 + hlen)
    if plen > MAX_RESULT_BYTES:
        raise ValueError("payload too large")
    end = 4 + hlen + 8 + plen
    if len(buf) < end:
        return None
    try:
        header = json.loads(bytes(buf[4 : 4 + hlen]))
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
        raise ValueError(f"bad header: {type(e).__name__}") from None
    if not isinstance(header, dict):
        raise ValueError("header is not an object")
    payload = bytes(buf[4 + hlen + 8 : end])
    del buf[:end]
    return header, payload


def load_npy(raw: bytes) -> np.ndarray:
    """A ``.npy`` blob as a plain numeric array, checked before any allocation: the header's
    shape x itemsize must equal the bytes that follow (a header may claim 2^45 elements)."""
    fmt = np.lib.format
    fp = io.BytesIO(raw)
    version = fmt.read_magic(fp)
    reader = {(1, 0): fmt.read_array_header_1_0, (2, 0): fmt.read_array_header_2_0}.get(version)
    if reader is None:
        raise ValueError(f"unsupported .npy version {version}")
    shape, fortran, dtype = reader(fp, max_header_size=2000)
    if (
        dtype.kind not in "fiub"
        or dtype.fields is not None
        or dtype.subdtype is not None
        or dtype.hasobject
    ):
        raise ValueError("not a numeric array")
    if len(shape) > 8 or any(not isinstance(s, int) or s < 0 for s in shape):
        raise ValueError("bad array shape")
    count = math.prod(shape)
    if count * dtype.itemsize != len(raw) - fp.tell():
        raise ValueError("the array's header does not match its data")
    arr = np.frombuffer(raw, dtype=dtype, count=count, offset=fp.tell())
    return np.array(arr.reshape(shape, order="F" if fortran else "C"))


def _decode(desc, blobs, depth=0):
    if depth > MAX_DEPTH or not isinstance(desc, dict):
        raise ValueError("output nested too deeply")
    kind = desc.get("kind")
    if kind == "array":
        return load_npy(next(blobs))
    if kind == "tuple":
        items = desc.get("items")
        if not isinstance(items, list) or len(items) > 256:
            raise ValueError("bad tuple")
        return tuple(_decode(d, blobs, depth + 1) for d in items)
    if kind == "value":
        v = desc.get("value")
        if isinstance(v, str):
            return clean_text(v, 200)
        if v is not None and not isinstance(v, (bool, int, float)):
            raise ValueError("not a plain value")
        if isinstance(v, int) and not isinstance(v, bool) and abs(v) > 1 << 62:
            raise ValueError("integer out of range")
        return v
    raise ValueError("unknown output kind")


def _outcome(header: dict, payload: bytes) -> CallOutcome:
    try:
        sizes = header.get("blob_sizes", [])
        if not isinstance(sizes, list) or len(sizes) > 1024:
            raise ValueError("bad blob sizes")
        sizes = [int(s) for s in sizes]
        if sum(sizes) != len(payload) or any(s < 0 for s in sizes):
            raise ValueError("blob sizes do not match the payload")
        offsets = np.cumsum([0] + sizes)
        blobs = iter(payload[offsets[i] : offsets[i + 1]] for i in range(len(sizes)))
        mutated = [int(i) for i in (header.get("mutated") or [])[:16]]
        launches = int(header.get("launches", 0))
        seconds = float(header.get("seconds", 0.0))
        trace = header.get("trace")
        if header.get("ok") is True:
            return CallOutcome(
                "ok",
                _decode(header.get("output", {}), blobs),
                None,
                seconds,
                mutated,
                launches,
                trace if isinstance(trace, list) else None,
            )
        err = header.get("error")
        err = err if isinstance(err, dict) else {}
        err = {k: clean_text(err.get(k, ""), 1500) for k in ("type", "message", "traceback")}
        status = "not_implemented" if err["type"] == "NotImplementedError" else "error"
        return CallOutcome(status, None, err, seconds, mutated, launches)
    except (
        ValueError,
        TypeError,
        StopIteration,
        KeyError,
        OSError,
        RecursionError,
        OverflowError,
        MemoryError,
        EOFError,
    ) as e:
        return CallOutcome(
            "invalid", message=f"the result could not be read as data ({clean_text(e, 200)})"
        )
