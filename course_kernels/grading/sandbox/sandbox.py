"""Run student code in bubblewrap, limited by a cgroup, and get back data only.

Each run of a submission is one sandbox: a small trusted launcher (``process_tree.LAUNCHER``: it
joins the run's cgroup, sets rlimits, forks ``bwrap``, reaps everything) starts ``bwrap``
(Debian's ``bubblewrap``) with

- the mount, PID, network, IPC, UTS and cgroup namespaces unshared; as root no user namespace
  (the first process drops to ``nobody``), otherwise a user namespace in which the child is
  ``nobody``; no capability, no new privileges;
- a seccomp filter (:mod:`.seccomp`, ``--seccomp FD``): ptrace, keyrings, BPF, perf, io_uring,
  namespaces, mounts, modules and the like answer EPERM;
- a file system made only of read-only binds of ``/usr`` (and the ``/bin``, ``/lib*`` links), the
  Python installation and its site-packages, with the course's own packages and the libraries a
  notebook may not use covered; the request (solution cells, test inputs) read-only at ``/req``;
  fresh size-capped tmpfs at ``/tmp`` and at ``/box`` (the cwd); a fresh ``/proc`` (``/proc/sys``
  read-only) and a read-only, size-capped ``/dev`` of harmless nodes; the root read-only. No
  other submission, no grader, test, solution or hidden test exists there;
- ``--new-session`` and ``--die-with-parent`` (the launcher has PDEATHSIG too: a dead grader leaves
  nothing running).

Where a cgroup can be made (root; or a user's delegated cgroup, see :mod:`.cgroups`), the
launcher and everything below it live in a fresh cgroup (v2, or v1's memory/pids/cpu
hierarchies): memory (``memory.max``, swap off), processes (``pids.max``) and CPU share (one
core) are limits of the whole tree, ``memory.peak`` (v1: ``memory.max_usage_in_bytes``) is the
tiling check's measurement, and the cgroup is killed and removed after every run. Without one,
rlimits bound each process (processes: per uid, shared by every sandbox), no peak is reported
and the tiling check fails closed; the CLI refuses to grade a class so unless ``--shared-limits``.

Results come back on a pipe as length-prefixed frames (JSON headers + ``.npy`` bytes), bounded in
size and depth and parsed here without ever executing or unpickling anything. The child's stdout is
a file the parent opened and reads through its own descriptor.

Without a working ``bwrap`` the grader refuses to run student code (``SandboxUnavailable``) unless
``unsafe=True`` (``--unsafe`` on the command line): then the child is only a separate, rlimited
process of the grader's user. See notes/grading.md and the README for the exact guarantees.

The parts, one module each: ``bwrap`` (the command line, the child's environment), ``seccomp``
(the filter), ``probe`` (what this machine allows, the refusals), ``cgroups`` (the run's
cgroup), ``process_tree`` (the launcher, reaping, leftovers, removing the run's folder),
``frames`` (bounded reading of the results); this module runs them together.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from course_kernels.grading.feedback import CallOutcome, clean_text

from ._common import Limits, SandboxUnavailable
from .bwrap import (
    BLOCKED,
    NOBODY,
    _bwrap_args,
    _child_env,
    _drop_prefix,
    _gpu_mode,
    _python,
    _site_paths,
    seccomp_fd,
)
from .cgroups import Cgroup, leftover_cgroups
from .frames import _decode, _new_state, _outcome, _pump, _take_frame, load_npy
from .probe import _nobody_can_run_python, isolation, require_sandbox
from .process_tree import LAUNCHER, _wait_for, leftovers, remove_tree

__all__ = [
    "CHILD",
    "LAUNCHER",
    "MAX_PRINT_BYTES",
    "Cgroup",
    "Limits",
    "SandboxReport",
    "SandboxUnavailable",
    "_decode",
    "_outcome",
    "_take_frame",
    "isolation",
    "leftover_cgroups",
    "leftovers",
    "load_npy",
    "remove_tree",
    "require_sandbox",
    "run_once",
    "run_submission",
]

CHILD = Path(__file__).with_name("_child.py")
MAX_PRINT_BYTES = 1 << 20  # stdout + stderr (RLIMIT_FSIZE on the parent-opened file)


@dataclass
class SandboxReport:
    calls: dict  # call id -> CallOutcome
    cells: dict  # exercise -> {"ok": bool, "error": ...}
    stdout: str = ""
    peak_bytes: int | None = None  # largest peak of any child of this submission (None: unknown)
    restarts: int = 0


def run_once(preamble, cells, calls, arrays, limits: Limits, triton=False, unsafe=False):
    """One child: run ``cells`` then ``calls`` in order. Returns a partial report (a dict).

    Every resource (temp dir, pipes, the process tree, the cgroup) is released in ``finally``.
    """
    iso = isolation()
    boxed = iso["sandbox"]
    if not boxed:
        require_sandbox(unsafe)
    state = _new_state()
    start = time.monotonic()
    work = tempfile.mkdtemp(prefix="grade-")
    fds: list[int] = []
    proc = cgroup = None
    try:
        req_dir = os.path.join(work, "req")
        os.mkdir(req_dir, 0o755)
        os.chmod(work, 0o711 if boxed else 0o700)
        _write_request(req_dir, preamble, cells, calls, arrays, triton)
        out_fd = os.open(os.path.join(work, "stdout"), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        fds.append(out_fd)
        rfd, wfd = os.pipe()
        fds += [rfd, wfd]
        cgroup = Cgroup.create(limits)
        root = os.geteuid() == 0
        drop = None  # the launcher becomes nobody before it starts anything
        passed = [wfd]
        if boxed:
            where = "/req"
            box = None
            filter_fd = seccomp_fd()
            fds.append(filter_fd)
            passed.append(filter_fd)
            cmd = _bwrap_args(
                iso["bwrap"], req_dir, limits, triton, iso["mode"], iso["size"], filter_fd
            )
            cmd += _drop_prefix(iso["mode"])
            env = _child_env(triton)
            if root and iso["mode"] == "userns":
                drop = NOBODY
        else:
            where = req_dir
            box = os.path.join(work, "box")
            os.mkdir(box, 0o700)
            cmd = []
            env = _child_env(triton, home=box)
            if root and _nobody_can_run_python():
                os.chmod(work, 0o711)
                os.chown(box, NOBODY, NOBODY)
                drop = NOBODY
        cmd += [_python(), "-I", "-S", os.path.join(where, "_child.py"), where, str(wfd)]
        cfg = {
            "parent": os.getpid(),
            "cgroups": cgroup.procs_files() if cgroup else [],
            "cpu": int(limits.total_seconds) + 5,
            "memory": limits.memory_bytes,
            "memrl": "DATA" if _gpu_mode() else "AS",
            "fsize": MAX_PRINT_BYTES,
            "nproc": limits.nproc if cgroup is None else None,
            "drop": drop,
        }
        proc = subprocess.Popen(
            [_python(), "-I", "-S", "-c", LAUNCHER, json.dumps(cfg)] + cmd,
            stdin=subprocess.DEVNULL,
            stdout=out_fd,
            stderr=out_fd,
            cwd=box or "/",
            env=env,
            pass_fds=passed,
            close_fds=True,
            start_new_session=True,
        )
        for fd in passed:
            os.close(fd)
            fds.remove(fd)
        _pump(rfd, state, calls, limits, start, cells)
        returncode = _wait_for(proc, state)
        # the tree's peak only where a cgroup adds up every process (fail closed elsewhere)
        state["peak_bytes"] = cgroup.peak() if cgroup else None
        state["returncode"] = returncode
        size = os.fstat(out_fd).st_size
        printed = os.pread(out_fd, 4000, 0).decode("utf-8", "replace")
        state["stdout"] = clean_text(printed, 4000)
        state["printed_too_much"] = size >= MAX_PRINT_BYTES
    finally:
        if proc is not None:
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGKILL)
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        if cgroup is not None:
            cgroup.remove()
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        remove_tree(work)
        state["seconds"] = time.monotonic() - start
    return state


def _write_request(req_dir, preamble, cells, calls, arrays, triton) -> None:
    """The child's read-only request folder: its code, the request and the input arrays."""
    req = {
        "sys_path": _site_paths(),
        "preamble": preamble,
        "cells": cells,
        "calls": calls,
        "triton": triton,
    }
    shutil.copy(CHILD, os.path.join(req_dir, "_child.py"))
    with open(os.path.join(req_dir, "_blocked.py"), "w") as f:
        f.write(BLOCKED)
    with open(os.path.join(req_dir, "request.json"), "w") as f:
        json.dump(req, f)
    np.savez(os.path.join(req_dir, "arrays.npz"), **arrays)
    for name in os.listdir(req_dir):
        os.chmod(os.path.join(req_dir, name), 0o644)


