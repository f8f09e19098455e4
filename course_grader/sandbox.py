"""Run student code in bubblewrap, limited by a cgroup, and get back data only.

Each run of a submission is one sandbox: a small trusted launcher (``LAUNCHER`` below: it joins the
run's cgroup, sets rlimits, forks ``bwrap``, reaps everything, reports the tree's peak RSS) starts
``bwrap`` (Debian's ``bubblewrap``) with

- every namespace unshared (``--unshare-all``: mount, PID, network, IPC, UTS, cgroup; and a user
  namespace where the kernel allows one, so the child runs as ``nobody`` with no capability);
- a file system made only of read-only binds of ``/usr`` (and the ``/bin``, ``/lib*`` links), the
  Python installation and its site-packages, with the course's own packages and the libraries a
  notebook may not use covered by empty tmpfs; the request (solution cells, test inputs) read-only
  at ``/req``; fresh size-capped tmpfs at ``/tmp`` and at ``/box`` (the cwd); a fresh ``/proc`` and
  a minimal ``/dev``. No other submission, no grader, test, solution or hidden test exists there;
- ``--new-session`` and ``--die-with-parent`` (the launcher has PDEATHSIG too: a dead grader leaves
  nothing running).

Where cgroups are writable (root), the launcher and everything below it live in a fresh cgroup
(v2, or v1's memory/pids/cpu hierarchies): memory (``memory.max``, swap off), processes
(``pids.max``) and CPU share (one core) are limits of the whole tree, ``memory.peak`` (v1:
``memory.max_usage_in_bytes``) is the tiling check's measurement, and the cgroup is killed and
removed after every run. Without writable cgroups, rlimits bound each process and the launcher's
``RUSAGE_CHILDREN`` gives the largest peak RSS of any process of the tree.

Results come back on a pipe as length-prefixed frames (JSON headers + ``.npy`` bytes), bounded in
size and depth and parsed here without ever executing or unpickling anything. The child's stdout is
a file the parent opened and reads through its own descriptor.

Without a working ``bwrap`` the grader refuses to run student code (``SandboxUnavailable``) unless
``unsafe=True`` (``--unsafe`` on the command line): then the child is only a separate, rlimited
process of the grader's user. See notes/grading.md and the README for the exact guarantees.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import secrets
import select
import shutil
import signal
import site
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from course_kernels.grading.feedback import CallOutcome, clean_text

CHILD = Path(__file__).with_name("_child.py")
MAX_HEADER = 1 << 20  # bytes per frame header
MAX_RESULT_BYTES = 64 << 20  # everything a child may send back
MAX_PRINT_BYTES = 1 << 20  # stdout + stderr (RLIMIT_FSIZE on the parent-opened file)
MAX_DEPTH = 8  # nesting of returned tuples
# Our own packages and libraries that do a NumPy exercise for the student: covered by an empty
# tmpfs inside the sandbox (a wall, where the source lint is only a lint).
HIDDEN_PACKAGES = ("course_kernels", "course_grader", "scipy", "flash_attn", "jax", "tensorflow")
NUMPY_ONLY_HIDDEN = ("torch", "triton", "functorch", "torchgen")


BLOCKED = (
    'raise ImportError(f"{__name__} is not available while grading this exercise: write '
    'the algorithm yourself")\n'
)


class SandboxUnavailable(RuntimeError):
    """No working bubblewrap: student code is not run unless the caller passes ``unsafe``."""


@dataclass
class Limits:
    call_seconds: float = 20.0  # wall time of one call
    total_seconds: float = 240.0  # wall time of the whole notebook (every child together)
    memory_bytes: int = 4 << 30  # whole tree (cgroup) and per process (RLIMIT_AS)
    nproc: int = 256  # pids.max (cgroup); RLIMIT_NPROC where not root
    tmpfs_bytes: int = 64 << 20  # size of /tmp and of /box inside the sandbox


@dataclass
class SandboxReport:
    calls: dict  # call id -> CallOutcome
    cells: dict  # exercise -> {"ok": bool, "error": ...}
    stdout: str = ""
    peak_bytes: int | None = None  # largest peak of any child of this submission (None: unknown)
    restarts: int = 0


# -- what the sandbox can see -----------------------------------------------------------------
def _site_paths() -> list[str]:
    """Where numpy/torch/triton live: site-packages, never the repository itself."""
    repo = os.path.realpath(Path(__file__).resolve().parents[1])
    paths = []
    for p in site.getsitepackages() + [os.path.dirname(np.__path__[0])]:
        real = os.path.realpath(p)
        if real not in paths and os.path.isdir(real) and real != repo:
            paths.append(real)
    return paths


def _python() -> str:
    return os.path.realpath(sys.executable)


def _gpu_mode() -> bool:
    """COURSE_GRADING_GPU=1: Triton children compile for the grader's GPU (not verified under
    bwrap; see notes/grading.md). CUDA reserves far more address space than it uses, so memory is
    then capped with RLIMIT_DATA instead of RLIMIT_AS."""
    return os.environ.get("COURSE_GRADING_GPU") == "1"


def _bwrap_args(bwrap, req_dir, limits, triton, userns, size=True) -> list[str]:
    a = [bwrap, "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL"]
    if userns:
        a += ["--unshare-user", "--uid", "65534", "--gid", "65534", "--disable-userns"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            a += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            a += ["--ro-bind", top, top]
    a += ["--ro-bind", "/usr", "/usr"]
    # fresh /tmp and /box first: an interpreter that lives under /tmp is bound on top of it
    # (and nothing else of the host's /tmp is seen)
    for d in ("/tmp", "/box"):
        a += (["--size", str(limits.tmpfs_bytes)] if size else []) + ["--tmpfs", d]
    py_roots = {
        os.path.realpath(sys.base_prefix),
        os.path.realpath(sys.prefix),
        os.path.dirname(os.path.dirname(_python())),
    }
    sites = _site_paths()
    for p in sorted(py_roots) + sites:
        if os.path.isdir(p) and not p.startswith("/usr/"):
            a += ["--ro-bind", p, p]
    hidden = HIDDEN_PACKAGES + (() if triton else NUMPY_ONLY_HIDDEN)
    for sp in sites:
        for name in hidden:
            target = os.path.join(sp, name)
            if os.path.isdir(target):  # an empty folder would import as a namespace package
                a += [
                    "--tmpfs",
                    target,
                    "--ro-bind",
                    os.path.join(req_dir, "_blocked.py"),
                    os.path.join(target, "__init__.py"),
                    "--remount-ro",
                    target,
                ]
    a += ["--proc", "/proc", "--dev", "/dev"]
    if _gpu_mode():
        for dev in sorted(os.listdir("/dev")):
            if dev.startswith("nvidia"):
                a += ["--dev-bind", f"/dev/{dev}", f"/dev/{dev}"]
        a += ["--ro-bind-try", "/etc", "/etc"]
    a += ["--ro-bind", req_dir, "/req", "--chdir", "/box"]
    return a


_ISOLATION: dict | None = None


def isolation() -> dict:
    """What this machine allows (probed once): ``sandbox`` (bwrap works), ``userns`` (the child
    runs as nobody in a user namespace), ``cgroup`` ("v2", "v1" or None), ``why`` (when not)."""
    global _ISOLATION
    if _ISOLATION is None:
        _ISOLATION = _probe()
    return _ISOLATION


def _probe() -> dict:
    out = {
        "sandbox": False,
        "userns": False,
        "size": True,
        "cgroup": Cgroup.kind(),
        "why": "",
        "bwrap": shutil.which("bwrap"),
    }
    if os.environ.get("COURSE_GRADING_NO_SANDBOX") == "1":
        out["why"] = "COURSE_GRADING_NO_SANDBOX=1 is set"
        return out
    if not out["bwrap"]:
        out["why"] = "bubblewrap is not installed (apt-get install bubblewrap)"
        return out
    with tempfile.TemporaryDirectory(prefix="grade-probe-") as req:
        with open(os.path.join(req, "_blocked.py"), "w") as f:
            f.write(BLOCKED)
        errors = []
        for userns, size in ((True, True), (False, True), (True, False), (False, False)):
            if not userns and os.geteuid() != 0:
                continue  # without a user namespace, only root may create the others
            cmd = _bwrap_args(out["bwrap"], req, Limits(), False, userns, size) + [
                _python(),
                "-I",
                "-S",
                "-c",
                "import os; print(os.getuid())",
            ]
            try:
                r = subprocess.run(
                    cmd, capture_output=True, timeout=60, text=True, env=_child_env(False)
                )
            except (OSError, subprocess.TimeoutExpired) as e:
                errors.append(str(e))
                continue
            if r.returncode == 0:
                out.update(sandbox=True, userns=userns, size=size)
                return out
            errors.append(r.stderr.strip()[-300:])
    out["why"] = "bwrap cannot create its namespaces here: " + " | ".join(dict.fromkeys(errors))
    return out


def require_sandbox(unsafe: bool) -> None:
    """Raise SandboxUnavailable with the reason unless bwrap works or ``unsafe`` is given."""
    iso = isolation()
    if not iso["sandbox"] and not unsafe:
        raise SandboxUnavailable(
            f"refusing to run student code without the sandbox ({iso['why']}). Install "
            "bubblewrap (and allow user namespaces, or run as root), or pass --unsafe to run "
            "submissions as ordinary processes of your user: they could then read and change "
            "anything you can (other submissions, the hidden tests, the grader, the gradebook), "
            "signal your processes and use the network. Use --unsafe only for code you trust."
        )


# -- cgroups ------------------------------------------------------------------------------------
def _mountpoints() -> dict:
    """fstype or v1 controller -> mount point."""
    found = {}
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                fstype, _src, opts = (right.split() + ["", "", ""])[:3]
                point = left.split()[4]
                if fstype == "cgroup2":
                    found.setdefault("cgroup2", point)
                elif fstype == "cgroup":
                    for c in ("memory", "pids", "cpu"):
                        if c in opts.split(","):
                            found.setdefault(c, point)
    except OSError:
        pass
    return found


def _own_cgroup(controller: str) -> str:
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                _, ctrls, path = line.rstrip("\n").split(":", 2)
                if controller in ctrls.split(","):
                    return path
    except (OSError, ValueError):
        pass
    return "/"


class Cgroup:
    """One run's cgroup(s): limits, peak memory, kill, remove. ``None`` where not writable."""

    _kind: str | None | bool = False

    def __init__(self, kind: str, dirs: dict):
        self.kind_, self.dirs = kind, dirs  # dirs: role ("v2" | "memory" | "pids" | "cpu") -> path

    @classmethod
    def kind(cls):
        if cls._kind is False:
            g = cls.create(Limits())
            cls._kind = g.kind_ if g else None
            if g:
                g.remove()
        return cls._kind

    @classmethod
    def create(cls, limits: Limits) -> Cgroup | None:
        if os.geteuid() != 0 or os.environ.get("COURSE_GRADING_NO_CGROUP") == "1":
            return None
        mounts = _mountpoints()
        name = f"course-grading-{_tag()}{secrets.token_hex(6)}"
        v2 = mounts.get("cgroup2")
        if v2 and os.path.exists(os.path.join(v2, "cgroup.controllers")):
            try:
                with open(os.path.join(v2, "cgroup.controllers")) as f:
                    have = f.read().split()
                if {"memory", "pids"} <= set(have):
                    with open(os.path.join(v2, "cgroup.subtree_control"), "w") as f:
                        f.write(" ".join("+" + c for c in ("memory", "pids", "cpu") if c in have))
                    d = os.path.join(v2, name)
                    os.mkdir(d)
                    g = cls("v2", {"v2": d})
                    try:
                        g._write("v2", "memory.max", limits.memory_bytes)
                        g._write("v2", "memory.swap.max", 0, optional=True)
                        g._write("v2", "pids.max", limits.nproc)
                        g._write("v2", "cpu.max", "100000 100000", optional=True)
                        return g
                    except OSError:
                        g.remove()
            except OSError:
                pass
        if "memory" in mounts and "pids" in mounts:
            dirs = {}
            try:
                for c in ("memory", "pids", "cpu"):
                    if c not in mounts:
                        continue
                    base = mounts[c]
                    own = os.path.join(base, _own_cgroup(c).lstrip("/"))
                    parent = own if os.access(own, os.W_OK) else base
                    d = os.path.join(parent, name)
                    os.mkdir(d)
                    dirs[c] = d
                g = cls("v1", dirs)
                try:
                    g._write("memory", "memory.limit_in_bytes", limits.memory_bytes)
                    g._write(
                        "memory", "memory.memsw.limit_in_bytes", limits.memory_bytes, optional=True
                    )
                    g._write("pids", "pids.max", limits.nproc)
                    if "cpu" in dirs:
                        g._write("cpu", "cpu.cfs_quota_us", 100000, optional=True)
                    return g
                except OSError:
                    g.remove()
            except OSError:
                for d in dirs.values():
                    with contextlib.suppress(OSError):
                        os.rmdir(d)
        return None

    def _write(self, role, fname, value, optional=False):
        try:
            with open(os.path.join(self.dirs[role], fname), "w") as f:
                f.write(str(value))
        except OSError:
            if not optional:
                raise

    def procs_files(self) -> list[str]:
        return [os.path.join(d, "cgroup.procs") for d in self.dirs.values()]

    def peak(self) -> int | None:
        fname = (
            ("v2", "memory.peak") if self.kind_ == "v2" else ("memory", "memory.max_usage_in_bytes")
        )
        try:
            with open(os.path.join(self.dirs[fname[0]], fname[1])) as f:
                return int(f.read().strip())
        except (OSError, ValueError, KeyError):
            return None

    def _pids(self) -> list[int]:
        role = "v2" if self.kind_ == "v2" else "pids"
        try:
            with open(os.path.join(self.dirs[role], "cgroup.procs")) as f:
                return [int(x) for x in f.read().split()]
        except (OSError, ValueError):
            return []

    def kill(self) -> None:
        if self.kind_ == "v2":
            self._write("v2", "cgroup.kill", 1, optional=True)
        for _ in range(200):
            pids = self._pids()
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.005)

    def remove(self) -> None:
        self.kill()
        for d in self.dirs.values():
            for _ in range(100):
                try:
                    os.rmdir(d)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.01)


