"""Exercise 03, the tiled forward pass in NumPy: everything about it in one place.

What a spec module holds and how it is used: ``course_kernels/grading/specs/__init__.py``.
"""

# The solutions use the typing names the notebook's setup cell imports (Optional, Tuple).
# ruff: noqa: UP006, UP035, UP045

from __future__ import annotations

import math
from typing import Optional, Tuple

import numpy as np

from ...numpy.reference import attention_naive, attention_reference
from ..builders import fwd_kwargs, name_of, qkv_inputs, structure_message
from ..feedback import Case, as_array, compare, unpack
from ..variants import lse_variants, tiled_variants
from . import source_of

NAME = "03_tiled_forward"
TITLE = "The tiled forward pass in NumPy"
TIMEOUT = 30.0
TRITON = False

INTRO = (
    "The article's NumPy demo, fixed. Flash Attention never forms the Nq x Nk score matrix: it "
    "walks over (block_q x block_k) tiles, keeps m, l and an output accumulator per query block, "
    "and divides by l once at the end (FlashAttention-2, Alg. 1). The demo this replaces took "
    "the key length from Q (cross-attention broke), forgot the 1/sqrt(d) scale and never tested "
    "uneven blocks. Your version must handle any Nq, Nk, dv, block sizes that do not divide N, "
    "causal masking (PyTorch's is_causal: query i sees keys j <= i), and return the logsumexp L "
    "= m + log(l) that the backward pass needs. The grader also measures memory: an "
    "implementation that forms the full N x N matrix fails the 'really tiled' test."
)


# -- the solution (real code: the notebook's solution cells are these functions' source) -------
# fmt: off
def flash_forward(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool = False,
    scale: Optional[float] = None, block_q: int = 64, block_k: int = 64,
) -> Tuple[np.ndarray, np.ndarray]:
    """Tiled Flash Attention forward (FlashAttention-2 loop order).

    Args:
        q: (..., Nq, d) queries, e.g. (batch, heads, seq, head_dim); float32 or float64.
        k: (..., Nk, d) keys.  v: (..., Nk, dv) values.
        causal: query i sees keys j <= i (top-left aligned, PyTorch is_causal).
        scale: multiplies Q K^T; None means 1/sqrt(d).
        block_q, block_k: rows of a query tile and of a key/value tile (need not divide Nq, Nk).
    Returns:
        out: (..., Nq, dv) in q's dtype;  lse: (..., Nq) logsumexp of each row's scaled scores.
    """
    n_q, d = q.shape[-2:]
    n_k, dv = k.shape[-2], v.shape[-1]  # from K and V, not from Q
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    out = np.empty((*q.shape[:-1], dv), dtype=q.dtype)  # (..., Nq, dv)
    lse = np.empty(q.shape[:-1], dtype=q.dtype)  # (..., Nq)
    for i0 in range(0, n_q, block_q):  # FA2 Alg. 1 line 3
        i1 = min(i0 + block_q, n_q)
        q_i = q[..., i0:i1, :]  # (..., block_q, d)
        m = np.full(q_i.shape[:-1], -np.inf, dtype=q.dtype)  # (..., block_q)
        l = np.zeros(q_i.shape[:-1], dtype=q.dtype)
        acc = np.zeros((*q_i.shape[:-1], dv), dtype=q.dtype)  # (..., block_q, dv)
        key_end = min(n_k, i1) if causal else n_k  # later key blocks are fully masked
        for j0 in range(0, key_end, block_k):
            j1 = min(j0 + block_k, key_end)
            s = scale * (q_i @ np.swapaxes(k[..., j0:j1, :], -1, -2))  # (..., block_q, block_k)
            if causal:
                visible = np.arange(j0, j1)[None, :] <= np.arange(i0, i1)[:, None]
                s = np.where(visible, s, -np.inf)
            m_new = np.maximum(m, s.max(axis=-1))  # line 9
            m_safe = np.where(np.isneginf(m_new), 0.0, m_new)
            p = np.exp(s - m_safe[..., None])  # (..., block_q, block_k)
            alpha = np.exp(m - m_safe)  # rescale what is already in l and acc
            l = alpha * l + p.sum(axis=-1)
            acc = alpha[..., None] * acc + p @ v[..., j0:j1, :]  # line 10
            m = m_new
        l_safe = np.where(l == 0, 1.0, l)
        out[..., i0:i1, :] = acc / l_safe[..., None]  # line 12: normalise once
        lse[..., i0:i1] = np.where(l == 0, -np.inf, np.where(np.isneginf(m), 0, m) + np.log(l_safe))
    return out, lse
# fmt: on


def solution_source(name: str) -> str:
    return source_of(SOLUTIONS, name)


SOLUTIONS = [flash_forward]

EXERCISES = [
    {
        "name": "flash_forward",
        "text": (
            "Write the tiled forward pass (outer loop over query blocks, inner loop over key "
            "blocks). Causal masks use `j <= i`; key blocks entirely above the diagonal can be "
            "skipped."
        ),
    }
]

