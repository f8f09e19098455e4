"""Exercise 06, the tiled backward pass: everything about it in one place.

What a spec module holds and how it is used: ``course_kernels/grading/specs/__init__.py``.
"""

# The solutions use the typing names the notebook's setup cell imports (Optional, Tuple).
# ruff: noqa: UP006, UP035, UP045

from __future__ import annotations

import math
from typing import Optional, Tuple

import numpy as np

from ...numpy.reference import attention_reference
from ...numpy.tiled_backward import attention_reference_backward
from ..builders import fwd_kwargs, name_of, qkv_inputs, structure_message
from ..feedback import Case, as_array, compare, unpack
from ..variants import naive_backward, tiled_variants
from . import source_of

NAME = "06_tiled_backward"
TITLE = "The tiled backward pass"
TIMEOUT = 60.0
TRITON = False

INTRO = (
    "The backward pass recomputes the score tiles instead of storing P (FlashAttention Alg. 4; "
    "FlashAttention-2 Alg. 2). With the saved L = m + log l, P_ij = exp(S_ij - L_i) exactly. Per "
    "tile: dV_j += P^T dO_i, dP = dO_i V_j^T, dS = P * (dP - D_i) with D = rowsum(dO * O), dQ_i "
    "+= scale dS K_j, dK_j += scale dS^T Q_i. Loop over key blocks outside (dK_j, dV_j stay on "
    "chip) and query blocks inside."
)


# -- the solution (real code: the notebook's solution cells are these functions' source) -------
# fmt: off
def flash_backward(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, out: np.ndarray, lse: np.ndarray,
    dout: np.ndarray, causal: bool = False, scale: Optional[float] = None,
    block_q: int = 64, block_k: int = 64,
) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Tiled Flash Attention backward from the saved logsumexp.

    Args:
        q: (..., Nq, d); k: (..., Nk, d); v: (..., Nk, dv); out, dout: (..., Nq, dv);
        lse: (..., Nq) the forward's logsumexp; causal, scale, block_q, block_k as in the forward.
    Returns:
        (dq, dk, dv) with the shapes of q, k, v.
    """
    n_q, d = q.shape[-2:]
    n_k = k.shape[-2]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    big_d = (dout * out).sum(axis=-1)  # (..., Nq) D = rowsum(dO * O)
    dq = np.zeros(q.shape, dtype=q.dtype)
    dk = np.zeros(k.shape, dtype=q.dtype)
    dv = np.zeros(v.shape, dtype=q.dtype)
    for j0 in range(0, n_k, block_k):  # outer loop over key blocks
        j1 = min(j0 + block_k, n_k)
        k_j, v_j = k[..., j0:j1, :], v[..., j0:j1, :]  # (..., block_k, d), (..., block_k, dv)
        first = (j0 // block_q) * block_q if causal else 0  # earlier rows cannot see key j0
        for i0 in range(first, n_q, block_q):
            i1 = min(i0 + block_q, n_q)
            s = scale * (q[..., i0:i1, :] @ np.swapaxes(k_j, -1, -2))  # (..., block_q, block_k)
            if causal:
                visible = np.arange(j0, j1)[None, :] <= np.arange(i0, i1)[:, None]
                s = np.where(visible, s, -np.inf)
            p = np.exp(s - lse[..., i0:i1, None])  # P recomputed from L
            do_i = dout[..., i0:i1, :]  # (..., block_q, dv)
            dv[..., j0:j1, :] += np.swapaxes(p, -1, -2) @ do_i
            dp = do_i @ np.swapaxes(v_j, -1, -2)  # (..., block_q, block_k)
            ds = p * (dp - big_d[..., i0:i1, None])
            dq[..., i0:i1, :] += scale * (ds @ k_j)
            dk[..., j0:j1, :] += scale * (np.swapaxes(ds, -1, -2) @ q[..., i0:i1, :])
    return dq, dk, dv
# fmt: on


def solution_source(name: str) -> str:
    return source_of(SOLUTIONS, name)


SOLUTIONS = [flash_backward]

EXERCISES = [
    {
        "name": "flash_backward",
        "text": (
            "Write the tiled backward. Causal as in the forward (query i sees keys j <= i). "
            "Never form an Nq x Nk matrix."
        ),
    }
]

VISIBLE = {
    "flash_backward": [
        {
            "name": "non-causal, uneven N",
            "lead": [2],
            "nq": 45,
            "block_q": 16,
            "block_k": 16,
            "seed": 50,
            "points": 3,
        },
        {
            "name": "causal",
            "nq": 50,
            "block_q": 16,
            "block_k": 8,
            "causal": True,
            "seed": 51,
            "points": 3,
        },
        {
            "name": "cross-attention: Nq != Nk, dv != d",
            "nq": 30,
            "nk": 47,
            "dv": 24,
            "seed": 52,
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
            "seed": 53,
            "points": 2,
        },
    ]
}

HIDDEN = {
    "flash_backward": [
        {
            "name": "hidden: causal prime sizes",
            "lead": [2],
            "nq": 61,
            "block_q": 13,
            "block_k": 17,
            "causal": True,
            "seed": 141,
            "points": 2,
        },
        {"name": "hidden: custom scale", "nq": 40, "scale": 0.2, "seed": 142, "points": 1},
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
            "seed": 143,
            "points": 2,
        },
    ]
}

# What the tiling check subtracts: the same calls on a stub that returns right-sized outputs.
BASELINE_STUBS = {
    "flash_backward": (
        "def flash_backward(q, k, v, *args, **kwargs):\n"
        "    return np.ones_like(q), np.ones_like(k), np.ones_like(v)\n"
    ),
}


# -- tests: builders and the mistakes they name ------------------------------------------------
def build_flash_backward(params) -> Case:
    q, k, v = qkv_inputs(params)
    kw = fwd_kwargs(params)
    rng = np.random.default_rng(int(params.get("seed", 0)) + 1)
    dout = rng.standard_normal((*q.shape[:-1], v.shape[-1])).astype(q.dtype)
    out, lse = attention_reference(q, k, v, kw["causal"], kw.get("scale"))
    out, lse = out.astype(q.dtype), lse.astype(np.float32 if q.dtype == np.float16 else q.dtype)
    memory = params.get("check") == "memory"

    def judge(res, outcome):
        dq, dk, dv = unpack(res, 3, "(dq, dk, dv)")
        refs = attention_reference_backward(q, k, v, dout, kw["causal"], kw.get("scale"))
        naive = naive_backward(q, k, v, dout, kw["causal"], kw.get("scale"))
        variants = tiled_variants(q, k, v, **kw, dout=dout)
        msgs = []
        for i, (g, what, x) in enumerate(
            zip((dq, dk, dv), ("dq", "dk", "dv"), (q, k, v), strict=True)
        ):
            g = as_array(g, what, x.shape)
            msgs.append(
                compare(
                    g,
                    refs[i],
                    naive[i],
                    what,
                    [(lambda vv=vv, i=i: vv()[i], m) for vv, m in variants],
                    factor=3.0,
                )
            )
        msg = "dq, dk, dv right"
        if memory:
            msg += structure_message(outcome, q, k, v, kw)
        return msg

    return Case(
        "flash_backward",
        name_of(params, "grads"),
        float(params.get("points", 1)),
        "flash_backward",
        (q, k, v, out, lse, dout),
        kw,
        judge,
        probe="memory" if memory else None,
        timeout=params.get("timeout"),
    )


BUILDERS = {
    "flash_backward": build_flash_backward,
}
