"""The start-up probe: what this machine allows (bubblewrap, user namespaces, the seccomp
filter, cgroups), checked once by running a sandbox; and the refusals that follow from it."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile

from . import seccomp
from ._common import Limits, SandboxUnavailable
from .bwrap import (
    BLOCKED,
    NOBODY,
    _bwrap_args,
    _child_env,
    _drop_prefix,
    _python,
    _site_paths,
    seccomp_fd,
)
from .cgroups import Cgroup

# What the probe runs inside a fresh sandbox: it must be nobody, unable to write kernel settings.
PROBE = (
    "import os\n"
    "bad = [p for p in ('/proc/sys/kernel/core_pattern', '/proc/sysrq-trigger', '/proc/sys/vm/drop_caches')\n"
    "       if os.path.exists(p) and os.access(p, os.W_OK)]\n"
    "for p in ('/proc/sys/kernel/core_pattern', '/proc/sys/vm/drop_caches'):\n"
    "    try:\n"
    "        os.close(os.open(p, os.O_WRONLY))\n"
    "        bad.append(p)\n"
    "    except OSError:\n"
    "        pass\n"
    "print(os.getuid(), os.geteuid(), os.getgid(), int(bool(bad)))\n"
)


_ISOLATION: dict | None = None


def isolation() -> dict:
    """What this machine allows (probed once): ``sandbox`` (bwrap works), ``userns`` (the child
    runs as nobody in a user namespace), ``cgroup`` ("v2", "v1" or None), ``why`` (when not)."""
    global _ISOLATION
    if _ISOLATION is None:
        _ISOLATION = _probe()
    return _ISOLATION


def _probe() -> dict:
    """Try the sandbox's modes (as root: "root" first, then a user namespace entered as
    nobody) and keep the first that works *and is safe*: the probe's child must report uid and
    gid 65534, be unable to open kernel settings (``/proc/sys``) for writing, and run under the
    seccomp filter (``Seccomp: 2``; ptrace, keyctl and unshare answer EPERM)."""
    out = {
        "sandbox": False,
        "userns": False,
        "mode": None,
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
    try:
        seccomp.program()
    except seccomp.SeccompUnsupported as e:
        out["why"] = str(e)
        return out
    root = os.geteuid() == 0
    modes = ("root", "userns") if root else ("userns",)
    with tempfile.TemporaryDirectory(prefix="grade-probe-") as req:
        os.chmod(req, 0o755)
        with open(os.path.join(req, "_blocked.py"), "w") as f:
            f.write(BLOCKED)
        os.chmod(os.path.join(req, "_blocked.py"), 0o644)
        errors = []
        for mode in modes:
            for size in (True, False):
                fd = seccomp_fd()
                cmd = _bwrap_args(out["bwrap"], req, Limits(), False, mode, size, fd)
                cmd += _drop_prefix(mode) + [_python(), "-I", "-S", "-c", PROBE + seccomp.PROBE]
                pre = None
                if root and mode == "userns":
                    pre = _drop_to_nobody  # bwrap itself runs as nobody: its map is nobody's
                try:
                    r = subprocess.run(
                        cmd,
                        capture_output=True,
                        timeout=60,
                        text=True,
                        env=_child_env(False),
                        preexec_fn=pre,
                        pass_fds=(fd,),
                    )
                except (OSError, subprocess.SubprocessError) as e:
                    errors.append(str(e))
                    continue
                finally:
                    os.close(fd)
                if r.returncode != 0:
                    errors.append(r.stderr.strip()[-300:])
                    continue
                ids = r.stdout.split()
                if ids[:3] != [str(NOBODY)] * 3 or ids[3:4] != ["0"]:
                    errors.append(f"unsafe sandbox in mode {mode}: the child reported {ids}")
                    continue
                if ids[4:] != ["seccomp", "2", "1"]:
                    errors.append(
                        f"bwrap did not apply the seccomp filter in mode {mode} (the child "
                        f"reported {' '.join(ids[4:])!r}, not 'seccomp 2 1': Seccomp mode 2 and "
                        "EPERM from ptrace, keyctl and unshare)"
                    )
                    continue
                out.update(sandbox=True, userns=mode == "userns", mode=mode, size=size)
                return out
    out["why"] = "bwrap cannot create a safe sandbox here: " + " | ".join(dict.fromkeys(errors))
    return out


_NOBODY_PYTHON: bool | None = None


def _nobody_can_run_python() -> bool:
    """Whether nobody can start this interpreter (``--unsafe`` as root then runs as nobody)."""
    global _NOBODY_PYTHON
    if _NOBODY_PYTHON is None:
        try:
            r = subprocess.run(
                [_python(), "-I", "-S", "-c", "import numpy"],
                capture_output=True,
                timeout=60,
                env={"PYTHONPATH": os.pathsep.join(_site_paths())},
                preexec_fn=_drop_to_nobody,
                cwd="/",
            )
            _NOBODY_PYTHON = r.returncode == 0
        except (OSError, subprocess.SubprocessError):
            _NOBODY_PYTHON = False
    return _NOBODY_PYTHON


def _drop_to_nobody() -> None:
    os.setgroups([])
    os.setresgid(NOBODY, NOBODY, NOBODY)
    os.setresuid(NOBODY, NOBODY, NOBODY)


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


#: What the CLI's ``--shared-limits`` gives up (its help string and the refusal quote it).
SHARED_LIMITS = (
    "every sandbox of your user then shares one process limit (a fork storm in one submission "
    "can make classmates' honest submissions fail), memory is limited per process only (a "
    "submission may use 4 GB in each of many processes), and the 'really tiled' tests cannot "
    "be verified, so they fail closed (score 0 with a message)"
)


def require_isolation(n_submissions: int, shared_limits: bool) -> None:
    """Refuse to grade several submissions without a cgroup per sandbox (SandboxUnavailable,
    saying what to set up) unless ``shared_limits``."""
    if n_submissions <= 1 or shared_limits or isolation()["cgroup"]:
        return
    uid = os.geteuid()
    raise SandboxUnavailable(
        f"refusing to grade {n_submissions} submissions without a cgroup per sandbox "
        f"({Cgroup.why_not}). Without one, {SHARED_LIMITS}. Set up one of: (1) a delegated "
        "cgroup v2 subtree (systemd with cgroup v2): run the grader as `systemd-run --user "
        "--scope -p Delegate=yes course-grade grade ...`; your user's systemd must delegate "
        f"the memory and pids controllers (`cat /sys/fs/cgroup/user.slice/user-{uid}.slice/"
        f"user@{uid}.service/cgroup.controllers` lists them; if not, an administrator adds "
        "`[Service]` `Delegate=memory pids cpu` in a drop-in for user@.service); or pass "
        "--cgroup DIR (COURSE_GRADING_CGROUP=DIR) naming a cgroup v2 directory you own that "
        "offers memory and pids, or --cgroup self when the grader already runs in such a scope "
        "(e.g. a shell started with `systemd-run --user --scope -p Delegate=yes bash`: its "
        "processes are moved into a leaf); (2) run the grader as root, or as root in a "
        "container; "
        "(3) pass --shared-limits to grade with shared limits anyway."
    )