def leftover_cgroups() -> list[str]:
    """Cgroups of this grader that still exist (tests assert there are none)."""
    out = []
    for point in set(_mountpoints().values()):
        for dirpath, dirnames, _ in os.walk(point):
            out += [os.path.join(dirpath, d) for d in dirnames if d.startswith("course-grading-")]
            dirnames[:] = [d for d in dirnames if not d.startswith("course-grading-")]
            if dirpath.count(os.sep) - point.count(os.sep) > 3:
                dirnames[:] = []
    return out


# -- the launcher: the first process of every run -----------------------------------------------
# It runs outside bwrap (trusted code, a fresh small interpreter): it dies with the grader
# (PDEATHSIG), joins the run's cgroup, sets rlimits, forks the command, and is a child subreaper,
# so it reaps every process of the tree (also those that escaped with setsid in --unsafe mode);
# on SIGTERM it kills them all. Its RUSAGE_CHILDREN.ru_maxrss (the largest peak RSS of any reaped
# descendant) goes to a pipe only the grader reads. A child killed by a signal is re-raised on
# the launcher so that the grader sees a crash as a crash.
LAUNCHER = r"""
import ctypes, json, os, resource, signal, sys, time
cfg, cmd = json.loads(sys.argv[1]), sys.argv[2:]
libc = ctypes.CDLL(None, use_errno=True)
libc.prctl(1, signal.SIGKILL, 0, 0, 0)
libc.prctl(36, 1, 0, 0, 0)
if os.getppid() != cfg["parent"]:
    os._exit(125)
for path in cfg["cgroups"]:
    with open(path, "w") as f:
        f.write(str(os.getpid()))
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
R = resource
R.setrlimit(R.RLIMIT_CPU, (cfg["cpu"], cfg["cpu"] + 5))
R.setrlimit(getattr(R, "RLIMIT_" + cfg["memrl"]), (cfg["memory"], cfg["memory"]))
R.setrlimit(R.RLIMIT_FSIZE, (cfg["fsize"], cfg["fsize"]))
R.setrlimit(R.RLIMIT_NOFILE, (256, 256))
R.setrlimit(R.RLIMIT_CORE, (0, 0))
if os.geteuid() != 0:
    try:
        R.setrlimit(R.RLIMIT_NPROC, (cfg["nproc"], cfg["nproc"]))
    except (ValueError, OSError):
        pass
fd = cfg["rss_fd"]
pid = os.fork()
if pid == 0:
    os.close(fd)
    try:
        os.execv(cmd[0], cmd)
    finally:
        os._exit(127)
def children():
    out = set()
    try:
        for t in os.listdir("/proc/self/task"):
            with open("/proc/self/task/%s/children" % t) as f:
                out.update(int(x) for x in f.read().split())
    except OSError:
        pass
    return out
def kill_all():
    for p in children():
        for k in (os.killpg, os.kill):
            try:
                k(p, signal.SIGKILL)
            except OSError:
                pass
stop = []
def on_term(*_):
    stop.append(1)
    kill_all()
signal.signal(signal.SIGTERM, on_term)
status = None
while True:
    try:
        got, st = os.waitpid(-1, 0)
    except ChildProcessError:
        break
    if got == pid:
        status = st
    if status is not None or stop:
        kill_all()
os.write(fd, str(R.getrusage(R.RUSAGE_CHILDREN).ru_maxrss).encode())
os.close(fd)
if status is None:
    os._exit(124)
if os.WIFSIGNALED(status):
    sig = os.WTERMSIG(status)
    signal.signal(sig, signal.SIG_DFL)
    os.kill(os.getpid(), sig)
code = os.waitstatus_to_exitcode(status)
os._exit(code & 0xFF)
"""


