"""Launching the Triton kernels: ``_forward`` runs ``triton_forward._attn_fwd``, ``_backward``
runs ``triton_backward._attn_bwd_dq`` then ``_attn_bwd_dkdv`` (or the closed form when there is
one key), on inputs :mod:`course_kernels.triton.flash` has already checked.

Chapter: "Flash Attention in Triton" (forward, backward). Private to the package except
:func:`head_dim_padded`; every name is importable from :mod:`course_kernels.triton.flash`, which
``ring attention`` and the benchmarks use (``flash._forward``, ``flash._TUNED``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os

from . import _env as _triton_env  # first: decides GPU vs interpreter before any kernel is defined
from ._env import INTERPRET, require_triton

require_triton()

import torch  # noqa: E402

from ..gluon.launch import gluon_attention_forward, gluon_available, why_unavailable  # noqa: E402
from .backward import _attn_bwd_dkdv, _attn_bwd_dq  # noqa: E402
from .forward import _attn_fwd  # noqa: E402
from .masks import CAUSAL, PLAIN, Variant, as_variant  # noqa: E402,F401  (re-exported)


# Host-side helpers in plain Python: triton.cdiv / triton.next_power_of_2 are Triton
# constexpr functions in recent versions and cost tens of microseconds per call, which showed
# up as launch overhead at N = 1024 (notes/kernel.md).
def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def head_dim_padded(d: int) -> int:
    """Next power of two >= d, at least 16 (the smallest tl.dot size)."""
    return max(16, _triton_env.next_power_of_2(d))


def _dot_precision(dtype: torch.dtype) -> str:
    """fp32 inputs use IEEE fp32 products (not TF32) so results match an fp32 reference."""
    return "ieee" if dtype == torch.float32 else "tf32"


def _quiet():
    """NumPy floating-point warnings off while the interpreter runs a kernel.

    Under ``TRITON_INTERPRET`` each ``tl`` operation is a NumPy call, so NaN or inf inputs
    (which the GPU propagates silently, as SDPA does) would leak ``RuntimeWarning``s such as
    "invalid value encountered in subtract" into the caller's code.
    """
    if INTERPRET:
        import numpy as np

        return np.errstate(all="ignore")
    return contextlib.nullcontext()


# Triton's Autotuner.run rebuilds its cache key from every argument on each call. After a
# shape's first (tuning) launch, remember the config it chose and launch the JIT function
# directly, exactly as Autotuner.run would. At N = 1K the whole Python launch path is still
# comparable to the kernel's ~0.1 ms (notes/kernel.md).
# Triton has no public API for this; the internals used here (Autotuner.best_config,
# Config.all_kwargs, fn.run(grid=, warmup=)) are pinned by tests/test_flash_launch_internals.py.
_TUNED: dict = {}


def _launch(kernel, grid, args, key, **constexprs):
    tuned = _TUNED.get((id(kernel), *key))  # the chosen config's kwargs (block sizes, warps...)
    if tuned is None:
        with _quiet():
            kernel[grid](*args, **constexprs)
        _TUNED[(id(kernel), *key)] = kernel.best_config.all_kwargs()
    elif INTERPRET:
        with _quiet():
            kernel.fn.run(*args, grid=grid, warmup=False, **constexprs, **tuned)
    else:
        kernel.fn.run(*args, grid=grid, warmup=False, **constexprs, **tuned)


# Which forward kernel runs: "auto" (the Gluon FA3-schedule forward where it applies: a Hopper
# GPU with the pinned Triton, fp16/bf16, d = 64 or 128, Nq = Nk, and at least GLUON_MIN_WORK;
# the tl kernel elsewhere), "gluon" (always; an error where it cannot) or "triton" (always tl).
FORWARD_ENV = "COURSE_KERNELS_FORWARD"
FORWARD_CHOICES = ("auto", "gluon", "triton")

# The Gluon forward's host path (four TMA descriptors and a warp-specialised launch per call)
# took up to 0.23 ms on the H200 beyond its CUDA-graph replay (0.43 ms before its layouts were
# cached), about twice the tl path's (course_kernels/data/gluon/h200_dispatch.json): at N <= 1K
# as long as the kernel, and the Gluon call beat the tl call in 2 of 16 rows there, 6 of 8 at
# N = 2K. From B * Hq * Nq * Nk * d = 2**36 (between N = 2K and 4K at B = 4, H * d = 2048) its
# kernel time hides the host path: at N = 4K it won all 8 rows. "auto" takes it from there on.
GLUON_MIN_WORK = 1 << 36


def _gluon_pays(q, k) -> bool:
    """Enough work per call for the Gluon forward's host cost to hide behind its kernel."""
    b, hq, n_q, d = q.shape
    return b * hq * n_q * k.shape[2] * d >= GLUON_MIN_WORK


