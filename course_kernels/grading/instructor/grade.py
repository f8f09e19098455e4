"""Grade one submitted notebook: read it safely, run its solution cells in the sandbox, judge the
results in this process (``course_kernels.grading`` holds the tests and the judges)."""

from __future__ import annotations

import json
import os
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from course_kernels.grading.exercises import (
    BASELINE_STUBS,
    EXERCISES,
    Notebook,
    notebook_of,
    preamble,
)
from course_kernels.grading.feedback import CallOutcome, clean_text
from course_kernels.grading.runner import build_cases, forbidden_use, judge, solution_cells

from ..sandbox.sandbox import Limits, isolation, require_sandbox, run_submission

MAX_NOTEBOOK_BYTES = 20 << 20
UNVERIFIABLE = (
    "cannot verify 'really tiled': this grader has no cgroup per sandbox, so only per-process "
    "memory is known and memory spread over several processes would not be added up; the "
    "test fails closed (a grader setup problem, not necessarily yours: tell the instructor)"
)


@dataclass
class NotebookResult:
    path: str
    notebook: str
    verdicts: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    seconds: float = 0.0

    @property
    def score(self) -> float:
        return sum(v.points for v in self.verdicts)

    @property
    def max_score(self) -> float:
        return sum(v.max_points for v in self.verdicts)


def _encode_args(case, cid, arrays):
    def enc(x, tag):
        if isinstance(x, np.ndarray):
            arrays[f"c{cid}_{tag}"] = x
            return {"array": f"c{cid}_{tag}"}
        return {"value": x}

    return (
        [enc(a, f"a{i}") for i, a in enumerate(case.args)],
        {k: enc(v, f"k{k}") for k, v in case.kwargs.items()},
    )


def _call_spec(case, cid, arrays, limits):
    args, kwargs = _encode_args(case, cid, arrays)
    timeout = min(case.timeout or limits.call_seconds, limits.call_seconds)
    return {
        "id": cid,
        "exercise": case.exercise,
        "func": case.func,
        "args": args,
        "kwargs": kwargs,
        "torch": case.torch,
        "io_sram": case.io_sram,
        "timeout": timeout,
    }


_BASELINES: dict = {}


def _baseline_peak(nb, cases, calls, arrays, limits, unsafe):
    """Peak memory of a child running the same calls on stubs that return None: what the
    interpreter, NumPy and the inputs cost. Cached per notebook and input sizes."""
    key = (
        nb.name,
        tuple((c.exercise, tuple(tuple(getattr(a, "shape", ())) for a in c.args)) for c in cases),
    )
    if key not in _BASELINES:
        stubs = [
            {
                "exercise": ex,
                "source": BASELINE_STUBS.get(ex, f"def {ex}(*args, **kwargs):\n    return None\n"),
            }
            for ex in nb.exercises
        ]
        peaks = []
        for _ in range(2):
            rep = run_submission(preamble(nb), stubs, calls, arrays, limits, nb.triton, unsafe)
            if rep.peak_bytes is not None:
                peaks.append(rep.peak_bytes)
        _BASELINES[key] = min(peaks) if peaks else None
    return _BASELINES[key]


