"""Grade a notebook: extract the solution cells, run them in the sandbox, judge the results here.

Also the in-notebook ``check`` (visible tests only, run in the student's own kernel: the student
is not an adversary of their own notebook, and the feedback is the same code as the grader's).
"""

from __future__ import annotations

import ast
import copy
import os
import time
import tracemalloc
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .exercises import (
    EXERCISES,
    FORBIDDEN_ALWAYS,
    FORBIDDEN_TORCH,
    Notebook,
    hidden_params,
    notebook_of,
    preamble,
)
from .feedback import Fail, Verdict, error_message, mutation_message
from .sandbox import CallOutcome, Limits, run_submission

ARG_NAMES = {
    "online_update": ["m", "l", "acc", "s", "v"],
    "merge_partials": ["m_a", "l_a", "acc_a", "m_b", "l_b", "acc_b"],
    "flash_backward": ["q", "k", "v", "out", "lse", "dout"],
}


@dataclass
class NotebookResult:
    path: str
    notebook: str
    verdicts: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    seconds: float = 0.0

    @property
    def score(self) -> float:
        return sum(v.points for v in self.verdicts)

    @property
    def max_score(self) -> float:
        return sum(v.max_points for v in self.verdicts)


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
    return cells or _cells_by_definition(nb_json)


def _cells_by_definition(nb_json) -> dict:
    """Fallback when an editor dropped the cell metadata: the last code cell that defines each
    exercise's function at top level is that exercise's solution cell."""
    found: dict = {}
    for cell in nb_json.get("cells", []):
        if cell.get("cell_type") != "code":
            continue
        src = cell.get("source", "")
        src = _strip_magics("".join(src) if isinstance(src, list) else str(src))
        try:
            tree = ast.parse(src)
        except SyntaxError:
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


def _strip_magics(src: str) -> str:
    """IPython magics and shell escapes are not Python: comment them out."""
    return "\n".join("# " + ln if ln.lstrip().startswith(("%", "!")) else ln
                     for ln in src.splitlines())


