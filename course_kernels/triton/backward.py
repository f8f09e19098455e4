"""Flash Attention backward in Triton: FlashAttention-2's Algorithm 2, split into three kernels.

Chapter: "Flash Attention in Triton: the backward kernel". Paper: FlashAttention-2 (Dao 2023,
arXiv 2307.08691), Algorithm 2; line numbers in the comments refer to it.

Layout (batch, heads, seq, head_dim); all tensors contiguous:

    Q, dO, dQ: (B, Hq, Nq, d)    K, V, dK, dV: (B, kv_heads, Nk, d)    LSE, D: (B, Hq, Nq) float32

The forward saved only O and the base-2 logsumexp ``lse2`` (see ``triton_forward``), so P is
recomputed block by block: P = exp2(S * scale * log2(e) - lse2), exactly the forward's P.

1. ``_attn_bwd_dq`` (launched first, in :mod:`.triton_backward_dq`): one program per query
   block; it computes D = rowsum(dO * O) for its rows (FA2 Alg. 2 line 4, stored for step 2),
   then loops over key blocks (FA2 Alg. 2 line 15 turned inside out). The paper adds dQ with
   atomics; a separate pass costs one more recomputation of S and dP but is bit-identical on
   repeat.
2. ``_attn_bwd_dkdv`` (here): one program per key block of one (batch, K/V head); it loops over
   every query block of every query head in the GQA group, accumulating dK, dV on chip
   (FA2 Alg. 2 lines 5-19 without line 15), reading the D that step 1 stored. Summing the group
   inside one program, in a fixed order, makes GQA gradients deterministic without atomics.

The paper's own variant is a switch, ``ATOMIC_DQ``, off in the package's launch: the dK/dV
kernel also adds dS K into an fp32 dQ with ``tl.atomic_add`` (line 15 as written), after
``_attn_bwd_preprocess`` has computed D alone (FA2's preprocessing pass). It does 5 matmuls per
block pair instead of 7 but sums dQ in whatever order programs finish; measured on the H200 it
was slower at d = 64 and at most 9% faster at d = 128 (``experiments/hopper/schedule_levers.py atomic``,
notes/kernel.md), so the deterministic two-kernel backward stays.

Causal is top-left aligned (query i sees keys j <= i), as in the forward. Rows past Nq load
as Q = dO = 0, D = 0 and lse2 = +inf in the dK/dV kernel, so they add exactly nothing (the +inf
alone would suffice: P = exp2(-inf) = 0; the zeros alone too: dO = 0 and dS = P * 0).

The autotuning space (block sizes per GPU, dtype and head dim) is in
:mod:`.triton_backward_configs`; its names are importable from here.
"""

from __future__ import annotations

from . import _env as _triton_env  # noqa: F401  (sets TRITON_INTERPRET before any @triton.jit)

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from ._env import autotune_kwargs, prune_configs  # noqa: E402
from .backward_configs import (  # noqa: E402  (re-exported)
    DKDV_D128_CONFIGS,
    DKDV_IEEE_CONFIG,
    DKDV_SM75,
    DKDV_SMALL_CONFIG,
    DQ_D128_CONFIGS,
    DQ_IEEE_CONFIG,
    DQ_SM75,
    DQ_SMALL_CONFIG,
    dkdv_configs,
    dq_configs,
)
from .backward_dq import _attn_bwd_dq, _attn_bwd_dq_inner  # noqa: E402,F401  (re-exported)
from .forward import LOG2E, _load_tile  # noqa: E402

__all__ = [
    "DKDV_D128_CONFIGS",
    "DKDV_IEEE_CONFIG",
    "DKDV_SM75",
    "DKDV_SMALL_CONFIG",
    "DQ_D128_CONFIGS",
    "DQ_IEEE_CONFIG",
    "DQ_SM75",
    "DQ_SMALL_CONFIG",
    "dkdv_configs",
    "dq_configs",
]


@triton.jit
def _attn_bwd_preprocess(
    Out,
    DO,
    Delta,
    N_ROWS,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PADDED: tl.constexpr,
    BLOCK_M: tl.constexpr,
):
    """D = rowsum(dO * O) over the flattened rows of contiguous (B, Hq, Nq, d) tensors."""
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)  # (BLOCK_M,)
    offs_d = tl.arange(0, HEAD_DIM_PADDED)  # (D,)
    mask = (offs_m[:, None] < N_ROWS) & (offs_d[None, :] < HEAD_DIM)
    ptrs = offs_m[:, None].to(tl.int64) * HEAD_DIM + offs_d[None, :]
    o = tl.load(Out + ptrs, mask=mask, other=0.0).to(tl.float32)  # (BLOCK_M, D)
    do = tl.load(DO + ptrs, mask=mask, other=0.0).to(tl.float32)  # (BLOCK_M, D)
    delta = tl.sum(o * do, axis=1)  # (BLOCK_M,)  FA2 Alg. 2 line 4
    tl.store(Delta + offs_m, delta, mask=offs_m < N_ROWS)


