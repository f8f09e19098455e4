"""Flash Attention's tiled forward pass in NumPy, in both loop orders.

Chapter: "Tiling" (book/chapters/03_tiling.ipynb).

Layout: q (..., Nq, d), k (..., Nk, d), v (..., Nk, dv); any leading (batch, heads) dims.
Nothing of size Nq x Nk is ever formed: only block_q x block_k score tiles.

- ``loop_order="fa2"`` (FlashAttention-2, arXiv 2307.08691, Alg. 1): the outer loop runs over
  query blocks Q_i; each keeps its running (m, l) and output accumulator on chip, streams every
  K_j, V_j past it, and normalises once at the end. K and V are read once per query block.
- ``loop_order="fa1"`` (FlashAttention, arXiv 2205.14135, Alg. 1): the outer loop runs over key
  blocks K_j, V_j (each read once); the inner loop re-reads Q_i and the *normalised* O_i, l_i, m_i
  from HBM and writes them back. Same result. Which order moves more depends on the block
  model (chapter "IO complexity"): with four equal blocks of M/4 elements (block_q = block_k =
  M/4d, score tile in registers) FA1 moves ~12 N^2 d^2 / M and FA2 ~8 N^2 d^2 / M; under the
  FA paper's block_q = min(block_k, d) FA1 moves less when M > 6 d^2; other splits of M give
  other constants (FA2 order with a small block_k and block_q ~ M/2d: ~4 N^2 d^2 / M).

Precision: the working dtype is kept. float32 in -> float32 everywhere; float16 in -> float32
scores, statistics and accumulator (like a GPU kernel's fp32 accumulators), float16 out;
float64 in -> float64. Nothing is silently upcast to float64. ``lse`` is returned in the
accumulator dtype (float32 for fp16/fp32 inputs).
"""

from __future__ import annotations

import numpy as np

from .._validate import (
    accumulator_dtype,
    check_bool,
    check_positive_int,
    check_qkv,
    resolve_scale,
)
from .online_softmax import safe_max

LOOP_ORDERS = ("fa1", "fa2")


def block_mask(i0: int, i1: int, j0: int, j1: int, causal: bool):
    """Visibility of keys [j0, j1) for queries [i0, i1): a (block_q, block_k) bool array, or None if all visible.

    Causal is PyTorch's ``is_causal``: query i sees key j iff j <= i.
    """
    if not causal or j1 - 1 <= i0:  # the whole tile lies on or below the diagonal
        return None
    return np.arange(j0, j1)[None, :] <= np.arange(i0, i1)[:, None]


def last_key_block_end(i1: int, n_k: int, causal: bool) -> int:
    """Keys a causal query block [i0, i1) can see end at i1 (exclusive); blocks past it are skipped."""
    return min(n_k, i1) if causal else n_k


def check_tiled_args(q, k, v, causal, scale, block_q, block_k):
    """Shared validation of the tiled forward and backward arguments."""
    q, k, v = check_qkv(q, k, v)
    causal = check_bool(causal, "causal")
    scale = resolve_scale(scale, q.shape[-1])
    block_q = check_positive_int(block_q, "block_q")
    block_k = check_positive_int(block_k, "block_k")
    return q, k, v, causal, scale, block_q, block_k


def flash_attention_numpy(
    q,
    k,
    v,
    causal: bool = False,
    scale=None,
    block_q: int = 64,
    block_k: int = 64,
    loop_order: str = "fa2",
):
    """Tiled Flash Attention forward. Returns ``(out, lse)``.

    Args:
        q: (..., Nq, d); k: (..., Nk, d); v: (..., Nk, dv). float16, float32 or float64.
        causal: query i sees keys j <= i (top-left aligned, PyTorch ``is_causal``).
        scale: multiplies Q K^T; ``None`` means 1/sqrt(d).
        block_q: block_q, rows of each query block (>= 1; N need not be a multiple).
        block_k: block_k, rows of each key/value block (>= 1).
        loop_order: "fa2" (outer loop over Q blocks) or "fa1" (outer loop over K/V blocks).

    Returns:
        out: (..., Nq, dv) in the input dtype; lse: (..., Nq) row logsumexp in the accumulator dtype.
    """
    q, k, v, causal, scale, block_q, block_k = check_tiled_args(
        q, k, v, causal, scale, block_q, block_k
    )
    if loop_order not in LOOP_ORDERS:
        raise ValueError(f"loop_order must be one of {LOOP_ORDERS}; got {loop_order!r}")
    acc_t = accumulator_dtype(q.dtype)
    impl = _forward_fa2 if loop_order == "fa2" else _forward_fa1
    out, lse = impl(q, k, v, causal, acc_t.type(scale), block_q, block_k, acc_t)
    return out.astype(q.dtype), lse


