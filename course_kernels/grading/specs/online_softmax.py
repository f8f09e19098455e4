"""Exercise 02, online softmax: the update and the merge: everything about it in one place.

What a spec module holds and how it is used: ``course_kernels/grading/specs/__init__.py``.
"""

# The solutions use the typing names the notebook's setup cell imports (Optional, Tuple).
# ruff: noqa: UP006, UP035, UP045

from __future__ import annotations

from typing import Tuple

import numpy as np

from ..builders import name_of, seeded
from ..feedback import Case, Fail, as_array, compare, unpack
from . import source_of

NAME = "02_online_softmax"
TITLE = "Online softmax: the update and the merge"
TIMEOUT = 20.0
TRITON = False

INTRO = (
    "Online softmax (Milakov & Gimelshein 2018) reads the scores block by block and keeps, per "
    "row, the running max m and the running sum l = sum exp(s - m). FlashAttention adds an "
    "unnormalised output accumulator acc = sum exp(s - m) v. When a block raises the max from "
    "m_old to m_new, everything accumulated so far is rescaled by alpha = exp(m_old - m_new) "
    "(FlashAttention-2, Alg. 1 lines 9-10). A row that has seen only masked scores has m = -inf, "
    "and exp(-inf - (-inf)) is NaN: guard it."
)


# -- the solution (real code: the notebook's solution cells are these functions' source) -------
# fmt: off
def online_update(
    m: np.ndarray, l: np.ndarray, acc: np.ndarray, s: np.ndarray, v: np.ndarray
) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One step of the online softmax with an output accumulator (FA2 Alg. 1 lines 9-10).

    Args:
        m: (Nq,) running row max (-inf: nothing seen yet).
        l: (Nq,) running sum of exp(s - m).
        acc: (Nq, dv) running sum of exp(s - m) @ v (not normalised).
        s: (Nq, block_k) this block's scores (-inf = masked).
        v: (block_k, dv) this block's values.
    Returns:
        (m_new, l_new, acc_new) with the same shapes. Do not modify the inputs.
    """
    m_new = np.maximum(m, s.max(axis=-1))  # (Nq,)
    m_safe = np.where(np.isneginf(m_new), 0.0, m_new)  # fully masked rows: no -inf - -inf
    p = np.exp(s - m_safe[:, None])  # (Nq, block_k), 0 where masked
    alpha = np.exp(m - m_safe)  # (Nq,) rescales what was accumulated so far
    l_new = alpha * l + p.sum(axis=-1)
    acc_new = alpha[:, None] * acc + p @ v  # (Nq, dv)
    return m_new, l_new, acc_new


def merge_partials(
    m_a: np.ndarray, l_a: np.ndarray, acc_a: np.ndarray,
    m_b: np.ndarray, l_b: np.ndarray, acc_b: np.ndarray,
) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Merge two partial attention states over disjoint keys.

    Args:
        m_a, m_b: (Nq,) row maxima (-inf: that side saw no key).
        l_a, l_b: (Nq,) sums of exp(s - m).
        acc_a, acc_b: (Nq, dv) unnormalised outputs.
    Returns:
        (m, l, acc): the state over the union of the keys.
    """
    m = np.maximum(m_a, m_b)  # (Nq,)
    m_safe = np.where(np.isneginf(m), 0.0, m)
    w_a = np.exp(m_a - m_safe)  # (Nq,) 0 for a side that saw nothing
    w_b = np.exp(m_b - m_safe)
    return m, w_a * l_a + w_b * l_b, w_a[:, None] * acc_a + w_b[:, None] * acc_b
# fmt: on


def solution_source(name: str) -> str:
    return source_of(SOLUTIONS, name)


SOLUTIONS = [online_update, merge_partials]

EXERCISES = [
    {
        "name": "online_update",
        "text": (
            "Absorb one block of scores `s` and values `v` into the running state. A fresh state "
            "is m = -inf, l = 0, acc = 0. Rows of `s` may be entirely `-inf`."
        ),
    },
    {
        "name": "merge_partials",
        "text": (
            "Two partial results over disjoint sets of keys, (m_a, l_a, acc_a) and (m_b, l_b, "
            "acc_b), combine exactly: bring both to the common max. This is what split-KV "
            "decoding (Flash-Decoding) does. A side may have seen no key (m = -inf)."
        ),
    },
]

