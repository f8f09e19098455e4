"""Run notebooks' code cells in plain Python, one fresh namespace per notebook; record the result.

For a machine that has the course's dependencies but no Jupyter (the lent GPU machine, where
nothing can be installed). It checks that chapters and solutions run where ``setup()`` picks the
GPU, at full size. It is not nbval: outputs are not compared, only errors are caught. Usage:

    PYTHONPATH=. python scripts/run_notebooks_plain.py book/part2/*.ipynb solutions/*.ipynb \
        --out run.json [--limit-s 120]

Each notebook runs in a subprocess with its own folder as the working directory (as Jupyter and
the book build do) and ``--limit-s`` seconds, through scripts/run_notebook.py's ``plain`` mode
(the one notebook runner: ``display`` prints a one-line summary, ``plt.show`` closes the figure,
``IPython.display`` is stubbed when IPython is absent, each cell's source is registered in
``linecache`` as Jupyter does, for Triton's ``@jit``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

RUNNER = Path(__file__).resolve().parent / "run_notebook.py"  # the shared runner, plain mode


def run(path: Path, limit_s: float, root: Path | None) -> dict:
    paths = ([str(root)] if root is not None else []) + [os.environ.get("PYTHONPATH", "")]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(paths).strip(os.pathsep),
        "MPLBACKEND": "Agg",
    }
    t0 = time.time()
    try:
        proc = subprocess.run(
            [sys.executable, str(RUNNER), "plain", path.name],
            cwd=path.parent,
            env=env,
            capture_output=True,
            text=True,
            timeout=limit_s,
        )
        out = proc.stdout + proc.stderr
        ok = proc.returncode == 0 and "NOTEBOOK OK" in proc.stdout
        status = "ok" if ok else f"failed (exit {proc.returncode})"
    except subprocess.TimeoutExpired as exc:
        out = (
            (exc.stdout or b"").decode(errors="replace")
            if isinstance(exc.stdout, bytes)
            else (exc.stdout or "")
        )
        status = f"timed out after {limit_s:.0f} s"
    return {
        "notebook": str(path),
        "status": status,
        "seconds": round(time.time() - t0, 1),
        "tail": out[-1500:] if status != "ok" else "",
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("notebooks", nargs="+", type=Path)
    ap.add_argument("--out", type=Path, required=True, help="JSON record to write")
    ap.add_argument("--limit-s", type=float, default=120.0, help="time limit per notebook")
    ap.add_argument(
        "--installed",
        action="store_true",
        help="use the installed course_kernels (a wheel): the repository is not put "
        "on the notebooks' path",
    )
    args = ap.parse_args(argv)
    root = None if args.installed else Path(__file__).resolve().parents[1]
    if root is not None:
        sys.path.insert(0, str(root))
    from course_kernels.bench import environment

    try:
        env = environment()
    except Exception as exc:  # no torch / no GPU: still record what ran
        env = {"error": repr(exc)}
    env["command"] = (
        "python scripts/run_notebooks_plain.py "
        + ("--installed " if args.installed else "")
        + " ".join(str(p) for p in args.notebooks)
    )
    results = []
    for path in args.notebooks:
        r = run(path.resolve(), args.limit_s, root)
        r["notebook"] = str(path)
        results.append(r)
        print(f"{r['status']:>24}  {r['seconds']:6.1f} s  {path}", flush=True)
        if r["tail"]:
            print(r["tail"])
        args.out.write_text(json.dumps({**env, "results": results}, indent=1))
    bad = [r for r in results if r["status"] != "ok"]
    print(f"{len(results) - len(bad)}/{len(results)} notebooks ran without error")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
