"""A Python that has only what Colab preinstalls, for tests/test_colab_wheel.py.

Colab ships torch, Triton, NumPy, matplotlib, tqdm, pip and Jupyter (IPython, ipykernel,
nbclient), never course_kernels. :func:`colab_like_site` builds that set from the test's own
environment without the network: a folder of symlinks to those distributions and everything they
require (their dependency closure, read from ``importlib.metadata``), and nothing else (no
course_kernels, no myst-nb, no pytest). :func:`fresh_venv` makes an empty virtual environment
that sees that folder (a ``.pth`` line) and nothing of the repository; ``pip install`` there
installs into the venv itself, as on Colab.
"""

from __future__ import annotations

import importlib.metadata as md
import re
import subprocess
import sys
from pathlib import Path

# What Colab preinstalls that the notebooks use (torch: `pip install torch==2.13.0`, the CPU build).
COLAB_PREINSTALLED = [
    "torch",
    "triton",
    "numpy",
    "matplotlib",
    "tqdm",
    "pip",
    "ipykernel",
    "ipython",
    "nbclient",
    "nbformat",
    "jupyter_client",
]
NEVER = {"course-kernels", "course_kernels", "myst-nb", "jupyter-book", "pytest"}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def closure(roots=COLAB_PREINSTALLED) -> list[md.Distribution]:
    """The installed distributions ``roots`` and, recursively, what they require."""
    from packaging.requirements import Requirement

    seen: dict[str, md.Distribution] = {}
    todo = list(roots)
    while todo:
        name = _norm(todo.pop())
        if name in seen:
            continue
        if name in NEVER:
            raise RuntimeError(f"{name} would be in the Colab-like environment")
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            raise RuntimeError(
                f"{name} is needed for the Colab-like environment but not installed "
                "in the test's Python (install the test extra)"
            ) from None
        seen[name] = dist
        for spec in dist.requires or []:
            req = Requirement(spec)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return list(seen.values())


def colab_like_site(dest: Path) -> Path:
    """Symlink every top-level module of :func:`closure` into ``dest``. Returns ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    for dist in closure():
        base = Path(str(dist.locate_file("")))
        tops = {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
        for top in tops:
            src = base / top
            link = dest / top
            if src.exists() and not link.exists() and top != "__pycache__":
                link.symlink_to(src)
    return dest


def fresh_venv(path: Path, site: Path) -> Path:
    """An empty venv (no pip of its own) that imports from ``site``. Returns its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    python = path / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (Path(purelib) / "colab_preinstalled.pth").write_text(str(site) + "\n")
    return python


def build_wheel(tmp: Path) -> Path:
    """A wheel of this checkout, built offline from a copy of what the wheel is made of (the
    checkout gets no build/ folder). Returns the wheel's path."""
    import shutil

    root = Path(__file__).resolve().parents[1]
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(root / name, src / name)
    shutil.copytree(
        root / "course_kernels",
        src / "course_kernels",
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
    )
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            str(src),
            "-w",
            str(tmp / "dist"),
        ],
        check=True,
    )
    (whl,) = (tmp / "dist").glob("course_kernels-*.whl")
    return whl