def _tag() -> str:
    """COURSE_GRADING_TAG: a label put in this grader's cgroup names and children's environment,
    so that a test can find anything of its own that outlived the grading."""
    tag = "".join(c for c in os.environ.get("COURSE_GRADING_TAG", "") if c.isalnum())[:32]
    return tag + "-" if tag else ""


def leftovers(tag: str) -> dict:
    """Processes (by the COURSE_GRADING_RUN variable of their environment) and cgroups of the
    grader run labelled ``tag`` that still exist."""
    procs = []
    needle = f"COURSE_GRADING_RUN={tag}".encode()
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    if needle in f.read().split(b"\0"):
                        procs.append(int(pid))
            except OSError:
                pass
    return {
        "processes": procs,
        "cgroups": [c for c in leftover_cgroups() if f"course-grading-{tag}-" in c],
    }


def _child_env(triton: bool, home="/box") -> dict:
    env = {
        "COURSE_GRADING_RUN": _tag()[:-1],
        "PATH": "/usr/bin:/bin",
        "HOME": home,
        "TMPDIR": "/tmp" if home == "/box" else home,
        "LANG": "C.UTF-8",
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "PYTHONHASHSEED": "0",
        "PYTHONDONTWRITEBYTECODE": "1",
        "TRITON_CACHE_DIR": os.path.join(home, ".triton"),
        "MPLBACKEND": "Agg",
    }
    if triton and not _gpu_mode():
        env["TRITON_INTERPRET"] = "1"
    if _gpu_mode():
        env.update(
            {
                k: v
                for k, v in os.environ.items()
                if k in ("LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES") or k.startswith("NVIDIA_")
            }
        )
    return env