@triton.jit
def _attn_bwd_dkdv_inner(
    dk,
    dv,
    k,
    v,  # (BLOCK_N1, D) x 4
    q_base,
    do_base,
    lse_base,
    delta_base,
    dq_base,
    stride_qm,
    stride_qk,
    offs_n,
    lo,
    hi,
    qk_scale,
    N_CTX_Q,
    BLOCK_M1: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PADDED: tl.constexpr,
    MASKED: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    ATOMIC_DQ: tl.constexpr,
):
    """Add the query blocks [lo, hi) of one query head into dK, dV (FA2 Alg. 2 lines 8-17)."""
    offs_d = tl.arange(0, HEAD_DIM_PADDED)
    d_ok = offs_d[None, :] < HEAD_DIM  # (1, D)
    for start_m in range(lo, hi, BLOCK_M1):
        start_m = tl.multiple_of(start_m, BLOCK_M1)
        offs_m = start_m + tl.arange(0, BLOCK_M1)  # (BLOCK_M1,)
        m_ok = offs_m < N_CTX_Q
        # FA2 Alg. 2 line 9: load Q_i, dO_i, L_i, D_i. Rows past Nq: lse = +inf gives P = 0.
        row_ptrs = offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qk
        q = _load_tile(q_base + row_ptrs, m_ok[:, None], d_ok, True, HEAD_DIM != HEAD_DIM_PADDED)
        lse2 = tl.load(lse_base + offs_m, mask=m_ok, other=float("inf"))  # (BLOCK_M1,)
        # FA2 Alg. 2 lines 10-11, transposed: P^T = exp2(K Q^T * scale log2e - L).
        qkT = tl.dot(k, tl.trans(q), input_precision=DOT_PRECISION)  # (BLOCK_N1, BLOCK_M1)
        pT = tl.math.exp2(qkT * qk_scale - lse2[None, :])  # (BLOCK_N1, BLOCK_M1)
        if MASKED:
            pT = tl.where(offs_n[:, None] <= offs_m[None, :], pT, 0.0)  # causal: key j <= query i
        do = _load_tile(do_base + row_ptrs, m_ok[:, None], d_ok, True, HEAD_DIM != HEAD_DIM_PADDED)
        # FA2 Alg. 2 line 12: dV_j += P^T dO_i.
        dv = tl.dot(pT.to(do.dtype), do, dv, input_precision=DOT_PRECISION)  # (BLOCK_N1, D)
        delta = tl.load(delta_base + offs_m, mask=m_ok, other=0.0)  # (BLOCK_M1,)
        # FA2 Alg. 2 lines 13-14, transposed: dP^T = V dO^T, dS^T = P^T * (dP^T - D).
        dpT = tl.dot(v, tl.trans(do), input_precision=DOT_PRECISION)  # (BLOCK_N1, BLOCK_M1)
        dsT = pT * (dpT - delta[None, :])  # (BLOCK_N1, BLOCK_M1)
        # FA2 Alg. 2 line 16: dK_j += dS^T Q_i (the scale is applied once at the end).
        dk = tl.dot(dsT.to(q.dtype), q, dk, input_precision=DOT_PRECISION)  # (BLOCK_N1, D)
        if ATOMIC_DQ:  # FA2 Alg. 2 line 15 as the paper has it: dQ_i += dS K_j, in fp32 atomics
            dq = tl.dot(tl.trans(dsT.to(k.dtype)), k, input_precision=DOT_PRECISION)
            tl.atomic_add(dq_base + row_ptrs, dq, mask=m_ok[:, None] & d_ok, sem="relaxed")
    return dk, dv