def forbidden_use(source: str, torch_rules: bool) -> str | None:
    """Why a solution cell may not be graded (by reading it), or None."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None  # reported when it runs
    jit_lines = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and any(
            "jit" in ast.unparse(dec) for dec in node.decorator_list
        ):
            jit_lines.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Name):
            names = [node.id]
        elif isinstance(node, ast.Attribute):
            names = [node.attr]
        elif isinstance(node, ast.Import):
            names = [p for a in node.names for p in a.name.split(".")]
        elif isinstance(node, ast.ImportFrom):
            names = (node.module or "").split(".") + [a.name for a in node.names]
        elif torch_rules and isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
            if node.lineno not in jit_lines:
                return "multiplies matrices with @ outside a Triton kernel (line %d)" % node.lineno
        for n in names:
            if n in FORBIDDEN_ALWAYS:
                return f"{FORBIDDEN_ALWAYS[n]} (`{n}`, line {node.lineno})"
            if torch_rules and n in FORBIDDEN_TORCH and node.lineno not in jit_lines:
                return f"{FORBIDDEN_TORCH[n]} (`{n}`, line {node.lineno})"
    return None


# -- grading in the sandbox -------------------------------------------------------------------
def build_cases(nb: Notebook, hidden_dir=None, include_hidden=True):
    hidden = hidden_params(nb.name, hidden_dir) if include_hidden else {}
    cases = []
    for name in nb.exercises:
        ex = EXERCISES[name]
        cases += ex.cases()
        cases += ex.cases(hidden.get(name, []), hidden=True)
    return cases


def _encode_args(case, cid, arrays):
    def enc(x, tag):
        if isinstance(x, np.ndarray):
            arrays[f"c{cid}_{tag}"] = x
            return {"array": f"c{cid}_{tag}"}
        return {"value": x}

    return ([enc(a, f"a{i}") for i, a in enumerate(case.args)],
            {k: enc(v, f"k{k}") for k, v in case.kwargs.items()})


def _call_spec(case, cid, arrays, limits):
    args, kwargs = _encode_args(case, cid, arrays)
    timeout = min(case.timeout or limits.call_seconds, limits.call_seconds)
    return {"id": cid, "exercise": case.exercise, "func": case.func, "args": args,
            "kwargs": kwargs, "torch": case.torch, "io_sram": case.io_sram,
            "timeout": timeout}


_BASELINES: dict = {}
# A Python process with NumPy loaded is tens of MB; a peak below this means the kernel's number
# did not cover the interpreter (e.g. only the `unshare` wrapper was measured).
PLAUSIBLE_MIN_RSS_KB = 10 * 1024


def _probe_memory(nb, case, cell, limits, hide=()):
    """Peak RSS of a fresh child running one call, minus that of a child running a trivial stub.

    Measured by the kernel (``wait4``'s ru_maxrss), so the student's code cannot fake it.
    """
    arrays: dict = {}
    call = _call_spec(case, 0, arrays, limits)
    key = (nb.name, case.exercise, case.name, case.hidden)
    if key not in _BASELINES:
        stub = f"def {case.func}(*args, **kwargs):\n    return None\n"
        rss = []
        for _ in range(4):
            rep = run_submission(preamble(nb), [{"exercise": case.exercise, "source": stub}],
                                 [call], arrays, limits, nb.triton, hide)
            if rep.maxrss_kb >= PLAUSIBLE_MIN_RSS_KB:
                rss.append(rep.maxrss_kb)
            if len(rss) == 2:
                break
        _BASELINES[key] = min(rss) if rss else None
    rep = run_submission(preamble(nb), [{"exercise": case.exercise, "source": cell}], [call],
                         arrays, limits, nb.triton, hide)
    outcome = rep.calls.get(0, CallOutcome("crash", message="no result"))
    if _BASELINES[key] is None or rep.maxrss_kb < PLAUSIBLE_MIN_RSS_KB:
        outcome.memory = None  # not measured: the judge fails closed, never "tiled" by default
        return outcome
    extra = max(0, rep.maxrss_kb - _BASELINES[key]) * 1024
    nq, nk = case.args[0].shape[-2], case.args[1].shape[-2]
    outcome.memory = (extra, nq * nk * 8 // 2, "as the peak resident memory of the process")
    return outcome


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
                    outcome.status == "error" and err == "NotImplementedError"):
                v.message = f"should raise {case.raises} here" + (
                    f"; it raised {err}" if err else "")
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
    return v


def grade_notebook(path, hidden_dir=None, limits: Limits | None = None,
                   include_hidden=True) -> NotebookResult:
    """Grade one submitted notebook. Never raises for anything inside the notebook."""
    import json

    t0 = time.monotonic()
    path = Path(path)
    res = NotebookResult(str(path), "?")
    try:
        nb_json = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(nb_json, dict):
            raise ValueError("not a notebook")
    except (OSError, ValueError, UnicodeDecodeError) as e:
        res.notes.append(f"could not read the notebook: {e}")
        return res
    meta = nb_json.get("metadata", {}).get("course_kernels", {})
    stem = meta.get("notebook") if isinstance(meta, dict) and meta.get("notebook") else path.stem
    try:
        nb = notebook_of(str(stem))
    except KeyError as e:
        res.notes.append(str(e))
        return res
    res.notebook = nb.name
    if nb.note:
        res.notes.append(nb.note)
    cases = build_cases(nb, hidden_dir, include_hidden)
    cells = solution_cells(nb_json)
    limits = limits or Limits(call_seconds=nb.timeout, total_seconds=max(240.0, 4 * nb.timeout))
    flagged = {}
    for ex, src in cells.items():
        why = forbidden_use(src, EXERCISES[ex].torch_rules)
        if why:
            flagged[ex] = why
    arrays: dict = {}
    calls = []
    by_id = {}
    for cid, case in enumerate(cases):
        if case.probe:
            continue
        calls.append(_call_spec(case, cid, arrays, limits))
        by_id[cid] = case
    cell_list = [{"exercise": ex, "source": src} for ex, src in cells.items()]
    hide = [path.resolve().parent] + ([Path(hidden_dir).resolve()] if hidden_dir else [])
    report = run_submission(preamble(nb), cell_list, calls, arrays, limits, nb.triton, hide)
    outcomes = dict(report.calls)
    bad = {ex for ex, st in report.cells.items() if not st.get("ok", True)}
    for cid, case in enumerate(cases):
        if not case.probe:
            continue
        prior = [outcomes.get(i) for i, c in by_id.items() if c.exercise == case.exercise]
        if case.exercise not in cells or case.exercise in bad or any(
                o is None or o.status in ("timeout", "crash", "not_implemented") for o in prior):
            outcomes[cid] = CallOutcome("not_run", message="not run: the other tests of this "
                                        "exercise did not complete")
            if prior and prior[0] is not None and prior[0].status == "not_implemented":
                outcomes[cid] = prior[0]
            continue
        outcomes[cid] = _probe_memory(nb, case, cells[case.exercise], limits, hide)
    for cid, case in enumerate(cases):
        outcome = outcomes.get(cid) or CallOutcome("crash", message="no result came back")
        cell = report.cells.get(case.exercise)
        cell_error = None
        if case.exercise not in cells:
            outcome = CallOutcome("error", error={
                "type": "NameError", "message": f"name {case.func!r} is not defined in your "
                "solution cells: the cell marked YOUR CODE is missing"})
        elif cell is not None and not cell.get("ok", True):
            err = cell.get("error") or {}
            cell_error = (err.get("message") if err.get("type") == "Crash"
                          else f"{err.get('type')}: {err.get('message')}")
        v = judge(case, outcome, cell_error)
        if case.exercise in flagged:
            v.points, v.status = 0.0, "flagged"
            v.message = (f"not graded: your code {flagged[case.exercise]}, which a submission may "
                         "not do. Write the algorithm with NumPy/Triton only")
        res.verdicts.append(v)
    if report.restarts:
        res.notes.append(f"the sandbox restarted {report.restarts} time(s) after a crash/timeout")
    res.seconds = time.monotonic() - t0
    return res


# -- the check cell ---------------------------------------------------------------------------
class LoggingMemory:
    """Wraps course_kernels.iosim.TwoLevelMemory and logs ops in the sandbox's format."""

    def __new__(cls, sram, **hbm):
        from ..iosim import TwoLevelMemory

        class _Logged(TwoLevelMemory):
            def __init__(self, sram, **hbm):
                super().__init__(sram, **hbm)
                self.log, self._tid = [], {}

            def load(self, name, rows=slice(None), registers=False):
                tile = super().load(name, rows, registers)
                n = self.hbm[name].shape[-2] if self.hbm[name].ndim >= 2 else self.hbm[name].shape[-1]
                a, b, _ = rows.indices(n)
                self._tid[id(tile)] = len(self._tid)
                self.log.append(["load", name, a, b, bool(registers), self._tid[id(tile)]])
                return tile

            def store(self, name, rows, tile=None):
                super().store(name, rows, tile)
                n = self.hbm[name].shape[-2] if self.hbm[name].ndim >= 2 else self.hbm[name].shape[-1]
                a, b, _ = rows.indices(n)
                self.log.append(["store", name, a, b])

            def alloc(self, shape, fill=0.0, dtype=np.float64):
                tile = super().alloc(shape, fill, dtype)
                self._tid[id(tile)] = len(self._tid)
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
            mem = LoggingMemory(case.io_sram, Q=q, K=k, V=v,
                                O=np.zeros((*q.shape[:-1], v.shape[-1]), q.dtype),
                                L=np.full(q.shape[:-1], -np.inf, q.dtype))
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

        outcome = CallOutcome("error", error={"type": type(e).__name__, "message": str(e),
                                              "traceback": traceback.format_exc(limit=-2)})
    finally:
        if started:
            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
            nq, nk = case.args[0].shape[-2], case.args[1].shape[-2]
            outcome.memory = (peak, nq * nk * 8 // 2, "with tracemalloc")
        if orig is not None:
            import triton.runtime.interpreter as interp

            interp.InterpretedFunction.run = orig
    outcome.launches = launches[0] if case.torch and orig is not None else 1
    before = [a for a in case.args if isinstance(a, np.ndarray)]
    after = [a.numpy() if hasattr(a, "numpy") else a for a in args if hasattr(a, "shape")]
    outcome.mutated = [i for i, (x, y) in enumerate(zip(before, after))
                       if x.shape != y.shape or not np.array_equal(x, y, equal_nan=True)]
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


def check(name: str, fn) -> None:
    """Run the visible tests of exercise ``name`` on ``fn`` and print teaching feedback.

    Used by the notebooks' check cells. Never raises for a wrong or unfinished solution: an
    unfinished stub reports "not yet implemented".
    """
    total = sum(c.points for c in EXERCISES[name].cases())
    verdicts = run_visible(name, fn)
    if verdicts and verdicts[-1].status == "not_implemented":
        print(f"{name}: not yet implemented - fill in the function above and run this cell "
              f"again (0/{total:g} points)")
        return
    earned = sum(v.points for v in verdicts)
    for v in verdicts:
        mark = "PASS" if v.passed else "FAIL"
        print(f"[{mark}] {v.name} ({v.points:g}/{v.max_points:g}): {v.message}")
    if earned == total:
        print(f"{name}: all visible tests pass ({earned:g}/{total:g}). The grader also runs hidden "
              "tests.")
    else:
        print(f"{name}: {earned:g}/{total:g} points on the visible tests. Start with the first "
              "FAIL above.")
