"""Run student code in a separate, limited process and get back data only.

What the child gets: a fresh interpreter (``python -I -S``: no user site, no PYTHONPATH, no
``.pth`` files, so the editable ``course_kernels`` install is not importable), a new process group
and session, a temporary working directory holding only the request (the student's solution cells
and the test inputs), a minimal environment (no secrets), and resource limits: CPU seconds, address
space, file size (which also caps what it prints), open files, and - where the kernel enforces it,
i.e. not for root - processes. The parent enforces wall time per call and per notebook, kills the
whole process group afterwards, and, being a child subreaper, also kills any descendant that
escaped the group with ``setsid``.

What comes back: length-prefixed frames (JSON headers + ``.npy`` bytes read with
``allow_pickle=False``), size-capped and validated here. Nothing from the child is ever executed
or unpickled by the parent. See notes/grading.md for what this does *not* protect against.
"""

from __future__ import annotations

import ctypes
import io
import json
import os
import resource
import select
import shutil
import signal
import site
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ._child import hide_and_freeze

CHILD = Path(__file__).with_name("_child.py")
ZYGOTE = Path(__file__).with_name("_zygote.py")
MAX_HEADER = 4 << 20  # bytes per frame header
MAX_RESULT_BYTES = 64 << 20  # everything a child may send back
MAX_PRINT_BYTES = 1 << 20  # stdout + stderr each (RLIMIT_FSIZE)


@dataclass
class Limits:
    call_seconds: float = 20.0  # wall time of one call
    total_seconds: float = 240.0  # wall time of one child process
    memory_bytes: int = 4 << 30  # address space (RLIMIT_AS)
    nproc: int = 256  # RLIMIT_NPROC (not enforced for root)


@dataclass
class CallOutcome:
    status: str  # ok | error | not_implemented | timeout | crash | not_run | invalid
    output: object = None  # decoded output: arrays, numbers, tuples
    error: dict | None = None
    seconds: float = 0.0
    mutated: list = field(default_factory=list)
    launches: int = 0
    trace: list | None = None
    message: str = ""  # sandbox-level explanation (timeout, crash, ...)


@dataclass
class SandboxReport:
    calls: dict  # call id -> CallOutcome
    cells: dict  # exercise -> {"ok": bool, "error": ...}
    stdout: str = ""
    maxrss_kb: int = 0  # measured by the kernel (wait4), not reported by the child
    restarts: int = 0


def _site_paths() -> list[str]:
    """Where numpy/torch/triton live: site-packages, never the repository itself."""
    repo = str(Path(__file__).resolve().parents[2])
    paths = []
    for p in site.getsitepackages() + [os.path.dirname(np.__path__[0])]:
        if p not in paths and os.path.isdir(p) and os.path.realpath(p) != os.path.realpath(repo):
            paths.append(p)
    return paths


MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
CLONE_NEWNS = 0x00020000
BOX = "/mnt"  # where the child's temp dir appears inside its mount namespace
_ISOLATION: dict | None = None


def isolation() -> dict:
    """Which OS isolation layers this machine allows (probed once).

    ``namespaces``: running as root with ``unshare`` usable, the child gets its own mount and PID
    namespaces: the file system read-only except its temp dir, the course's solutions, tests,
    hidden tests and the submissions hidden under empty tmpfs mounts, other graders' temp dirs
    hidden, and a PID namespace in which it can only see and signal its own processes (killed
    all at once when it ends). ``cgroup``: a pids cgroup caps the number of processes.
    """
    global _ISOLATION
    if _ISOLATION is None:
        ok = False
        if os.geteuid() == 0 and shutil.which("unshare") and os.path.isdir(BOX) and \
                os.environ.get("COURSE_GRADING_NO_NAMESPACES") != "1":
            try:
                r = subprocess.run(["unshare", "--pid", "--fork", "--kill-child", "--mount-proc",
                                    "true"], capture_output=True, timeout=20)
                ok = r.returncode == 0
            except (OSError, subprocess.TimeoutExpired):
                ok = False
        cg = None
        for base in ("/sys/fs/cgroup/pids", "/sys/fs/cgroup"):
            if os.geteuid() == 0 and os.access(base, os.W_OK) and os.path.exists(
                    os.path.join(base, "cgroup.procs")):
                try:
                    probe = tempfile.mkdtemp(prefix="course-grading-", dir=base)
                    ok_cg = os.path.exists(os.path.join(probe, "pids.max"))
                    os.rmdir(probe)
                    if ok_cg:
                        cg = base
                        break
                except OSError:
                    pass
        _ISOLATION = {"namespaces": ok, "cgroup": cg}
    return _ISOLATION


