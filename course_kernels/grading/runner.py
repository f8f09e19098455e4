"""The student's side of grading: reading solution cells, the lint (in :mod:`.lint`, re-exported
here), judging a result, and the in-notebook ``check`` (visible tests only, run in the student's
own kernel: the student is not an adversary of their own notebook, and the feedback is the same
code as the grader's).

The instructor's grader (``sandbox``, ``instructor``, next to this module) uses these
same functions, so the check cell and the grader cannot disagree.
"""

from __future__ import annotations

import ast
import copy
import os
import secrets
import time
import tracemalloc

import numpy as np

from .exercises import (
    EXERCISES,
    FORBIDDEN_ALWAYS as FORBIDDEN_ALWAYS,
    FORBIDDEN_NUMPY as FORBIDDEN_NUMPY,
    FORBIDDEN_NUMPY_ATTRS as FORBIDDEN_NUMPY_ATTRS,
    FORBIDDEN_TORCH as FORBIDDEN_TORCH,
    Notebook,
    hidden_params,
)
from .feedback import CallOutcome, Fail, Verdict, clean_text, error_message, mutation_message
from .lint import (  # re-exported: the grader (course_kernels.grading.instructor.grade) imports forbidden_use from here
    MAX_CELL_CHARS as MAX_CELL_CHARS,
    SYS_ALLOWED as SYS_ALLOWED,
    _jit_lines_and_harmless_sys as _jit_lines_and_harmless_sys,
    _names_used as _names_used,
    _strip_magics,
    forbidden_use,
)

ARG_NAMES = {
    "online_update": ["m", "l", "acc", "s", "v"],
    "merge_partials": ["m_a", "l_a", "acc_a", "m_b", "l_b", "acc_b"],
    "flash_backward": ["q", "k", "v", "out", "lse", "dout"],
}


# -- reading submissions ----------------------------------------------------------------------
def solution_cells(nb_json) -> dict:
    """exercise -> source of the cells marked as that exercise's solution (YOUR CODE)."""
    cells: dict = {}
    for cell in nb_json.get("cells", []):
        if cell.get("cell_type") != "code":
            continue
        meta = cell.get("metadata", {}).get("course_kernels", {})
        if not isinstance(meta, dict) or meta.get("role") != "solution":
            continue
        ex = meta.get("exercise")
        src = cell.get("source", "")
        src = "".join(src) if isinstance(src, list) else str(src)
        if ex in EXERCISES:
            cells[ex] = cells.get(ex, "") + _strip_magics(src) + "\n"
            if len(cells[ex]) > MAX_CELL_CHARS:  # refused by the lint, unread: keep it short
                cells[ex] = cells[ex][: MAX_CELL_CHARS + 1]
    return cells or _cells_by_definition(nb_json)


def _cells_by_definition(nb_json) -> dict:
    """Fallback when an editor dropped the cell metadata: the last code cell that defines each
    exercise's function at top level is that exercise's solution cell."""
    found: dict = {}
    for cell in nb_json.get("cells", []):
        if cell.get("cell_type") != "code":
            continue
        src = cell.get("source", "")
        src = "".join(src) if isinstance(src, list) else str(src)
        if len(src) > MAX_CELL_CHARS:
            continue  # never parsed here: the grader's memory is not the submission's to spend
        src = _strip_magics(src)
        try:
            tree = ast.parse(src)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            continue
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name in EXERCISES:
                found[node.name] = src + "\n"
    return found


def replace_solution(nb_json: dict, exercise: str, code: str) -> dict:
    """A copy of a notebook whose solution cell for ``exercise`` holds ``code`` (tests, demos)."""
    nb = copy.deepcopy(nb_json)
    for cell in nb["cells"]:
        meta = cell.get("metadata", {}).get("course_kernels", {})
        if meta.get("role") == "solution" and meta.get("exercise") == exercise:
            cell["source"] = code
            return nb
    raise KeyError(f"no solution cell for {exercise!r}")


# -- grading in the sandbox -------------------------------------------------------------------
def build_cases(nb: Notebook, hidden_dir=None, include_hidden=True, fresh_seeds=False):
    """The notebook's test cases. ``fresh_seeds``: the inputs of the tiling (memory) tests are
    drawn at grading time, so no table of answers prepared in advance can match them."""
    hidden = hidden_params(nb.name, hidden_dir) if include_hidden else {}
    cases = []
    for name in nb.exercises:
        ex = EXERCISES[name]
        visible, secret = ex.visible, hidden.get(name, [])
        if fresh_seeds:
            visible, secret = (
                [
                    dict(p, seed=secrets.randbelow(2**31)) if p.get("check") == "memory" else p
                    for p in ps
                ]
                for ps in (visible, secret)
            )
        cases += ex.cases(visible)
        cases += ex.cases(secret, hidden=True)
    return cases


