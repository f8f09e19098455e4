"""Launching the Triton kernels: ``_forward`` runs ``triton_forward._attn_fwd``, ``_backward``
runs ``triton_backward._attn_bwd_dq`` then ``_attn_bwd_dkdv`` (or the closed form when there is
one key), on inputs :mod:`course_kernels.triton.flash` has already checked.

Chapter: "Flash Attention in Triton" (forward, backward). Private to the package except
:func:`head_dim_padded`; every name is importable from :mod:`course_kernels.triton.flash`, which
``ring attention`` and the benchmarks use (``flash._forward``, ``flash._TUNED``).
"""

from __future__ import annotations

import dataclasses
import math

from . import _env as _triton_env  # first: decides GPU vs interpreter before any kernel is defined
from ._env import INTERPRET, require_triton
from ._env import environ_get as _environ_get

require_triton()

import torch  # noqa: E402

from ..gluon.backward_launch import gluon_attention_backward, gluon_varlen_backward  # noqa: E402
from ..gluon.launch import gluon_attention_forward, gluon_varlen_forward  # noqa: E402
from ..gluon.launch import gluon_available, why_unavailable  # noqa: E402
from .backward import _attn_bwd_dkdv, _attn_bwd_dq, _one_key_closed_form  # noqa: E402
from .backward import _backward_one_key as _backward_one_key  # noqa: E402
from .configs import _TUNED as _TUNED, KernelPlan, _launch as _launch  # noqa: E402
from .forward import _attn_fwd  # noqa: E402
from .masks import CAUSAL, PLAIN, Variant, as_variant  # noqa: E402,F401  (re-exported)
from .masks import lse_from_base2, lse_to_base2  # noqa: E402,F401  (re-exported)


# Host-side helpers in plain Python: triton.cdiv / next_power_of_2 are constexpr functions in
# recent Triton, tens of microseconds a call: launch overhead at N = 1024 (notes/kernel.md).
def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def head_dim_padded(d: int) -> int:
    """Next power of two >= d, at least 16 (the smallest tl.dot size)."""
    return max(16, _triton_env.next_power_of_2(d))


def _dot_precision(dtype: torch.dtype) -> str:
    """fp32 inputs use IEEE fp32 products (not TF32) so results match an fp32 reference."""
    return "ieee" if dtype == torch.float32 else "tf32"


# Which forward kernel runs: "auto" (the Gluon FA3-schedule forward where it applies: Hopper with
# the pinned Triton, fp16/bf16, d = 64, 128 or 256, Nq = Nk, at least GLUON_MIN_WORK; else tl),
# "gluon" (always; an error where it cannot) or "triton". The backward has its own
# variable ("auto": GLUON_BACKWARD_AUTO's dims; GQA only if GLUON_BACKWARD_GQA, else forced).
FORWARD_ENV, BACKWARD_ENV = "COURSE_KERNELS_FORWARD", "COURSE_KERNELS_BACKWARD"
FORWARD_CHOICES = ("auto", "gluon", "triton")

# The Gluon forward's host path (four TMA descriptors, a warp-specialised launch) took up to
# 0.23 ms on the H200, about twice the tl path's (course_kernels/data/gluon/h200_dispatch.json):
# the Gluon call won 2 of 16 rows at N <= 1K, 6 of 8 at 2K, all 8 at 4K. From B * Hq * Nq * Nk *
# d = 2**36 (between N = 2K and 4K at B = 4, H * d = 2048) "auto" takes it.
GLUON_MIN_WORK = 1 << 36


def _gluon_pays(q, k) -> bool:
    """Enough work per call for the Gluon forward's host cost to hide behind its kernel."""
    b, hq, n_q, d = q.shape
    return b * hq * n_q * k.shape[2] * d >= GLUON_MIN_WORK


def _gluon_fits(q, k, dims) -> bool:
    fp16 = q.dtype in (torch.float16, torch.bfloat16)
    return q.is_cuda and fp16 and q.shape[3] in dims and q.shape[2] == k.shape[2]


# Head dims where "auto" takes the Gluon backward (H200): d = 64, 5-9% faster than tl; d = 128
# since DQ_TMA (session 12, notes/gluon_backward.md). Windows and packed causal documents: the dims
# where it beat tl by 3% in every row (data/bench/h100_features_bench_{masked_bwd,session16_window_bwd}_*).
GLUON_BACKWARD_AUTO, GLUON_MASKED_BACKWARD = (64, 128), {"window": (128,), "documents": (64, 128)}
GLUON_MASKED_FORWARD = {"documents": (128,)}  # the same rule (h100_features_bench_docs_fwd_*)
# The dims each Gluon kernel takes; d = 256 auto's by h100_d256_session21*.json; GQA: h100_gqa_*.
GLUON_FORWARD_DIMS = GLUON_FORWARD_AUTO = (64, 128, 256)
GLUON_BACKWARD_DIMS, GLUON_BACKWARD_GQA = (64, 128), True


