"""The tiled backward pass: gradients from the saved logsumexp, never an N x N matrix.

Chapter: "The backward pass" (book/chapters/backward_pass.ipynb); the Triton kernels that
compute the same gradients: "Backward and recomputation" (book part two).

The forward pass saves only O (..., Nq, dv) and lse (..., Nq). The backward pass recomputes
each tile of P = exp(S - lse) from Q, K and the saved lse (FlashAttention-2, arXiv 2307.08691,
Alg. 2), so memory stays O(N) and FLOPs go up (S is computed twice). The "# line N" comments
below are the line numbers of that Algorithm 2 (FA2 paper, Sec. 3.1.2: dQ = 0 is line 3, the loops
are lines 5 and 8, the load of Q_i, O_i, dO_i, dQ_i, L_i, D_i line 9, S_ij to dK_j lines 10-16,
the write of dK_j, dV_j line 18).

With D_i = rowsum(dO_i * O_i) (Alg. 2 line 4; equal to rowsum(dP_i * P_i)):
    dV = P^T dO,  dP = dO V^T,  dS = P * (dP - D),  dQ = scale * dS K,  dK = scale * dS^T Q.
"""

from __future__ import annotations

import numpy as np

from .._validate import accumulator_dtype, as_float_array, check_qkv, resolve_scale
from .online_softmax import safe_max
from .reference import _softmax_times_v, variant_scores
from .tiled import block_mask, check_tiled_args


def attention_reference_backward(
    q,
    k,
    v,
    dout,
    causal: bool = False,
    scale=None,
    *,
    alignment: str = "top_left",
    window_size=None,
    softcap=None,
    alibi_slopes=None,
):
    """Exact gradients of standard attention in float64 (dense; for checking). Returns (dq, dk, dv).

    The keyword-only variants are :func:`~course_kernels.numpy.reference.attention_reference`'s.
    With ``softcap`` the score is softcap * tanh(scale q.k / softcap), whose derivative in q.k
    is scale * (1 - tanh^2): dS is multiplied by (1 - t^2) before it reaches dQ and dK.
    """
    q, k, v = check_qkv(q, k, v)  # checked once, here: the helpers below trust them
    s, t = variant_scores(q, k, causal, scale, alignment, window_size, softcap, alibi_slopes)
    scale = resolve_scale(scale, q.shape[-1])
    out, lse = _softmax_times_v(s, v)
    dout = _check_like(dout, out.shape, "dout")
    p = np.exp(s - safe_max(lse)[..., None])  # (..., Nq, Nk); exp(-inf) = 0 where masked
    do = dout.astype(np.float64)
    dv = np.swapaxes(p, -1, -2) @ do  # (..., Nk, dv)
    dp = do @ np.swapaxes(v.astype(np.float64), -1, -2)  # (..., Nq, Nk)
    ds = p * (dp - (do * out).sum(axis=-1, keepdims=True))
    if t is not None:
        ds = ds * (1.0 - t * t)  # through the soft cap
    dq = scale * ds @ k.astype(np.float64)
    dk = scale * np.swapaxes(ds, -1, -2) @ q.astype(np.float64)
    return dq, dk, dv


def _check_like(x, shape, name):
    arr = as_float_array(x, name)
    if arr.shape != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}; got {arr.shape}")
    return arr


def flash_attention_numpy_backward(
    q,
    k,
    v,
    out,
    lse,
    dout,
    causal: bool = False,
    scale=None,
    block_q: int = 64,
    block_k: int = 64,
):
    """Gradients of Flash Attention from the saved ``out`` and ``lse``. Returns ``(dq, dk, dv)``.

    Args:
        q: (..., Nq, d); k: (..., Nk, d); v: (..., Nk, dv).
        out: (..., Nq, dv) the forward output; lse: (..., Nq) its row logsumexp (natural log).
        dout: (..., Nq, dv) the gradient of the loss with respect to ``out``.
        causal, scale, block_q, block_k: as in :func:`course_kernels.flash_attention_numpy`.

    Returns gradients in the input dtype, accumulated in float32 for fp16/fp32 inputs.
    """
    q, k, v, causal, scale, block_q, block_k = check_tiled_args(
        q, k, v, causal, scale, block_q, block_k
    )
    *lead, n_q, _ = q.shape
    n_k, d_v = v.shape[-2:]
    out = _check_like(out, (*lead, n_q, d_v), "out")
    dout = _check_like(dout, (*lead, n_q, d_v), "dout")
    lse = np.asarray(lse)
    if lse.shape != (*lead, n_q):
        raise ValueError(
            f"lse must have shape {(*lead, n_q)} (one logsumexp per query row); got {lse.shape}"
        )
    acc_t = accumulator_dtype(q.dtype)
    scale = acc_t.type(scale)
    lse_safe = safe_max(lse.astype(acc_t))  # a fully masked row (lse = -inf) has P = 0
    dlt = (dout.astype(acc_t) * out.astype(acc_t)).sum(axis=-1)  # line 4: D = rowsum(dO * O)
    dq = np.zeros(q.shape, dtype=acc_t)  # line 3: dQ = 0 in HBM
    dk = np.empty(k.shape, dtype=acc_t)
    dv = np.empty(v.shape, dtype=acc_t)
    for j0 in range(0, n_k, block_k):  # line 5: for 1 <= j <= Tc
        j1 = min(j0 + block_k, n_k)
        k_j = k[..., j0:j1, :].astype(acc_t)  # line 6: load K_j, V_j
        v_j = v[..., j0:j1, :].astype(acc_t)
        dk_j = np.zeros(k_j.shape, dtype=acc_t)  # line 7: dK_j = 0, dV_j = 0 on chip
        dv_j = np.zeros(v_j.shape, dtype=acc_t)
        first_i = (j0 // block_q) * block_q if causal else 0
        for i0 in range(first_i, n_q, block_q):  # line 8: for 1 <= i <= Tr
            i1 = min(i0 + block_q, n_q)
            q_i = q[..., i0:i1, :].astype(acc_t)  # line 9: load Q_i, O_i, dO_i, dQ_i, L_i, D_i
            do_i = dout[..., i0:i1, :].astype(acc_t)
            s = scale * (q_i @ np.swapaxes(k_j, -1, -2))  # line 10: S_ij, (..., block_q, block_k)
            p = np.exp(s - lse_safe[..., i0:i1, None])  # line 11: P_ij = exp(S_ij - L_i)
            mask = block_mask(i0, i1, j0, j1, causal)
            if mask is not None:
                p = np.where(mask, p, 0)
            if np.any(np.isneginf(lse[..., i0:i1])):
                p = np.where(np.isneginf(lse[..., i0:i1, None]), 0, p)
            dv_j += np.swapaxes(p, -1, -2) @ do_i  # line 12: dV_j += P^T dO_i
            dp = do_i @ np.swapaxes(v_j, -1, -2)  # line 13: dP_ij = dO_i V_j^T
            ds = p * (dp - dlt[..., i0:i1, None])  # line 14: dS_ij = P * (dP - D_i)
            dq[..., i0:i1, :] += scale * (ds @ k_j)  # line 15: dQ_i += dS K_j (written to HBM)
            dk_j += scale * (np.swapaxes(ds, -1, -2) @ q_i)  # line 16: dK_j += dS^T Q_i
        dk[..., j0:j1, :] = dk_j  # line 18: write dK_j, dV_j
        dv[..., j0:j1, :] = dv_j
    return dq.astype(q.dtype), dk.astype(q.dtype), dv.astype(q.dtype)
