"""Exercise 01, stable softmax and logsumexp: everything about it in one place.

What a spec module holds and how it is used: ``course_kernels/grading/specs/__init__.py``.
"""

from __future__ import annotations

import math

import numpy as np

from ..builders import name_of, seeded
from ..feedback import Case, as_array, compare
from . import source_of

NAME = "01_stable_softmax"
TITLE = "Stable softmax and logsumexp"
TIMEOUT = 20.0
TRITON = False

INTRO = (
    "Softmax turns a row of scores into probabilities. Computed naively, `exp` overflows at "
    "scores above ~88 in float32 (~709 in float64). The fix is the identity softmax(x) = "
    "softmax(x - c) for any constant c: with c = max(x) every exponent is <= 0. The logsumexp L "
    "= log sum exp(x) is the number FlashAttention saves for its backward pass."
)


# -- the solution (real code: the notebook's solution cells are these functions' source) -------
# fmt: off
def stable_softmax(x: np.ndarray) -> np.ndarray:
    """Row softmax along the last axis.

    Args:
        x: (..., N) scores, float32 or float64; may contain -inf (masked), never a row of only -inf.
    Returns:
        (..., N) probabilities in x's dtype; each row sums to 1.
    """
    m = x.max(axis=-1, keepdims=True)  # (..., 1) row max: every exponent below is <= 0
    e = np.exp(x - m)  # (..., N)
    return e / e.sum(axis=-1, keepdims=True)


def logsumexp(x: np.ndarray) -> np.ndarray:
    """Row logsumexp along the last axis.

    Args:
        x: (..., N) scores; may contain -inf, never a row of only -inf.
    Returns:
        (...,) log(sum(exp(x), axis=-1)), natural log.
    """
    m = x.max(axis=-1, keepdims=True)  # (..., 1)
    return (m + np.log(np.exp(x - m).sum(axis=-1, keepdims=True)))[..., 0]
# fmt: on


def solution_source(name: str) -> str:
    return source_of(SOLUTIONS, name)


SOLUTIONS = [stable_softmax, logsumexp]

EXERCISES = [
    {
        "name": "stable_softmax",
        "text": (
            "Write a softmax along the last axis that never overflows. Rows may contain `-inf` "
            "(masked scores, probability 0) but always at least one finite score."
        ),
    },
    {
        "name": "logsumexp",
        "text": (
            "Write the row logsumexp L = log sum_j exp(x_j), stable for large scores: L = m + "
            "log sum_j exp(x_j - m) with m the row max."
        ),
    },
]

VISIBLE = {
    "stable_softmax": [
        {"name": "small rows", "shape": [4, 9], "seed": 1, "points": 2},
        {"name": "large scores (overflow)", "shape": [3, 8], "scale": 1000, "seed": 2, "points": 2},
        {"name": "masked scores (-inf)", "shape": [4, 10], "masked": True, "seed": 3, "points": 1},
        {
            "name": "batched (..., N), float32",
            "shape": [2, 3, 5, 7],
            "dtype": "float32",
            "scale": 5,
            "seed": 4,
            "points": 1,
        },
    ],
    "logsumexp": [
        {"name": "small rows", "shape": [4, 9], "seed": 5, "points": 1},
        {
            "name": "large scores (overflow)",
            "shape": [3, 8],
            "scale": 10,
            "shift": 1000,
            "seed": 6,
            "points": 2,
        },
        {"name": "masked scores (-inf)", "shape": [4, 10], "masked": True, "seed": 7, "points": 1},
    ],
}

HIDDEN = {
    "stable_softmax": [
        {
            "name": "hidden: long rows float32",
            "shape": [3, 1000],
            "dtype": "float32",
            "scale": 30,
            "seed": 101,
            "points": 2,
        },
        {
            "name": "hidden: huge negative scores",
            "shape": [5, 17],
            "scale": 10,
            "shift": -5000,
            "seed": 102,
            "points": 1,
        },
    ],
    "logsumexp": [
        {
            "name": "hidden: batched large",
            "shape": [2, 4, 33],
            "scale": 50,
            "shift": 800,
            "seed": 103,
            "points": 2,
        }
    ],
}


