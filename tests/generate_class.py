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


def main(argv=None):
    from course_kernels.grading.exercises import NOTEBOOKS
    from course_kernels.grading.runner import replace_solution

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("out")
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--notebook", default=None)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    rng = random.Random(args.seed)
    names = [args.notebook] if args.notebook else sorted(NOTEBOOKS)
    answers = {}
    for s in range(args.n):
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
        target = Path(args.out) / f"student-{s:03d}" / f"{name}.ipynb"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(nb))
        answers[f"student-{s:03d}/{name}"] = kind
    out = Path(args.out)
    (out.parent / f"{out.name}-answers.json").write_text(json.dumps(answers, indent=1))


if __name__ == "__main__":
    main()