def _use_gluon(q, k, backward: bool = False, mask: str = "") -> bool:
    """Whether the forward (or ``backward``; with a ``mask``: of GLUON_MASKED_FORWARD's or
    _BACKWARD's) runs the Gluon kernel (``$COURSE_KERNELS_FORWARD``, ``_BACKWARD``, see above)."""
    env, what = (BACKWARD_ENV, "backward") if backward else (FORWARD_ENV, "forward")
    choice = _environ_get(env, "auto")
    if choice not in FORWARD_CHOICES:
        raise ValueError(f"${env}={choice!r}: choose one of {', '.join(FORWARD_CHOICES)}")
    if choice == "triton":
        return False
    masked = GLUON_MASKED_BACKWARD if backward else GLUON_MASKED_FORWARD
    dims = masked[mask] if mask else GLUON_BACKWARD_AUTO
    if (backward and choice == "auto" or mask) and (
        q.shape[-1] not in dims or torch.are_deterministic_algorithms_enabled()
    ):
        return False
    dims = GLUON_BACKWARD_DIMS if backward else GLUON_FORWARD_DIMS
    fits = _gluon_fits(q, k, dims) and q.shape[1] % k.shape[1] == 0
    if choice == "gluon":
        if not gluon_available():
            raise RuntimeError(f"${env}=gluon, but {why_unavailable()}")
        if not fits:
            raise ValueError(
                f"${env}=gluon: the Gluon {what} takes CUDA fp16/bf16 inputs with d in {dims} "
                f"and Nq = Nk; got "
                f"{q.dtype}, d = {q.shape[3]}, Nq = {q.shape[2]}, Nk = {k.shape[2]}, "
                f"{q.shape[1]} query and {k.shape[1]} K/V heads on {q.device}"
            )
        return True
    fits = fits and (backward or mask or q.shape[3] in GLUON_FORWARD_AUTO)  # (else checked above)
    fits = fits and (not backward or GLUON_BACKWARD_GQA or q.shape[1] == k.shape[1])
    return not INTERPRET and fits and _gluon_pays(q, k) and gluon_available()


def _gluon_docs(q, k, variant: Variant, alibi, varlen, backward: bool) -> bool:
    """Packed causal documents (one cu_seqlens) at the dims GLUON_MASKED_FORWARD/_BACKWARD list."""
    if varlen is None or alibi is not None or varlen[0] is not varlen[1]:
        return False
    packed = (x.transpose(0, 1).unsqueeze(0) for x in (q, k))  # (1, H, total, d) views
    return variant.gluon_form() == (True, None) and _use_gluon(*packed, backward, "documents")