def remove_tree(path: str) -> None:
    """Remove a folder however deep it is (GNU rm has no recursion limit and no path length limit;
    shutil.rmtree in Python 3.11 recurses). Never follows symlinks."""
    if not os.path.lexists(path):
        return
    with contextlib.suppress(OSError, subprocess.TimeoutExpired):
        subprocess.run(
            ["rm", "-rf", "--one-file-system", "--", path],
            timeout=120,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    if os.path.lexists(path):
        shutil.rmtree(path, ignore_errors=True)


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
        rss_r, rss_w = os.pipe()
        fds += [rfd, wfd, rss_r, rss_w]
        cgroup = Cgroup.create(limits)
        if boxed:
            where = "/req"
            box = None
            cmd = _bwrap_args(iso["bwrap"], req_dir, limits, triton, iso["userns"], iso["size"])
            env = _child_env(triton)
        else:
            where = req_dir
            box = os.path.join(work, "box")
            os.mkdir(box, 0o700)
            cmd = []
            env = _child_env(triton, home=box)
        cmd += [_python(), "-I", "-S", os.path.join(where, "_child.py"), where, str(wfd)]
        cfg = {
            "parent": os.getpid(),
            "cgroups": cgroup.procs_files() if cgroup else [],
            "cpu": int(limits.total_seconds) + 5,
            "memory": limits.memory_bytes,
            "memrl": "DATA" if _gpu_mode() else "AS",
            "fsize": MAX_PRINT_BYTES,
            "nproc": limits.nproc,
            "rss_fd": rss_w,
        }
        proc = subprocess.Popen(
            [_python(), "-I", "-S", "-c", LAUNCHER, json.dumps(cfg)] + cmd,
            stdin=subprocess.DEVNULL,
            stdout=out_fd,
            stderr=out_fd,
            cwd=box or "/",
            env=env,
            pass_fds=(wfd, rss_w),
            close_fds=True,
            start_new_session=True,
        )
        for fd in (wfd, rss_w):
            os.close(fd)
            fds.remove(fd)
        _pump(rfd, state, calls, limits, start)
        returncode = _wait_for(proc, state)
        maxrss_kb = _read_small(rss_r)
        peak = cgroup.peak() if cgroup else None
        if peak is None and maxrss_kb and not state.get("unmeasured"):
            peak = maxrss_kb * 1024
        state["peak_bytes"] = peak
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


REAP_GRACE_SECONDS = 3.0


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


def _wait_for(proc, state):
    """The launcher's exit code, or None when it had to be killed.

    A child that finished exits by itself at once (_child.serve ends with os._exit): let it, so
    that every process of the tree is reaped by its parent and the launcher's RUSAGE_CHILDREN
    covers them (killing bwrap first would lose the numbers). Then stop whatever is left.
    """
    if state["done"] and state["problem"] is None:
        try:
            return proc.wait(timeout=REAP_GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            state["unmeasured"] = True  # the tree had to be killed: no RSS fallback
    with contextlib.suppress(OSError):
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        return None


def _read_small(fd) -> int:
    try:
        r, _, _ = select.select([fd], [], [], 0.5)
        data = os.read(fd, 32) if r else b""
    except OSError:
        data = b""
    text = data.decode("ascii", "replace")
    return int(text) if text.isdigit() else 0


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