def _hideable(paths: list[str]) -> list[str]:
    """Paths that can be hidden without hiding the interpreter and its packages."""
    keep = [os.path.realpath(p) for p in [sys.prefix, sys.base_prefix, *_site_paths()]]
    out = []
    for p in paths:
        real = os.path.realpath(p)
        if os.path.isdir(real) and real != "/" and not any(
                k == real or k.startswith(real + os.sep) for k in keep):
            out.append(real)
    return out


def _repo_dirs_to_hide() -> list[str]:
    """The repository's folders (solutions, tests, hidden tests, the library...), except those
    holding the interpreter or its site-packages."""
    repo = Path(CHILD).resolve().parents[2]
    keep = [os.path.realpath(p) for p in [sys.prefix, *_site_paths()]]
    out = []
    for entry in repo.iterdir():
        real = os.path.realpath(entry)
        if entry.is_dir() and not any(k == real or k.startswith(real + os.sep) for k in keep):
            out.append(str(entry))
    return out


def _become_subreaper() -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except Exception:  # not Linux: fall back to killing the process group only
        pass


def _children_of_me() -> set[int]:
    me = os.getpid()
    kids = set()
    try:
        for task in os.listdir(f"/proc/{me}/task"):
            with open(f"/proc/{me}/task/{task}/children") as f:
                kids.update(int(x) for x in f.read().split())
    except OSError:
        pass
    return kids


def _kill_escaped(known: set[int]) -> None:
    """Kill and reap children (re-parented to us as subreaper) that are not ours from before."""
    for _ in range(50):
        extra = _children_of_me() - known
        if not extra:
            return
        for pid in extra:
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        for pid in extra:
            try:
                os.waitpid(pid, os.WNOHANG)
            except OSError:
                pass
        time.sleep(0.02)


def _preexec(limits: Limits, cpu_seconds: int, tmp: str, hide: list, cgroup: str | None):
    def setup():
        os.setsid()
        if cgroup:
            with open(os.path.join(cgroup, "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))
        if hide is not None:
            hide_and_freeze(tmp, hide, BOX)  # and chdir to BOX, the writable view of tmp
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # oversize writes fail instead of killing
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 5))
        mem_limit = resource.RLIMIT_DATA if _gpu_mode() else resource.RLIMIT_AS
        resource.setrlimit(mem_limit, (limits.memory_bytes, limits.memory_bytes))
        resource.setrlimit(resource.RLIMIT_FSIZE, (MAX_PRINT_BYTES, MAX_PRINT_BYTES))
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        try:
            resource.setrlimit(resource.RLIMIT_NPROC, (limits.nproc, limits.nproc))
        except (ValueError, OSError):
            pass

    return setup


def _decode(desc, blobs):
    kind = desc.get("kind")
    if kind == "array":
        raw = next(blobs)
        arr = np.load(io.BytesIO(raw), allow_pickle=False)
        if not isinstance(arr, np.ndarray) or arr.dtype.kind not in "fiub":
            raise ValueError("not a numeric array")
        return arr
    if kind == "tuple":
        return tuple(_decode(d, blobs) for d in desc["items"])
    if kind == "value":
        v = desc["value"]
        if v is not None and not isinstance(v, (bool, int, float, str)):
            raise ValueError("not a plain value")
        return v
    raise ValueError(f"unknown output kind {kind!r}")


def _gpu_mode() -> bool:
    """COURSE_GRADING_GPU=1: Triton children compile for the grader's GPU. CUDA reserves far more
    address space than it uses, so memory is then capped with RLIMIT_DATA instead of RLIMIT_AS."""
    return os.environ.get("COURSE_GRADING_GPU") == "1"


