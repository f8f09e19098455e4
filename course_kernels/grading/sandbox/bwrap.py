"""The bubblewrap command line: what the sandbox sees, its seccomp filter's descriptor, and the
child's environment (:mod:`.probe` checks what this machine allows). See sandbox.py."""

from __future__ import annotations

import glob
import os
import site
import sys
import sysconfig
from pathlib import Path

import numpy as np

from . import seccomp
from ._common import _tag

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
    """COURSE_GRADING_GPU=1: Triton children compile for the grader's GPU (run under bwrap on an
    H200 as root; notes/grading.md). CUDA reserves far more address space than it uses, so
    memory is then capped with RLIMIT_DATA instead of RLIMIT_AS."""
    return os.environ.get("COURSE_GRADING_GPU") == "1"


def seccomp_fd() -> int:
    """A pipe's read end holding the seccomp filter (:mod:`.seccomp`), for ``bwrap --seccomp``
    (which reads it to the end). Raises SeccompUnsupported on an architecture without tables."""
    prog = seccomp.program()
    r, w = os.pipe()
    try:
        assert len(prog) < 65536  # fits the pipe: written before bwrap reads
        os.write(w, prog)
    finally:
        os.close(w)
    return r


def _bwrap_args(bwrap, req_dir, limits, triton, mode, size=True, filter_fd=None) -> list[str]:
    """The bwrap command line. ``mode``: "userns" (a user namespace; the caller is not root:
    the launcher drops root to nobody before bwrap starts), or "root" (bwrap runs as root
    without a user namespace and keeps only CAP_SETUID/CAP_SETGID, with which :data:`DROP`
    becomes nobody before anything else runs). Either way the sandboxed code is never host
    uid 0. ``filter_fd``: the descriptor of :func:`seccomp_fd`. Every tmpfs is size-capped
    (``--size``; bubblewrap 0.8 has no option for tmpfs inodes) and all but ``/tmp`` and
    ``/box`` are read-only, the root of the sandbox included."""

    def sized(n):
        return ["--size", str(n)] if size else []

    a = [bwrap, "--die-with-parent", "--new-session", "--cap-drop", "ALL"]
    if filter_fd is not None:
        a += ["--seccomp", str(filter_fd)]
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
        a += sized(limits.tmpfs_bytes) + ["--perms", "1777", "--tmpfs", d]
    py_roots = {
        os.path.realpath(sys.base_prefix),
        os.path.realpath(sys.prefix),
        os.path.dirname(os.path.dirname(_python())),
    }
    a += _bind_args(sorted(py_roots) + _site_paths())
    a += _hide_args(req_dir, py_roots, triton, sized(SMALL_TMPFS))
    # a fresh /proc whose kernel settings are read-only; a read-only /dev on a capped tmpfs (not
    # bwrap's --dev, which --size cannot cap) holding the harmless device nodes and fd links
    a += ["--proc", "/proc", "--ro-bind", "/proc/sys", "/proc/sys"]
    a += ["--ro-bind-try", "/proc/sysrq-trigger", "/proc/sysrq-trigger"]
    a += sized(SMALL_TMPFS) + ["--perms", "0755", "--tmpfs", "/dev"]
    for node in DEV_NODES:
        a += ["--dev-bind", f"/dev/{node}", f"/dev/{node}"]
    for target, link in DEV_LINKS:
        a += ["--symlink", target, link]
    if _gpu_mode():
        for dev in sorted(os.listdir("/dev")):
            if dev.startswith("nvidia"):
                a += ["--dev-bind", f"/dev/{dev}", f"/dev/{dev}"]
        # what the CUDA driver's loader reads: never all of /etc (/etc/shadow, keys, ...)
        for name in GPU_ETC:
            a += ["--ro-bind-try", name, name]
        cuda_dir = libcuda_dir()
        if cuda_dir and not cuda_dir.startswith("/usr/"):  # /usr is bound already
            a += ["--ro-bind-try", cuda_dir, cuda_dir]
    a += ["--remount-ro", "/dev"]
    a += ["--ro-bind", req_dir, "/req", "--chdir", "/box"]
    # bwrap's own root tmpfs (and the parent folders made on it) would be writable and uncapped
    # in a user namespace, where its owner is the sandbox's nobody
    a += ["--remount-ro", "/"]
    return a


SMALL_TMPFS = 1 << 20  # /dev and the covers over hidden packages: a few empty mount points
DEV_NODES = ("null", "zero", "full", "random", "urandom")
DEV_LINKS = (
    ("/proc/self/fd", "/dev/fd"),
    ("/proc/self/fd/0", "/dev/stdin"),
    ("/proc/self/fd/1", "/dev/stdout"),
    ("/proc/self/fd/2", "/dev/stderr"),
)


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


def _hide_args(req_dir, py_roots, triton, sized=()) -> list[str]:
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
                a += [*sized, "--tmpfs", target]
                a += ["--ro-bind", blocked, os.path.join(target, "__init__.py")]
                a += ["--remount-ro", target]
    return a


#: The only files of /etc a GPU child sees (the dynamic loader's configuration).
GPU_ETC = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d")


def _drop_prefix(mode) -> list[str]:
    """What goes before the child's command inside bwrap: in root mode, :data:`DROP`."""
    return [_python(), "-I", "-S", "-c", DROP] if mode == "root" else []


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
        cuda_dir = libcuda_dir()
        if cuda_dir:  # Triton then skips its `ldconfig -p` (which failed inside on the H200)
            env["TRITON_LIBCUDA_PATH"] = cuda_dir
    return env


def libcuda_dir() -> str | None:
    """The folder of the CUDA driver library (libcuda.so.1) as the grader's loader finds it:
    ``$TRITON_LIBCUDA_PATH``, else ``ldconfig -p``, else ``$LD_LIBRARY_PATH``. A GPU child gets
    it as ``TRITON_LIBCUDA_PATH`` (and the folder read-only), because Triton's own lookup runs
    ``/sbin/ldconfig -p``, which exited 1 inside the sandbox on the H200 (notes/grading.md)."""
    if os.environ.get("TRITON_LIBCUDA_PATH"):
        return os.environ["TRITON_LIBCUDA_PATH"]
    import subprocess

    try:
        out = subprocess.run(
            ["/sbin/ldconfig", "-p"], capture_output=True, text=True, timeout=20
        ).stdout
    except (OSError, subprocess.SubprocessError):
        out = ""
    for line in out.splitlines():
        if line.strip().startswith("libcuda.so.1 ") and "=>" in line:
            return os.path.dirname(line.split("=>", 1)[1].strip())
    for d in os.environ.get("LD_LIBRARY_PATH", "").split(":"):
        if d and os.path.exists(os.path.join(d, "libcuda.so.1")):
            return d
    return None