VISIBLE = {
    "online_update": [
        {"name": "first block (empty state)", "state": "empty", "seed": 10, "points": 1},
        {"name": "the max rises: rescale", "m_shift": -3.0, "seed": 11, "points": 2},
        {"name": "the max stays", "m_shift": 4.0, "seed": 12, "points": 1},
        {"name": "fully masked rows", "state": "empty", "masked_rows": 2, "seed": 13, "points": 2},
    ],
    "merge_partials": [
        {"name": "two halves of the keys", "seed": 20, "points": 2},
        {"name": "very different maxima", "shift_b": 8.0, "seed": 21, "points": 1},
        {"name": "a side that saw no key", "empty_a": 2, "seed": 22, "points": 2},
    ],
}

HIDDEN = {
    "online_update": [
        {
            "name": "hidden: wide block, big rise",
            "nq": 9,
            "block_k": 31,
            "dv": 5,
            "m_shift": -10.0,
            "seed": 111,
            "points": 2,
        },
        {
            "name": "hidden: masked rows after keys seen",
            "nq": 7,
            "masked_rows": 3,
            "seed": 112,
            "points": 1,
        },
    ],
    "merge_partials": [
        {
            "name": "hidden: both sides empty on some rows",
            "nq": 8,
            "empty_a": 3,
            "empty_b": 2,
            "seed": 113,
            "points": 2,
        }
    ],
}


# -- tests: builders and the mistakes they name ------------------------------------------------
def _safe(m):
    return np.where(np.isneginf(m), 0.0, m)


def _update_ref(m, l, acc, s, v, bug=None):
    with np.errstate(all="ignore"):
        m_new = np.maximum(m, s.max(-1))
        ms = m_new if bug == "no_guard" else _safe(m_new)
        p = np.exp(s - ms[:, None])
        alpha = np.exp(m - ms) if bug != "inverted" else np.exp(ms - m)
        if bug == "no_rescale":
            return m_new, l + p.sum(-1), acc + p @ v
        if bug == "l_only":
            return m_new, alpha * l + p.sum(-1), acc + p @ v
        if bug == "normalize_block":
            return (
                m_new,
                alpha * l + p.sum(-1),
                alpha[:, None] * acc + (p / p.sum(-1, keepdims=True)) @ v,
            )
        return m_new, alpha * l + p.sum(-1), alpha[:, None] * acc + p @ v


UPDATE_MESSAGES = {
    "no_rescale": "the old l and acc are not rescaled: when the max rises from m_old to m_new, "
    "multiply both by alpha = exp(m_old - m_new) before adding the new block",
    "l_only": "l is rescaled but acc (the output accumulator) is not: O must be multiplied by "
    "alpha = exp(m_old - m_new) too (FA2 Alg. 1 line 10)",
    "inverted": "alpha is upside down: it is exp(m_old - m_new) <= 1",
    "normalize_block": "each block's probabilities were normalised on their own; keep acc "
    "unnormalised and divide by l once at the end",
    "no_guard": "rows whose scores are all -inf (fully masked) give NaN: exp(-inf - (-inf)) = "
    "exp(NaN). Subtract m_safe = (m if m > -inf else 0) so that those rows keep l = 0, acc = 0",
}


def _update_inputs(params):
    rng = seeded(params)
    nq, block_k, dv = params.get("nq", 5), params.get("block_k", 6), params.get("dv", 3)
    kind = params.get("state", "random")
    s = rng.standard_normal((nq, block_k)) * 2
    v = rng.standard_normal((block_k, dv))
    if kind == "empty":
        m, l, acc = np.full(nq, -np.inf), np.zeros(nq), np.zeros((nq, dv))
    else:
        m = rng.standard_normal(nq) + float(params.get("m_shift", 0.0))
        l = rng.random(nq) * 3 + 0.5
        acc = rng.standard_normal((nq, dv)) * l[:, None]
    if params.get("masked_rows"):
        s[: params["masked_rows"]] = -np.inf
    return m, l, acc, s, v


