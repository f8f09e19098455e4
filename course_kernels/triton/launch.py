"""Launching the Triton kernels: ``_forward`` runs ``triton_forward._attn_fwd``, ``_backward``
runs ``triton_backward._attn_bwd_dq`` then ``_attn_bwd_dkdv`` (or the closed form when there is
one key), on inputs :mod:`course_kernels.triton.flash` has already checked.

Chapter: "Flash Attention in Triton" (forward, backward). Private to the package except
:func:`head_dim_padded`; every name is importable from :mod:`course_kernels.triton.flash`, which
``ring attention`` and the benchmarks use (``flash._forward``, ``flash._TUNED``).
"""

from __future__ import annotations

import contextlib
import os

from . import _env as _triton_env  # first: decides GPU vs interpreter before any kernel is defined
from ._env import INTERPRET, require_triton

require_triton()

import torch  # noqa: E402

from ..gluon.launch import gluon_attention_forward, gluon_available, why_unavailable  # noqa: E402
from ..numpy.reference import LOG2E  # noqa: E402
from .backward import _attn_bwd_dkdv, _attn_bwd_dq  # noqa: E402
from .forward import _attn_fwd  # noqa: E402


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
# GPU with the pinned Triton, fp16/bf16, d = 64 or 128, Nq = Nk; the tl kernel elsewhere),
# "gluon" (always; an error where it cannot) or "triton" (always the tl kernel).
FORWARD_ENV = "COURSE_KERNELS_FORWARD"
FORWARD_CHOICES = ("auto", "gluon", "triton")


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
    return not INTERPRET and _gluon_fits(q, k) and gluon_available()


def _forward(q, k, v, causal: bool, scale: float):
    """Run the forward: ``_attn_fwd`` (the tl kernel), or on Hopper the Gluon FA3-schedule
    forward (:mod:`course_kernels.gluon`; see :func:`_use_gluon`). q (B, Hq, Nq, d),
    k/v (B, kv_heads, Nk, d), already checked.

    Returns o (B, Hq, Nq, d) contiguous in q.dtype and lse2 (B, Hq, Nq) float32 in base 2.
    Non-contiguous inputs are made contiguous. Under the interpreter bf16 is computed in fp32
    and O rounded to bf16 (triton-lang/triton#11584).
    """
    if _use_gluon(q, k):
        o, lse = gluon_attention_forward(q, k, v, causal=causal, scale=scale)
        return o, lse * LOG2E  # natural-log lse -> base 2, as the tl backward reads it
    if INTERPRET and q.dtype == torch.bfloat16:
        o, lse2 = _forward(q.float(), k.float(), v.float(), causal, scale)
        return o.to(torch.bfloat16), lse2
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    B, Hq, Nq, d = q.shape
    kv_heads, Nk = k.shape[1], k.shape[2]
    o = torch.empty_like(q)
    lse2 = torch.empty((B, Hq, Nq), device=q.device, dtype=torch.float32)

    def grid(meta):
        return (_cdiv(Nq, meta["BLOCK_M"]), B * Hq)

    args = (
        q,
        k,
        v,
        scale,
        lse2,
        o,
        *q.stride(),
        *k.stride(),
        *v.stride(),
        *o.stride(),
        Hq,
        Hq // kv_heads,
        Nq,
        Nk,
    )
    _launch(
        _attn_fwd,
        grid,
        args,
        (q.device, q.dtype, Nq, Nk, d, causal),
        HEAD_DIM=d,
        HEAD_DIM_PADDED=head_dim_padded(d),
        CAUSAL=causal,
        DOT_PRECISION=_dot_precision(q.dtype),
    )
    return o, lse2


