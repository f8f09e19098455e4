"""The instructor's grader.

    python -m course_kernels.grading release --out DIR [--zip]
    python -m course_kernels.grading grade PATH... [--out DIR] [--workers N] [--hidden DIR]
                                             [--exercise NN] [--roster CSV] [--unsafe]
                                             [--cgroup DIR] [--shared-limits]
    python -m course_kernels.grading gradescope --exercise NN --out autograder.zip [--hidden DIR]

``release`` writes the student version (the exercise notebooks: stubs, visible tests only; no
solution, no hidden test) to a folder, or a zip with ``--zip``.

PATH is a notebook or a folder of notebooks (searched recursively). Each notebook is one
submission; its id is its path relative to the folder, without ``.ipynb`` (``alice/03_tiled_forward``).
The file name (or ``--exercise``) decides which exercise a notebook is graded as. With
``--roster CSV`` (a column ``id``; other columns are kept), PATH is one folder holding one folder
per student id, and ``roster.csv`` in DIR gets one row per student: per-notebook totals, the total,
and the notebooks that are missing. Without bubblewrap the grader refuses to run student code
unless ``--unsafe`` is given; without a cgroup per sandbox (a non-root grader with no delegated
cgroup) it refuses to grade more than one notebook unless ``--shared-limits`` (see README).
Writes to DIR (default ``grading-output``):

- ``gradebook.csv``: one row per submission (id, notebook, score, max score, seconds, one column
  per exercise);
- ``results/<id>.json``: Gradescope's format ``{"score", "tests": [{"name", "score",
  "max_score", "output", "visibility"}]}``; with a single submission also ``results.json``;
- ``feedback/<id>.txt``: the same feedback as text.

Modules: this one finds submissions, grades them (one process or a pool) and parses the command
line; :mod:`.gradebook` holds the result formats (Gradescope's JSON, the feedback text, the
roster), :mod:`.release` the student release and the Gradescope bundle. Every name of those is
importable from here.
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

from course_kernels.grading.exercises import NOTEBOOKS

from .gradebook import (  # re-exported: tests and scripts import them from here
    _safe_rel,
    _write,
    csv_row,
    feedback_text,
    gradescope,
    notebook_max as notebook_max,
    write_roster,
)
from ..sandbox import cgroups
from ..sandbox.probe import SHARED_LIMITS
from .release import gradescope_bundle, release


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


def _grade_one(sid, path, hidden, exercise=None, unsafe=False, call_seconds=None):
    from course_kernels.grading.exercises import notebook_of
    from course_kernels.grading.feedback import clean_text

    from .grade import NotebookResult, expected_notebook, grade_notebook
    from ..sandbox.sandbox import Limits, SandboxUnavailable

    try:
        limits = None
        if call_seconds:
            nb = expected_notebook(path, exercise) or notebook_of("01")
            limits = Limits(
                call_seconds=min(call_seconds, nb.timeout), total_seconds=max(240.0, 4 * nb.timeout)
            )
        res = grade_notebook(
            path, hidden_dir=hidden, exercise=exercise, unsafe=unsafe, limits=limits
        )
    except SandboxUnavailable:
        raise
    except BaseException as e:  # noqa: BLE001 - one broken submission must not stop a class
        if isinstance(e, KeyboardInterrupt):
            raise
        res = NotebookResult(clean_text(path), "?")
        res.notes.append(clean_text(f"the grader failed on this notebook: {type(e).__name__}: {e}"))
    return sid, res


def _grade_in_pool(
    subs, hidden, workers, results, bar, exercise=None, unsafe=False, call_seconds=None
):
    """Grade in worker processes. A worker that dies (possible only where the sandbox has no PID
    namespace) breaks the pool; the submissions it left unfinished are graded again one per pool,
    and the one that breaks its own pool scores zero with a message."""
    from .grade import NotebookResult

    def run(batch, n):
        broken = []
        with ProcessPoolExecutor(max_workers=n) as pool:
            futs = {
                pool.submit(_grade_one, sid, path, hidden, exercise, unsafe, call_seconds): (
                    sid,
                    path,
                )
                for sid, path in batch
            }
            for fut in as_completed(futs):
                try:
                    sid, res = fut.result()
                except BrokenProcessPool:
                    broken.append(futs[fut])
                    continue
                except Exception as e:  # noqa: BLE001 - e.g. a result that cannot be pickled
                    sid, path = futs[fut]
                    res = NotebookResult(str(path), "?")
                    res.notes.append(f"the grader failed on this notebook: {type(e).__name__}")
                results[sid] = res
                bar.update()
        return broken

    for sid, path in run(subs, workers):
        if run([(sid, path)], 1):
            res = NotebookResult(str(path), "?")
            res.notes.append(
                "grading this notebook killed the grader's worker process; it scores zero"
            )
            results[sid] = res
            bar.update()


def grade(
    paths,
    out_dir,
    workers=1,
    hidden=None,
    progress=True,
    exercise=None,
    unsafe=False,
    roster=None,
    expect=None,
    call_seconds=None,
    shared_limits=False,
) -> list:
    from ..sandbox.probe import require_isolation, require_sandbox

    require_sandbox(unsafe)  # refuse before anything runs, with the reason
    subs = find_submissions(paths)
    require_isolation(len(subs), shared_limits)  # a class: a cgroup per sandbox, or refuse
    out_dir = Path(out_dir)
    (out_dir / "results").mkdir(parents=True, exist_ok=True)
    (out_dir / "feedback").mkdir(parents=True, exist_ok=True)
    results = {}
    bar = tqdm(total=len(subs), desc="grading", unit="nb", disable=not progress)
    if workers <= 1:
        for sid, path in subs:
            results[sid] = _grade_one(sid, path, hidden, exercise, unsafe, call_seconds)[1]
            bar.update()
    else:
        _grade_in_pool(subs, hidden, workers, results, bar, exercise, unsafe, call_seconds)
    bar.close()
    exercises = [ex for nb in NOTEBOOKS.values() for ex in nb.exercises]
    rows = []
    for sid, _ in subs:
        res = results[sid]
        per_ex = {
            ex: sum(v.points for v in res.verdicts if v.exercise == ex)
            for ex in exercises
            if any(v.exercise == ex for v in res.verdicts)
        }
        rows.append(
            {
                "submission": sid,
                "notebook": res.notebook,
                "score": round(res.score, 4),
                "max_score": res.max_score,
                "seconds": round(res.seconds, 2),
                **per_ex,
            }
        )
        if any("sandbox failed to start" in (v.message or "") for v in res.verdicts):
            rows[-1]["_grader_problem"] = True
        rel = _safe_rel(sid)
        for folder, suffix, text in (
            ("results", ".json", json.dumps(gradescope(res), indent=1)),
            ("feedback", ".txt", feedback_text(sid, res)),
        ):
            _write(out_dir / folder / rel.with_name(rel.name + suffix), text)
    if len(subs) == 1:
        _write(out_dir / "results.json", json.dumps(gradescope(results[subs[0][0]]), indent=1))
    fields = ["submission", "notebook", "score", "max_score", "seconds"] + [
        ex for ex in exercises if any(ex in r for r in rows)
    ]
    with open(
        out_dir / "gradebook.csv", "w", newline="", encoding="utf-8", errors="backslashreplace"
    ) as f:
        w = csv.DictWriter(f, fieldnames=fields, restval="", extrasaction="ignore")
        w.writeheader()
        w.writerows(csv_row(r) for r in rows)
    if roster is not None:
        write_roster(roster, subs, results, out_dir / "roster.csv", expect, hidden)
    return rows


def cgroup_setting(value: str) -> str:
    """``--cgroup``'s value as ``COURSE_GRADING_CGROUP`` holds it: ``self``, or an absolute path."""
    return cgroups.SELF if value == cgroups.SELF else os.path.abspath(value)