def _forward(q, k, v, causal, scale: float, alibi=None):
    """Run the forward: ``_attn_fwd`` (the tl kernel), or on Hopper for the plain, causal and
    causal sliding-window variants (``Variant.gluon_form``) the Gluon FA3-schedule forward
    (:func:`_use_gluon`). q (B, Hq, Nq, d), k/v (B, kv_heads, Nk, d), already checked.

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
    gluon_form = variant.gluon_form() if varlen is None and alibi is None else None
    if _gluon_docs(q, k, variant, alibi, varlen, False):
        o, lse = gluon_varlen_forward(q, k, v, varlen[0], scale, True)  # offsets checked
        return o, lse / variant.units(scale)[1]  # natural-log lse (H, total) -> units of c
    if gluon_form is not None and _use_gluon(q, k):
        causal, window_left = gluon_form
        o, lse = gluon_attention_forward(q, k, v, causal, scale, window_left)
        return o, lse / variant.units(scale)[1]  # natural-log lse -> units of c
    if INTERPRET and q.dtype == torch.bfloat16:
        o, lse_c = _forward_c(q.float(), k.float(), v.float(), variant, scale, alibi, varlen)
        return o.to(torch.bfloat16), lse_c
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    dev = q.device
    key = ("fwd", q.shape, k.shape, q.stride(), k.stride(), v.stride(), q.dtype, k.dtype, v.dtype)
    key = (*key, dev, *_plan_key(variant, scale, alibi, varlen))
    plan = _PLANS.get(key)
    o = torch.empty_like(q)
    if plan is None:
        plan = _remember(key, _fwd_plan(q, k, v, o, variant, scale, alibi, varlen))
    lse_shape, c, kernel_plan = plan
    lse_c = torch.empty(lse_shape, device=dev, dtype=torch.float32)
    cu = (lse_c, lse_c) if varlen is None else varlen[:2]
    alibi_r = lse_c if alibi is None else _alibi_r(alibi, c)
    kernel_plan.launch((q, k, v, lse_c, o, *cu, alibi_r))
    return o, lse_c


# A call's launch plans (configs.KernelPlan: strides, sizes, the variant's numbers, grid),
# per (kernel, shapes, strides, dtypes, device, variant, scale, ALiBi/varlen layout): computed
# by a shape's first call, reused by the next ones (~10 us of Python per call, notes/kernel.md).
_PLANS: dict = {}
_MAX_PLANS = 1024  # then start over: a long run over ever new shapes must not grow without end


def _plan_key(variant: Variant, scale, alibi, varlen) -> tuple:
    """The rest of a plan's key. ``scale``'s type and sign too: -0.0 == 0.0 and 1 == 1.0, but the
    kernels see them differently (signed zeros; Triton specialises the int 1)."""
    aux = None if alibi is None else alibi.shape
    if varlen is not None:
        cu_q, cu_k, max_q, max_k = varlen
        aux = (aux, cu_q.shape, cu_k.shape, cu_q.dtype, cu_k.dtype, max_q, max_k)
    return (variant, scale, type(scale), math.copysign(1.0, scale), aux)


def _remember(key, plan):
    if len(_PLANS) >= _MAX_PLANS:
        _PLANS.clear()
    _PLANS[key] = plan
    return plan


def _fwd_plan(q, k, v, o, variant: Variant, scale: float, alibi, varlen):
    """(lse shape, c, the forward's KernelPlan) for contiguous q, k, v and o = empty_like(q)."""
    lay = _layout(q, k, varlen)
    qk_mul, c, c2 = variant.units(scale)
    n_q, n_k = lay.n_q, lay.n_k
    scalars = (
        *lay.strides(q),
        *lay.strides(k),
        *lay.strides(v),
        *lay.strides(o),
        *lay.lse_strides,
        _alibi_stride(alibi),
        qk_mul,
        c2,
        *variant.window_offsets(),
        lay.hq,
        lay.hq // lay.kv_heads,
        n_q,
        n_k,
    )
    constexprs = _constexprs(lay, q.dtype, variant, alibi, varlen)
    tune_key = (q.device, q.dtype, n_q, n_k, lay.d, variant, alibi is not None, varlen is not None)

    def grid(meta):
        return (_cdiv(n_q, meta["BLOCK_M"]), lay.batch * lay.hq)

    plan = KernelPlan(_attn_fwd, (id(_attn_fwd), *tune_key), scalars, constexprs, grid)
    return lay.lse_shape, c, plan


def _constexprs(lay, dtype, variant: Variant, alibi, varlen) -> dict:
    """The constexprs the forward and both backward kernels share."""
    return {
        "HEAD_DIM": lay.d,
        "HEAD_DIM_PADDED": head_dim_padded(lay.d),
        "WINDOWED": variant.windowed,
        "BOTTOM_RIGHT": variant.bottom_right,
        "SOFTCAP": variant.softcap > 0,
        "ALIBI": alibi is not None,
        "VARLEN": varlen is not None,
        "DOT_PRECISION": _dot_precision(dtype),
    }


def _alibi_r(alibi, c: float):
    """slope / c as a contiguous float32 (B or 1, Hq) tensor: the kernels' ALIBI_R."""
    return (alibi.to(torch.float32) / c).contiguous()


def _alibi_stride(alibi) -> int:
    """ALIBI_R's batch stride: Hq for one slope row per batch entry, 0 for one row for all."""
    return 0 if alibi is None or alibi.shape[0] == 1 else alibi.shape[1]


def _alibi_args(alibi, c: float, dummy):
    """(slope / c as a contiguous float32 tensor, its batch stride) or (dummy, 0)."""
    return (dummy, 0) if alibi is None else (_alibi_r(alibi, c), _alibi_stride(alibi))


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


def _backward(do, q, k, v, o, lse2, causal, scale: float, alibi=None):
    """Run the two backward kernels; returns dq, dk, dv shaped and typed like q, k, v.

    Inputs as returned by / given to :func:`_forward` (base-2 lse2; any strides). ``causal``:
    a bool or a :class:`Variant`. :func:`_backward_c` takes the kernels' own statistic.
    """
    variant = as_variant(causal)
    lse_c = lse_from_base2(lse2, variant, scale)
    return _backward_c(do, q, k, v, o, lse_c, variant, scale, alibi)


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
    constexprs = _constexprs(lay, q.dtype, variant, alibi, varlen)
    return common, constexprs


def _backward_c(do, q, k, v, o, lse_c, variant: Variant, scale: float, alibi=None, varlen=None):
    """:func:`_backward` on the statistic of :func:`_forward_c` (dense, or packed ``varlen``)."""
    if _one_key_closed_form(k, variant, alibi, varlen):
        return _backward_one_key(do, q, k, v, o, lse_c, scale, variant)
    form = variant.gluon_form() if alibi is None else None
    if _gluon_docs(q, k, variant, alibi, varlen, True):
        lse = lse_c * variant.units(scale)[1]  # units of c -> the natural-log lse
        return gluon_varlen_backward(do, q, k, v, o, lse, varlen[0], scale, True, True)
    if form and varlen is None and _use_gluon(q, k, True, "window" if form[1] else ""):
        lse = lse_c * variant.units(scale)[1]
        return gluon_attention_backward(do, q, k, v, o, lse, form[0], scale, window_left=form[1])
    if INTERPRET and q.dtype == torch.bfloat16:
        f = (x.float() for x in (do, q, k, v, o))
        grads = _backward_c(*f, lse_c, variant, scale, alibi, varlen)
        return tuple(g.to(torch.bfloat16) for g in grads)
    q, k, v, o, do = q.contiguous(), k.contiguous(), v.contiguous(), o.contiguous(), do.contiguous()
    lse_c = lse_c.contiguous()
    key = ("bwd", q.shape, k.shape, q.stride(), k.stride(), q.dtype, k.dtype, v.dtype, o.dtype)
    key = (*key, do.dtype, lse_c.dtype, q.device, *_plan_key(variant, scale, alibi, varlen))
    plan = _PLANS.get(key)
    if plan is None:
        plan = _remember(key, _bwd_plans(q, k, lse_c, variant, scale, alibi, varlen))
    c, dq_plan, dkdv_plan = plan
    delta = torch.empty_like(lse_c)  # float32, written by the dQ kernel
    dq = torch.empty_like(q)
    dk = torch.empty_like(k)
    dv = torch.empty_like(v)
    cu = (lse_c, lse_c) if varlen is None else varlen[:2]
    alibi_r = lse_c if alibi is None else _alibi_r(alibi, c)
    # dQ first: it also computes D = rowsum(dO * O), which the dK/dV kernel reads (one launch fewer)
    dq_plan.launch((q, k, v, do, o, lse_c, delta, dq, *cu, alibi_r))
    # dq: read only with ATOMIC_DQ (not used here: dQ has its own kernel)
    dkdv_plan.launch((q, k, v, do, lse_c, delta, dk, dv, dq, *cu, alibi_r))
    return dq, dk, dv


def _bwd_plans(q, k, lse_c, variant: Variant, scale: float, alibi, varlen):
    """(c, the dQ kernel's KernelPlan, the dK/dV kernel's) for contiguous inputs."""
    lay = _layout(q, k, varlen)
    group = lay.hq // lay.kv_heads
    key = (q.device, q.dtype, lay.n_q, lay.n_k, lay.d, variant, group, alibi is not None)
    key = (*key, varlen is not None)
    common, constexprs = bwd_variant_args(q, k, lse_c, variant, scale, alibi, varlen)
    constexprs["EVEN_BLOCKS"] = varlen is None and _even(lay.n_q, lay.n_k)
    scalars = common[3:]  # after the cu_seqlens and ALiBi tensors
    dq = KernelPlan(
        _attn_bwd_dq,
        (id(_attn_bwd_dq), *key),
        (*scalars, lay.hq, group, lay.n_q, lay.n_k),
        constexprs,
        lambda meta: (_cdiv(lay.n_q, meta["BLOCK_M2"]), lay.batch * lay.hq),
    )
    dkdv = KernelPlan(
        _attn_bwd_dkdv,
        (id(_attn_bwd_dkdv), *key),
        (*scalars, lay.kv_heads, group, lay.n_q, lay.n_k),
        # ONE_LOOP: no serialised wgmma; PEEL: the tail block outside the loop (both backward.py)
        {**constexprs, "ATOMIC_DQ": False, "ONE_LOOP": True, "PEEL": True},
        lambda meta: (_cdiv(lay.n_k, meta["BLOCK_N1"]), lay.batch * lay.kv_heads),
    )
    return variant.units(scale)[1], dq, dkdv


def _even(n_q: int, n_k: int) -> bool:
    """Nq and Nk multiples of every block size in the backward kernels' autotuning lists: their
    loads then need no bounds masks (``EVEN_BLOCKS``, FlexAttention's ``IS_DIVISIBLE``; -14 to
    -33% on the dK/dV kernel on the H200, notes/kernel.md session 8). Dense calls only; other
    lengths get most of it from the dK/dV kernel's ``PEEL`` (notes/kernel.md, session 10)."""
    kernels = (_attn_bwd_dq, _attn_bwd_dkdv)
    if not all(getattr(kern, "configs", None) for kern in kernels):
        return False  # no list to read the blocks from: keep the masks
    block = max(v for kern in kernels for cfg in kern.configs for v in cfg.kwargs.values())
    return n_q % block == 0 and n_k % block == 0