@triton.autotune(
    configs=dkdv_configs(),
    key=["N_CTX_Q", "N_CTX_K", "HEAD_DIM", "CAUSAL", "GROUP_SIZE", "DOT_PRECISION", "ATOMIC_DQ"],
    prune_configs_by={
        "early_config_prune": prune_configs(DKDV_IEEE_CONFIG, DKDV_SMALL_CONFIG, DKDV_SM75)
    },
    **autotune_kwargs(),
)
@triton.jit
def _attn_bwd_dkdv(
    Q,
    K,
    V,
    DO,
    LSE,
    Delta,
    DK,
    DV,
    DQ,
    scale,
    stride_qz,
    stride_qh,
    stride_qm,
    stride_qk,
    stride_kz,
    stride_kh,
    stride_kn,
    stride_kk,
    KV_HEADS,
    GROUP_SIZE,
    N_CTX_Q,
    N_CTX_K,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PADDED: tl.constexpr,
    CAUSAL: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    ATOMIC_DQ: tl.constexpr,
    BLOCK_M1: tl.constexpr,
    BLOCK_N1: tl.constexpr,
):
    """dK, dV for one key block of one (batch, K/V head). Grid: (cdiv(Nk, BLOCK_N1), B * kv_heads).

    Q and dO share strides (stride_q*); K, V, dK, dV share strides (stride_k*).
    """
    start_n = tl.program_id(0) * BLOCK_N1
    off_hz = tl.program_id(1)
    off_z = (off_hz // KV_HEADS).to(tl.int64)
    off_kvh = (off_hz % KV_HEADS).to(tl.int64)
    kv_off = off_z * stride_kz + off_kvh * stride_kh

    offs_n = start_n + tl.arange(0, BLOCK_N1)  # (BLOCK_N1,)
    offs_d = tl.arange(0, HEAD_DIM_PADDED)  # (D,)
    n_ok = offs_n[:, None] < N_CTX_K  # (BLOCK_N1, 1)
    d_ok = offs_d[None, :] < HEAD_DIM  # (1, D)
    kv_ptrs = kv_off + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kk
    # FA2 Alg. 2 lines 6-7: load K_j, V_j; dK_j = dV_j = 0. Rows past Nk load as 0, never stored.
    k = _load_tile(K + kv_ptrs, n_ok, d_ok, True, HEAD_DIM != HEAD_DIM_PADDED)  # (BLOCK_N1, D)
    v = _load_tile(V + kv_ptrs, n_ok, d_ok, True, HEAD_DIM != HEAD_DIM_PADDED)  # (BLOCK_N1, D)
    dk = tl.zeros([BLOCK_N1, HEAD_DIM_PADDED], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N1, HEAD_DIM_PADDED], dtype=tl.float32)
    qk_scale = scale * LOG2E

    if CAUSAL:
        # Queries i < start_n see none of these keys. Blocks that straddle the diagonal are
        # masked; the ones below it are not.
        lo = (start_n // BLOCK_M1) * BLOCK_M1
        mid = tl.minimum(((start_n + BLOCK_N1 + BLOCK_M1 - 1) // BLOCK_M1) * BLOCK_M1, N_CTX_Q)
    else:
        lo = 0
        mid = 0
    # GQA: the GROUP_SIZE query heads that read this K/V head, summed in a fixed order.
    for g in range(0, GROUP_SIZE):
        off_h = off_kvh * GROUP_SIZE + g  # query head
        off_bh = off_z * (KV_HEADS * GROUP_SIZE) + off_h  # row of the (B * Hq, Nq) LSE and D
        q_base = Q + off_z * stride_qz + off_h * stride_qh
        do_base = DO + off_z * stride_qz + off_h * stride_qh
        lse_base = LSE + off_bh * N_CTX_Q
        delta_base = Delta + off_bh * N_CTX_Q
        dq_base = DQ + off_z * stride_qz + off_h * stride_qh  # fp32, only with ATOMIC_DQ
        dk, dv = _attn_bwd_dkdv_inner(
            dk,
            dv,
            k,
            v,
            q_base,
            do_base,
            lse_base,
            delta_base,
            dq_base,
            stride_qm,
            stride_qk,
            offs_n,
            lo,
            mid,
            qk_scale,
            N_CTX_Q,
            BLOCK_M1,
            HEAD_DIM,
            HEAD_DIM_PADDED,
            True,
            DOT_PRECISION,
            ATOMIC_DQ,
        )
        dk, dv = _attn_bwd_dkdv_inner(
            dk,
            dv,
            k,
            v,
            q_base,
            do_base,
            lse_base,
            delta_base,
            dq_base,
            stride_qm,
            stride_qk,
            offs_n,
            mid,
            N_CTX_Q,
            qk_scale,
            N_CTX_Q,
            BLOCK_M1,
            HEAD_DIM,
            HEAD_DIM_PADDED,
            False,
            DOT_PRECISION,
            ATOMIC_DQ,
        )

    # FA2 Alg. 2 line 18: write dK_j, dV_j. S = scale * Q K^T, so dK carries the scale.
    mask = n_ok & d_ok
    tl.store(DK + kv_ptrs, (dk * scale).to(DK.dtype.element_ty), mask=mask)
    tl.store(DV + kv_ptrs, dv.to(DV.dtype.element_ty), mask=mask)
