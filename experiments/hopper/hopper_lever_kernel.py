"""The experimental forward behind the Hopper chapter's lever table (experiments/hopper/hopper_levers.py
``levers`` and ``check``; re-exported there).

Not the package's kernel: the package's forward loop with switches for tensor-descriptor (TMA)
loads of K and V, Triton's automatic warp specialization of the key loop, and the tutorial's
FMA form of the softmax rescaling, so that each lever is measured against the same kernel with
the switch off, in the same process.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from course_kernels.triton import _env as _triton_env  # noqa: E402,F401  (TRITON_INTERPRET before @jit)

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from course_kernels.triton.forward import LOG2E  # noqa: E402

try:
    from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: E402
except ImportError:  # older Triton
    TensorDescriptor = None


# --------------------------------------------------------------------------------------------
# The experimental forward: the package's loop with lever switches (N a multiple of BLOCK_M,
# head dim a power of two, Hq = kv_heads: enough for the benchmark shapes).


@triton.jit
def _lever_step(
    acc,
    l_i,
    m_i,
    q,
    desc_k,
    desc_v,
    K,
    V,
    row0,
    offs_m,
    start_n,
    qk_scale,
    BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    MASKED: tl.constexpr,
    USE_TMA: tl.constexpr,
    FMA: tl.constexpr,
):
    """One key block through the online softmax (the package's loop body, with switches)."""
    offs_d = tl.arange(0, HEAD_DIM)
    offs_n = start_n + tl.arange(0, BLOCK_N)
    if USE_TMA:
        k = desc_k.load([(row0 + start_n).to(tl.int32), 0])  # (BLOCK_N, D) by the TMA engine
    else:
        k = tl.load(K + (row0 + offs_n)[:, None] * HEAD_DIM + offs_d[None, :])
    qk = tl.dot(q, tl.trans(k))
    if MASKED:
        qk = qk * qk_scale
        qk = tl.where(offs_n[None, :] <= offs_m[:, None], qk, float("-inf"))
        m_ij = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.math.exp2(qk - m_ij[:, None])
    elif FMA:  # scale folded into the subtraction: one fused multiply-add per score
        m_ij = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        p = tl.math.exp2(qk * qk_scale - m_ij[:, None])
    else:  # the package's form: scale, then subtract
        qk = qk * qk_scale
        m_ij = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.math.exp2(qk - m_ij[:, None])
    alpha = tl.math.exp2(m_i - m_ij)
    l_i = l_i * alpha + tl.sum(p, 1)
    if USE_TMA:
        v = desc_v.load([(row0 + start_n).to(tl.int32), 0])
    else:
        v = tl.load(V + (row0 + offs_n)[:, None] * HEAD_DIM + offs_d[None, :])
    acc = acc * alpha[:, None]
    acc = tl.dot(p.to(v.dtype), v, acc)
    return acc, l_i, m_ij


@triton.jit
def _lever_inner(
    acc,
    l_i,
    m_i,
    q,
    desc_k,
    desc_v,
    K,
    V,
    row0,
    offs_m,
    lo,
    hi,
    qk_scale,
    BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    MASKED: tl.constexpr,
    USE_TMA: tl.constexpr,
    WS: tl.constexpr,
    FMA: tl.constexpr,
):
    if WS:  # Triton's automatic warp specialization of the loop (producer / consumer warps)
        for start_n in tl.range(lo, hi, BLOCK_N, warp_specialize=True):
            start_n = tl.multiple_of(start_n, BLOCK_N)
            acc, l_i, m_i = _lever_step(
                acc,
                l_i,
                m_i,
                q,
                desc_k,
                desc_v,
                K,
                V,
                row0,
                offs_m,
                start_n,
                qk_scale,
                BLOCK_N,
                HEAD_DIM,
                MASKED,
                USE_TMA,
                FMA,
            )
    else:
        for start_n in range(lo, hi, BLOCK_N):
            start_n = tl.multiple_of(start_n, BLOCK_N)
            acc, l_i, m_i = _lever_step(
                acc,
                l_i,
                m_i,
                q,
                desc_k,
                desc_v,
                K,
                V,
                row0,
                offs_m,
                start_n,
                qk_scale,
                BLOCK_N,
                HEAD_DIM,
                MASKED,
                USE_TMA,
                FMA,
            )
    return acc, l_i, m_i


@triton.jit
def _lever_fwd(
    Q,
    K,
    V,
    Out,
    desc_k,
    desc_v,
    scale,
    N_CTX,
    HEAD_DIM: tl.constexpr,
    CAUSAL: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    USE_TMA: tl.constexpr,
    WS: tl.constexpr,
    FMA: tl.constexpr,
):
    start_m = tl.program_id(0) * BLOCK_M
    row0 = tl.program_id(1).to(tl.int64) * N_CTX  # first row of this (batch, head)
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + (row0 + offs_m)[:, None] * HEAD_DIM + offs_d[None, :])
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    qk_scale = scale * LOG2E
    if CAUSAL:
        acc, l_i, m_i = _lever_inner(
            acc,
            l_i,
            m_i,
            q,
            desc_k,
            desc_v,
            K,
            V,
            row0,
            offs_m,
            0,
            start_m,
            qk_scale,
            BLOCK_N,
            HEAD_DIM,
            False,
            USE_TMA,
            WS,
            FMA,
        )
        acc, l_i, m_i = _lever_inner(
            acc,
            l_i,
            m_i,
            q,
            desc_k,
            desc_v,
            K,
            V,
            row0,
            offs_m,
            start_m,
            start_m + BLOCK_M,
            qk_scale,
            BLOCK_N,
            HEAD_DIM,
            True,
            USE_TMA,
            False,
            FMA,
        )
    else:
        acc, l_i, m_i = _lever_inner(
            acc,
            l_i,
            m_i,
            q,
            desc_k,
            desc_v,
            K,
            V,
            row0,
            offs_m,
            0,
            N_CTX,
            qk_scale,
            BLOCK_N,
            HEAD_DIM,
            False,
            USE_TMA,
            WS,
            FMA,
        )
    acc = acc / l_i[:, None]
    tl.store(
        Out + (row0 + offs_m)[:, None] * HEAD_DIM + offs_d[None, :], acc.to(Out.dtype.element_ty)
    )


