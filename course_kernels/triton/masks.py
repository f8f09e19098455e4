"""Score and mask hooks shared by the forward and backward kernels, and the block ranges they imply.

Chapter: "Flash Attention in Triton" (masks, sliding windows, soft-capping, ALiBi, varlen).

FlexAttention's idea (PyTorch, Dong et al. 2024): attention variants differ only in a
*score modification* (a function of the score and the indices i, j) and a *mask* (a predicate
of i, j). Here both are small ``@triton.jit`` functions, switched on by constexprs, that every
kernel calls on its tile of scores, so the forward and the two backward kernels compute the
same scores the same way:

- :func:`_score_mod`: the score in "units of c" (the natural-log score is s = c * r), with
  soft-capping (``SOFTCAP``: r = tanh(scale q.k / softcap), c = softcap) and ALiBi (``ALIBI``:
  r -= slope / c * |i + Nk - Nq - j|). Without soft-capping r = sign(scale) * q.k, c = |scale|.
- :func:`_visible`: the sliding window / causal predicate i + lo <= j <= i + hi (flash-attn's
  ``window_size``; causal is hi = 0 on its diagonal; ``BIG`` stands for an unbounded side).

Why "units of c": P is recomputed in the backward as exp2((r - L) * c log2 e) from the stored
row statistic L (the logsumexp in units of c). The multiplication comes *after* the subtraction,
so a compiler that fuses a multiply and an add into one FMA (GPUs do) cannot make the backward's
r - L differ from the forward's: for a row with one visible key r - L = 0 exactly and P = 1
exactly, so dV = dO exactly. The old form exp2(q.k * scale log2 e - lse2) let the backward
fuse the product into the subtraction (one rounding) while the forward rounded the product
first: P came out as exp2(rounding error) instead of 1 (issue 22).

The block ranges: a query block [m0, m0 + BLOCK_M) visits only the key blocks that hold a
visible key (:func:`_key_blocks`), split into masked edges and an unmasked middle; a key block
visits only the query blocks that see it (:func:`_query_blocks`). A window-limited row costs
O(window), not O(N). :func:`key_blocks` is the same arithmetic in Python, for tests and books.

On the host: :class:`Variant` (the variant a launch computes, part of the tuned-config key) and
the checks of the public arguments (:func:`check_variant`, :func:`check_alibi`: SDPA's causal
bias objects, ``window_size``, ``softcap``, ``alibi_slopes``), which raise the same errors as
the NumPy reference's (``course_kernels.numpy.reference``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math

from . import _env as _triton_env  # noqa: F401  (sets TRITON_INTERPRET before any @triton.jit)

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from ..numpy.reference import LOG2E, check_alignment, check_softcap, check_window  # noqa: E402

# An unbounded side of the window: i + BIG is past any key, i - BIG before any (int32-safe).
BIG = 1 << 30
LOG2E_TL = tl.constexpr(1.4426950408889634)


@triton.jit
def _tanh(x):
    """tanh in fp32 from exp2 (no libdevice: the interpreter has none): an odd Taylor series below
    |x| = 0.25 (where 1 - e cancels), (1 - e) / (1 + e) with e = exp(-2|x|) above."""
    ax = tl.abs(x)
    x2 = x * x
    small = x * (
        1.0 + x2 * (-1.0 / 3.0 + x2 * (2.0 / 15.0 + x2 * (-17.0 / 315.0 + x2 * (62.0 / 2835.0))))
    )
    e = tl.math.exp2(ax * (-2.0 * LOG2E_TL))
    big = (1.0 - e) / (1.0 + e)
    big = tl.where(x < 0, -big, big)
    return tl.where(ax < 0.25, small, big)


@triton.jit
def _score_mod(qk, qi, kj, qk_mul, alibi_r, alibi_diag, SOFTCAP: tl.constexpr, ALIBI: tl.constexpr):
    """The score hook: (r, t) from the raw dot q.k. s = c * r is the natural-log score.

    qi, kj: query and key indices broadcastable to qk's shape (rows x keys, or keys x rows in
    the dK/dV kernel). t = tanh(...) is the soft cap's value (its derivative is 1 - t^2); without
    ``SOFTCAP`` it is r itself (unused).
    """
    r = qk * qk_mul  # no soft cap: qk_mul = sign(scale), exact
    t = r
    if SOFTCAP:
        t = _tanh(r)  # qk_mul = scale / softcap
        r = t
    if ALIBI:
        r = r - alibi_r * tl.abs(qi + alibi_diag - kj).to(tl.float32)  # alibi_r = slope / c
    return r, t


@triton.jit
def _visible(qi, kj, diag_lo, diag_hi):
    """The mask hook: key kj is visible to query qi (causal, sliding window, either alignment)."""
    return (kj >= qi + diag_lo) & (kj <= qi + diag_hi)


@triton.jit
def _seq(CU, off_z, n_dense, VARLEN: tl.constexpr):
    """(first token, length) of sequence off_z: from cu_seqlens when ``VARLEN``, else (0, n)."""
    if VARLEN:
        start = tl.load(CU + off_z).to(tl.int64)
        n = (tl.load(CU + off_z + 1) - start).to(tl.int32)
    else:
        start = 0
        n = n_dense
    return start, n


@triton.jit
def _key_blocks(start_m, n_k, diag_lo, diag_hi, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Key ranges of query block [start_m, start_m + BLOCK_M): masked [lo, full_lo), unmasked
    [full_lo, full_hi), masked [full_hi, hi). Block starts are multiples of BLOCK_N; a row that
    sees nothing gives hi = lo (nothing visited); full_lo <= hi, so no block past hi is visited."""
    lo = (tl.maximum(start_m + diag_lo, 0) // BLOCK_N) * BLOCK_N
    hi = tl.maximum(tl.minimum(start_m + BLOCK_M + diag_hi, n_k), lo)  # hi = lo: nothing to see
    first = tl.maximum(start_m + BLOCK_M - 1 + diag_lo, 0)  # the first key every row sees
    full_lo = tl.minimum(tl.maximum(((first + BLOCK_N - 1) // BLOCK_N) * BLOCK_N, lo), hi)
    full_hi = (tl.maximum(tl.minimum(start_m + 1 + diag_hi, n_k), 0) // BLOCK_N) * BLOCK_N
    full_hi = tl.maximum(full_hi, full_lo)
    return lo, full_lo, full_hi, hi


@triton.jit
def _query_blocks(start_n, n_q, diag_lo, diag_hi, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr):
    """Query ranges that see key block [start_n, start_n + BLOCK_N), as :func:`_key_blocks`."""
    lo = (tl.maximum(start_n - diag_hi, 0) // BLOCK_M) * BLOCK_M
    hi = tl.maximum(tl.minimum(start_n + BLOCK_N - diag_lo, n_q), lo)
    first = tl.maximum(start_n + BLOCK_N - 1 - diag_hi, 0)  # the first row that sees every key
    full_lo = tl.minimum(tl.maximum(((first + BLOCK_M - 1) // BLOCK_M) * BLOCK_M, lo), hi)
    full_hi = tl.minimum((tl.maximum(start_n + 1 - diag_lo, 0) // BLOCK_M) * BLOCK_M, hi)
    full_hi = tl.maximum(full_hi, full_lo)
    return lo, full_lo, full_hi, hi


@triton.jit
def _step_range(
    STEP: tl.constexpr, lo, full_lo, full_hi, hi, n, BLOCK: tl.constexpr, PEEL: tl.constexpr
):
    """[s_lo, s_hi) of step ``STEP`` of a block loop split by :func:`_key_blocks` or
    :func:`_query_blocks` (n: Nk or Nq): 0 masked edge, 1 unmasked middle, 2 masked edge.

    Tail peeling (``PEEL``, session 9): the only block that can cross the sequence's end starts
    at tail = floor(n / BLOCK) * BLOCK. Steps 0-2 stop at tail, so every block they visit lies
    inside [0, n) and needs no bounds mask; step 3 is [tail, hi), at most that one block, the
    last one visited before too (same blocks, same order). Nothing here needs n on the host."""
    if STEP == 0:
        s_lo, s_hi = lo, full_lo
    elif STEP == 1:
        s_lo, s_hi = full_lo, full_hi
    elif STEP == 2:
        s_lo, s_hi = full_hi, hi
    else:
        s_lo, s_hi = lo, hi
    if PEEL:
        tail = (n // BLOCK) * BLOCK
        if STEP == 3:
            s_lo = tl.maximum(s_lo, tail)
        else:
            s_hi = tl.minimum(s_hi, tail)
    return s_lo, s_hi


def key_blocks(start_m, n_k, diag_lo, diag_hi, block_m, block_n):
    """:func:`_key_blocks` in plain Python (the same integer arithmetic)."""
    lo = (max(start_m + diag_lo, 0) // block_n) * block_n
    hi = max(min(start_m + block_m + diag_hi, n_k), lo)
    first = max(start_m + block_m - 1 + diag_lo, 0)
    full_lo = min(max(((first + block_n - 1) // block_n) * block_n, lo), hi)
    full_hi = max((max(min(start_m + 1 + diag_hi, n_k), 0) // block_n) * block_n, full_lo)
    return lo, full_lo, full_hi, hi


def query_blocks(start_n, n_q, diag_lo, diag_hi, block_n, block_m):
    """:func:`_query_blocks` in plain Python (the same integer arithmetic)."""
    lo = (max(start_n - diag_hi, 0) // block_m) * block_m
    hi = max(min(start_n + block_n - diag_lo, n_q), lo)
    first = max(start_n + block_n - 1 - diag_hi, 0)
    full_lo = min(max(((first + block_m - 1) // block_m) * block_m, lo), hi)
    full_hi = max(min((max(start_n + 1 - diag_lo, 0) // block_m) * block_m, hi), full_lo)
    return lo, full_lo, full_hi, hi


def step_ranges(lo, full_lo, full_hi, hi, n, block, peel=True):
    """:func:`_step_range` in plain Python: (s_lo, s_hi) of every step, in order."""
    ranges = [(lo, full_lo), (full_lo, full_hi), (full_hi, hi)]
    if not peel:
        return ranges
    tail = (n // block) * block
    return [(a, min(b, tail)) for a, b in ranges] + [(max(lo, tail), hi)]


# ---- the variant a launch computes, and the checks of the public arguments -------------------


@dataclasses.dataclass(frozen=True)
class Variant:
    """The attention variant a launch computes (checked by ``flash``): every field is hashable,
    part of the tuned-config key, and turned into kernel arguments by :meth:`kernel_args`.

    causal, bottom_right: the causal mask and where its diagonal sits (also the window's).
    window: flash-attn's (left, right), -1 unbounded. softcap: 0.0 = off.
    """

    causal: bool = False
    bottom_right: bool = False
    window: tuple[int, int] = (-1, -1)
    softcap: float = 0.0

    @property
    def windowed(self) -> bool:
        return self.causal or self.window != (-1, -1)

    def window_offsets(self) -> tuple[int, int]:
        """(win_lo, win_hi): row i sees keys [i + diag + win_lo, i + diag + win_hi]."""
        left, right = self.window
        if self.causal:
            right = 0
        return (-BIG if left < 0 else -left), (BIG if right < 0 else right)

    def gluon_form(self):
        """(causal, window_left) of the Gluon forward's call for this variant, None where it has
        no such call: it computes plain, causal and causal sliding-window attention (row i sees
        keys [i - left, i], left >= 1; the alignment is moot there, Nq = Nk). Left = 0 stays on the
        tl kernel: there every row has one key, which only tl's statistic keeps exact (P = 1)."""
        lo, hi = self.window_offsets()
        if self.softcap > 0 or hi not in (0, BIG):
            return None
        if hi == BIG:
            return (False, None) if lo == -BIG else None
        return (True, None) if lo == -BIG else ((True, -lo) if lo < 0 else None)

    def units(self, scale: float) -> tuple[float, float, float]:
        """(qk_mul, c, c2): the score s = c * r with r = qk * qk_mul [tanh], c2 = c log2 e."""
        if self.softcap > 0:
            qk_mul, c = scale / self.softcap, self.softcap
        elif scale == 0:
            qk_mul, c = 0.0, 1.0
        else:
            qk_mul, c = math.copysign(1.0, scale), abs(scale)
        return qk_mul, c, c * LOG2E


PLAIN = Variant()
CAUSAL = Variant(causal=True)


def as_variant(causal) -> Variant:
    """The old ``causal`` bool (ring attention, benchmarks) or a :class:`Variant`."""
    if isinstance(causal, Variant):
        return causal
    return CAUSAL if causal else PLAIN


def _causal_bias_types():
    """SDPA's causal bias class and its variant enum (torch >= 2.2), or (None, None)."""
    try:
        from torch.nn.attention.bias import CausalBias, CausalVariant
    except ImportError:  # pragma: no cover (older torch)
        return None, None
    return CausalBias, CausalVariant


def bias_alignment(attn_mask, n_q: int, n_k: int) -> str:
    """The alignment of SDPA's ``causal_upper_left`` / ``causal_lower_right`` bias object."""
    CausalBias, CausalVariant = _causal_bias_types()
    if CausalBias is None or not isinstance(attn_mask, CausalBias):
        raise TypeError(
            "attn_mask must be None or one of SDPA's causal bias objects "
            "(torch.nn.attention.bias.causal_upper_left(Nq, Nk) or causal_lower_right(Nq, Nk)); "
            f"got {type(attn_mask).__name__}. Tensor masks are not supported: use "
            "window_size / causal here, or FlexAttention / SDPA for arbitrary masks."
        )
    if (attn_mask.seq_len_q, attn_mask.seq_len_kv) != (n_q, n_k):
        raise ValueError(
            f"attn_mask was built for (Nq, Nk) = ({attn_mask.seq_len_q}, "
            f"{attn_mask.seq_len_kv}) but q, k have Nq = {n_q}, Nk = {n_k}"
        )
    return "top_left" if attn_mask.variant == CausalVariant.UPPER_LEFT else "bottom_right"


def check_variant(
    causal, causal_alignment, window_size, softcap, attn_mask, n_q: int, n_k: int
) -> Variant:
    """Validate the variant arguments of ``flash_attention``; return the :class:`Variant`."""
    usual = window_size is None and softcap is None and attn_mask is None
    if usual and causal_alignment == "top_left" and isinstance(causal, bool):
        return CAUSAL if causal else PLAIN  # the usual call: a shared constant, nothing to build
    alignment = check_alignment(causal_alignment)
    if attn_mask is not None:
        if causal:
            raise ValueError(
                "pass either causal=True or attn_mask (a causal bias object), not both "
                "(as in scaled_dot_product_attention)"
            )
        bias_align = bias_alignment(attn_mask, n_q, n_k)
        if alignment == "bottom_right" and bias_align == "top_left":
            raise ValueError(
                "causal_alignment='bottom_right' contradicts attn_mask=causal_upper_left(...); "
                "pass one of them"
            )
        causal, alignment = True, bias_align
    return Variant(
        causal=causal,
        bottom_right=alignment == "bottom_right",
        window=check_window(window_size),
        softcap=check_softcap(softcap),
    )


def check_once(t: torch.Tensor, name: str, facts: tuple, check) -> None:
    """Run ``check()``, a check that reads ``t``'s values (a device-to-host copy: a sync on a
    GPU), unless this same tensor, unchanged since (PyTorch bumps ``t._version`` on every
    in-place write), already passed it with the same ``facts``: the pass is stamped on the tensor
    as attribute ``name``. Writes that bypass the version counter (through ``.data``, by another
    kernel, a CUDA-graph replay) are not seen. Inference tensors (``torch.inference_mode``) have
    no version counter: they are checked on every call."""
    try:
        stamp = (t._version, *facts)
    except RuntimeError:  # "Inference tensors do not track version counter"
        check()
        return
    if getattr(t, name, None) == stamp:
        return
    check()
    with contextlib.suppress(AttributeError, RuntimeError):  # a subclass without attributes
        setattr(t, name, stamp)


def _check_finite_slopes(slopes: torch.Tensor) -> None:
    if not torch.isfinite(slopes).all():
        raise ValueError("alibi_slopes must be finite")


def check_alibi(alibi_slopes, q: torch.Tensor, batch: int | None = None, heads: int | None = None):
    """``None``, or slopes (H,) or (B, H) -> a float32 (1 or B, H) tensor on q's device.

    Dense q is (B, H, Nq, d); for packed varlen q pass ``batch`` (sequences) and ``heads``.
    """
    if alibi_slopes is None:
        return None
    B = q.shape[0] if batch is None else batch
    H = q.shape[1] if heads is None else heads
    if not isinstance(alibi_slopes, torch.Tensor):
        raise TypeError(
            f"alibi_slopes must be None or a tensor of shape ({H},) or ({B}, {H}); got "
            f"{type(alibi_slopes).__name__}"
        )
    if not alibi_slopes.is_floating_point():
        raise TypeError(f"alibi_slopes must be a floating tensor; got {alibi_slopes.dtype}")
    if tuple(alibi_slopes.shape) not in ((H,), (B, H)):
        raise ValueError(
            f"alibi_slopes must have shape (H,) = ({H},) or (B, H) = ({B}, {H}) (one slope per "
            f"query head, optionally per batch entry); got {tuple(alibi_slopes.shape)}"
        )
    if alibi_slopes.device != q.device:
        raise ValueError(
            f"alibi_slopes must be on q's device {q.device}; got {alibi_slopes.device}"
        )
    # (a data-dependent check: skipped under torch.compile, where it would break the graph;
    # once per unchanged tensor, as the varlen offsets: it is a sync every call otherwise)
    if not torch.compiler.is_compiling():
        check_once(
            alibi_slopes,
            "_course_kernels_checked_finite",
            (),
            lambda: _check_finite_slopes(alibi_slopes),
        )
    return alibi_slopes.detach().to(torch.float32).reshape(-1, H)


def lse_to_base2(lse_c, variant: Variant, scale: float):
    """The kernels' row statistic (units of c, +inf for an empty row) -> base-2 logsumexp (-inf)."""
    _, _, c2 = variant.units(scale)
    return torch.where(torch.isposinf(lse_c), float("-inf"), lse_c * c2)


def lse_from_base2(lse2, variant: Variant, scale: float):
    """The inverse of :func:`lse_to_base2`."""
    _, _, c2 = variant.units(scale)
    return torch.where(torch.isneginf(lse2), float("inf"), lse2 / c2)