def build_online_update(params) -> Case:
    m, l, acc, s, v = _update_inputs(params)

    def judge(out, outcome):
        m2, l2, a2 = unpack(out, 3, "(m_new, l_new, acc_new)")
        m2 = as_array(m2, "m_new", m.shape)
        l2 = as_array(l2, "l_new", l.shape)
        a2 = as_array(a2, "acc_new", acc.shape)
        ref = _update_ref(m, l, acc, s, v)
        scale = 1e-12 * (1 + np.abs(ref[2]).max())
        notes = []
        for i, (got, what) in enumerate(((m2, "m_new"), (l2, "l_new"), (a2, "acc_new"))):
            variants = [
                (_update_ref(m, l, acc, s, v, bug)[i], UPDATE_MESSAGES[bug])
                for bug in ("no_guard", "l_only", "no_rescale", "inverted", "normalize_block")
            ]
            if not np.array_equal(np.isneginf(got), np.isneginf(ref[i])):
                raise Fail(
                    f"{what} should be -inf exactly where no score was seen yet "
                    "(a fully masked row keeps m = -inf)"
                )
            notes.append(
                compare(
                    np.where(np.isneginf(got), 0, got),
                    np.where(np.isneginf(ref[i]), 0, ref[i]),
                    None,
                    what,
                    [(np.where(np.isneginf(vv), 0, vv), msg) for vv, msg in variants],
                    budget=scale * (1 + np.abs(np.nan_to_num(ref[i])).max()),
                )
            )
        return "m, l and acc are right"

    return Case(
        "online_update",
        name_of(params, "update"),
        float(params.get("points", 1)),
        "online_update",
        (m, l, acc, s, v),
        {},
        judge,
    )


def _partial(rng, nq, nk, dv, empty_rows=0):
    s = rng.standard_normal((nq, nk)) * 2
    v = rng.standard_normal((nk, dv))
    if empty_rows:
        s[:empty_rows] = -np.inf
    return _update_ref(np.full(nq, -np.inf), np.zeros(nq), np.zeros((nq, dv)), s, v)


def _merge_ref(a, b, bug=None):
    with np.errstate(all="ignore"):
        m = np.maximum(a[0], b[0])
        ms = m if bug == "no_guard" else _safe(m)
        wa, wb = np.exp(a[0] - ms), np.exp(b[0] - ms)
        if bug == "no_rescale":
            wa = wb = np.ones_like(m)
        return m, wa * a[1] + wb * b[1], wa[:, None] * a[2] + wb[:, None] * b[2]


MERGE_MESSAGES = {
    "no_rescale": "the two partial results were added without rescaling: bring both to the common "
    "max first, l = exp(m_a - m) l_a + exp(m_b - m) l_b (and the same for acc)",
    "no_guard": "a side that has seen no key (m = -inf) gives NaN: exp(-inf - (-inf)). Use "
    "m_safe = (m if m > -inf else 0) in the exponent",
}


def build_merge_partials(params) -> Case:
    rng = seeded(params)
    nq, dv = params.get("nq", 6), params.get("dv", 4)
    a = _partial(rng, nq, params.get("nk_a", 5), dv, params.get("empty_a", 0))
    b = _partial(rng, nq, params.get("nk_b", 7), dv, params.get("empty_b", 0))
    if params.get("shift_b"):
        b = (b[0] + params["shift_b"], b[1], b[2])

    def judge(out, outcome):
        got = unpack(out, 3, "(m, l, acc)")
        ref = _merge_ref(a, b)
        for i, what in enumerate(("m", "l", "acc")):
            g = as_array(got[i], what, ref[i].shape)
            if not np.array_equal(np.isneginf(g), np.isneginf(ref[i])):
                raise Fail(f"{what}: -inf must stay exactly where neither side saw a key")
            variants = [
                (
                    np.where(np.isneginf(_merge_ref(a, b, bug)[i]), 0, _merge_ref(a, b, bug)[i]),
                    MERGE_MESSAGES[bug],
                )
                for bug in ("no_guard", "no_rescale")
            ]
            compare(
                np.where(np.isneginf(g), 0, g),
                np.where(np.isneginf(ref[i]), 0, ref[i]),
                None,
                what,
                variants,
                budget=1e-12 * (1 + np.abs(np.nan_to_num(ref[i])).max()),
            )
        return "the merge is exact"

    return Case(
        "merge_partials",
        name_of(params, "merge"),
        float(params.get("points", 1)),
        "merge_partials",
        (*a, *b),
        {},
        judge,
    )


BUILDERS = {
    "online_update": build_online_update,
    "merge_partials": build_merge_partials,
}
