"""Exercise 04, block sizes and the SRAM budget: everything about it in one place.

What a spec module holds and how it is used: ``course_kernels/grading/specs/__init__.py``.
"""

# The solutions use the typing names the notebook's setup cell imports (Optional, Tuple).
# ruff: noqa: UP006, UP035, UP045
# M is the SRAM size (the paper's name), not a constant: `M < 4 * d` is not a Yoda condition.
# ruff: noqa: SIM300

from __future__ import annotations

import math
from typing import Tuple

import numpy as np

from ..builders import as_int, name_of
from ..feedback import Case, Fail, unpack
from . import source_of

NAME = "04_block_sizes"
TITLE = "Block sizes and the SRAM budget"
TIMEOUT = 20.0
TRITON = False

INTRO = (
    "The SRAM holds M elements. The article's rule: the Q, K, V and O blocks of B rows (d "
    "columns each) must fit, 4 B d <= M, and it says to round B = M / 4d *up*. Rounding an upper "
    "bound up breaks it: M = 100000, d = 64 gives 391 rows and 4 x 391 x 64 = 100096 > M. The "
    "paper also has to fit the score tile S (`block_q` x `block_k`), which is why it sets "
    "B_c = M/4d and B_r = min(B_c, d) (FlashAttention Alg. 1 line 1, with floor): our "
    "`block_k` and `block_q`."
)


# -- the solution (real code: the notebook's solution cells are these functions' source) -------
# fmt: off
def block_size(M: int, d: int) -> int:
    """The largest B with 4*B*d <= M (blocks of Q, K, V, O fit the SRAM).

    Args:
        M: SRAM capacity in elements.  d: head dim.
    Raises:
        ValueError: if M < 4*d.
    """
    if M < 4 * d:
        raise ValueError(f"M={M} is too small for one row of each block: need M >= 4d = {4 * d}")
    return M // (4 * d)  # floor: rounding an upper bound up breaks it


def tile_sizes(M: int, d: int) -> Tuple[int, int]:
    """(block_q, block_k): block_k = floor(M / 4d), block_q = min(block_k, d).

    The paper's B_r, B_c (FlashAttention Alg. 1 line 1).
    """
    block_k = block_size(M, d)
    return min(block_k, d), block_k


def fits_in_sram(block_q: int, block_k: int, d: int, M: int) -> bool:
    """True if 2*block_q*d + 2*block_k*d + block_q*block_k <= M (blocks plus the score tile)."""
    return 2 * block_q * d + 2 * block_k * d + block_q * block_k <= M
# fmt: on


def solution_source(name: str) -> str:
    return source_of(SOLUTIONS, name)


SOLUTIONS = [block_size, tile_sizes, fits_in_sram]

EXERCISES = [
    {
        "name": "block_size",
        "text": "The largest B with 4 B d <= M; raise `ValueError` when not even one row fits.",
    },
    {
        "name": "tile_sizes",
        "text": (
            "The tiles of FlashAttention Alg. 1 line 1: `block_k` = floor(M / 4d), `block_q` = "
            "min(`block_k`, d) (the paper's B_c, B_r)."
        ),
    },
    {
        "name": "fits_in_sram",
        "text": (
            "Do Q_i and O_i (`block_q` x d), K_j and V_j (`block_k` x d) *and* the score tile "
            "S_ij (`block_q` x `block_k`) fit in M elements?"
        ),
    },
]

VISIBLE = {
    "block_size": [
        {"M": 100000, "d": 64, "points": 2},
        {"M": 96000, "d": 64, "points": 1},
        {"M": 1000, "d": 64, "points": 1},
        {"name": "M < 4d raises ValueError", "M": 100, "d": 64, "points": 1},
    ],
    "tile_sizes": [{"M": 100000, "d": 64}, {"M": 2048, "d": 64}, {"M": 65536, "d": 128}],
    "fits_in_sram": [
        {"block_q": 64, "block_k": 390, "d": 64, "M": 100000},
        {
            "name": "the article's B=375 at d=64",
            "block_q": 375,
            "block_k": 375,
            "d": 64,
            "M": 96000,
            "points": 2,
        },
        {"name": "exactly full", "block_q": 8, "block_k": 8, "d": 8, "M": 320},
    ],
}

