"""A warm parent for sandboxed children: torch and Triton imported once, each submission forked.

Importing torch costs seconds; forking a process that already has it costs milliseconds. This
trusted script (no student code ever runs in it) runs as PID 1 of its own PID namespace
(``unshare --pid --fork --kill-child``), started by :mod:`.sandbox` only where that namespace
exists. Protocol, one JSON line each way on stdin/stdout:

- in: ``{"tmp", "box", "hide", "stdout", "fifo", "cpu", "memory", "fsize"}`` -> fork a child that
  redirects its output, closes this channel, isolates its mounts, sets limits and serves the
  request exactly like a freshly started ``_child.py``;
- in: ``{"kill": true}`` -> SIGKILL every other process of the namespace;
- out: ``{"ready": true}`` once, then ``{"status", "maxrss"}`` when a child ends (every process it
  left behind is killed first: ``kill(-1)`` from PID 1 reaches the whole namespace and only it).
"""

import json
import os
import resource
import select
import signal
import sys

sys.path[:0] = json.loads(sys.argv[1])
HERE = os.path.dirname(os.path.abspath(__file__))


def _load_child():
    import importlib.util

    spec = importlib.util.spec_from_file_location("_grading_child", os.path.join(HERE, "_child.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


child = _load_child()
import numpy  # noqa: E402,F401
import torch  # noqa: E402,F401
import triton  # noqa: E402,F401
import triton.language  # noqa: E402,F401
import triton.runtime.interpreter  # noqa: E402,F401


def run_child(req):
    os.setsid()
    out = os.open(req["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    result = os.open(req["fifo"], os.O_WRONLY)
    null = os.open("/dev/null", os.O_RDONLY)
    os.dup2(null, 0)  # closes the control channel (stdin/stdout) in the child
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(out)
    os.close(null)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    child.hide_and_freeze(req["tmp"], req["hide"], req["box"])
    resource.setrlimit(resource.RLIMIT_CPU, (req["cpu"], req["cpu"] + 5))
    limit = getattr(resource, "RLIMIT_" + req.get("memory_rlimit", "AS"))
    resource.setrlimit(limit, (req["memory"], req["memory"]))
    resource.setrlimit(resource.RLIMIT_FSIZE, (req["fsize"], req["fsize"]))
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    sys.stdout = open(1, "w", closefd=False)
    sys.stderr = open(2, "w", closefd=False)
    child.serve(req["box"], result)


def reap_all(target):
    status = maxrss = None
    while True:
        try:
            pid, st, ru = os.wait4(-1, os.WNOHANG)
        except ChildProcessError:
            return status, maxrss, True
        if pid == 0:
            return status, maxrss, False
        if pid == target:
            status, maxrss = os.waitstatus_to_exitcode(st), ru.ru_maxrss


_pending = bytearray()


def read_line(timeout=None):
    """One line from the control channel (fd 0), unbuffered so that select() stays truthful."""
    while b"\n" not in _pending:
        if timeout is not None and not select.select([0], [], [], timeout)[0]:
            return None
        chunk = os.read(0, 65536)
        if not chunk:
            return ""
        _pending.extend(chunk)
    line, _, rest = bytes(_pending).partition(b"\n")
    _pending[:] = rest
    return line.decode()


def kill_all():
    try:
        os.kill(-1, signal.SIGKILL)
    except ProcessLookupError:
        pass


def main():
    print(json.dumps({"ready": True}), flush=True)
    while True:
        line = read_line()
        if not line:
            return
        req = json.loads(line)
        if req.get("kill"):
            continue
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                run_child(req)
            except BaseException:  # noqa: BLE001 - the child must never return into the loop
                code = 70
            finally:
                os._exit(code)
        result = None
        while result is None:
            cmd = read_line(0.05)
            if cmd == "":
                kill_all()
                return
            if cmd and json.loads(cmd).get("kill"):
                kill_all()
            status, maxrss, _ = reap_all(pid)
            if status is not None:
                result = {"status": status, "maxrss": maxrss}
        kill_all()  # whatever the child left behind
        while not reap_all(-2)[2]:
            select.select([], [], [], 0.01)
        print(json.dumps(result), flush=True)


main()