def lever_attention(
    q,
    k,
    v,
    causal,
    block_q,
    block_k,
    num_warps,
    num_stages,
    tma=False,
    ws=False,
    fma=False,
    scale=None,
):
    """Run the experimental forward; q, k, v (B, H, N, d) contiguous, N % block_q == 0."""
    B, H, N, d = q.shape
    assert N % block_q == 0 and block_q % block_k == 0 and q.is_contiguous()
    o = torch.empty_like(q)
    scale = d**-0.5 if scale is None else scale
    if tma:
        flat_k, flat_v = k.view(B * H * N, d), v.view(B * H * N, d)
        desc_k = TensorDescriptor(flat_k, list(flat_k.shape), list(flat_k.stride()), [block_k, d])
        desc_v = TensorDescriptor(flat_v, list(flat_v.shape), list(flat_v.stride()), [block_k, d])
    else:
        desc_k = desc_v = k  # unused (a pointer placeholder)
    kernel = _lever_fwd[(N // block_q, B * H)](
        q,
        k,
        v,
        o,
        desc_k,
        desc_v,
        scale,
        N,
        HEAD_DIM=d,
        CAUSAL=causal,
        BLOCK_M=block_q,
        BLOCK_N=block_k,
        USE_TMA=tma,
        WS=ws,
        FMA=fma,
        num_warps=num_warps,
        num_stages=num_stages,
    )
    return o, kernel


VARIANTS = {  # name -> (tma, ws, fma)
    "pointer": (False, False, False),
    "pointer+fma": (False, False, True),
    "tma": (True, False, False),
    "tma+fma": (True, False, True),
    "tma+fma+ws": (True, True, True),
}
LEVER_CONFIGS = ((64, 64, 4, 3), (128, 128, 8, 3))