def _gluon_fits(q, k) -> bool:
    return (
        q.is_cuda
        and q.dtype in (torch.float16, torch.bfloat16)
        and q.shape[3] in (64, 128)
        and q.shape[2] == k.shape[2]
    )


def _use_gluon(q, k) -> bool:
    """Whether ``_forward`` runs the Gluon forward (``$COURSE_KERNELS_FORWARD``, see above)."""
    choice = os.environ.get(FORWARD_ENV, "auto")
    if choice not in FORWARD_CHOICES:
        raise ValueError(f"${FORWARD_ENV}={choice!r}: choose one of {', '.join(FORWARD_CHOICES)}")
    if choice == "triton":
        return False
    if choice == "gluon":
        if not gluon_available():
            raise RuntimeError(f"${FORWARD_ENV}=gluon, but {why_unavailable()}")
        if not _gluon_fits(q, k):
            raise ValueError(
                f"${FORWARD_ENV}=gluon: the Gluon forward takes CUDA fp16/bf16 inputs with "
                f"d = 64 or 128 and Nq = Nk; got {q.dtype}, d = {q.shape[3]}, "
                f"Nq = {q.shape[2]}, Nk = {k.shape[2]} on {q.device}"
            )
        return True
    return not INTERPRET and _gluon_fits(q, k) and _gluon_pays(q, k) and gluon_available()


def lse_to_base2(lse_c, variant: Variant, scale: float):
    """The kernels' row statistic (units of c, +inf for an empty row) -> base-2 logsumexp (-inf)."""
    _, _, c2 = variant.units(scale)
    return torch.where(torch.isposinf(lse_c), float("-inf"), lse_c * c2)


def lse_from_base2(lse2, variant: Variant, scale: float):
    _, _, c2 = variant.units(scale)
    return torch.where(torch.isneginf(lse2), float("inf"), lse2 / c2)


def _forward(q, k, v, causal, scale: float, alibi=None):
    """Run the forward: ``_attn_fwd`` (the tl kernel), or on Hopper for the plain and causal
    variants the Gluon FA3-schedule forward (:mod:`course_kernels.gluon`; see :func:`_use_gluon`).
    q (B, Hq, Nq, d), k/v (B, kv_heads, Nk, d), already checked.

    ``causal``: a bool (top-left causal) or a :class:`Variant`; ``alibi``: None or (B or 1, Hq)
    float32 slopes. Returns o (B, Hq, Nq, d) contiguous in q.dtype and lse2 (B, Hq, Nq) float32
    in base 2 (-inf for a row that sees no key). :func:`_forward_c` returns the kernels' own
    statistic instead (what :func:`_backward_c` takes).
    """
    variant = as_variant(causal)
    o, lse_c = _forward_c(q, k, v, variant, scale, alibi)
    return o, lse_to_base2(lse_c, variant, scale)


def _forward_c(q, k, v, variant: Variant, scale: float, alibi=None, varlen=None):
    """As :func:`_forward`, returning the row statistic in units of c (masks.py), +inf if empty.

    ``varlen``: None (dense) or (cu_q, cu_k, max_q, max_k): q (total_q, Hq, d), k/v (total_k,
    kv_heads, d) packed; the statistic is then (Hq, total_q). Under the interpreter bf16 is
    computed in fp32 and O rounded to bf16 (triton-lang/triton#11584).
    """
    plain = varlen is None and alibi is None and variant in (PLAIN, CAUSAL)
    if plain and _use_gluon(q, k):
        o, lse = gluon_attention_forward(q, k, v, causal=variant.causal, scale=scale)
        return o, lse / variant.units(scale)[1]  # natural-log lse -> units of c
    if INTERPRET and q.dtype == torch.bfloat16:
        o, lse_c = _forward_c(q.float(), k.float(), v.float(), variant, scale, alibi, varlen)
        return o.to(torch.bfloat16), lse_c
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    o = torch.empty_like(q)
    lay = _layout(q, k, varlen)
    lse_c = torch.empty(lay.lse_shape, device=q.device, dtype=torch.float32)
    qk_mul, c, c2 = variant.units(scale)
    win_lo, win_hi = variant.window_offsets()
    alibi_r, stride_az = _alibi_args(alibi, c, lse_c)
    n_q, n_k = lay.n_q, lay.n_k

    def grid(meta):
        return (_cdiv(n_q, meta["BLOCK_M"]), lay.batch * lay.hq)

    args = (
        q,
        k,
        v,
        lse_c,
        o,
        *lay.cu(lse_c),
        alibi_r,
        *lay.strides(q),
        *lay.strides(k),
        *lay.strides(v),
        *lay.strides(o),
        *lay.lse_strides,
        stride_az,
        qk_mul,
        c2,
        win_lo,
        win_hi,
        lay.hq,
        lay.hq // lay.kv_heads,
        n_q,
        n_k,
    )
    _launch(
        _attn_fwd,
        grid,
        args,
        (q.device, q.dtype, n_q, n_k, lay.d, variant, alibi is not None, varlen is not None),
        HEAD_DIM=lay.d,
        HEAD_DIM_PADDED=head_dim_padded(lay.d),
        **_variant_constexprs(variant, alibi, varlen),
        DOT_PRECISION=_dot_precision(q.dtype),
    )
    return o, lse_c


