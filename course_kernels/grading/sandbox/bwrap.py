"""The bubblewrap command line: what the sandbox sees, the child's environment, and the probe
of what this machine allows (bwrap, user namespaces, cgroups). See sandbox.py for the design."""

from __future__ import annotations

import glob
import os
import shutil
import site
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import numpy as np

from ._common import Limits, SandboxUnavailable, _tag
from .cgroups import Cgroup

# Our own packages and libraries that do a NumPy exercise for the student: covered by an empty
# tmpfs inside the sandbox (a wall, where the source lint is only a lint).
HIDDEN_PACKAGES = ("course_kernels", "scipy", "flash_attn", "jax", "tensorflow")
NUMPY_ONLY_HIDDEN = ("torch", "triton", "functorch", "torchgen")


#: The unprivileged uid/gid sandboxed code runs as (``nobody``): never the grader's root.
NOBODY = 65534

# Run by the sandbox's first process when bubblewrap runs as root without a user namespace
# (``mode == "root"``): bubblewrap keeps only CAP_SETUID/CAP_SETGID, this drops to nobody (which
# clears every capability) and execs the child. NO_NEW_PRIVS (bubblewrap sets it) keeps it there.
DROP = (
    "import os, sys\n"
    f"os.setgroups([]); os.setresgid({NOBODY}, {NOBODY}, {NOBODY}); "
    f"os.setresuid({NOBODY}, {NOBODY}, {NOBODY})\n"
    "if 0 in os.getresuid() + os.getresgid() + tuple(os.getgroups()):\n    os._exit(126)\n"
    "os.execv(sys.argv[1], sys.argv[1:])\n"
)

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

BLOCKED = (
    'raise ImportError(f"{__name__} is not available while grading this exercise: write '
    'the algorithm yourself")\n'
)


# -- what the sandbox can see -----------------------------------------------------------------
def _site_paths() -> list[str]:
    """Where numpy/torch/triton live: site-packages, never a checkout of the repository (an
    installed course_kernels lives in site-packages next to numpy: that folder is kept, and the
    package is covered inside the sandbox)."""
    holder = os.path.realpath(Path(__file__).resolve().parents[3])  # holds course_kernels
    sites = [os.path.realpath(p) for p in site.getsitepackages()]
    for key in ("purelib", "platlib"):
        sites.append(os.path.realpath(sysconfig.get_paths()[key]))
    paths = []
    numpy_dirs = [  # where numpy is found, and where it really is (a folder of symlinks)
        os.path.realpath(os.path.dirname(np.__path__[0])),
        os.path.dirname(os.path.realpath(np.__path__[0])),
    ]
    for real in sites + numpy_dirs:
        if real in paths or not os.path.isdir(real):
            continue
        if real == holder and real not in sites:
            continue  # a checkout (or a PYTHONPATH folder): the course's source, not a library
        paths.append(real)
    return paths


def _all_site_dirs(roots) -> list[str]:
    """Every folder a library could be imported from inside the sandbox: the sys.path folders,
    and the site-/dist-packages of each bound Python root and of /usr (the base interpreter's
    own site-packages is bound with it, and a student could append it to sys.path)."""
    found = list(_site_paths())
    patterns = []
    for root in list(roots) + ["/usr", "/usr/local"]:
        patterns += [
            os.path.join(root, "lib", "python3*", "site-packages"),
            os.path.join(root, "lib", "python3*", "dist-packages"),
            os.path.join(root, "lib", "python3", "dist-packages"),
            os.path.join(root, "lib64", "python3*", "site-packages"),
        ]
    for pattern in patterns:
        for d in sorted(glob.glob(pattern)):
            real = os.path.realpath(d)
            if os.path.isdir(real) and real not in found:
                found.append(real)
    return found


def _python() -> str:
    return os.path.realpath(sys.executable)


def _gpu_mode() -> bool:
    """COURSE_GRADING_GPU=1: Triton children compile for the grader's GPU (not verified under
    bwrap; see notes/grading.md). CUDA reserves far more address space than it uses, so memory is
    then capped with RLIMIT_DATA instead of RLIMIT_AS."""
    return os.environ.get("COURSE_GRADING_GPU") == "1"


