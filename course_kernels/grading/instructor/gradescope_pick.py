"""The Gradescope bundle's helper (``run_autograder`` calls it): which notebook of an upload is
graded, and the one ``results.json`` Gradescope reads.

    python -m course_kernels.grading.instructor.gradescope_pick SUBMISSION EXERCISE DEST
    python -m course_kernels.grading.instructor.gradescope_pick --merge OUT EXERCISE RESULTS NOTE
                                                                [--hidden DIR]

Exactly one notebook per exercise is graded: the file named like the exercise
(``03_tiled_forward.ipynb``), else one whose name starts with its number, else the first in
path order; every other notebook of the upload is named in the output and not graded (three
copies of a solved notebook score the exercise once). The score is capped at the exercise's
maximum, and ``extra_data.sandbox`` says whether bubblewrap isolated the run.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

MAX_BYTES = 20 << 20


def candidates(folder: Path) -> list[Path]:
    found = []
    for p in sorted(folder.rglob("*.ipynb")):
        rel = p.relative_to(folder)
        if any(part.startswith(".") for part in rel.parts):  # .ipynb_checkpoints, hidden files
            continue
        try:
            st = os.lstat(p)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            found.append(p)
    return found


def choose(found: list[Path], exercise: str, folder: Path) -> Path | None:
    for test in (
        lambda p: p.stem == exercise,
        lambda p: p.stem.startswith(exercise[:2]),
        lambda p: True,
    ):
        for p in found:
            if test(p):
                return p
    return None


def pick(folder: Path, exercise: str, dest: Path) -> dict:
    found = candidates(folder) if folder.is_dir() else []
    chosen = choose(found, exercise, folder)
    out = {"graded": None, "ignored": [p.relative_to(folder).as_posix() for p in found]}
    if chosen is not None:
        out["graded"] = chosen.relative_to(folder).as_posix()
        out["ignored"].remove(out["graded"])
        with open(chosen, "rb") as src, open(dest / f"{exercise}.ipynb", "wb") as dst:
            dst.write(src.read(MAX_BYTES + 1))  # the grader refuses what is larger
    return out


def merge(out: Path, exercise: str, target: Path, note: str, hidden=None) -> dict:
    from course_kernels.grading.feedback import clean_text

    from .gradebook import notebook_max

    picked = json.loads((out / "pick.txt").read_text())
    maximum = notebook_max(exercise, hidden)
    lines = [note] if note else []
    data = {"score": 0.0, "tests": []}
    result = out / "graded" / "results.json"
    if picked["graded"] is None:
        lines.append("no notebook (.ipynb) was found in the submission")
    elif result.is_file():
        data = json.loads(result.read_text())
        lines.append(clean_text(f"graded: {picked['graded']} (as {exercise})"))
    else:
        lines.append("the grader wrote no result (a grader problem: tell the instructor)")
    if picked["ignored"]:
        names = ", ".join(picked["ignored"][:20])
        lines.append(clean_text(f"not graded (one notebook per exercise is graded): {names}", 2000))
    if data.get("output"):
        lines.append(data["output"])
    merged = {
        "score": round(min(float(data.get("score", 0.0)), maximum), 4),
        "tests": data.get("tests", []),
        "output": "\n".join(lines),
        "extra_data": {"sandbox": "none" if note else "bubblewrap", "max_score": maximum},
    }
    target.write_text(json.dumps(merged, indent=1))
    return merged


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "--merge":
        hidden = None
        if "--hidden" in argv:
            i = argv.index("--hidden")
            hidden = argv[i + 1]
            del argv[i : i + 2]
        out, exercise, target, note = argv[1:5]
        merge(Path(out), exercise, Path(target), note, hidden)
        return 0
    folder, exercise, dest = argv[:3]
    print(json.dumps(pick(Path(folder), exercise, Path(dest))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