def _variant_constexprs(variant: Variant, alibi, varlen) -> dict:
    return {
        "WINDOWED": variant.windowed,
        "BOTTOM_RIGHT": variant.bottom_right,
        "SOFTCAP": variant.softcap > 0,
        "ALIBI": alibi is not None,
        "VARLEN": varlen is not None,
    }


def _alibi_args(alibi, c: float, dummy):
    """(slope / c as a contiguous float32 tensor, its batch stride) or (dummy, 0)."""
    if alibi is None:
        return dummy, 0
    alibi_r = (alibi.to(torch.float32) / c).contiguous()  # (B or 1, Hq)
    return alibi_r, (alibi_r.stride(0) if alibi_r.shape[0] > 1 else 0)


@dataclasses.dataclass(frozen=True)
class _Layout:
    """Dense (B, H, N, d) or packed varlen (total, H, d) tensors, as the kernels index them."""

    batch: int
    hq: int
    kv_heads: int
    n_q: int  # Nq, or max_seqlen_q
    n_k: int
    d: int
    lse_shape: tuple
    lse_strides: tuple  # (per sequence, per head); per token 1
    cu_q: object = None
    cu_k: object = None

    def strides(self, x):
        """(z, h, token, dim) strides; a packed tensor has no batch stride (tokens are offset)."""
        if self.cu_q is None:
            return x.stride()
        return (0, x.stride(1), x.stride(0), x.stride(2))

    def cu(self, dummy):
        return (dummy, dummy) if self.cu_q is None else (self.cu_q, self.cu_k)


def _layout(q, k, varlen) -> _Layout:
    if varlen is None:
        B, Hq, Nq, d = q.shape
        return _Layout(B, Hq, k.shape[1], Nq, k.shape[2], d, (B, Hq, Nq), (Hq * Nq, Nq))
    cu_q, cu_k, max_q, max_k = varlen
    total_q, Hq, d = q.shape
    return _Layout(
        cu_q.numel() - 1, Hq, k.shape[1], max_q, max_k, d, (Hq, total_q), (0, total_q), cu_q, cu_k
    )


def _backward_one_key(do, q, k, v, o, lse_c, scale, variant: Variant = PLAIN):
    """The backward when there is one key (Nk = 1) and every row sees it, in closed form
    (PyTorch ops, O(N d)); ``lse_c`` is the kernels' statistic (units of c, masks.py).

    P = exp2((r - L) * c log2 e), dP = dO . v, D = rowsum(dO * O), dS = P (dP - D), dQ = dS k
    scale, dK = sum dS q scale, dV = sum P dO. When o and L are this call's own forward's, O = V
    exactly, so D and dP are the same sum of the same numbers and dS is exactly 0: dQ = dK = 0
    as in exact arithmetic. The kernels compute dP with a tensor-core dot and D with an
    elementwise sum, in different orders, which left ~1e-5 of rounding noise in dQ and dK there
    (notes/kernel.md). With another o and L (ring attention passes the global ones per block)
    this is the general formula. NaN or inf in the inputs still propagate to the gradients.
    """
    B, Hq, Nq, d = q.shape
    kv_heads = k.shape[1]
    G = Hq // kv_heads
    f = torch.float32
    qk_mul, _, c2 = variant.units(scale)
    qf = q.to(f).reshape(B, kv_heads, G, Nq, d)
    kf = k.to(f).reshape(B, kv_heads, 1, 1, d)
    vf = v.to(f).reshape(B, kv_heads, 1, 1, d)
    dof = do.to(f).reshape(B, kv_heads, G, Nq, d)
    of = o.to(f).reshape(B, kv_heads, G, Nq, d)
    r = (qf * kf).sum(-1, keepdim=True) * qk_mul  # (B, kv_heads, G, Nq, 1), units of c
    p = torch.exp2((r - lse_c.reshape(B, kv_heads, G, Nq, 1)) * c2)
    dp = (dof * vf).sum(-1, keepdim=True)
    delta = (dof * of).sum(-1, keepdim=True)  # bitwise dp when o = v: same shapes, same order
    ds = p * (dp - delta)
    dq = (ds * kf * scale).reshape(B, Hq, Nq, d)
    dk = (ds * qf).sum((2, 3)).reshape(B, kv_heads, 1, d) * scale
    dv = (p * dof).sum((2, 3)).reshape(B, kv_heads, 1, d)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