def _bwrap_args(bwrap, req_dir, limits, triton, mode, size=True) -> list[str]:
    """The bwrap command line. ``mode``: "userns" (a user namespace; the caller is not root:
    the launcher drops root to nobody before bwrap starts), or "root" (bwrap runs as root
    without a user namespace and keeps only CAP_SETUID/CAP_SETGID, with which :data:`DROP`
    becomes nobody before anything else runs). Either way the sandboxed code is never host
    uid 0."""
    a = [bwrap, "--die-with-parent", "--new-session", "--cap-drop", "ALL"]
    # every namespace but the user namespace (--unshare-all would add a user namespace mapping
    # only root, in which nobody does not exist)
    a += [
        "--unshare-ipc",
        "--unshare-pid",
        "--unshare-net",
        "--unshare-uts",
        "--unshare-cgroup-try",
    ]
    if mode == "root":
        a += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        a += ["--unshare-user", "--uid", str(NOBODY), "--gid", str(NOBODY), "--disable-userns"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            a += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            a += ["--ro-bind", top, top]
    a += ["--ro-bind", "/usr", "/usr"]
    # fresh /tmp and /box first: an interpreter that lives under /tmp is bound on top of it
    # (and nothing else of the host's /tmp is seen)
    for d in ("/tmp", "/box"):
        a += (["--size", str(limits.tmpfs_bytes)] if size else []) + ["--perms", "1777"]
        a += ["--tmpfs", d]
    py_roots = {
        os.path.realpath(sys.base_prefix),
        os.path.realpath(sys.prefix),
        os.path.dirname(os.path.dirname(_python())),
    }
    a += _bind_args(sorted(py_roots) + _site_paths())
    a += _hide_args(req_dir, py_roots, triton)
    # a fresh /proc whose kernel settings are read-only; a /dev that nothing can be created in
    # (its tmpfs is outside every size limit): the device nodes, /dev/pts, the fd links only
    a += ["--proc", "/proc", "--ro-bind", "/proc/sys", "/proc/sys"]
    a += ["--ro-bind-try", "/proc/sysrq-trigger", "/proc/sysrq-trigger"]
    a += ["--dev", "/dev"]
    if _gpu_mode():
        for dev in sorted(os.listdir("/dev")):
            if dev.startswith("nvidia"):
                a += ["--dev-bind", f"/dev/{dev}", f"/dev/{dev}"]
        # what the CUDA driver's loader reads: never all of /etc (/etc/shadow, keys, ...)
        for name in GPU_ETC:
            a += ["--ro-bind-try", name, name]
    a += ["--remount-ro", "/dev"]
    a += ["--ro-bind", req_dir, "/req", "--chdir", "/box"]
    return a


def _bind_args(paths) -> list[str]:
    """Read-only binds of ``paths``, their parents made first as 0755 folders (bwrap would copy
    a 0700 /root, which nobody cannot traverse)."""
    binds = [p for p in paths if os.path.isdir(p) and not p.startswith("/usr/")]
    a: list[str] = []
    made: set = set()
    for p in binds:
        for parent in reversed(Path(p).parents[:-1]):
            if str(parent) not in made and str(parent) not in ("/tmp", "/usr"):
                made.add(str(parent))
                a += ["--perms", "0755", "--dir", str(parent)]
    for p in binds:
        a += ["--ro-bind", p, p]
    return a


def _hide_args(req_dir, py_roots, triton) -> list[str]:
    """Cover each hidden package, in every site folder, with a package whose import fails (an
    empty folder would import as a namespace package)."""
    hidden = HIDDEN_PACKAGES + (() if triton else NUMPY_ONLY_HIDDEN)
    a: list[str] = []
    bound = [*py_roots, *_site_paths(), "/usr"]
    done = set()
    for sp in _all_site_dirs(py_roots):
        for name in hidden:
            target = os.path.realpath(os.path.join(sp, name))  # a symlink: cover what it names
            inside = any(target.startswith(b.rstrip("/") + "/") for b in bound)
            if os.path.isdir(target) and inside and target not in done:
                done.add(target)
                blocked = os.path.join(req_dir, "_blocked.py")
                a += ["--tmpfs", target, "--ro-bind", blocked, os.path.join(target, "__init__.py")]
                a += ["--remount-ro", target]
    return a


#: The only files of /etc a GPU child sees (the dynamic loader's configuration).
GPU_ETC = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d")


def _drop_prefix(mode) -> list[str]:
    """What goes before the child's command inside bwrap: in root mode, :data:`DROP`."""
    return [_python(), "-I", "-S", "-c", DROP] if mode == "root" else []


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
    gid 65534 and be unable to open kernel settings (``/proc/sys``) for writing."""
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
                cmd = _bwrap_args(out["bwrap"], req, Limits(), False, mode, size)
                cmd += _drop_prefix(mode) + [_python(), "-I", "-S", "-c", PROBE]
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
                    )
                except (OSError, subprocess.SubprocessError) as e:
                    errors.append(str(e))
                    continue
                if r.returncode != 0:
                    errors.append(r.stderr.strip()[-300:])
                    continue
                ids = r.stdout.split()
                if ids[:3] != [str(NOBODY)] * 3 or ids[3:] != ["0"]:
                    errors.append(f"unsafe sandbox in mode {mode}: the child reported {ids}")
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