def judge(case, outcome, cell_error=None) -> Verdict:
    """Points and feedback for one case. Never raises."""
    v = Verdict(case.name, case.exercise, 0.0, case.points, "", hidden=case.hidden)
    try:
        if case.raises:
            err = (outcome.error or {}).get("type")
            if outcome.status == "error" and err == case.raises:
                v.points, v.message = case.points, f"raises {case.raises}"
                return v
            if outcome.status in ("ok", "error") and not (
                outcome.status == "error" and err == "NotImplementedError"
            ):
                v.message = f"should raise {case.raises} here" + (
                    f"; it raised {err}" if err else ""
                )
                v.status = "fail"
                return v
        if outcome.status != "ok":
            v.status, v.message = error_message(outcome, case.func)
            if cell_error and outcome.status == "not_run":
                v.message = cell_error
            elif cell_error and outcome.status in ("error", "crash"):
                v.message = f"your code cell failed ({cell_error}), so: " + v.message
            return v
        if outcome.mutated:
            raise Fail(mutation_message(outcome.mutated, ARG_NAMES.get(case.func, ["q", "k", "v"])))
        msg = case.judge(outcome.output, outcome)
        v.points, v.message, v.status = case.points, msg or "passed", "ok"
    except Fail as e:
        v.status, v.message = "fail", str(e)
    except Exception as e:  # noqa: BLE001 - a judge must never take the grader down
        v.status, v.message = "fail", f"the result could not be checked ({type(e).__name__}: {e})"
    v.message = clean_text(v.message, 4000)
    return v


# -- the check cell ---------------------------------------------------------------------------
class LoggingMemory:
    """Wraps course_kernels.iosim.TwoLevelMemory and logs ops in the sandbox's format."""

    def __new__(cls, sram, **hbm):
        from ..iosim import TwoLevelMemory

        class _Logged(TwoLevelMemory):
            def __init__(self, sram, **hbm):
                super().__init__(sram, **hbm)
                self.log, self._tid, self._next = [], {}, 0

            def load(self, name, rows=slice(None), registers=False):
                tile = super().load(name, rows, registers)
                n = (
                    self.hbm[name].shape[-2]
                    if self.hbm[name].ndim >= 2
                    else self.hbm[name].shape[-1]
                )
                a, b, _ = rows.indices(n)
                self._tid[id(tile)] = self._next
                self._next += 1
                self.log.append(["load", name, a, b, bool(registers), self._tid[id(tile)]])
                return tile

            def store(self, name, rows, tile=None):
                super().store(name, rows, tile)
                n = (
                    self.hbm[name].shape[-2]
                    if self.hbm[name].ndim >= 2
                    else self.hbm[name].shape[-1]
                )
                a, b, _ = rows.indices(n)
                self.log.append(["store", name, a, b])

            def alloc(self, shape, fill=0.0, dtype=np.float64):
                tile = super().alloc(shape, fill, dtype)
                self._tid[id(tile)] = self._next
                self._next += 1
                self.log.append(["alloc", [int(s) for s in shape], self._tid[id(tile)]])
                return tile

            def free(self, *tiles):
                super().free(*tiles)
                for t in tiles:
                    self.log.append(["free", self._tid.pop(id(t))])

        return _Logged(sram, **hbm)


def _normalize(x):
    """What the sandbox would send back: arrays, numbers and tuples only."""
    if hasattr(x, "detach"):
        x = x.detach().cpu().float().numpy()
    if isinstance(x, (list, tuple)):
        return tuple(_normalize(i) for i in x)
    if isinstance(x, np.generic):
        return np.asarray(x)
    return x