def _child_env(tmp: str, triton: bool) -> dict:
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": tmp,
        "TMPDIR": tmp,
        "LANG": "C.UTF-8",
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "PYTHONHASHSEED": "0",
        "PYTHONDONTWRITEBYTECODE": "1",
        "TRITON_CACHE_DIR": os.path.join(tmp, ".triton"),
        "MPLBACKEND": "Agg",
    }
    if triton and not _gpu_mode():
        env["TRITON_INTERPRET"] = "1"
    if _gpu_mode():
        env.update({k: v for k, v in os.environ.items()
                    if k in ("LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES") or k.startswith("NVIDIA_")})
    return env


_ZYGOTE: dict = {}


def _zygote(env) -> subprocess.Popen | None:
    """This process's warm parent for Triton children (see _zygote.py), started on first use."""
    z = _ZYGOTE.get("proc")
    if z is not None and z.poll() is None:
        return z
    cmd = ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", sys.executable, "-I",
           "-S", str(ZYGOTE), json.dumps(_site_paths())]
    z = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, env=env, cwd="/", start_new_session=True)
    line = _read_line(z, time.monotonic() + 300)
    if not line or not json.loads(line).get("ready"):
        _stop_zygote(z)
        return None
    _ZYGOTE["proc"] = z
    return z


def _read_line(z, deadline):
    buf = _ZYGOTE.setdefault("buf", bytearray())
    fd = z.stdout.fileno()
    while b"\n" not in buf:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return None
        chunk = os.read(fd, 65536)
        if not chunk:
            return None
        buf.extend(chunk)
    line, _, rest = bytes(buf).partition(b"\n")
    buf[:] = rest
    return line.decode()


def _stop_zygote(z):
    try:
        os.killpg(z.pid, signal.SIGKILL)
    except OSError:
        pass
    z.wait()
    _ZYGOTE.clear()


def run_once(preamble, cells, calls, arrays, limits: Limits, triton=False, hide=()):
    """One child process: run ``cells`` then ``calls`` in order. Returns a partial report + state.

    ``calls``: dicts {id, func, args, kwargs, torch?, io_sram?, timeout?}; ``arrays``: name -> array.
    """
    tmp = tempfile.mkdtemp(prefix="grade-")
    iso = isolation()
    boxed = iso["namespaces"]
    req = {"sys_path": _site_paths(), "preamble": preamble, "cells": cells, "calls": calls,
           "triton": triton, "drop_privileges": boxed}
    shutil.copy(CHILD, os.path.join(tmp, "_child.py"))
    with open(os.path.join(tmp, "request.json"), "w") as f:
        json.dump(req, f)
    np.savez(os.path.join(tmp, "arrays.npz"), **arrays)
    out_path = os.path.join(tmp, "stdout.txt")
    if boxed and triton and os.environ.get("COURSE_GRADING_NO_ZYGOTE") != "1":
        z = _zygote(_child_env(BOX, triton))
        if z is not None:
            return _run_forked(z, tmp, out_path, calls, limits, hide)
    cgroup = None
    if iso["cgroup"]:
        try:
            cgroup = tempfile.mkdtemp(prefix="course-grading-", dir=iso["cgroup"])
            with open(os.path.join(cgroup, "pids.max"), "w") as f:
                f.write(str(limits.nproc))
        except OSError:
            cgroup = None
    rfd, wfd = os.pipe()
    rss_r, rss_w = os.pipe()
    known = _children_of_me()
    start = time.monotonic()
    cpu = int(limits.total_seconds) + 5
    with open(out_path, "wb") as out:
        where = BOX if boxed else tmp
        cmd = [sys.executable, "-I", "-S", os.path.join(where, "_child.py"), where, str(wfd)]
        if boxed:
            cmd = ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc"] + cmd
            hidden = _hideable([str(p) for p in hide] + ["/tmp"] + _repo_dirs_to_hide())
        cmd = [sys.executable, "-I", "-S", "-c", LAUNCHER, str(rss_w)] + cmd
        proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            cwd=tmp, env=_child_env(where, triton), pass_fds=(wfd, rss_w),
            preexec_fn=_preexec(limits, cpu, tmp, hidden if boxed else None, cgroup),
            close_fds=True,
        )
    os.close(wfd)
    os.close(rss_w)
    state = _new_state()
    _pump(rfd, state, calls, limits, start)
    # Let the child exit by itself first: under `unshare --fork`, the interpreter is unshare's
    # child, and its peak memory reaches our wait4 only if unshare lived to reap it. Killing
    # unshare at once (as a loaded machine's timing sometimes allowed) lost that number.
    reaped = _wait4_nohang(proc.pid, deadline=time.monotonic() + REAP_GRACE_SECONDS)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
    os.close(rfd)
    _, status, _rusage = reaped or os.wait4(proc.pid, 0)
    _kill_escaped(known)
    if cgroup:
        _kill_cgroup(cgroup)
    with os.fdopen(rss_r, "rb") as f:
        reported = f.read(32).decode("ascii", "replace")
    maxrss = int(reported) if reported.isdigit() else 0  # 0: unknown (the judge fails closed)
    _finish(state, tmp, out_path, os.waitstatus_to_exitcode(status), maxrss, start)
    return state


