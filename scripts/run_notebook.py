"""Run one notebook's code cells: the project's one notebook runner (outside the grader's sandbox).

Two ways, because the machines differ:

* ``plain``: the code cells in plain Python, one namespace, no Jupyter. For the lent GPU machine,
  where nothing can be installed and there is no Jupyter. Used by scripts/run_notebooks_plain.py
  (which adds time limits and a JSON record) and scripts/gpu_smoke.py.
* ``kernel``: the notebook in a Jupyter kernel through nbclient, outputs kept. Used by
  scripts/build_notebooks.py (the executed solutions that nbval compares) and by
  tests/test_colab_wheel.py (run by path inside a fresh Colab-like venv, which is why this file
  imports only the standard library at the top and never ``course_kernels``).

The grader's cell runner (course_grader, course_kernels/grading/runner.py) is separate on
purpose: it runs a student's code inside the bubblewrap sandbox with resource limits.

    python scripts/run_notebook.py plain NOTEBOOK          # cwd = the notebook's folder
    python scripts/run_notebook.py kernel SRC WORKDIR OUT  # prints {"seconds", "error"} as JSON
"""

from __future__ import annotations

import json
import os
import sys
import time


def _ipython_display():
    """``IPython.display.display``, or a stand-in that prints, where IPython is absent."""
    import types

    try:
        if os.environ.get("RUN_NOTEBOOKS_STUB_IPYTHON"):  # tests: exercise the stand-in below
            raise ImportError
        import IPython.display  # noqa: F401
    except ImportError:  # a minimal stand-in: the objects only need to exist and print
        mod = types.ModuleType("IPython.display")

        class _Obj:
            def __init__(self, data=None, *a, **k):
                self.data = data

            def __repr__(self):
                return f"<{type(self).__name__} {str(self.data)[:60]!r}>"

        for name in ("Markdown", "HTML", "Image", "SVG", "Math", "JSON"):
            setattr(mod, name, type(name, (_Obj,), {}))
        mod.display = lambda *objs, **k: [print(repr(o)[:120]) for o in objs]
        pkg = types.ModuleType("IPython")
        pkg.display = mod
        pkg.get_ipython = lambda: None  # matplotlib asks for a shell (there is none) ...
        pkg.version_info = (9, 0, 0, "stand-in")  # ... and for a version, to pick a GUI hook
        sys.modules["IPython"], sys.modules["IPython.display"] = pkg, mod
    from IPython.display import display

    return display


def run_plain(path: str) -> None:
    """Execute the code cells of the notebook at ``path`` in plain Python; raise on an error.

    ``display`` prints a one-line summary, ``plt.show`` closes the figure, ``IPython.display``
    is stubbed when IPython is absent, cells with IPython magics or shell escapes are skipped,
    and each cell's source is registered in ``linecache`` as Jupyter does (Triton's ``@jit``
    reads its function's source). Prints "NOTEBOOK OK" at the end.
    """
    import linecache

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.show = lambda *a, **k: plt.close("all")
    display = _ipython_display()
    with open(path) as f:
        nb = json.load(f)
    ns = {"__name__": "__main__", "display": display}
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "code":
            continue
        src = "".join(cell["source"])
        if any(line.lstrip().startswith(("%", "!")) for line in src.splitlines()):
            print(f"cell {i}: skipped (IPython magic or shell escape)")
            continue
        print(f"-- cell {i}", flush=True)
        name = f"<{path} cell {i}>"
        # Register the source as Jupyter does, so inspect.getsource works (Triton's @jit needs it).
        linecache.cache[name] = (len(src), None, src.splitlines(True), name)
        exec(compile(src, name, "exec"), ns)  # noqa: S102 - the course's own notebook
    print("NOTEBOOK OK", flush=True)


def execute_in_kernel(nb, workdir, timeout: float = 600):
    """Execute the nbformat notebook ``nb`` in place in a ``python3`` Jupyter kernel whose working
    directory is ``workdir``; raises nbclient's ``CellExecutionError`` on a failing cell."""
    from nbclient import NotebookClient

    NotebookClient(
        nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(workdir)}}
    ).execute()
    return nb


def run_kernel(src: str, workdir: str, out: str) -> dict:
    """Execute ``src`` in this interpreter's ``python3`` kernel, write it to ``out`` and return
    ``{"seconds", "error"}`` (error: the tail of the failing cell's report, or None)."""
    import nbformat
    from jupyter_client.kernelspec import KernelSpecManager
    from nbclient.exceptions import CellExecutionError

    spec = KernelSpecManager().get_kernel_spec("python3")
    if spec.argv[0] not in (sys.executable, "python"):
        raise RuntimeError(f"kernel is not this interpreter's python: {spec.argv}")
    nb = nbformat.read(src, as_version=4)
    t0 = time.time()
    error = None
    try:
        execute_in_kernel(nb, workdir)
    except CellExecutionError as exc:
        error = str(exc)[-3000:]
    nbformat.write(nb, out)
    return {"seconds": round(time.time() - t0, 1), "error": error}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["plain"] and len(argv) == 2:
        # As `python -c` and Jupyter do: the working directory first on the path, not scripts/.
        sys.path[0] = os.getcwd()
        run_plain(argv[1])
        return 0
    if argv[:1] == ["kernel"] and len(argv) == 4:
        print(json.dumps(run_kernel(*argv[1:])))
        return 0
    print(__doc__.rsplit("\n\n", 1)[-1], file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
