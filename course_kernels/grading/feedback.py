"""Turning an outcome into points and a sentence a student can act on.

Everything here runs in the grader's (or the notebook's) own process on data only: arrays that
came back from the student's function, checked for type, shape and finiteness before anything
else, and compared with a float64 reference computed here. The accuracy rule is the course's
(:mod:`course_kernels.testing`): at most 2x the error of a naive implementation in the same dtype
(3x for gradients). Known-wrong variants of each algorithm are computed too, so that a wrong
answer can be *named* ("the accumulator is not rescaled") rather than just reported.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from collections.abc import Callable

import numpy as np

from ..testing import error_budget, max_abs_error


class Fail(Exception):
    """Raised by a judge: the message is the student-facing feedback."""


@dataclass
class Case:
    """One test: a call made in the student's process, judged in ours."""

    exercise: str
    name: str
    points: float
    func: str
    args: tuple
    kwargs: dict
    judge: Callable  # (output, outcome) -> message on success; raises Fail
    torch: bool = False  # arrays become torch tensors before the call
    io_sram: int | None = None  # run ``func(mem, **kwargs)`` against a two-level memory
    probe: str | None = None  # "memory": measured in a separate process (see runner)
    timeout: float | None = None
    raises: str | None = None  # the test expects this exception type
    hidden: bool = False


@dataclass
class Verdict:
    name: str
    exercise: str
    points: float
    max_points: float
    message: str
    status: str = "ok"
    hidden: bool = False
    extra: dict = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return self.points >= self.max_points


def as_array(x, name: str, shape=None) -> np.ndarray:
    """The output as a float ndarray of the expected shape, or a Fail that says what is wrong.

    Values (NaN, inf) are judged by :func:`compare`, which can name the mistake behind them.
    """
    if hasattr(x, "detach"):  # torch tensors, in the notebook's own check cell
        x = x.detach().cpu().float().numpy()
    if not isinstance(x, np.ndarray) or type(x) is not np.ndarray:
        raise Fail(f"{name} should be a NumPy array; got {type(x).__name__}")
    if x.dtype.kind != "f":
        raise Fail(f"{name} should be a floating-point array; got dtype {x.dtype}")
    if shape is not None and tuple(x.shape) != tuple(shape):
        raise Fail(f"{name} has shape {tuple(x.shape)}, expected {tuple(shape)}")
    return x


def unpack(out, n: int, what: str):
    if not isinstance(out, tuple) or len(out) != n:
        got = f"a tuple of {len(out)}" if isinstance(out, tuple) else type(out).__name__
        raise Fail(f"should return {what} ({n} values); got {got}")
    return out


def close(x, ref, naive=None, factor=2.0, budget=None) -> tuple[bool, float, float]:
    """(ok, error, budget) under the course's rule."""
    if budget is None:
        budget = (
            error_budget(naive, ref, factor)
            if naive is not None
            else 1e-9 * max(1.0, float(np.abs(ref).max(initial=0)))
        )
    err = max_abs_error(x, ref)
    return err <= budget, err, budget


def matches(x, variant) -> bool:
    """Is ``x`` (almost) the output of a known-wrong variant? Loose: the variant is a diagnosis."""
    variant = np.asarray(variant, dtype=np.float64)
    x = np.asarray(x, dtype=np.float64)
    if x.shape != variant.shape:
        return False
    with np.errstate(invalid="ignore"):
        both_nan = np.isnan(x) & np.isnan(variant)
        same_inf = np.isinf(x) & (x == variant)
        ok = both_nan | same_inf | (np.abs(x - variant) <= 1e-3 * (1 + np.abs(variant)))
    return bool(ok.all())


def diagnose(x, variants) -> str | None:
    """The message of the first known-wrong variant ``x`` matches, else None."""
    for variant, message in variants:
        try:
            with np.errstate(all="ignore"):
                v = variant() if callable(variant) else variant
        except Exception:  # a variant that cannot be built for this case
            continue
        if matches(x, v):
            return message
    return None


def compare(
    x, ref, naive=None, what="output", variants=(), factor=2.0, budget=None, hint=None
) -> str:
    """Pass (returns a short message) or raise Fail naming the mistake when one is recognised."""
    ok, err, bud = close(x, ref, naive, factor, budget)
    if ok:
        return f"max error {err:.1e} (budget {bud:.1e})"
    named = diagnose(x, variants)
    if named:
        raise Fail(f"{what} is wrong: {named}")
    xf = np.asarray(x, dtype=np.float64)
    if np.isnan(xf).any():
        raise Fail(f"{what} contains NaN where the answer is finite. " + (hint or ""))
    msg = f"{what}: max abs error {err:.2e} exceeds the budget {bud:.2e}"
    if hint:
        msg += f". {hint}"
    raise Fail(msg)


def mutation_message(mutated: list, names: list[str]) -> str:
    which = ", ".join(names[i] if i < len(names) else f"argument {i}" for i in mutated)
    return (
        f"your function modified its input ({which}) in place. Callers reuse their arrays: "
        "work on copies (x = x.copy()) or new arrays"
    )


def error_message(outcome, func: str) -> tuple[str, str]:
    """(status, message) for an outcome that is not a normal return."""
    st = outcome.status
    err = outcome.error or {}
    if st == "not_implemented":
        return st, f"not yet implemented: fill in `{func}` (it still raises NotImplementedError)"
    if st == "error":
        t, m = err.get("type", "Error"), err.get("message", "")
        if t == "SystemExit":
            return st, f"`{func}` called sys.exit(); a function must return its result"
        if t == "OSError" and "File too large" in m:
            return st, (
                f"`{func}` printed more than the 1 MB of output the grader keeps "
                "(printing failed with 'File too large'): remove the prints"
            )
        if t == "MemoryError":
            return st, f"`{func}` ran out of memory (MemoryError): is something N x N or larger?"
        if t == "NameError" and "not defined in your solution" in m:
            return st, m + " (keep the function's name and put it in the cell marked YOUR CODE)"
        tb = err.get("traceback", "")
        line = next((ln.strip() for ln in reversed(tb.splitlines()) if "line" in ln), "")
        return st, f"`{func}` raised {t}: {m}" + (f" ({line})" if line else "")
    if st in ("timeout", "crash", "not_run", "invalid"):
        return st, outcome.message
    return st, f"unexpected outcome {st}"


MAX_STRING = 2000  # characters kept of any string from a submission


def clean_text(s, limit=MAX_STRING) -> str:
    """Any text from a submission, safe to print and to write as UTF-8 (lone surrogates escaped)."""
    s = str(s)[:limit]
    return s.encode("utf-8", "backslashreplace").decode("utf-8")


@dataclass
class CallOutcome:
    status: str  # ok | error | not_implemented | timeout | crash | not_run | invalid
    output: object = None  # decoded output: arrays, numbers, tuples
    error: dict | None = None
    seconds: float = 0.0
    mutated: list = field(default_factory=list)
    launches: int = 0
    trace: list | None = None
    message: str = ""  # sandbox-level explanation (timeout, crash, ...)
    memory: object = None  # (extra bytes, limit, how) for tiling checks; set by the runner
    peak: int | None = None  # peak memory (bytes) of the whole child that ran this call
    memory_note: str = ""  # why ``memory`` is None when the grader knows (no cgroup)
