"""The bubblewrap command line: what the sandbox sees, the child's environment, and the probe
of what this machine allows (bwrap, user namespaces, cgroups). See sandbox.py for the design."""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from ._common import Limits, SandboxUnavailable, _tag
from .cgroups import Cgroup

# Our own packages and libraries that do a NumPy exercise for the student: covered by an empty
# tmpfs inside the sandbox (a wall, where the source lint is only a lint).
HIDDEN_PACKAGES = ("course_kernels", "scipy", "flash_attn", "jax", "tensorflow")
NUMPY_ONLY_HIDDEN = ("torch", "triton", "functorch", "torchgen")


BLOCKED = (
    'raise ImportError(f"{__name__} is not available while grading this exercise: write '
    'the algorithm yourself")\n'
)


# -- what the sandbox can see -----------------------------------------------------------------
def _site_paths() -> list[str]:
    """Where numpy/torch/triton live: site-packages, never the repository itself."""
    # the folder that holds the course_kernels package (a checkout, or site-packages)
    repo = os.path.realpath(Path(__file__).resolve().parents[3])
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
