"""Standard attention, the float64 reference every other implementation is checked against.

Chapter: "Standard attention's bottleneck" (book/chapters/02_standard_attention.ipynb).

Layout: arrays of shape (..., N, d), e.g. (batch, heads, seq, head_dim) as in PyTorch's
``scaled_dot_product_attention``. The three steps are the paper's Algorithm 0 (FlashAttention,
arXiv 2205.14135, Sec. 2.2): S = scale * Q K^T, P = softmax(S) row-wise, O = P V.
"""

from __future__ import annotations

import math

import numpy as np

from .._validate import check_bool, check_qkv, resolve_scale

# The package's one definition of the base change: exp(x) = exp2(x * LOG2E); lse = lse2 * LN2.
LN2 = math.log(2.0)
LOG2E = 1.0 / LN2  # log2(e) = 1.4426950408889634


def causal_mask(n_q: int, n_k: int) -> np.ndarray:
    """Boolean (n_q, n_k) mask, True where query i may see key j.

    PyTorch's ``is_causal`` convention, aligned to the top-left corner: query i sees keys
    j <= i. For n_q = 4, n_k = 5::

        1 0 0 0 0
        1 1 0 0 0
        1 1 1 0 0
        1 1 1 1 0
    """
    return np.arange(n_k)[None, :] <= np.arange(n_q)[:, None]


def scores(q, k, causal: bool = False, scale=None) -> np.ndarray:
    """S = scale * Q K^T in float64, with masked entries set to -inf. Shape (..., Nq, Nk)."""
    q, k, _ = check_qkv(q, k, k)
    causal = check_bool(causal, "causal")
    return _scores(q, k, causal, resolve_scale(scale, q.shape[-1]))


def _scores(q, k, causal: bool, scale: float) -> np.ndarray:
    """:func:`scores` for checked arrays, a bool and a resolved scale."""
    s = scale * (q.astype(np.float64) @ np.swapaxes(k.astype(np.float64), -1, -2))  # (..., Nq, Nk)
    if causal:
        s = np.where(causal_mask(q.shape[-2], k.shape[-2]), s, -np.inf)
    return s


def attention_reference(q, k, v, causal: bool = False, scale=None):
    """Exact attention in float64. Returns ``(out, lse)``.

    Args:
        q: (..., Nq, d) queries.
        k: (..., Nk, d) keys.
        v: (..., Nk, dv) values (dv may differ from d).
        causal: query i sees keys j <= i (PyTorch ``is_causal``, top-left aligned).
        scale: multiplies Q K^T; ``None`` means 1/sqrt(d).

    Returns:
        out: (..., Nq, dv) float64.
        lse: (..., Nq) float64, the row logsumexp of the scaled, masked scores.
            A row with every score masked has lse = -inf and output 0.
    """
    q, k, v = check_qkv(q, k, v)
    causal = check_bool(causal, "causal")
    s = _scores(q, k, causal, resolve_scale(scale, q.shape[-1]))  # (..., Nq, Nk)
    return _softmax_times_v(s, v)


def _softmax_times_v(s, v):
    """(out, lse) of softmax(s) @ v in float64, from checked scores s (..., Nq, Nk)."""
    m = s.max(axis=-1, keepdims=True)  # (..., Nq, 1)
    m_safe = np.where(np.isneginf(m), 0.0, m)  # a fully masked row would give -inf - -inf = NaN
    p = np.exp(s - m_safe)  # (..., Nq, Nk)
    l = p.sum(axis=-1, keepdims=True)  # (..., Nq, 1)
    with np.errstate(divide="ignore"):
        lse = (m_safe + np.log(l))[..., 0]  # (..., Nq); log(0) = -inf for fully masked rows
    out = (p @ v.astype(np.float64)) / np.where(l == 0.0, 1.0, l)  # (..., Nq, dv)
    return out, lse


def attention_naive(q, k, v, causal: bool = False, scale=None):
    """Standard attention computed entirely in the inputs' dtype (no float64, no fp32 upcast).

    This is the "naive implementation in the same precision" of FlashAttention's test rule:
    a faster kernel may be at most a small factor less accurate than this. Returns ``out``
    (..., Nq, dv) in the input dtype.
    """
    q, k, v = check_qkv(q, k, v)
    causal = check_bool(causal, "causal")
    dt = q.dtype.type
    scale = dt(resolve_scale(scale, q.shape[-1]))
    s = (q @ np.swapaxes(k, -1, -2)) * scale  # (..., Nq, Nk), in dtype
    if causal:
        s = np.where(causal_mask(q.shape[-2], k.shape[-2]), s, dt(-np.inf))
    m = s.max(axis=-1, keepdims=True)
    p = np.exp(s - m)
    p = p / p.sum(axis=-1, keepdims=True)
    return (p @ v).astype(q.dtype)
