"""The instructor's grader.

    python -m course_kernels.grading grade PATH... [--out DIR] [--workers N] [--hidden DIR]

PATH is a notebook or a folder of notebooks (searched recursively). Each notebook is one
submission; its id is its path relative to the folder, without ``.ipynb`` (``alice/03_tiled_forward``).
Writes to DIR (default ``grading-output``):

- ``gradebook.csv``: one row per submission (id, notebook, score, max score, seconds, one column
  per exercise);
- ``results/<id>.json``: Gradescope's format ``{"score", "tests": [{"name", "score",
  "max_score", "output", "visibility"}]}``; with a single submission also ``results.json``;
- ``feedback/<id>.txt``: the same feedback as text.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

from tqdm import tqdm

from .exercises import NOTEBOOKS


def find_submissions(paths) -> list[tuple[str, Path]]:
    """(id, path) pairs: ids are unique and file-system safe."""
    found = []
    for p in map(Path, paths):
        if p.is_dir():
            for nb in sorted(p.rglob("*.ipynb")):
                if ".ipynb_checkpoints" in nb.parts:
                    continue
                found.append((nb.relative_to(p).with_suffix("").as_posix(), nb))
        elif p.is_file():
            found.append((p.stem, p))
        else:
            raise SystemExit(f"no such notebook or folder: {p}")
    seen: dict = {}
    out = []
    for sid, path in found:
        seen[sid] = seen.get(sid, 0) + 1
        out.append((sid if seen[sid] == 1 else f"{sid}~{seen[sid]}", path))
    return out


def _grade_one(sid, path, hidden):
    from .runner import grade_notebook

    try:
        res = grade_notebook(path, hidden_dir=hidden)
    except Exception as e:  # noqa: BLE001 - one broken submission must not stop a class
        from .runner import NotebookResult

        res = NotebookResult(str(path), "?")
        res.notes.append(f"the grader failed on this notebook: {type(e).__name__}: {e}")
    return sid, res


def _grade_in_pool(subs, hidden, workers, results, bar):
    """Grade in worker processes. A worker that dies (possible only where the sandbox has no PID
    namespace) breaks the pool; the submissions it left unfinished are graded again one per pool,
    and the one that breaks its own pool scores zero with a message."""
    from .runner import NotebookResult

    def run(batch, n):
        broken = []
        with ProcessPoolExecutor(max_workers=n) as pool:
            futs = {pool.submit(_grade_one, sid, path, hidden): (sid, path) for sid, path in batch}
            for fut in as_completed(futs):
                try:
                    sid, res = fut.result()
                except BrokenProcessPool:
                    broken.append(futs[fut])
                    continue
                results[sid] = res
                bar.update()
        return broken

    for sid, path in run(subs, workers):
        if run([(sid, path)], 1):
            res = NotebookResult(str(path), "?")
            res.notes.append("grading this notebook killed the grader's worker process; it "
                             "scores zero")
            results[sid] = res
            bar.update()


def gradescope(res) -> dict:
    tests = [
        {"name": f"{v.exercise}: {v.name}" + (" (hidden)" if v.hidden else ""),
         "score": round(v.points, 4), "max_score": v.max_points, "output": v.message,
         "visibility": "after_published" if v.hidden else "visible"}
        for v in res.verdicts
    ]
    out = {"score": round(res.score, 4), "tests": tests}
    if res.notes:
        out["output"] = "\n".join(res.notes)
    return out


def feedback_text(sid, res) -> str:
    lines = [f"{sid}: {res.notebook}  {res.score:g}/{res.max_score:g}"]
    lines += [f"  note: {n}" for n in res.notes]
    for v in res.verdicts:
        mark = "PASS" if v.passed else "FAIL"
        lines.append(f"  [{mark}] {v.exercise} / {v.name}{' (hidden)' if v.hidden else ''} "
                     f"({v.points:g}/{v.max_points:g}): {v.message}")
    return "\n".join(lines) + "\n"


def _safe_rel(sid: str) -> Path:
    parts = [p for p in Path(sid).parts if p not in ("", ".", "..", "/")]
    return Path(*parts) if parts else Path("submission")


def grade(paths, out_dir, workers=1, hidden=None, progress=True) -> list:
    subs = find_submissions(paths)
    out_dir = Path(out_dir)
    (out_dir / "results").mkdir(parents=True, exist_ok=True)
    (out_dir / "feedback").mkdir(parents=True, exist_ok=True)
    results = {}
    bar = tqdm(total=len(subs), desc="grading", unit="nb", disable=not progress)
    if workers <= 1:
        for sid, path in subs:
            results[sid] = _grade_one(sid, path, hidden)[1]
            bar.update()
    else:
        _grade_in_pool(subs, hidden, workers, results, bar)
    bar.close()
    exercises = [ex for nb in NOTEBOOKS.values() for ex in nb.exercises]
    rows = []
    for sid, _ in subs:
        res = results[sid]
        per_ex = {ex: sum(v.points for v in res.verdicts if v.exercise == ex) for ex in exercises
                  if any(v.exercise == ex for v in res.verdicts)}
        rows.append({"submission": sid, "notebook": res.notebook, "score": round(res.score, 4),
                     "max_score": res.max_score, "seconds": round(res.seconds, 2), **per_ex})
        rel = _safe_rel(sid)
        for folder, suffix, text in (
            ("results", ".json", json.dumps(gradescope(res), indent=1)),
            ("feedback", ".txt", feedback_text(sid, res)),
        ):
            target = out_dir / folder / rel.with_name(rel.name + suffix)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
    if len(subs) == 1:
        (out_dir / "results.json").write_text(json.dumps(gradescope(results[subs[0][0]]), indent=1))
    fields = ["submission", "notebook", "score", "max_score", "seconds"] + [
        ex for ex in exercises if any(ex in r for r in rows)]
    with open(out_dir / "gradebook.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, restval="")
        w.writeheader()
        w.writerows(rows)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m course_kernels.grading",
                                 description="Grade exercise notebooks in a sandbox.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("grade", help="grade notebooks or folders of notebooks")
    g.add_argument("paths", nargs="+")
    g.add_argument("--out", default="grading-output", help="output folder")
    g.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    g.add_argument("--hidden", default=None,
                   help="folder of hidden-test JSON files (default: grading/hidden_tests)")
    g.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    rows = grade(args.paths, args.out, args.workers, args.hidden, not args.no_progress)
    total = sum(r["score"] for r in rows)
    print(f"graded {len(rows)} submission(s) in {time.monotonic() - t0:.1f} s "
          f"(mean score {total / max(len(rows), 1):.2f}); wrote {args.out}/gradebook.csv",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
