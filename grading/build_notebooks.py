"""Write exercises/NN_*.ipynb (stubs), solutions/NN_*.ipynb (solved, executed) and the hidden
tests' JSON from the spec modules (course_kernels/grading/specs/, gathered by sources.py).

    python grading/build_notebooks.py            # both, solutions executed (for nbval)
    python grading/build_notebooks.py --no-exec  # do not execute the solutions

The Colab install line uses the repository URL of _config.yml (repository.url).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT / "scripts"))
from run_notebook import execute_in_kernel  # noqa: E402 (the one notebook runner)
from sources import HOW, NOTEBOOKS, hidden_json, stub_from_solution  # noqa: E402


def repository_url() -> str:
    """repository.url from _config.yml (the one place it lives)."""
    text = (ROOT / "_config.yml").read_text()
    match = re.search(r"^repository:\s*\n(?:\s+.*\n)*?\s+url:\s*(\S+)", text, re.M)
    if not match:
        raise SystemExit("no repository.url in _config.yml")
    return match.group(1).rstrip("/")


def _cell(kind, source, role=None, exercise=None):
    cell = (
        nbformat.v4.new_code_cell(source)
        if kind == "code"
        else nbformat.v4.new_markdown_cell(source)
    )
    meta = {}
    if role:
        meta["role"] = role
    if exercise:
        meta["exercise"] = exercise
    if meta:
        cell.metadata["course_kernels"] = meta
    if role in ("setup", "check"):
        cell.metadata["editable"] = False
        cell.metadata["deletable"] = False
    return cell


def build(name: str, spec: dict, solved: bool):
    from course_kernels.grading.exercises import NOTEBOOKS as SPECS

    from course_kernels.grading.exercises import hidden_params

    nb_spec = SPECS[name]
    from course_kernels.grading.exercises import EXERCISES

    hidden = {
        ex: sum(c.points for c in EXERCISES[ex].cases(ps, hidden=True))
        for ex, ps in hidden_params(name).items()
    }
    total = sum(ex["points"] + hidden.get(ex["name"], 0) for ex in spec["exercises"])
    nb = nbformat.v4.new_notebook()
    nb.metadata["course_kernels"] = {"notebook": name}
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nb.metadata["language_info"] = {"name": "python"}
    title = f"# Exercise {name[:2]}: {nb_spec.title}" + (" (solution)" if solved else "")
    cells = [
        _cell(
            "md",
            f"{title}\n\n{spec['intro']}\n\n{HOW}\n\n**Points: {total:g}** (visible and hidden tests). "
            + (nb_spec.note or ""),
        ),
        _cell("code", spec["setup"].format(repo=repository_url()), role="setup"),
    ]
    for ex in spec["exercises"]:
        h = hidden.get(ex["name"], 0)
        pts = (
            f"{ex['points'] + h:g} points: {ex['points']:g} in the visible tests below, {h:g} "
            "in hidden tests"
            if h
            else f"{ex['points']:g} points"
        )
        cells.append(_cell("md", f"## `{ex['name']}` ({pts})\n\n{ex['text']}"))
        stub = ex.get("stub") or stub_from_solution(ex["solution"])
        cells.append(
            _cell("code", ex["solution"] if solved else stub, role="solution", exercise=ex["name"])
        )
        cells.append(
            _cell("code", f'check("{ex["name"]}", {ex["name"]})', role="check", exercise=ex["name"])
        )
    if spec.get("practice"):
        cells.append(_cell("md", "## Try it (not graded)"))
        cells.append(_cell("code", spec["practice"], role="practice"))
    for i, cell in enumerate(cells):  # ids from the exercise and the cell's place: no churn
        cell.id = f"ex{name[:2]}-cell{i:02d}"
    nb.cells = cells
    nbformat.validator.normalize(nb)
    return nb


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--no-exec", action="store_true")
    ap.add_argument("--only", nargs="*", help="notebook names to build")
    args = ap.parse_args(argv)
    from course_kernels.grading.exercises import SPECS

    for name, spec_module in SPECS.items():  # hidden tests of the spec modules, as JSON
        (ROOT / "grading" / "hidden_tests" / f"{name}.json").write_text(hidden_json(spec_module))
    for name, spec in NOTEBOOKS.items():
        if args.only and name not in args.only:
            continue
        for solved, folder in ((False, ROOT / "exercises"), (True, ROOT / "solutions")):
            nb = build(name, spec, solved)
            if solved and not args.no_exec:
                env_before = os.environ.get("TRITON_INTERPRET")
                execute_in_kernel(nb, folder, timeout=600)
                if env_before is None:
                    os.environ.pop("TRITON_INTERPRET", None)
                for cell in nb.cells:  # run timestamps change at every build: not kept
                    cell.metadata.pop("execution", None)
            folder.mkdir(exist_ok=True)
            nbformat.write(nb, folder / f"{name}.ipynb")
            print("wrote", folder / f"{name}.ipynb")


if __name__ == "__main__":
    main()
