"""Make a synthetic class of submissions, to measure the grader (and to demo it).

    python tests/generate_class.py OUT_DIR [--n 200] [--notebook 07_triton_forward]

Student s gets notebook s mod 9 (or --notebook for all), solved (60%), untouched (15%), with a
classic mistake (20%), or with an infinite loop (5%). Files: OUT_DIR/student-NNN/<notebook>.ipynb,
and OUT_DIR/../<name of OUT_DIR>-answers.json: submission id -> "solved" | "untouched" | "wrong" |
"loop" (what its grade must be: full marks, zero, less than full marks).
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

WRONG = {  # exercise -> a plausible wrong solution (the classic mistakes)
    "stable_softmax": "def stable_softmax(x):\n    e = np.exp(x)\n    return e / e.sum(-1, keepdims=True)\n",
    "online_update": (
        "def online_update(m, l, acc, s, v):\n    m_new = np.maximum(m, s.max(-1))\n"
        "    p = np.exp(s - m_new[:, None])\n    a = np.exp(m - m_new)\n"
        "    return m_new, a * l + p.sum(-1), acc + p @ v\n"
    ),
    "block_size": "def block_size(M, d):\n    return -(-M // (4 * d))\n",
    "fa2_reads": "def fa2_reads(N, d, block_q):\n    return N * d + (N // block_q) * N * 2 * d\n",
    "smem_bytes": (
        "def smem_bytes(block_q, block_k, head_dim, num_stages, dtype_bytes=2):\n"
        "    return (block_q * head_dim + 2 * block_k * head_dim) * dtype_bytes\n"
    ),
}
LOOP = "def {name}(*args, **kwargs):\n    while True:\n        pass\n"


def misgraded(rows: dict, answers: dict) -> list:
    """(id, kind, score, max) of every submission whose grade contradicts its kind: a solved
    notebook below full marks (a false fail), an untouched one above zero, a wrong or looping one
    at full marks (a false pass). ``rows``: the gradebook's rows by submission id."""
    wrong = []
    for sid, kind in answers.items():
        score, top = float(rows[sid]["score"]), float(rows[sid]["max_score"])
        ok = {
            "solved": score == top > 0,
            "untouched": score == 0,
            "wrong": score < top,
            "loop": score < top,
        }[kind]
        if not ok:
            wrong.append((sid, kind, score, top))
    return wrong


def share(folder, answers: dict, dest, half=None) -> dict:
    """Copy the class in ``folder`` to ``dest``: all of it, or with ``half=0`` its even students
    (100 of 200: every notebook, every kind of submission); returns the answers of what was
    copied. The tests grade all 200 as a non-root user and the even half as root (the class of
    200 twice would cost CI another two minutes); ``COURSE_TEST_FULL_CLASS=1`` gives root all
    200 too."""
    import os
    import shutil

    if os.environ.get("COURSE_TEST_FULL_CLASS") == "1":
        half = None
    mine = {sid: k for sid, k in answers.items() if half is None or int(sid[8:11]) % 2 == half}
    notebooks = {sid.split("/")[1] for sid in answers}
    assert set(mine.values()) == set(answers.values()), "a half lacks a kind of submission"
    assert {sid.split("/")[1] for sid in mine} == notebooks, "a half lacks a notebook"
    for student in {sid.split("/")[0] for sid in mine}:
        shutil.copytree(Path(folder) / student, Path(dest) / student)
    return mine


def generate(out, n=200, notebook=None, seed=0) -> dict:
    """Write the class into ``out`` and its answers next to it; returns the answers."""
    from course_kernels.grading.exercises import NOTEBOOKS
    from course_kernels.grading.runner import replace_solution

    rng = random.Random(seed)
    names = [notebook] if notebook else sorted(NOTEBOOKS)
    answers = {}
    for s in range(n):
        name = names[s % len(names)]
        solved = json.loads((ROOT / "solutions" / f"{name}.ipynb").read_text())
        stub = json.loads((ROOT / "exercises" / f"{name}.ipynb").read_text())
        r = rng.random()
        exercise = NOTEBOOKS[name].exercises[0]
        if r < 0.60:
            nb, kind = solved, "solved"
        elif r < 0.75:
            nb, kind = stub, "untouched"
        elif r < 0.95:
            code = WRONG.get(exercise)
            nb, kind = (
                (replace_solution(solved, exercise, code), "wrong") if code else (stub, "untouched")
            )
        else:
            nb, kind = replace_solution(solved, exercise, LOOP.format(name=exercise)), "loop"
        target = Path(out) / f"student-{s:03d}" / f"{name}.ipynb"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(nb))
        answers[f"student-{s:03d}/{name}"] = kind
    out = Path(out)
    (out.parent / f"{out.name}-answers.json").write_text(json.dumps(answers, indent=1))
    return answers


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("out")
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--notebook", default=None)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    generate(args.out, args.n, args.notebook, args.seed)


if __name__ == "__main__":
    main()