REAP_GRACE_SECONDS = 5.0

# The first process of a sandbox run: it forks and execs the real command, reaps it with wait4
# and writes the reaped tree's peak resident memory (KB) to a pipe only the grader reads. Why not
# wait4 on the grader's own child: a forked process's peak memory includes the parent's resident
# memory at fork time (Linux keeps the pre-exec high-water mark), so a grader that has imported
# torch would hide any submission using less than that. This launcher is a fresh, small
# interpreter, so its children start small. It re-raises the child's fatal signal on itself so
# that the grader still sees a crash as a crash.
LAUNCHER = """
import os, signal, sys
fd, cmd = int(sys.argv[1]), sys.argv[2:]
pid = os.fork()
if pid == 0:
    os.close(fd)
    try:
        os.execvp(cmd[0], cmd)
    finally:
        os._exit(127)
_, status, ru = os.wait4(pid, 0)
os.write(fd, str(ru.ru_maxrss).encode())
os.close(fd)
if os.WIFSIGNALED(status):
    sig = os.WTERMSIG(status)
    signal.signal(sig, signal.SIG_DFL)
    os.kill(os.getpid(), sig)
os._exit(os.waitstatus_to_exitcode(status) & 0xFF)
"""


def _wait4_nohang(pid, deadline):
    """Poll ``wait4(pid, WNOHANG)`` until the process has ended or ``deadline`` passes."""
    while True:
        got, status, rusage = os.wait4(pid, os.WNOHANG)
        if got == pid:
            return got, status, rusage
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.01)


def _finish(state, tmp, out_path, returncode, maxrss, start):
    try:
        with open(out_path, "rb") as f:
            printed = f.read(4000).decode("utf-8", "replace")
        printed_size = os.path.getsize(out_path)
    except OSError:
        printed, printed_size = "", 0
    shutil.rmtree(tmp, ignore_errors=True)
    state["returncode"] = returncode
    state["stdout"] = printed
    state["printed_too_much"] = printed_size >= MAX_PRINT_BYTES
    state["maxrss_kb"] = maxrss
    state["seconds"] = time.monotonic() - start


def _run_forked(z, tmp, out_path, calls, limits, hide):
    """run_once through the warm zygote: same protocol, results on a FIFO."""
    start = time.monotonic()
    fifo = os.path.join(tmp, "result.fifo")
    os.mkfifo(fifo, 0o600)
    rfd = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)  # never EOF: the zygote says when it ends
    order = {"tmp": tmp, "box": BOX, "stdout": out_path, "fifo": fifo,
             "hide": _hideable([str(p) for p in hide] + ["/tmp"] + _repo_dirs_to_hide()),
             "cpu": int(limits.total_seconds) + 5, "memory": limits.memory_bytes,
             "memory_rlimit": "DATA" if _gpu_mode() else "AS",
             "fsize": MAX_PRINT_BYTES}
    state = _new_state()
    try:
        z.stdin.write((json.dumps(order) + "\n").encode())
        z.stdin.flush()
        report = _pump(rfd, state, calls, limits, start, z)
        if report is None:  # timeout or garbage: kill the child's whole namespace of processes
            z.stdin.write(b'{"kill": true}\n')
            z.stdin.flush()
            line = _read_line(z, time.monotonic() + 15)
            report = json.loads(line) if line else None
            _drain(rfd, state)
    except (OSError, ValueError):
        report = None
    os.close(rfd)
    if report is None:
        _stop_zygote(z)
        report = {"status": -9, "maxrss": 0}
    _finish(state, tmp, out_path, report["status"], report["maxrss"], start)
    return state