HIDDEN = {
    "block_size": [
        {"name": "hidden: M=163840, d=128", "M": 163840, "d": 128, "points": 1},
        {"name": "hidden: M=4d exactly", "M": 512, "d": 128, "points": 1},
    ],
    "tile_sizes": [{"name": "hidden: M=1000000, d=64", "M": 1000000, "d": 64, "points": 1}],
    "fits_in_sram": [
        {
            "name": "hidden: one element over",
            "block_q": 8,
            "block_k": 8,
            "d": 8,
            "M": 319,
            "points": 1,
        }
    ],
}


# -- tests: builders and the mistakes they name ------------------------------------------------
def build_block_size(params) -> Case:
    M, d = int(params["M"]), int(params["d"])

    def judge(out, outcome):
        if M < 4 * d:
            raise Fail(f"M={M} < 4d={4 * d}: no block fits; raise ValueError")
        b = as_int(out, "block_size")
        want = M // (4 * d)
        if b == want:
            return f"B = {b}, 4*B*d = {4 * b * d} <= M = {M}"
        if b == math.ceil(M / (4 * d)):
            raise Fail(
                f"B = {b} was rounded up: 4*B*d = {4 * b * d} > M = {M}. B is an upper "
                "bound, so round down (floor)"
            )
        raise Fail(f"B = {b}; the largest B with 4*B*d <= M is {want}")

    raises = "ValueError" if M < 4 * int(d) else None
    return Case(
        "block_size",
        name_of(params, f"M={M}, d={d}"),
        float(params.get("points", 1)),
        "block_size",
        (M, d),
        {},
        judge,
        raises=raises,
    )


def build_tile_sizes(params) -> Case:
    M, d = int(params["M"]), int(params["d"])

    def judge(out, outcome):
        block_q, block_k = unpack(out, 2, "(block_q, block_k)")
        block_q, block_k = as_int(block_q, "block_q"), as_int(block_k, "block_k")
        want_block_k = M // (4 * d)
        want = (min(want_block_k, d), want_block_k)
        if (block_q, block_k) == want:
            return f"(block_q, block_k) = {want}"
        if block_k == math.ceil(M / (4 * d)) and block_k != want_block_k:
            raise Fail("block_k was rounded up; use floor(M / 4d)")
        if (block_q, block_k) == (want_block_k, want_block_k):
            raise Fail(
                "block_q must also keep the block_q x block_k score tile small: "
                "block_q = min(block_k, d)"
            )
        raise Fail(f"got (block_q, block_k) = ({block_q}, {block_k}); expected {want}")

    return Case(
        "tile_sizes",
        name_of(params, f"M={M}, d={d}"),
        float(params.get("points", 1)),
        "tile_sizes",
        (M, d),
        {},
        judge,
    )


def build_fits_in_sram(params) -> Case:
    block_q, block_k, d, M = (int(params[x]) for x in ("block_q", "block_k", "d", "M"))
    need = 2 * block_q * d + 2 * block_k * d + block_q * block_k

    def judge(out, outcome):
        if not isinstance(out, bool) and not (isinstance(out, np.ndarray) and out.dtype == bool):
            raise Fail(f"should return a bool; got {type(out).__name__}")
        want = need <= M
        if bool(out) == want:
            return f"{need} elements {'<=' if want else '>'} M = {M}"
        if bool(out) == (2 * block_q * d + 2 * block_k * d <= M):
            raise Fail(
                f"the block_q x block_k = {block_q * block_k}-element score tile S must fit too "
                f"({need} > {M})"
            )
        raise Fail(
            f"Q_i, O_i (block_q x d), K_j, V_j (block_k x d) and S_ij (block_q x block_k) take "
            f"{need} elements; M = {M}"
        )

    return Case(
        "fits_in_sram",
        name_of(params, f"block_q={block_q}, block_k={block_k}, d={d}, M={M}"),
        float(params.get("points", 1)),
        "fits_in_sram",
        (block_q, block_k, d, M),
        {},
        judge,
    )


BUILDERS = {
    "block_size": build_block_size,
    "tile_sizes": build_tile_sizes,
    "fits_in_sram": build_fits_in_sram,
}
