"""Online softmax: the running (m, l) state, its update, and the merge of partial results.

Chapter: "Online softmax" (book/chapters/04_online_softmax.ipynb).

Milakov & Gimelshein (arXiv 1805.02867) compute softmax's normaliser in one pass: keep the
running maximum ``m`` and the running sum ``l = sum exp(x - m)``; when a new block raises the
maximum to ``m_new``, rescale the old sum by ``exp(m - m_new)``. FlashAttention (arXiv 2205.14135,
Alg. 1 lines 10-12) carries the same rescaling into the output accumulator, and a partial result
``(m, l, acc)`` over any subset of keys can be merged with another one exactly and
associatively - which is what split-KV decoding (Flash-Decoding) reuses.

The -inf guard: a row whose scores seen so far are all -inf (fully masked) has m = -inf, and the
textbook ``exp(x - m)`` would compute ``-inf - (-inf) = NaN``. Every exponent here subtracts
``m_safe`` (m with -inf replaced by 0), which gives exp(-inf) = 0 instead.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .._compat import renamed_kwargs
from .._validate import check_positive_int


class SoftmaxState(NamedTuple):
    """Running softmax statistics of each row. ``m``: (...,) row max; ``l``: (...,) sum exp(x - m)."""

    m: np.ndarray
    l: np.ndarray


class PartialAttention(NamedTuple):
    """Attention over a subset of the keys, not yet normalised.

    m: (..., Nq) row max of the scores seen; l: (..., Nq) sum of exp(s - m);
    acc: (..., Nq, dv) sum of exp(s - m) * v.
    """

    m: np.ndarray
    l: np.ndarray
    acc: np.ndarray


def safe_max(m: np.ndarray) -> np.ndarray:
    """m with -inf replaced by 0, so exp(x - m_safe) is 0 (not NaN) for fully masked rows."""
    return np.where(np.isneginf(m), np.zeros_like(m), m)


def init_state(shape, dtype=np.float64) -> SoftmaxState:
    """The empty state: m = -inf, l = 0 (FA2 Alg. 1 line 5)."""
    return SoftmaxState(np.full(shape, -np.inf, dtype=dtype), np.zeros(shape, dtype=dtype))


def update(state: SoftmaxState, scores: np.ndarray):
    """Absorb a block of scores (..., block_k) into the running state.

    Returns ``(new_state, p, alpha)`` where ``p = exp(scores - m_new)`` (..., block_k) are the block's
    unnormalised probabilities and ``alpha = exp(m_old - m_new)`` (...,) is the factor by which
    anything accumulated so far (l, and the output accumulator) must be rescaled.
    FA2 Alg. 1 lines 9-10: m_new = max(m_old, rowmax(S)), l_new = alpha * l_old + rowsum(P).
    """
    scores = np.asarray(scores)
    m_new = np.maximum(state.m, scores.max(axis=-1))  # (...,)
    m_safe = safe_max(m_new)
    p = np.exp(scores - m_safe[..., None])  # (..., block_k); 0 where scores are -inf
    alpha = np.exp(state.m - m_safe)  # (...,); exp(-inf) = 0 when nothing was seen yet
    l_new = alpha * state.l + p.sum(axis=-1)
    return SoftmaxState(m_new, l_new), p, alpha


@renamed_kwargs(block="block_k")
def online_softmax(x, block_k: int = 128) -> np.ndarray:
    """Row softmax of ``x`` (..., N) computed block by block with the online update.

    Pass 1 streams the blocks through :func:`update` to get (m, l); pass 2 normalises. The result
    equals ``exp(x - max) / sum`` up to rounding in x's precision (float32 stays float32).
    Rows that are entirely -inf give 0, not NaN.
    """
    x = np.asarray(x)
    if x.ndim < 1 or x.shape[-1] == 0:
        raise ValueError(f"x must have a non-empty last axis; got shape {x.shape}")
    if not np.issubdtype(x.dtype, np.floating):
        raise TypeError(f"x must be floating point; got {x.dtype}")
    block_k = check_positive_int(block_k, "block_k")
    state = init_state(x.shape[:-1], dtype=x.dtype)
    for j0 in range(0, x.shape[-1], block_k):
        state, _, _ = update(state, x[..., j0 : j0 + block_k])
    p = np.exp(x - safe_max(state.m)[..., None])
    return p / np.where(state.l == 0, 1, state.l)[..., None]


def empty_partial(n_q_shape, dv: int, dtype=np.float64) -> PartialAttention:
    """A partial result over no keys: m = -inf, l = 0, acc = 0. The identity of :func:`merge`."""
    st = init_state(n_q_shape, dtype)
    return PartialAttention(st.m, st.l, np.zeros((*n_q_shape, dv), dtype=dtype))


def partial_attention(q, k, v, scale=None, mask=None) -> PartialAttention:
    """Unnormalised attention of q (..., Nq, d) over one chunk of keys k, v (..., Nk, d/dv).

    ``mask`` (Nq, Nk) booleans, True = visible. Computed in q's dtype (fp16 -> fp32).
    """
    from .._validate import accumulator_dtype, check_qkv, resolve_scale

    q, k, v = check_qkv(q, k, v)
    acc_t = accumulator_dtype(q.dtype)
    s = resolve_scale(scale, q.shape[-1]) * (
        q.astype(acc_t) @ np.swapaxes(k.astype(acc_t), -1, -2)
    )  # (..., Nq, Nk)
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    state, p, _ = update(init_state(s.shape[:-1], acc_t), s)
    return PartialAttention(state.m, state.l, p @ v.astype(acc_t))


def merge(a: PartialAttention, b: PartialAttention) -> PartialAttention:
    """Combine partial results over two disjoint sets of keys. Exact, commutative, associative.

    m = max(m_a, m_b); each side is rescaled by exp(m_side - m) before adding
    (the same rescaling as FA1 Alg. 1 lines 11-12).
    """
    m = np.maximum(a.m, b.m)
    m_safe = safe_max(m)
    wa = np.exp(a.m - m_safe)  # (..., Nq); 0 for a side that has seen nothing
    wb = np.exp(b.m - m_safe)
    return PartialAttention(m, wa * a.l + wb * b.l, wa[..., None] * a.acc + wb[..., None] * b.acc)


def finalize(p: PartialAttention):
    """Normalise: ``out = acc / l`` and ``lse = m + log(l)``. Returns ``(out, lse)``.

    FA2 Alg. 1 lines 12-13. A row that saw no visible key (l = 0) gives out = 0, lse = -inf.
    """
    l_safe = np.where(p.l == 0, np.ones_like(p.l), p.l)
    out = p.acc / l_safe[..., None]
    with np.errstate(divide="ignore"):
        lse = np.where(p.l == 0, -np.inf, safe_max(p.m) + np.log(l_safe))
    return out, lse.astype(p.l.dtype)
