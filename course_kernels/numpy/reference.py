"""Standard attention, the float64 reference every other implementation is checked against.

Chapter: "Standard attention's bottleneck" (book/chapters/02_standard_attention.ipynb).

Layout: arrays of shape (..., N, d), e.g. (batch, heads, seq, head_dim) as in PyTorch's
``scaled_dot_product_attention``. The three steps are the paper's Algorithm 0 (FlashAttention,
arXiv 2205.14135, Sec. 2.2): S = scale * Q K^T, P = softmax(S) row-wise, O = P V.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from .._validate import check_bool, check_qkv, resolve_scale

# The package's one definition of the base change: exp(x) = exp2(x * LOG2E); lse = lse2 * LN2.
LN2 = math.log(2.0)
LOG2E = 1.0 / LN2  # log2(e) = 1.4426950408889634


ALIGNMENTS = ("top_left", "bottom_right")


def check_alignment(alignment) -> str:
    """``"top_left"`` or ``"bottom_right"``; anything else raises a clear error."""
    if alignment not in ALIGNMENTS:
        raise ValueError(
            f"alignment must be 'top_left' (PyTorch is_causal) or 'bottom_right' (flash-attn, "
            f"chunked prefill over a KV cache); got {alignment!r}"
        )
    return alignment


def causal_mask(n_q: int, n_k: int, alignment: str = "top_left") -> np.ndarray:
    """Boolean (n_q, n_k) mask, True where query i may see key j.

    ``"top_left"`` (PyTorch's ``is_causal``): query i sees keys j <= i. For n_q = 4, n_k = 5::

        1 0 0 0 0
        1 1 0 0 0
        1 1 1 0 0
        1 1 1 1 0

    ``"bottom_right"`` (flash-attn >= 2.1, SDPA's ``causal_lower_right``): the last query sees
    the last key, query i sees keys j <= i + n_k - n_q. For n_q = 4, n_k = 5::

        1 1 0 0 0
        1 1 1 0 0
        1 1 1 1 0
        1 1 1 1 1

    With n_q > n_k the first n_q - n_k rows see nothing (their output is 0).
    """
    offset = 0 if check_alignment(alignment) == "top_left" else n_k - n_q
    return np.arange(n_k)[None, :] <= np.arange(n_q)[:, None] + offset


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


def attention_reference(
    q,
    k,
    v,
    causal: bool = False,
    scale=None,
    *,
    alignment: str = "top_left",
    window_size=None,
    softcap=None,
    alibi_slopes=None,
):
    """Exact attention in float64. Returns ``(out, lse)``.

    Args:
        q: (..., Nq, d) queries.
        k: (..., Nk, d) keys.
        v: (..., Nk, dv) values (dv may differ from d).
        causal: query i sees keys j <= i (PyTorch ``is_causal``, top-left aligned), or
            j <= i + Nk - Nq with ``alignment="bottom_right"``.
        scale: multiplies Q K^T; ``None`` means 1/sqrt(d).
        alignment: ``"top_left"`` or ``"bottom_right"``: where the diagonal of ``causal`` and of
            ``window_size`` sits (:func:`causal_mask`).
        window_size: ``(left, right)``, flash-attn's sliding window: query i sees keys
            i + off - left <= j <= i + off + right (off = 0, or Nk - Nq bottom-right); -1 is
            unbounded. With ``causal`` the right side is 0. ``None`` = (-1, -1).
        softcap: logit soft-capping (Gemma 2): s = softcap * tanh(s / softcap); None or 0: off.
        alibi_slopes: (H,) or (B, H) (q must then be (B, H, Nq, d)): adds
            -slope * |i + Nk - Nq - j| to the scores (flash-attn's ALiBi).

    Returns:
        out: (..., Nq, dv) float64.
        lse: (..., Nq) float64, the row logsumexp of the scaled, masked scores.
            A row with every score masked has lse = -inf and output 0.
    """
    q, k, v = check_qkv(q, k, v)
    s, _ = variant_scores(
        q, k, causal, scale, alignment, window_size, softcap, alibi_slopes
    )  # (..., Nq, Nk)
    return _softmax_times_v(s, v)


def check_window(window_size) -> tuple[int, int]:
    """``None`` -> (-1, -1); else two ints >= -1 (-1: unbounded on that side)."""
    if window_size is None:
        return (-1, -1)
    ok = isinstance(window_size, (tuple, list)) and len(window_size) == 2
    if ok:
        ok = all(isinstance(w, numbers.Integral) and not isinstance(w, bool) for w in window_size)
    if not ok or min(window_size) < -1:
        raise ValueError(
            "window_size must be None or (left, right), two ints >= -1 (-1: unbounded, as in "
            f"flash-attn); got {window_size!r}"
        )
    return int(window_size[0]), int(window_size[1])


def check_softcap(softcap) -> float:
    """``None`` or 0 -> 0.0 (off); else a finite real number > 0."""
    if softcap is None:
        return 0.0
    if isinstance(softcap, bool) or not isinstance(softcap, numbers.Real):
        raise TypeError(f"softcap must be None or a real number > 0; got {softcap!r}")
    if not math.isfinite(softcap) or softcap < 0:
        raise ValueError(f"softcap must be None, 0 (off) or a finite number > 0; got {softcap}")
    return float(softcap)


def window_bounds(n_q: int, n_k: int, causal: bool, alignment: str, window_size):
    """(lo, hi): query i sees keys i + lo <= j <= i + hi; None where a side is unbounded."""
    left, right = check_window(window_size)
    if causal:
        right = 0
    off = 0 if check_alignment(alignment) == "top_left" else n_k - n_q
    return (None if left < 0 else off - left), (None if right < 0 else off + right)


def attention_mask(n_q, n_k, causal=False, alignment="top_left", window_size=None) -> np.ndarray:
    """Boolean (n_q, n_k) mask, True where query i sees key j: :func:`causal_mask` and the
    sliding window of :func:`attention_reference` together."""
    lo, hi = window_bounds(n_q, n_k, check_bool(causal, "causal"), alignment, window_size)
    i, j = np.arange(n_q)[:, None], np.arange(n_k)[None, :]
    keep = np.ones((n_q, n_k), dtype=bool)
    if lo is not None:
        keep &= j >= i + lo
    if hi is not None:
        keep &= j <= i + hi
    return keep


def alibi_bias(slopes, shape) -> np.ndarray:
    """-slope * |i + Nk - Nq - j| for scores of shape (B, H, Nq, Nk); slopes (H,) or (B, H)."""
    slopes = np.asarray(slopes, dtype=np.float64)
    if len(shape) != 4 or slopes.shape not in ((shape[1],), (shape[0], shape[1])):
        raise ValueError(
            "alibi_slopes must have shape (H,) or (B, H) for q of shape (B, H, Nq, d); got "
            f"slopes {slopes.shape} for scores {tuple(shape)}"
        )
    n_q, n_k = shape[-2:]
    dist = np.abs(np.arange(n_q)[:, None] + n_k - n_q - np.arange(n_k)[None, :])  # (Nq, Nk)
    slopes = slopes.reshape(-1, shape[1])  # (1 or B, H)
    return -slopes[..., None, None] * dist


def variant_scores(q, k, causal, scale, alignment, window_size, softcap, alibi_slopes):
    """(s, t): masked float64 scores and tanh(scale q.k / softcap) (None without softcap)."""
    causal = check_bool(causal, "causal")
    scale = resolve_scale(scale, q.shape[-1])
    cap = check_softcap(softcap)
    s = _scores(q, k, False, scale)  # (..., Nq, Nk)
    t = None
    if cap > 0:
        t = np.tanh(s / cap)
        s = cap * t
    if alibi_slopes is not None:
        s = s + alibi_bias(alibi_slopes, s.shape)
    keep = attention_mask(q.shape[-2], k.shape[-2], causal, alignment, window_size)
    return np.where(keep, s, -np.inf), t


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
