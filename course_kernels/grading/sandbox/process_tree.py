"""The process tree of one run: the trusted launcher that starts it, waiting for and reaping it,
removing the run's folder, and finding leftovers."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess

from .cgroups import leftover_cgroups

# -- the launcher: the first process of every run -----------------------------------------------
# It runs outside bwrap (trusted code, a fresh small interpreter): it dies with the grader
# (PDEATHSIG), joins the run's cgroup, sets rlimits, forks the command, and is a child subreaper,
# so it reaps every process of the tree (also those that escaped with setsid in --unsafe mode);
# on SIGTERM it kills them all. A child killed by a signal is re-raised on the launcher so that
# the grader sees a crash as a crash. (Peak memory comes from the run's cgroup only: one
# process's peak RSS misses memory spread over several processes.)
LAUNCHER = r"""
import ctypes, json, os, resource, signal, sys, time
cfg, cmd = json.loads(sys.argv[1]), sys.argv[2:]
libc = ctypes.CDLL(None, use_errno=True)
for path in cfg["cgroups"]:
    with open(path, "w") as f:
        f.write(str(os.getpid()))
if cfg.get("drop") is not None:  # root: nothing below runs as uid 0 (PDEATHSIG is set after)
    d = cfg["drop"]
    os.setgroups([])
    os.setresgid(d, d, d)
    os.setresuid(d, d, d)
    if 0 in os.getresuid() + os.getresgid() + tuple(os.getgroups()):
        os._exit(126)
libc.prctl(1, signal.SIGKILL, 0, 0, 0)
libc.prctl(36, 1, 0, 0, 0)
if os.getppid() != cfg["parent"]:
    os._exit(125)
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
R = resource
R.setrlimit(R.RLIMIT_CPU, (cfg["cpu"], cfg["cpu"] + 5))
R.setrlimit(getattr(R, "RLIMIT_" + cfg["memrl"]), (cfg["memory"], cfg["memory"]))
R.setrlimit(R.RLIMIT_FSIZE, (cfg["fsize"], cfg["fsize"]))
R.setrlimit(R.RLIMIT_NOFILE, (256, 256))
R.setrlimit(R.RLIMIT_CORE, (0, 0))
if cfg["nproc"] is not None:  # no cgroup: per uid (shared by every sandbox of that uid)
    try:
        R.setrlimit(R.RLIMIT_NPROC, (cfg["nproc"], cfg["nproc"]))
    except (ValueError, OSError):
        pass
pid = os.fork()
if pid == 0:
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
if status is None:
    os._exit(124)
if os.WIFSIGNALED(status):
    sig = os.WTERMSIG(status)
    signal.signal(sig, signal.SIG_DFL)
    os.kill(os.getpid(), sig)
code = os.waitstatus_to_exitcode(status)
os._exit(code & 0xFF)
"""


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


REAP_GRACE_SECONDS = 3.0


def _wait_for(proc, state):
    """The launcher's exit code, or None when it had to be killed.

    A child that finished exits by itself at once (_child.serve ends with os._exit): let it, so
    that its exit code is its own (a clean exit, not a kill). Then stop whatever is left.
    """
    if state["done"] and state["problem"] is None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            return proc.wait(timeout=REAP_GRACE_SECONDS)
    with contextlib.suppress(OSError):
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        return None
