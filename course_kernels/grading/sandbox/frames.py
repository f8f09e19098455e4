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


def _pump(rfd, state, calls, limits, start):
    """Read frames until the child says it is done, closes the pipe, or a limit is hit."""
    buf = bytearray()
    total = 0
    deadline = start + limits.total_seconds
    timeouts = {c["id"]: c.get("timeout", limits.call_seconds) for c in calls}
    d = state["deadlines"] = {"call": None, "cell": None, "cell_seconds": limits.call_seconds}
    try:
        while not state["done"]:
            now = time.monotonic()
            limit = min(x for x in (deadline, d["call"], d["cell"]) if x is not None)
            if now >= limit:
                state["problem"] = "timeout"
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
            _frames(buf, state, timeouts, limits)
    except (ValueError, RecursionError, MemoryError, TypeError, KeyError) as e:
        state["problem"] = f"malformed: {clean_text(e, 200)}"


def _frames(buf, state, timeouts, limits):
    d = state["deadlines"]
    while True:
        frame = _take_frame(buf)
        if frame is None:
            return
        header, payload = frame
        state["frames"] += 1
        kind = header.get("type")
        if kind == "cell_start":
            state["in_cell"] = _key(header.get("exercise"))
            d["cell"] = time.monotonic() + d["cell_seconds"]
        elif kind == "cell":
            ex = _key(header.get("exercise"))
            err = header.get("error")
            err = (
                {k: clean_text(err.get(k, ""), 1500) for k in ("type", "message", "traceback")}
                if isinstance(err, dict)
                else None
            )
            state["cells"][ex] = {"ok": header.get("ok") is True, "error": err}
            state["in_cell"], d["cell"] = None, None
        elif kind == "start":
            state["in_call"] = header.get("call")
            d["call"] = time.monotonic() + timeouts.get(state["in_call"], limits.call_seconds)
        elif kind == "result":
            cid = header.get("call")
            if cid in timeouts:
                state["results"][cid] = _outcome(header, payload)
            state["in_call"], d["call"] = None, None
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