def run_submission(
    preamble, cells, calls, arrays, limits: Limits | None = None, triton=False, unsafe=False
):
    """Run every call, restarting the child after a crash or timeout (that exercise's remaining
    calls are marked not run). The whole notebook stays within ``limits.total_seconds``. Never
    raises for anything the student's code does (``SandboxUnavailable`` when there is no sandbox
    and ``unsafe`` is False)."""
    limits = limits or Limits()
    outcomes: dict = {}
    cell_status: dict = {}
    printed = []
    peaks = []
    restarts = 0
    bad_exercises: dict = {}  # exercise -> message
    pending_cells = list(cells)
    pending = list(calls)
    t_start = time.monotonic()
    while True:
        run_cells = [c for c in pending_cells if c["exercise"] not in bad_exercises]
        run_calls = [c for c in pending if c["exercise"] not in bad_exercises]
        for c in pending:
            if c["exercise"] in bad_exercises and c["id"] not in outcomes:
                outcomes[c["id"]] = CallOutcome("not_run", message=bad_exercises[c["exercise"]])
        if not run_calls:
            break
        remaining = limits.total_seconds - (time.monotonic() - t_start)
        if remaining < 1:
            for c in run_calls:
                outcomes[c["id"]] = CallOutcome(
                    "timeout", message="the notebook's total time limit ran out before this test"
                )
            break
        lim = Limits(
            limits.call_seconds, remaining, limits.memory_bytes, limits.nproc, limits.tmpfs_bytes
        )
        st = run_once(preamble, run_cells, run_calls, arrays, lim, triton, unsafe)
        peaks.append(st["peak_bytes"])
        printed.append(st["stdout"])
        cell_status.update(st["cells"])
        for cid, o in st["results"].items():
            o.peak = st["peak_bytes"]
            outcomes[cid] = o
        if st["done"] and st["problem"] is None:
            break
        culprit_call = st["in_call"]
        ids = {c["id"]: c for c in run_calls}
        if culprit_call is not None and culprit_call in ids:
            lim.call_seconds = ids[culprit_call].get("timeout") or lim.call_seconds
        why = _explain(st, lim)
        if culprit_call is not None and culprit_call in ids:
            ex = ids[culprit_call]["exercise"]
            status = "timeout" if st["problem"] == "timeout" else "crash"
            outcomes[culprit_call] = CallOutcome(status, message=why)
            bad_exercises[ex] = f"not run: an earlier test of this exercise failed ({why})"
        elif st["in_cell"] is not None and any(c["exercise"] == st["in_cell"] for c in run_cells):
            ex = st["in_cell"]
            cell_status[ex] = {
                "ok": False,
                "error": {"type": "Crash", "message": f"while your code cell ran: {why}"},
            }
            bad_exercises[ex] = (
                f"your code cell for this exercise stopped the grader's process ({why})"
            )
        else:  # died outside any call (e.g. while starting, or garbage on the pipe)
            for c in run_calls:
                if c["id"] not in outcomes:
                    outcomes[c["id"]] = CallOutcome("crash", message=why)
            break
        restarts += 1
        pending_cells = [c for c in run_cells if c["exercise"] not in bad_exercises]
        pending = [c for c in run_calls if c["id"] not in outcomes]
    known = [p for p in peaks if p is not None]
    return SandboxReport(
        outcomes,
        cell_status,
        "".join(printed)[:4000],
        max(known) if known and len(known) == len(peaks) else None,
        restarts,
    )


