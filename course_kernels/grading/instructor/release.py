"""What the instructor hands out: the student release (``python -m course_kernels.grading release``)
and a Gradescope autograder bundle for one exercise (``python -m course_kernels.grading gradescope``).

Split from :mod:`course_kernels.grading.instructor.cli` (which re-exports these names). Both are built from a
checkout of the repository (the exercise and solution notebooks, the packages, ``gradescope/``).
"""

from __future__ import annotations

import json
from pathlib import Path


def release(out: str, as_zip: bool = False) -> Path:
    """The student version: the exercise notebooks (stubs and visible tests; the solutions and
    hidden tests live elsewhere) with outputs cleared, as a folder or a zip."""
    import shutil
    import tempfile
    import zipfile

    repo = Path(__file__).resolve().parents[3]
    src = repo / "exercises"
    notebooks = sorted(src.glob("[0-9][0-9]_*.ipynb"))
    if not notebooks:
        raise SystemExit(f"no exercise notebooks in {src}")
    solved = {}
    for p in sorted((repo / "solutions").glob("[0-9][0-9]_*.ipynb")):
        nb = json.loads(p.read_text())
        solved[p.name] = [
            c
            for c in nb["cells"]
            if c.get("metadata", {}).get("course_kernels", {}).get("role") == "solution"
        ]
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "exercises"
        folder.mkdir()
        for p in notebooks:
            nb = json.loads(p.read_text())
            for cell in nb["cells"]:
                if cell.get("cell_type") == "code":
                    cell["outputs"], cell["execution_count"] = [], None
                meta = cell.get("metadata", {}).get("course_kernels", {})
                if meta.get("role") == "solution":
                    body = (
                        "".join(cell["source"])
                        if isinstance(cell["source"], list)
                        else cell["source"]
                    )
                    for sol in solved.get(p.name, []):
                        ssrc = (
                            "".join(sol["source"])
                            if isinstance(sol["source"], list)
                            else sol["source"]
                        )
                        if (
                            sol["metadata"]["course_kernels"].get("exercise")
                            == meta.get("exercise")
                            and ssrc.strip() == body.strip()
                        ):
                            raise SystemExit(
                                f"{p.name}: the exercise cell of "
                                f"{meta.get('exercise')} holds the solution"
                            )
            (folder / p.name).write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
        out_path = Path(out)
        if as_zip:
            target = out_path if out_path.suffix == ".zip" else out_path.with_suffix(".zip")
            target.parent.mkdir(parents=True, exist_ok=True)
            with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as z:
                for p in sorted(folder.iterdir()):
                    z.write(p, f"exercises/{p.name}")
            return target
        out_path.mkdir(parents=True, exist_ok=True)
        for p in sorted(folder.iterdir()):
            shutil.copy(p, out_path / p.name)
        return out_path


def gradescope_bundle(exercise: str, out: str, hidden=None) -> Path:
    """A Gradescope autograder zip for one exercise notebook: ``setup.sh`` (installs Python,
    bubblewrap and this package from the bundle), ``run_autograder`` (grades the submission with
    the bundle's hidden tests, writes ``/autograder/results/results.json``), the hidden tests and
    a copy of the course package. Built from a checkout of the repository."""
    import shutil
    import tempfile
    import zipfile

    from course_kernels.grading.exercises import DEFAULT_HIDDEN, notebook_of

    nb = notebook_of(exercise)
    repo = Path(__file__).resolve().parents[3]
    here = Path(__file__).resolve().parent / "gradescope"
    hidden_dir = Path(hidden) if hidden else DEFAULT_HIDDEN
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "bundle"
        (src / "hidden_tests").mkdir(parents=True)
        for name in ("setup.sh", "run_autograder"):
            shutil.copy(here / name, src / name)
        (src / "exercise.txt").write_text(nb.name + "\n")
        (src / "triton.txt").write_text(("1" if nb.triton else "0") + "\n")
        if (hidden_dir / f"{nb.name}.json").is_file():
            shutil.copy(hidden_dir / f"{nb.name}.json", src / "hidden_tests")
        course = src / "course"
        for package in ("course_kernels",):
            shutil.copytree(
                repo / package,
                course / package,
                ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
            )
        for name in ("pyproject.toml", "README.md", "requirements/constraints.txt"):
            (course / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(repo / name, course / name)
        target = Path(out)
        target = target if target.suffix == ".zip" else target.with_suffix(".zip")
        target.parent.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as z:
            for p in sorted(src.rglob("*")):
                if p.is_file():
                    info = zipfile.ZipInfo(p.relative_to(src).as_posix())
                    info.external_attr = (
                        0o755 if p.name in ("setup.sh", "run_autograder") else 0o644
                    ) << 16
                    info.compress_type = zipfile.ZIP_DEFLATED
                    z.writestr(info, p.read_bytes())
    return target
