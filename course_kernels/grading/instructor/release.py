"""What the instructor hands out: the student release (``course-grade release``) and a Gradescope
autograder bundle for one exercise (``course-grade gradescope``).

Both work from an installed package as from a checkout: the release builds the students'
notebooks from the package's exercise specs (:func:`course_kernels.grading.notebooks.build`),
stamped with the repository address (:data:`course_kernels.colab.REPOSITORY_URL`) as the Colab
copies are; the bundle ships a wheel of the package it was made from (:func:`package_wheel`),
which its ``setup.sh`` installs into a fresh virtual environment.
"""

from __future__ import annotations

import base64
import hashlib
import re
import zipfile
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2]  # the course_kernels folder


def _solution_sources(nb) -> dict:
    return {
        c.metadata["course_kernels"]["exercise"]: c.source.strip()
        for c in nb.cells
        if c.metadata.get("course_kernels", {}).get("role") == "solution"
    }


def release_notebooks(url: str | None = None) -> dict:
    """file name -> the student's notebook (JSON text): stubs and visible tests, no solution, no
    hidden test, outputs empty, the setup cell stamped with the repository address."""
    import nbformat

    from course_kernels.colab import REPOSITORY_URL, stamp_setup_cell
    from course_kernels.grading.notebooks import NOTEBOOKS, build

    url = (url or REPOSITORY_URL).rstrip("/")
    out = {}
    for name in NOTEBOOKS:
        nb = build(name, False, url)
        solved = _solution_sources(build(name, True, url))
        for ex, src in _solution_sources(nb).items():
            if src == solved.get(ex):
                raise SystemExit(f"{name}: the exercise cell of {ex} holds the solution")
        for cell in nb.cells:
            if cell.cell_type == "code":
                cell.outputs, cell.execution_count = [], None
            if cell.metadata.get("course_kernels", {}).get("role") == "setup":
                cell.source = stamp_setup_cell(cell.source, url)
        out[f"{name}.ipynb"] = nbformat.writes(nb) + "\n"
    if not out:
        raise SystemExit("no exercises in this install of course_kernels")
    return out


def release(out: str, as_zip: bool = False, url: str | None = None) -> Path:
    """The student version (:func:`release_notebooks`) as a folder, or a zip with ``as_zip``."""
    notebooks = release_notebooks(url)
    out_path = Path(out)
    if as_zip:
        target = out_path if out_path.suffix == ".zip" else out_path.with_suffix(".zip")
        target.parent.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as z:
            for name, text in sorted(notebooks.items()):
                z.writestr(f"exercises/{name}", text)
        return target
    out_path.mkdir(parents=True, exist_ok=True)
    for name, text in sorted(notebooks.items()):
        (out_path / name).write_text(text, encoding="utf-8")
    return out_path


# -- a wheel of this package, made from what is installed (or checked out) ------------------------
def _metadata() -> tuple[str, str, str]:
    """(version, METADATA text, entry_points.txt) of this package: from the checkout's
    pyproject.toml when the package sits in a checkout, else from the installed distribution."""
    pyproject = PACKAGE.parent / "pyproject.toml"
    try:
        import tomllib
    except ImportError:  # Python 3.10: the installed distribution's metadata
        tomllib = None
    if tomllib and pyproject.is_file() and 'name = "course_kernels"' in pyproject.read_text():
        project = tomllib.loads(pyproject.read_text())["project"]
        lines = [
            "Metadata-Version: 2.1",
            f"Name: {project['name']}",
            f"Version: {project['version']}",
            f"Summary: {project.get('description', '')}",
            f"Requires-Python: {project.get('requires-python', '>=3.10')}",
        ]
        lines += [f"Requires-Dist: {d}" for d in project.get("dependencies", [])]
        for extra, deps in project.get("optional-dependencies", {}).items():
            lines.append(f"Provides-Extra: {extra}")
            lines += [f'Requires-Dist: {d}; extra == "{extra}"' for d in deps]
        scripts = project.get("scripts", {})
        entry = "[console_scripts]\n" + "".join(f"{k} = {v}\n" for k, v in scripts.items())
        return project["version"], "\n".join(lines) + "\n", entry
    import importlib.metadata as md

    dist = md.distribution("course_kernels")
    return dist.version, dist.read_text("METADATA") or "", dist.read_text("entry_points.txt") or ""


def package_wheel(dest: Path) -> Path:
    """A wheel (py3-none-any) of the course_kernels package this code belongs to: its files as
    they are (package data included), with the distribution's metadata. Returns its path."""
    version, metadata, entry = _metadata()
    version = re.sub(r"[^\w.]+", "_", version)
    info = f"course_kernels-{version}.dist-info"
    files = {}
    for p in sorted(PACKAGE.rglob("*")):
        if p.is_file() and "__pycache__" not in p.parts and p.suffix not in (".pyc", ".pyo"):
            files[f"course_kernels/{p.relative_to(PACKAGE).as_posix()}"] = p.read_bytes()
    files[f"{info}/METADATA"] = metadata.encode()
    files[f"{info}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: course-grade\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    if entry.strip():
        files[f"{info}/entry_points.txt"] = entry.encode()
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append(f"{info}/RECORD,,")
    files[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    dest.mkdir(parents=True, exist_ok=True)
    target = dest / f"course_kernels-{version}-py3-none-any.whl"
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in files.items():
            z.writestr(name, data)
    return target


def gradescope_bundle(exercise: str, out: str, hidden=None) -> Path:
    """A Gradescope autograder zip for one exercise notebook: ``setup.sh`` (installs Python,
    bubblewrap and the wheel of this package shipped in the bundle), ``run_autograder`` (grades
    one notebook of the upload with the bundle's hidden tests and writes
    ``/autograder/results/results.json``), the hidden tests and ``wheels/course_kernels-*.whl``.
    Works from an installed package as from a checkout."""
    import tempfile

    from course_kernels.grading.exercises import DEFAULT_HIDDEN, notebook_of

    nb = notebook_of(exercise)
    here = Path(__file__).resolve().parent / "gradescope"
    hidden_dir = Path(hidden) if hidden else DEFAULT_HIDDEN
    if hidden and not (hidden_dir / f"{nb.name}.json").is_file():
        raise SystemExit(f"no hidden tests {nb.name}.json in {hidden_dir}")
    with tempfile.TemporaryDirectory() as tmp:
        wheel = package_wheel(Path(tmp))
        entries = {
            "setup.sh": (here / "setup.sh").read_bytes(),
            "run_autograder": (here / "run_autograder").read_bytes(),
            "exercise.txt": (nb.name + "\n").encode(),
            "triton.txt": (("1" if nb.triton else "0") + "\n").encode(),
            f"wheels/{wheel.name}": wheel.read_bytes(),
        }
        if (hidden_dir / f"{nb.name}.json").is_file():
            entries[f"hidden_tests/{nb.name}.json"] = (hidden_dir / f"{nb.name}.json").read_bytes()
        target = Path(out)
        target = target if target.suffix == ".zip" else target.with_suffix(".zip")
        target.parent.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as z:
            for name, data in sorted(entries.items()):
                info = zipfile.ZipInfo(name)
                info.external_attr = (
                    0o755 if name in ("setup.sh", "run_autograder") else 0o644
                ) << 16
                info.compress_type = zipfile.ZIP_DEFLATED
                z.writestr(info, data)
    return target


__all__ = ["gradescope_bundle", "package_wheel", "release", "release_notebooks"]