def _explain(st, lim: Limits) -> str:
    rc = st["returncode"]
    if st["frames"] == 0 and st["problem"] is None:
        return (
            "the grader's sandbox failed to start (a grader problem, not yours; tell the "
            f"instructor): exit code {rc}, {st['stdout'][-300:]!r}"
        )
    if st["problem"] == "timeout":
        return (
            f"time limit exceeded ({lim.call_seconds:g} s per test): an infinite loop, or far "
            "too slow"
        )
    if st["problem"] == "too_much_output":
        return "sent back more data than any test needs"
    if st["problem"] and st["problem"].startswith("malformed"):
        return "something other than the grader wrote on the grader's result channel"
    if st["printed_too_much"]:
        return f"printed more than {MAX_PRINT_BYTES // (1 << 20)} MB"
    if rc is not None and rc > 128 and isolation()["sandbox"]:
        rc = -(rc - 128)  # bwrap reports a child killed by signal N as 128 + N
    if rc is not None and rc < 0:
        sig = signal.Signals(-rc).name if -rc in signal.Signals._value2member_map_ else str(-rc)
        if sig == "SIGKILL":
            return "the process was killed (SIGKILL): memory or CPU limit, or a runaway process"
        if sig == "SIGXCPU":
            return "CPU time limit exceeded"
        return f"the Python process crashed ({sig})"
    if "MemoryError" in st["stdout"]:
        return "ran out of memory (the limit is a few GB)"
    return (
        f"the process exited early (exit code {rc}): sys.exit() or os._exit() in your code "
        "ends the grader's run, not just the test"
    )