def read_notebook(path) -> dict:
    """A notebook's JSON, read through a descriptor opened here: regular files only (a FIFO or
    a device never blocks the grader), at most MAX_NOTEBOOK_BYTES. Raises ValueError."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        raise ValueError(f"cannot open it ({e.strerror})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError("it is not a regular file")
        if st.st_size > MAX_NOTEBOOK_BYTES:
            raise ValueError(f"it is larger than {MAX_NOTEBOOK_BYTES >> 20} MB")
        data = os.read(fd, MAX_NOTEBOOK_BYTES + 1)
    finally:
        os.close(fd)
    try:
        nb = json.loads(data.decode("utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise ValueError(f"it is not a notebook (JSON: {clean_text(e, 200)})") from None
    if not isinstance(nb, dict) or not isinstance(nb.get("cells", []), list):
        raise ValueError("it is not a notebook")
    return nb


def expected_notebook(path, exercise=None) -> Notebook | None:
    """Which exercise a file is graded as: ``exercise`` (the CLI's --exercise) if given, else the
    file name (its number prefix). Never the notebook's own metadata, which a student controls."""
    for stem in (exercise, Path(path).stem):
        if stem:
            try:
                return notebook_of(str(stem))
            except KeyError:
                if stem == exercise:
                    raise
    return None


def _identify(path, nb_json, exercise, notes):
    """The exercise a submission is graded as (``exercise``, else the file name, else the
    notebook's own metadata), or None; what disagrees goes into ``notes``."""
    meta = nb_json.get("metadata", {})
    meta = meta.get("course_kernels", {}) if isinstance(meta, dict) else {}
    claimed = meta.get("notebook") if isinstance(meta, dict) else None
    try:
        nb = expected_notebook(path, exercise)
        if nb is None and isinstance(claimed, str):
            nb = notebook_of(claimed)
            notes.append(
                f"graded as {nb.name}: the file name names no exercise, the "
                "notebook's metadata does (pass --exercise to be explicit)"
            )
    except KeyError as e:
        notes.append(clean_text(e))
        return None
    if nb is None:
        notes.append("no exercise matches this file's name; pass --exercise NN")
        return None
    if isinstance(claimed, str) and claimed != nb.name:
        notes.append(
            clean_text(
                f"this file is graded as {nb.name}, but the notebook inside "
                f"says it is {claimed!r}: was the wrong notebook submitted?"
            )
        )
    return nb


def _with_cell(case, outcome, cells, cell_reports):
    """(outcome, cell_error) of a case given its solution cell: missing, failed or fine."""
    if case.exercise not in cells:
        return CallOutcome(
            "error",
            error={
                "type": "NameError",
                "message": f"name {case.func!r} is not defined in your "
                "solution cells: the cell marked YOUR CODE is missing",
            },
        ), None
    cell = cell_reports.get(case.exercise)
    if cell is not None and not cell.get("ok", True):
        err = cell.get("error") or {}
        return outcome, (
            err.get("message")
            if err.get("type") == "Crash"
            else f"{err.get('type')}: {err.get('message')}"
        )
    return outcome, None


def grade_notebook(
    path,
    hidden_dir=None,
    limits: Limits | None = None,
    include_hidden=True,
    exercise=None,
    unsafe=False,
) -> NotebookResult:
    """Grade one submitted notebook. Never raises for anything inside the notebook
    (``SandboxUnavailable`` without bubblewrap unless ``unsafe``)."""
    require_sandbox(unsafe)
    t0 = time.monotonic()
    path = Path(path)
    res = NotebookResult(clean_text(path), "?")
    try:
        nb_json = read_notebook(path)
    except ValueError as e:
        res.notes.append(f"could not read the notebook: {e}")
        return res
    nb = _identify(path, nb_json, exercise, res.notes)
    if nb is None:
        return res
    res.notebook = nb.name
    if nb.note:
        res.notes.append(nb.note)
    cases = build_cases(nb, hidden_dir, include_hidden, fresh_seeds=True)
    cells = solution_cells(nb_json)
    limits = limits or Limits(call_seconds=nb.timeout, total_seconds=max(240.0, 4 * nb.timeout))
    flagged = {}
    for ex, src in cells.items():
        why = forbidden_use(src, EXERCISES[ex].torch_rules)
        if why:
            flagged[ex] = why
    arrays: dict = {}
    calls = [_call_spec(case, cid, arrays, limits) for cid, case in enumerate(cases)]
    cell_list = [{"exercise": ex, "source": src} for ex, src in cells.items() if ex not in flagged]
    report = run_submission(preamble(nb), cell_list, calls, arrays, limits, nb.triton, unsafe)
    outcomes = dict(report.calls)
    if any(c.probe == "memory" for c in cases):
        measured = bool(isolation()["cgroup"])  # else only per-process memory: fail closed
        base = _baseline_peak(nb, cases, calls, arrays, limits, unsafe) if measured else None
        how = "as the peak memory of the whole process tree (cgroup)"
        for cid, case in enumerate(cases):
            o = outcomes.get(cid)
            if case.probe == "memory" and o is not None and o.status == "ok":
                o.memory = None if base is None or o.peak is None else (max(0, o.peak - base), how)
                o.memory_note = "" if measured else UNVERIFIABLE
    for cid, case in enumerate(cases):
        outcome = outcomes.get(cid) or CallOutcome("crash", message="no result came back")
        cell_error = None
        if case.exercise not in flagged:
            outcome, cell_error = _with_cell(case, outcome, cells, report.cells)
        v = judge(case, outcome, cell_error)
        if case.exercise in flagged:
            v.points, v.status = 0.0, "flagged"
            v.message = clean_text(
                f"not graded: your code {flagged[case.exercise]}, which a "
                "submission may not do. Write the algorithm with NumPy/Triton "
                "only"
            )
        res.verdicts.append(v)
    if report.restarts:
        res.notes.append(f"the sandbox restarted {report.restarts} time(s) after a crash/timeout")
    res.seconds = time.monotonic() - t0
    return res