def _backward_one_key(do, q, k, v, o, lse2, scale):
    """The backward when there is one key (Nk = 1), in closed form (PyTorch ops, O(N d)).

    Every query row sees only key 0 (also with the causal mask): P = exp2(s * scale * log2 e -
    lse2), dP = dO . v, D = rowsum(dO * O), dS = P (dP - D), dQ = dS k scale, dK = sum dS q scale,
    dV = sum P dO. When o and lse2 are this call's own forward's, O = V exactly, so D and dP are
    the same sum of the same numbers and dS is exactly 0: dQ = dK = 0 as in exact arithmetic.
    The kernels compute dP with a tensor-core dot and D with an elementwise sum, in different
    orders, which left ~1e-5 of rounding noise in dQ and dK there (notes/kernel.md). With another
    o and lse2 (ring attention passes the global ones per block) this is the general formula.
    NaN or inf in the inputs still propagate to the gradients they reach.
    """
    B, Hq, Nq, d = q.shape
    kv_heads = k.shape[1]
    G = Hq // kv_heads
    f = torch.float32
    qf = q.to(f).reshape(B, kv_heads, G, Nq, d)
    kf = k.to(f).reshape(B, kv_heads, 1, 1, d)
    vf = v.to(f).reshape(B, kv_heads, 1, 1, d)
    dof = do.to(f).reshape(B, kv_heads, G, Nq, d)
    of = o.to(f).reshape(B, kv_heads, G, Nq, d)
    s2 = (qf * kf).sum(-1, keepdim=True) * (scale * LOG2E)  # (B, kv_heads, G, Nq, 1), base 2
    p = torch.exp2(s2 - lse2.reshape(B, kv_heads, G, Nq, 1))
    dp = (dof * vf).sum(-1, keepdim=True)
    delta = (dof * of).sum(-1, keepdim=True)  # bitwise dp when o = v: same shapes, same order
    ds = p * (dp - delta)
    dq = (ds * kf * scale).reshape(B, Hq, Nq, d)
    dk = (ds * qf).sum((2, 3)).reshape(B, kv_heads, 1, d) * scale
    dv = (p * dof).sum((2, 3)).reshape(B, kv_heads, 1, d)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


def _backward(do, q, k, v, o, lse2, causal: bool, scale: float):
    """Run the two backward kernels; returns dq, dk, dv shaped and typed like q, k, v.

    Inputs as returned by / given to :func:`_forward` (any strides; made contiguous here).
    """
    if k.shape[2] == 1:
        return _backward_one_key(do, q, k, v, o, lse2, scale)
    if INTERPRET and q.dtype == torch.bfloat16:
        grads = _backward(
            do.float(), q.float(), k.float(), v.float(), o.float(), lse2, causal, scale
        )
        return tuple(g.to(torch.bfloat16) for g in grads)
    q, k, v, o, do, lse2 = (x.contiguous() for x in (q, k, v, o, do, lse2))
    B, Hq, Nq, d = q.shape
    kv_heads, Nk = k.shape[1], k.shape[2]
    dpad = head_dim_padded(d)
    prec = _dot_precision(q.dtype)
    delta = torch.empty_like(lse2)  # (B, Hq, Nq) float32, written by the dQ kernel
    dq = torch.empty_like(q)
    dk = torch.empty_like(k)
    dv = torch.empty_like(v)
    key = (q.device, q.dtype, Nq, Nk, d, causal, Hq // kv_heads)
    # dQ first: it also computes D = rowsum(dO * O), which the dK/dV kernel reads (the
    # preprocessing pass folded in: one launch fewer).
    _launch(
        _attn_bwd_dq,
        lambda meta: (_cdiv(Nq, meta["BLOCK_M2"]), B * Hq),
        (
            q,
            k,
            v,
            do,
            o,
            lse2,
            delta,
            dq,
            scale,
            *q.stride(),
            *k.stride(),
            Hq,
            Hq // kv_heads,
            Nq,
            Nk,
        ),
        key,
        HEAD_DIM=d,
        HEAD_DIM_PADDED=dpad,
        CAUSAL=causal,
        DOT_PRECISION=prec,
    )
    _launch(
        _attn_bwd_dkdv,
        lambda meta: (_cdiv(Nk, meta["BLOCK_N1"]), B * kv_heads),
        (
            q,
            k,
            v,
            do,
            lse2,
            delta,
            dk,
            dv,
            dq,  # read only with ATOMIC_DQ (not used here: dQ has its own kernel)
            scale,
            *q.stride(),
            *k.stride(),
            kv_heads,
            Hq // kv_heads,
            Nq,
            Nk,
        ),
        key,
        HEAD_DIM=d,
        HEAD_DIM_PADDED=dpad,
        CAUSAL=causal,
        DOT_PRECISION=prec,
        ATOMIC_DQ=False,
    )
    return dq, dk, dv