def _forward_fa2(q, k, v, causal, scale, block_q, block_k, acc_t):
    """FlashAttention-2 Alg. 1: outer loop over query blocks."""
    *lead, n_q, _ = q.shape
    n_k, dv = v.shape[-2:]
    out = np.empty((*lead, n_q, dv), dtype=acc_t)
    lse = np.empty((*lead, n_q), dtype=acc_t)
    for i0 in range(0, n_q, block_q):  # line 3: for 1 <= i <= Tr
        i1 = min(i0 + block_q, n_q)
        q_i = q[..., i0:i1, :].astype(acc_t)  # line 4: load Q_i, (..., block_q, d)
        m_i = np.full((*lead, i1 - i0), -np.inf, dtype=acc_t)  # line 5: m = -inf
        l_i = np.zeros((*lead, i1 - i0), dtype=acc_t)  # line 5: l = 0
        acc = np.zeros((*lead, i1 - i0, dv), dtype=acc_t)  # line 5: O_i = 0, (..., block_q, dv)
        for j0 in range(0, last_key_block_end(i1, n_k, causal), block_k):  # line 6
            j1 = min(j0 + block_k, n_k)
            k_j = k[..., j0:j1, :].astype(acc_t)  # line 7: load K_j, (..., block_k, d)
            v_j = v[..., j0:j1, :].astype(acc_t)  # line 7: load V_j, (..., block_k, dv)
            s = scale * (q_i @ np.swapaxes(k_j, -1, -2))  # line 8: S_ij, (..., block_q, block_k)
            mask = block_mask(i0, i1, j0, j1, causal)
            if mask is not None:
                s = np.where(mask, s, -np.inf)
            m_new = np.maximum(m_i, s.max(axis=-1))  # line 9: m_ij
            m_safe = safe_max(m_new)  # -inf guard for rows with nothing visible yet
            p = np.exp(s - m_safe[..., None])  # line 9: P~_ij, (..., block_q, block_k)
            alpha = np.exp(m_i - m_safe)  # rescale factor of everything accumulated so far
            l_i = alpha * l_i + p.sum(axis=-1)  # line 9: l_ij
            acc = alpha[..., None] * acc + p @ v_j  # line 10: O_ij = diag(alpha) O + P~ V_j
            m_i = m_new
        l_safe = np.where(l_i == 0, np.ones_like(l_i), l_i)
        out[..., i0:i1, :] = acc / l_safe[..., None]  # line 12: O_i = diag(l)^-1 O_i
        with np.errstate(divide="ignore"):
            lse[..., i0:i1] = np.where(l_i == 0, -np.inf, safe_max(m_i) + np.log(l_safe))  # line 13
    return out, lse


def _forward_fa1(q, k, v, causal, scale, block_q, block_k, acc_t):
    """FlashAttention (v1) Alg. 1: outer loop over key/value blocks; O, l, m live in HBM."""
    *lead, n_q, _ = q.shape
    n_k, dv = v.shape[-2:]
    out = np.zeros((*lead, n_q, dv), dtype=acc_t)  # line 2: O = 0, l = 0, m = -inf in HBM
    l_all = np.zeros((*lead, n_q), dtype=acc_t)
    m_all = np.full((*lead, n_q), -np.inf, dtype=acc_t)
    for j0 in range(0, n_k, block_k):  # line 5: for 1 <= j <= Tc
        j1 = min(j0 + block_k, n_k)
        k_j = k[..., j0:j1, :].astype(acc_t)  # line 6: load K_j, V_j
        v_j = v[..., j0:j1, :].astype(acc_t)
        first_i = (
            (j0 // block_q) * block_q if causal else 0
        )  # query blocks above the diagonal see nothing
        for i0 in range(first_i, n_q, block_q):  # line 7: for 1 <= i <= Tr
            i1 = min(i0 + block_q, n_q)
            q_i = q[..., i0:i1, :].astype(acc_t)  # line 8: load Q_i, O_i, l_i, m_i
            o_i, l_i, m_i = out[..., i0:i1, :], l_all[..., i0:i1], m_all[..., i0:i1]
            s = scale * (q_i @ np.swapaxes(k_j, -1, -2))  # line 9: S_ij, (..., block_q, block_k)
            mask = block_mask(i0, i1, j0, j1, causal)
            if mask is not None:
                s = np.where(mask, s, -np.inf)
            m_tilde = s.max(axis=-1)  # line 10: m~_ij = rowmax(S_ij)
            p = np.exp(s - safe_max(m_tilde)[..., None])  # line 10: P~_ij
            l_tilde = p.sum(axis=-1)  # line 10: l~_ij
            m_new = np.maximum(m_i, m_tilde)  # line 11
            m_safe = safe_max(m_new)
            a_old = np.exp(m_i - m_safe)
            a_new = np.exp(m_tilde - m_safe)
            l_new = a_old * l_i + a_new * l_tilde  # line 11
            l_div = np.where(l_new == 0, np.ones_like(l_new), l_new)
            out[..., i0:i1, :] = (  # line 12: write O_i (normalised) to HBM
                (l_i * a_old)[..., None] * o_i + a_new[..., None] * (p @ v_j)
            ) / l_div[..., None]
            l_all[..., i0:i1] = l_new  # line 13: write l_i, m_i to HBM
            m_all[..., i0:i1] = m_new
    with np.errstate(divide="ignore"):
        lse = np.where(
            l_all == 0, -np.inf, safe_max(m_all) + np.log(np.where(l_all == 0, 1, l_all))
        )
    return out, lse.astype(acc_t)