def _new_state():
    return {"cells": {}, "results": {}, "in_cell": None, "in_call": None, "done": False,
            "problem": None, "frames": 0}


def _drain(rfd, state):
    buf = state.setdefault("_buf", bytearray())
    while True:
        try:
            chunk = os.read(rfd, 1 << 20)
        except BlockingIOError:
            break
        if not chunk:
            break
        buf += chunk
    _frames(buf, state, {}, Limits())


def _pump(rfd, state, calls, limits, start, z=None):
    """Read frames until the child finishes (EOF, or the zygote's report) or a limit is hit.

    Returns the zygote's report when it sent one."""
    buf = state.setdefault("_buf", bytearray())
    total = 0
    deadline = start + limits.total_seconds
    state["timeouts"] = {c["id"]: c.get("timeout", limits.call_seconds) for c in calls}
    state["deadlines"] = {"call": None, "cell": None, "cell_seconds": limits.call_seconds}
    zfd = z.stdout.fileno() if z is not None else None
    try:
        while True:
            now = time.monotonic()
            d = state["deadlines"]
            limit = min(x for x in (deadline, d["call"], d["cell"]) if x is not None)
            if now >= limit:
                state["problem"] = "timeout"
                return None
            watch = [rfd] + ([zfd] if zfd is not None else [])
            ready, _, _ = select.select(watch, [], [], min(0.5, limit - now))
            if zfd is not None and zfd in ready:
                line = _read_line(z, time.monotonic() + 5)
                _drain(rfd, state)
                return json.loads(line) if line else None
            if rfd not in ready:
                continue
            try:
                chunk = os.read(rfd, 1 << 20)
            except BlockingIOError:
                continue
            if not chunk:
                return None  # the child closed its end: finished or died
            total += len(chunk)
            if total > MAX_RESULT_BYTES:
                state["problem"] = "too_much_output"
                return None
            buf += chunk
            _frames(buf, state, state["timeouts"], limits)
    except ValueError as e:  # a malformed frame: the child wrote garbage on the result pipe
        state["problem"] = f"malformed: {e}"
        return None


def _frames(buf, state, timeouts, limits):
    d = state.setdefault("deadlines", {"call": None, "cell": None,
                                       "cell_seconds": limits.call_seconds})
    while True:
        frame = _take_frame(buf)
        if frame is None:
            return
        header, payload = frame
        state["frames"] += 1
        kind = header.get("type")
        if kind == "cell_start":
            state["in_cell"] = header.get("exercise")
            d["cell"] = time.monotonic() + d["cell_seconds"]
        elif kind == "cell":
            state["cells"][header.get("exercise")] = header
            state["in_cell"], d["cell"] = None, None
        elif kind == "start":
            state["in_call"] = header.get("call")
            d["call"] = time.monotonic() + timeouts.get(state["in_call"], limits.call_seconds)
        elif kind == "result":
            state["results"][header.get("call")] = _outcome(header, payload)
            state["in_call"], d["call"] = None, None
        elif kind == "done":
            state["done"] = True


def _kill_cgroup(cgroup: str) -> None:
    for _ in range(100):
        try:
            with open(os.path.join(cgroup, "cgroup.procs")) as f:
                pids = [int(x) for x in f.read().split()]
        except OSError:
            return
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.01)
    try:
        os.rmdir(cgroup)
    except OSError:
        pass


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
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"bad header: {e}") from None
    if not isinstance(header, dict):
        raise ValueError("header is not an object")
    payload = bytes(buf[4 + hlen + 8 : end])
    del buf[:end]
    return header, payload


def _outcome(header: dict, payload: bytes) -> CallOutcome:
    try:
        sizes = [int(s) for s in header.get("blob_sizes", [])]
        if sum(sizes) != len(payload) or any(s < 0 for s in sizes):
            raise ValueError("blob sizes do not match the payload")
        offsets = np.cumsum([0] + sizes)
        blobs = iter(payload[offsets[i] : offsets[i + 1]] for i in range(len(sizes)))
        mutated = [int(i) for i in header.get("mutated", [])][:16]
        launches = int(header.get("launches", 0))
        seconds = float(header.get("seconds", 0.0))
        trace = header.get("trace")
        if header.get("ok") is True:
            return CallOutcome("ok", _decode(header.get("output", {}), blobs), None, seconds,
                               mutated, launches, trace if isinstance(trace, list) else None)
        err = header.get("error") or {}
        err = {k: str(err.get(k, ""))[:1500] for k in ("type", "message", "traceback")}
        status = "not_implemented" if err["type"] == "NotImplementedError" else "error"
        return CallOutcome(status, None, err, seconds, mutated, launches)
    except (ValueError, TypeError, StopIteration, KeyError, OSError) as e:
        return CallOutcome("invalid", message=f"the result could not be read as data ({e})")