def _backward(do, q, k, v, o, lse2, causal, scale: float, alibi=None):
    """Run the two backward kernels; returns dq, dk, dv shaped and typed like q, k, v.

    Inputs as returned by / given to :func:`_forward` (base-2 lse2; any strides). ``causal``:
    a bool or a :class:`Variant`. :func:`_backward_c` takes the kernels' own statistic.
    """
    variant = as_variant(causal)
    lse_c = lse_from_base2(lse2, variant, scale)
    return _backward_c(do, q, k, v, o, lse_c, variant, scale, alibi)


def _one_key_closed_form(k, variant: Variant, alibi, varlen) -> bool:
    """Nk = 1 and every row sees key 0 with the plain score: the closed form applies."""
    plain = variant.softcap == 0 and alibi is None and variant.window == (-1, -1)
    return varlen is None and k.shape[2] == 1 and plain and not variant.bottom_right


def bwd_variant_args(q, k, lse_c, variant: Variant, scale: float, alibi=None, varlen=None):
    """The backward kernels' arguments between their tensors and (heads, group, Nq, Nk) --
    cu_seqlens, ALiBi, scale, strides, the variant's numbers -- and their constexprs (but
    ATOMIC_DQ). ``experiments/hopper/schedule_levers.py`` launches the dK/dV kernel with them."""
    lay = _layout(q, k, varlen)
    qk_mul, c, c2 = variant.units(scale)
    alibi_r, stride_az = _alibi_args(alibi, c, lse_c)
    common = (
        *lay.cu(lse_c),
        alibi_r,
        scale,
        *lay.strides(q),
        *lay.strides(k),
        *lay.lse_strides,
        stride_az,
        qk_mul,
        c2,
        *variant.window_offsets(),
    )
    constexprs = dict(
        HEAD_DIM=lay.d,
        HEAD_DIM_PADDED=head_dim_padded(lay.d),
        **_variant_constexprs(variant, alibi, varlen),
        DOT_PRECISION=_dot_precision(q.dtype),
    )
    return common, constexprs


def _backward_c(do, q, k, v, o, lse_c, variant: Variant, scale: float, alibi=None, varlen=None):
    """:func:`_backward` on the statistic of :func:`_forward_c` (dense, or packed ``varlen``)."""
    if _one_key_closed_form(k, variant, alibi, varlen):
        return _backward_one_key(do, q, k, v, o, lse_c, scale, variant)
    if INTERPRET and q.dtype == torch.bfloat16:
        f = (x.float() for x in (do, q, k, v, o))
        grads = _backward_c(*f, lse_c, variant, scale, alibi, varlen)
        return tuple(g.to(torch.bfloat16) for g in grads)
    q, k, v, o, do, lse_c = (x.contiguous() for x in (q, k, v, o, do, lse_c))
    lay = _layout(q, k, varlen)
    delta = torch.empty_like(lse_c)  # float32, written by the dQ kernel
    dq = torch.empty_like(q)
    dk = torch.empty_like(k)
    dv = torch.empty_like(v)
    group = lay.hq // lay.kv_heads
    key = (q.device, q.dtype, lay.n_q, lay.n_k, lay.d, variant, group, alibi is not None)
    key = (*key, varlen is not None)
    common, constexprs = bwd_variant_args(q, k, lse_c, variant, scale, alibi, varlen)
    # dQ first: it also computes D = rowsum(dO * O), which the dK/dV kernel reads (the
    # preprocessing pass folded in: one launch fewer).
    _launch(
        _attn_bwd_dq,
        lambda meta: (_cdiv(lay.n_q, meta["BLOCK_M2"]), lay.batch * lay.hq),
        (q, k, v, do, o, lse_c, delta, dq, *common, lay.hq, group, lay.n_q, lay.n_k),
        key,
        **constexprs,
    )
    _launch(
        _attn_bwd_dkdv,
        lambda meta: (_cdiv(lay.n_k, meta["BLOCK_N1"]), lay.batch * lay.kv_heads),
        # dq: read only with ATOMIC_DQ (not used here: dQ has its own kernel)
        (q, k, v, do, lse_c, delta, dk, dv, dq, *common, lay.kv_heads, group, lay.n_q, lay.n_k),
        key,
        **constexprs,
        ATOMIC_DQ=False,
    )
    return dq, dk, dv
