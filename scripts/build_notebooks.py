"""Write exercises/NN_*.ipynb (stubs), solutions/NN_*.ipynb (solved, executed) and the hidden
tests' JSON (course_kernels/grading/hidden_tests/) from the spec modules
(course_kernels/grading/specs/, built by course_kernels.grading.notebooks).

    python scripts/build_notebooks.py            # both, solutions executed (for nbval)
    python scripts/build_notebooks.py --no-exec  # do not execute the solutions

The Colab install line uses course_kernels.colab.REPOSITORY_URL.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from run_notebook import execute_in_kernel  # noqa: E402 (the one notebook runner)

from course_kernels.grading.notebooks import NOTEBOOKS, build, hidden_json  # noqa: E402

HIDDEN_DIR = ROOT / "course_kernels" / "grading" / "hidden_tests"


def repository_url() -> str:
    """course_kernels.colab.REPOSITORY_URL (the one place it lives)."""
    from course_kernels.colab import REPOSITORY_URL

    return REPOSITORY_URL.rstrip("/")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--no-exec", action="store_true", help="do not execute the solutions")
    ap.add_argument("--only", nargs="*", help="notebook names to build (default: all)")
    args = ap.parse_args(argv)
    from course_kernels.grading.exercises import SPECS

    for name, spec_module in SPECS.items():  # hidden tests of the spec modules, as JSON
        (HIDDEN_DIR / f"{name}.json").write_text(hidden_json(spec_module))
    url = repository_url()
    for name in NOTEBOOKS:
        if args.only and name not in args.only:
            continue
        for solved, folder in ((False, ROOT / "exercises"), (True, ROOT / "solutions")):
            nb = build(name, solved, url)
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