def main(argv=None) -> int:
    script = os.path.basename(sys.argv[0] or "")  # the console script says its own name
    ap = argparse.ArgumentParser(
        prog=script if script == "course-grade" else "python -m course_kernels.grading",
        description="Grade exercise notebooks in a sandbox.",
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("grade", help="grade notebooks or folders of notebooks")
    g.add_argument(
        "paths",
        nargs="+",
        help="notebooks, or folders searched recursively for notebooks (with --roster: one "
        "folder holding one folder per student id)",
    )
    g.add_argument("--out", default="grading-output", help="output folder (default: %(default)s)")
    g.add_argument(
        "--workers",
        type=int,
        default=os.cpu_count() or 1,
        help="notebooks graded at the same time, one sandbox each (default: the number of "
        "CPUs, %(default)s; each sandbox may use one core and 4 GB)",
    )
    g.add_argument(
        "--hidden",
        default=None,
        help="folder of hidden-test JSON files, <notebook>.json (default: the ones shipped in "
        "the package, course_kernels/grading/hidden_tests: public; pass secret ones here)",
    )
    g.add_argument("--no-progress", action="store_true", help="no progress bar")
    g.add_argument(
        "--exercise",
        default=None,
        help="grade every notebook as this exercise (e.g. 03 or 03_tiled_forward); "
        "default: each file's name",
    )
    g.add_argument(
        "--roster",
        default=None,
        help="CSV with a column 'id': PATH holds one folder per student; writes "
        "roster.csv with one row per student",
    )
    g.add_argument(
        "--expect",
        default=None,
        help="comma-separated notebooks every student must submit (default: all)",
    )
    g.add_argument(
        "--call-seconds",
        type=float,
        default=None,
        help="cap the time limit of every test at this many seconds (default: each "
        "notebook's own limit, 20-60 s)",
    )
    g.add_argument(
        "--unsafe",
        action="store_true",
        help="run student code without the bubblewrap sandbox (trusted code only)",
    )
    g.add_argument(
        "--cgroup",
        default=None,
        metavar="DIR|self",
        help="a cgroup v2 directory delegated to you (memory and pids in its "
        "cgroup.controllers) in which each sandbox gets its own cgroup; the processes in it "
        "are moved into a leaf 'course-grader' first (cgroup v2 allows no process beside "
        "child cgroups). 'self': the grader's own cgroup, e.g. a shell started with "
        "`systemd-run --user --scope -p Delegate=yes bash`. Default: $COURSE_GRADING_CGROUP, "
        "else the grader's own cgroup only if it is writable and holds no process but the "
        "grader's (as under `systemd-run --user --scope -p Delegate=yes course-grade grade "
        "...`), never a cgroup shared with other programs (a desktop terminal's); root needs "
        "none",
    )
    g.add_argument(
        "--shared-limits",
        action="store_true",
        help="grade several submissions even when no cgroup per sandbox can be made (a "
        f"non-root grader without a delegated cgroup): {SHARED_LIMITS}",
    )
    gs = sub.add_parser("gradescope", help="write a Gradescope autograder zip for one exercise")
    gs.add_argument(
        "--exercise", required=True, help="the exercise it grades, e.g. 03 or 03_tiled_forward"
    )
    gs.add_argument("--out", required=True, help="the .zip to write (upload it to Gradescope)")
    gs.add_argument(
        "--hidden",
        default=None,
        help="folder of hidden-test JSON files to put in the bundle (default: the package's)",
    )
    r = sub.add_parser("release", help="write the student version of the exercises")
    r.add_argument("--out", required=True, help="a folder, or a .zip file with --zip")
    r.add_argument(
        "--zip", action="store_true", help="write one zip (exercises/NN_*.ipynb) instead"
    )
    r.add_argument(
        "--repo-url",
        default=None,
        help="the GitHub address written into the notebooks' setup cell, from which Colab "
        "installs the package (default: course_kernels.colab.REPOSITORY_URL)",
    )
    args = ap.parse_args(argv)
    if args.cmd == "release":
        print(f"wrote {release(args.out, args.zip, args.repo_url)}", file=sys.stderr)
        return 0
    if args.cmd == "gradescope":
        print(f"wrote {gradescope_bundle(args.exercise, args.out, args.hidden)}", file=sys.stderr)
        return 0
    from course_kernels.grading.exercises import notebook_of

    from ..sandbox.sandbox import SandboxUnavailable

    if args.cgroup:
        os.environ[cgroups.ENV] = cgroup_setting(args.cgroup)
    expect = None
    if args.expect:
        expect = [notebook_of(x.strip()).name for x in args.expect.split(",") if x.strip()]
    if args.exercise:
        notebook_of(args.exercise)  # a clear error now rather than per notebook
    t0 = time.monotonic()
    try:
        rows = grade(
            args.paths,
            args.out,
            args.workers,
            args.hidden,
            not args.no_progress,
            args.exercise,
            args.unsafe,
            args.roster,
            expect,
            args.call_seconds,
            args.shared_limits,
        )
    except SandboxUnavailable as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    total = sum(r["score"] for r in rows)
    broken = [r["submission"] for r in rows if r.get("_grader_problem")]
    print(
        f"graded {len(rows)} submission(s) in {time.monotonic() - t0:.1f} s "
        f"(mean score {total / max(len(rows), 1):.2f}); wrote {args.out}/gradebook.csv",
        file=sys.stderr,
    )
    if broken:
        print(
            f"error: the sandbox failed to start for {len(broken)} submission(s) (a grader "
            f"problem, not the students'; e.g. {broken[0]}): see their feedback",
            file=sys.stderr,
        )
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