def _call_in_process(fn, case):
    args = [a.copy() if isinstance(a, np.ndarray) else copy.deepcopy(a) for a in case.args]
    kwargs = copy.deepcopy(case.kwargs)
    if case.torch:
        import torch

        args = [torch.from_numpy(a) if isinstance(a, np.ndarray) else a for a in args]
    launches = [0]
    orig = None
    if case.torch and os.environ.get("TRITON_INTERPRET") == "1":
        try:
            import triton.runtime.interpreter as interp

            orig = interp.InterpretedFunction.run

            def counting(self, *a, **kw):
                launches[0] += 1
                return orig(self, *a, **kw)

            interp.InterpretedFunction.run = counting
        except Exception:
            orig = None
    outcome = CallOutcome("ok")
    started = False
    try:
        if case.probe == "memory":
            tracemalloc.start()
            started = True
        t0 = time.perf_counter()
        if case.io_sram is not None:
            q, k, v = args[:3]
            mem = LoggingMemory(
                case.io_sram,
                Q=q,
                K=k,
                V=v,
                O=np.zeros((*q.shape[:-1], v.shape[-1]), q.dtype),
                L=np.full(q.shape[:-1], -np.inf, q.dtype),
            )
            fn(mem, **kwargs)
            outcome.output = (mem.hbm["O"], mem.hbm["L"])
            outcome.trace = mem.log
        else:
            outcome.output = _normalize(fn(*args, **kwargs))
        outcome.seconds = time.perf_counter() - t0
    except NotImplementedError:
        outcome = CallOutcome("not_implemented", error={"type": "NotImplementedError"})
    except Exception as e:  # noqa: BLE001
        import traceback

        outcome = CallOutcome(
            "error",
            error={
                "type": type(e).__name__,
                "message": str(e),
                "traceback": traceback.format_exc(limit=-2),
            },
        )
    finally:
        if started:
            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
            outcome.memory = (peak, "with tracemalloc")
        if orig is not None:
            import triton.runtime.interpreter as interp

            interp.InterpretedFunction.run = orig
    outcome.launches = launches[0] if case.torch and orig is not None else 1
    before = [a for a in case.args if isinstance(a, np.ndarray)]
    after = [a.numpy() if hasattr(a, "numpy") else a for a in args if hasattr(a, "shape")]
    outcome.mutated = [
        i
        for i, (x, y) in enumerate(zip(before, after, strict=False))
        if x.shape != y.shape or not np.array_equal(x, y, equal_nan=True)
    ]
    return outcome


def run_visible(name: str, fn) -> list:
    """The visible tests of exercise ``name`` run on ``fn`` in this process: a list of Verdicts.

    Stops at the first "not yet implemented".
    """
    verdicts = []
    for case in EXERCISES[name].cases():
        outcome = _call_in_process(fn, case)
        verdicts.append(judge(case, outcome))
        if outcome.status == "not_implemented":
            break
    return verdicts


def cell_source(fn) -> str | None:
    """The whole code cell (or file) that defined ``fn``, as the grader will read it."""
    import linecache

    code = getattr(fn, "__code__", None)
    if code is None:
        return None
    name = code.co_filename
    if "ipykernel_" in name or name.startswith("<ipython-input"):  # a Jupyter cell
        lines = linecache.getlines(name)
        return "".join(lines) if lines else None
    import inspect

    try:  # defined in a file (a test, a script): only the function itself
        return inspect.getsource(fn)
    except (OSError, TypeError):
        return None


def check(name: str, fn) -> None:
    """Run the visible tests of exercise ``name`` on ``fn`` and print teaching feedback.

    Used by the notebooks' check cells. Never raises for a wrong or unfinished solution: an
    unfinished stub reports "not yet implemented". The cell that defined ``fn`` goes through the
    grader's own lint first, so what the grader refuses is refused here too.
    """
    total = sum(c.points for c in EXERCISES[name].cases())
    src = cell_source(fn)
    why = forbidden_use(_strip_magics(src), EXERCISES[name].torch_rules) if src else None
    if why:
        print(
            f"[FAIL] {name}: the grader will not grade this cell: your code {why}, which a "
            f"submission may not do. Write the algorithm with NumPy/Triton only (0/{total:g} "
            "points)"
        )
        return
    verdicts = run_visible(name, fn)
    if verdicts and verdicts[-1].status == "not_implemented":
        print(
            f"{name}: not yet implemented - fill in the function above and run this cell "
            f"again (0/{total:g} points)"
        )
        return
    earned = sum(v.points for v in verdicts)
    for v in verdicts:
        mark = "PASS" if v.passed else "FAIL"
        print(f"[{mark}] {v.name} ({v.points:g}/{v.max_points:g}): {v.message}")
    if earned == total:
        print(
            f"{name}: all visible tests pass ({earned:g}/{total:g}). The grader also runs hidden "
            "tests."
        )
    else:
        print(
            f"{name}: {earned:g}/{total:g} points on the visible tests. Start with the first "
            "FAIL above."
        )