def run_submission(preamble, cells, calls, arrays, limits: Limits | None = None, triton=False,
                   hide=()):
    """Run every call, restarting the child after a crash or timeout (that exercise's remaining
    calls are marked not run). Never raises for anything the student's code does."""
    limits = limits or Limits()
    _become_subreaper()
    outcomes: dict = {}
    cell_status: dict = {}
    printed = []
    maxrss = 0
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
                    "timeout", message="the notebook's total time limit ran out before this test")
            break
        lim = Limits(limits.call_seconds, remaining, limits.memory_bytes, limits.nproc)
        st = run_once(preamble, run_cells, run_calls, arrays, lim, triton, hide)
        maxrss = max(maxrss, st["maxrss_kb"])
        printed.append(st["stdout"])
        cell_status.update(st["cells"])
        outcomes.update(st["results"])
        if st["done"] and st["problem"] is None:
            break
        culprit_call = st["in_call"]
        if culprit_call is not None:
            lim.call_seconds = timeouts_of(run_calls).get(culprit_call, lim.call_seconds)
        why = _explain(st, lim)
        if culprit_call is not None:
            ex = next(c["exercise"] for c in run_calls if c["id"] == culprit_call)
            status = "timeout" if st["problem"] == "timeout" else "crash"
            outcomes[culprit_call] = CallOutcome(status, message=why)
            bad_exercises[ex] = f"not run: an earlier test of this exercise failed ({why})"
        elif st["in_cell"] is not None:
            ex = st["in_cell"]
            cell_status[ex] = {"ok": False, "error": {"type": "Crash",
                                                      "message": f"while your code cell ran: {why}"}}
            bad_exercises[ex] = f"your code cell for this exercise stopped the grader's process ({why})"
        else:  # died outside any call (e.g. while starting, or garbage on the pipe)
            for c in run_calls:
                if c["id"] not in outcomes:
                    outcomes[c["id"]] = CallOutcome("crash", message=why)
            break
        restarts += 1
        pending_cells = [c for c in run_cells if c["exercise"] not in bad_exercises]
        pending = [c for c in run_calls if c["id"] not in outcomes]
    return SandboxReport(outcomes, cell_status, "".join(printed)[:4000], maxrss, restarts)


def timeouts_of(calls) -> dict:
    return {c["id"]: c.get("timeout") or 0 for c in calls}


def _explain(st, lim: Limits) -> str:
    rc = st["returncode"]
    if st["frames"] == 0 and st["problem"] is None:
        return ("the grader's sandbox failed to start (a grader problem, not yours; tell the "
                f"instructor): exit code {rc}, {st['stdout'][-300:]!r}")
    if st["problem"] == "timeout":
        return (f"time limit exceeded ({lim.call_seconds:g} s per test): an infinite loop, or far "
                "too slow")
    if st["problem"] == "too_much_output":
        return "sent back more data than any test needs"
    if st["problem"] and st["problem"].startswith("malformed"):
        return "something other than the grader wrote on the grader's result channel"
    if st["printed_too_much"]:
        return f"printed more than {MAX_PRINT_BYTES // (1 << 20)} MB"
    if rc is not None and rc < 0:
        sig = signal.Signals(-rc).name if -rc in signal.Signals._value2member_map_ else str(-rc)
        if sig == "SIGKILL":
            return "the process was killed (SIGKILL): memory or CPU limit, or a runaway process"
        if sig == "SIGXCPU":
            return "CPU time limit exceeded"
        return f"the Python process crashed ({sig})"
    if "MemoryError" in st["stdout"]:
        return "ran out of memory (the limit is a few GB)"
    return (f"the process exited early (exit code {rc}): sys.exit() or os._exit() in your code "
            "ends the grader's run, not just the test")