VISIBLE = {
    "flash_forward": [
        {
            "name": "blocks divide N",
            "lead": [2, 3],
            "nq": 64,
            "block_q": 16,
            "block_k": 16,
            "seed": 30,
            "points": 2,
        },
        {
            "name": "uneven N and blocks",
            "nq": 77,
            "block_q": 16,
            "block_k": 24,
            "spread": 4,
            "seed": 31,
            "points": 2,
        },
        {
            "name": "cross-attention: Nq != Nk, dv != d",
            "nq": 50,
            "nk": 83,
            "d": 16,
            "dv": 24,
            "block_q": 16,
            "block_k": 32,
            "seed": 32,
            "points": 2,
        },
        {
            "name": "causal, uneven N",
            "nq": 70,
            "block_q": 16,
            "block_k": 24,
            "causal": True,
            "seed": 33,
            "points": 2,
        },
        {
            "name": "causal with Nq < Nk",
            "nq": 40,
            "nk": 72,
            "block_q": 16,
            "block_k": 16,
            "causal": True,
            "seed": 34,
            "points": 1,
        },
        {
            "name": "blocks of 1 and longer than N",
            "nq": 9,
            "block_q": 1,
            "block_k": 64,
            "seed": 35,
            "points": 1,
        },
        {"name": "custom scale", "nq": 33, "scale": 0.3, "seed": 36, "points": 1},
        {
            "name": "logsumexp saved for backward",
            "check": "lse",
            "nq": 45,
            "causal": True,
            "seed": 37,
            "points": 2,
        },
        {
            "name": "really tiled: no N x N matrix",
            "check": "memory",
            "lead": [1],
            "nq": 2048,
            "d": 16,
            "dtype": "float64",
            "block_q": 64,
            "block_k": 64,
            "seed": 38,
            "points": 2,
        },
    ]
}

HIDDEN = {
    "flash_forward": [
        {
            "name": "hidden: prime sizes",
            "lead": [2, 3],
            "nq": 113,
            "nk": 203,
            "d": 24,
            "dv": 40,
            "block_q": 32,
            "block_k": 48,
            "spread": 5,
            "seed": 121,
            "points": 2,
        },
        {
            "name": "hidden: causal prime sizes",
            "lead": [3],
            "nq": 97,
            "block_q": 13,
            "block_k": 29,
            "causal": True,
            "seed": 122,
            "points": 2,
        },
        {
            "name": "hidden: causal lse, Nq < Nk",
            "check": "lse",
            "nq": 31,
            "nk": 64,
            "block_q": 8,
            "block_k": 16,
            "causal": True,
            "seed": 123,
            "points": 1,
        },
        {
            "name": "hidden: really tiled with a long key sequence (no score matrix, not even in row chunks)",
            "check": "memory",
            "lead": [1],
            "nq": 64,
            "nk": 32768,
            "d": 16,
            "dtype": "float64",
            "block_q": 64,
            "block_k": 64,
            "seed": 124,
            "points": 2,
        },
    ]
}

# What the tiling check subtracts: the same calls on a stub that returns right-sized outputs.
BASELINE_STUBS = {
    "flash_forward": (
        "def flash_forward(q, k, v, *args, **kwargs):\n"
        "    out = np.ones((*q.shape[:-1], v.shape[-1]), q.dtype)\n"
        "    return out, np.ones(q.shape[:-1], q.dtype)\n"
    ),
}


# -- tests: builders and the mistakes they name ------------------------------------------------
def build_flash_forward(params) -> Case:
    q, k, v = qkv_inputs(params)
    kw = fwd_kwargs(params)
    what = params.get("check", "out")
    memory = what == "memory"

    def judge(out, outcome):
        o, lse = unpack(out, 2, "(out, lse)")
        o = as_array(o, "out", (*q.shape[:-1], v.shape[-1]))
        lse = as_array(lse, "lse", q.shape[:-1])
        ref, ref_lse = attention_reference(q, k, v, kw["causal"], kw.get("scale"))
        naive = attention_naive(q, k, v, kw["causal"], kw.get("scale"))
        msg = compare(
            o,
            ref,
            naive,
            "out",
            tiled_variants(q, k, v, **kw),
            hint="check the running max, the rescaling and the final division by l",
        )
        if what in ("lse", "memory"):
            naive_lse = ref_lse.astype(np.float32)
            compare(
                lse,
                ref_lse,
                None,
                "lse (saved for the backward pass)",
                lse_variants(q, k, kw["causal"], kw.get("scale")),
                budget=max(4e-6 * (1 + np.abs(naive_lse).max()), 1e-12),
            )
            msg += "; lse right"
        if memory:
            msg += structure_message(outcome, q, k, v, kw)
        return msg

    return Case(
        "flash_forward",
        name_of(params, what),
        float(params.get("points", 1)),
        "flash_forward",
        (q, k, v),
        kw,
        judge,
        probe="memory" if memory else None,
        timeout=params.get("timeout"),
    )


BUILDERS = {
    "flash_forward": build_flash_forward,
}