# -- tests: builders and the mistakes they name ------------------------------------------------
def _softmax64(x):
    x = np.asarray(x, dtype=np.float64)
    m = x.max(axis=-1, keepdims=True)
    e = np.exp(x - m)
    return e / e.sum(axis=-1, keepdims=True)


def _softmax_same_dtype(x):
    m = x.max(axis=-1, keepdims=True)
    e = np.exp(x - m)
    return e / e.sum(axis=-1, keepdims=True)


def _softmax_input(params):
    rng = seeded(params)
    shape = tuple(params.get("shape", (4, 9)))
    dtype = np.dtype(params.get("dtype", "float64"))
    x = rng.standard_normal(shape) * float(params.get("scale", 1.0)) + float(params.get("shift", 0))
    if params.get("masked"):
        x = np.where(rng.random(shape) < 0.3, -np.inf, x)
        x[..., 0] = 0.0  # every row keeps one visible score
    return x.astype(dtype)


def build_stable_softmax(params) -> Case:
    x = _softmax_input(params)

    def judge(out, outcome):
        y = as_array(out, "the result", x.shape)
        ref = _softmax64(x)
        with np.errstate(all="ignore"):
            xf = x.astype(np.float64)
            variants = [
                (
                    lambda: np.exp(xf) / np.exp(xf).sum(-1, keepdims=True),
                    "exp overflowed: subtract the row max before exp (softmax(x) = softmax(x - max x))",
                ),
                (
                    lambda: np.exp(xf - xf.max(-1, keepdims=True)),
                    "the rows do not sum to 1: divide by the row sum",
                ),
                (
                    lambda: (
                        np.exp(xf - xf.max(0, keepdims=True))
                        / np.exp(xf - xf.max(0, keepdims=True)).sum(0, keepdims=True)
                    ),
                    "normalised over the wrong axis: softmax runs along the last axis (-1)",
                ),
                (
                    lambda: (
                        np.exp(xf - xf.max(-1, keepdims=True))
                        / np.exp(xf - xf.max(-1, keepdims=True)).sum(0, keepdims=True)
                    ),
                    "the sum runs over the wrong axis: use axis=-1, keepdims=True",
                ),
            ]
        return compare(
            y,
            ref,
            _softmax_same_dtype(x),
            "softmax",
            variants,
            hint="softmax(x)_i = exp(x_i - max x) / sum_j exp(x_j - max x) along axis -1",
        )

    return Case(
        "stable_softmax",
        name_of(params, "softmax"),
        float(params.get("points", 1)),
        "stable_softmax",
        (x,),
        {},
        judge,
    )


def build_logsumexp(params) -> Case:
    x = _softmax_input(params)

    def judge(out, outcome):
        y = as_array(np.asarray(out) if np.isscalar(out) else out, "the result", x.shape[:-1])
        xf = x.astype(np.float64)
        m = xf.max(-1)
        ref = m + np.log(np.exp(xf - m[..., None]).sum(-1))
        naive = (x.max(-1) + np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1))).astype(x.dtype)
        with np.errstate(all="ignore"):
            variants = [
                (
                    lambda: np.log(np.exp(xf).sum(-1)),
                    "exp overflowed: compute m + log(sum exp(x - m)) with m the row max",
                ),
                (
                    lambda: np.log(np.exp(xf - m[..., None]).sum(-1)),
                    "you subtracted the max but did not add it back: lse = m + log(sum exp(x - m))",
                ),
                (lambda: ref / math.log(2), "that is log base 2; use the natural log"),
                (lambda: m, "that is the row max, not the logsumexp (add log of the sum)"),
            ]
        return compare(y, ref, naive, "logsumexp", variants)

    return Case(
        "logsumexp",
        name_of(params, "logsumexp"),
        float(params.get("points", 1)),
        "logsumexp",
        (x,),
        {},
        judge,
    )


BUILDERS = {
    "stable_softmax": build_stable_softmax,
    "logsumexp": build_logsumexp,
}
