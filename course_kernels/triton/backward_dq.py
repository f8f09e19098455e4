"""The dQ pass of the Triton backward (FA2 Algorithm 2, line 15 turned inside out), and D.

Chapter: "Flash Attention in Triton: the backward kernel"; the whole backward is described in
:mod:`.triton_backward`, which re-exports these names. ``_attn_bwd_dq`` runs first: one program
per query block of one (batch, query head) computes D = rowsum(dO * O) for its rows (FA2 Alg. 2
line 4, stored for the dK/dV kernel) and then loops over the key blocks, recomputing P and dP,
to sum dQ_i = scale * sum_j dS_ij K_j in a fixed order (no atomics: bit-identical on repeat).
"""

from __future__ import annotations

from . import _env as _triton_env  # noqa: F401  (sets TRITON_INTERPRET before any @triton.jit)

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from ._env import autotune_kwargs, prune_configs  # noqa: E402
from .backward_configs import DQ_IEEE_CONFIG, DQ_SM75, DQ_SMALL_CONFIG, dq_configs  # noqa: E402
from .forward import LOG2E, _load_tile  # noqa: E402


@triton.jit
def _attn_bwd_dq_inner(
    dq,
    q,
    do,
    lse2,
    delta,  # (BLOCK_M2, D) x 3, (BLOCK_M2,) x 2
    k_base,
    v_base,
    stride_kn,
    stride_kk,
    offs_m,
    lo,
    hi,
    qk_scale,
    N_CTX_K,
    BLOCK_N2: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PADDED: tl.constexpr,
    MASKED: tl.constexpr,
    CAUSAL: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """Add the key blocks [lo, hi) into dQ_i (FA2 Alg. 2 lines 10-15 for one query block)."""
    offs_d = tl.arange(0, HEAD_DIM_PADDED)
    d_ok = offs_d[None, :] < HEAD_DIM  # (1, D)
    for start_n in range(lo, hi, BLOCK_N2):
        start_n = tl.multiple_of(start_n, BLOCK_N2)
        offs_n = start_n + tl.arange(0, BLOCK_N2)  # (BLOCK_N2,)
        n_ok = offs_n[:, None] < N_CTX_K  # (BLOCK_N2, 1)
        kv_ptrs = offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kk
        k = _load_tile(k_base + kv_ptrs, n_ok, d_ok, MASKED, HEAD_DIM != HEAD_DIM_PADDED)
        v = _load_tile(v_base + kv_ptrs, n_ok, d_ok, MASKED, HEAD_DIM != HEAD_DIM_PADDED)
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)  # (BLOCK_M2, BLOCK_N2)
        p = tl.math.exp2(qk * qk_scale - lse2[:, None])  # FA2 Alg. 2 line 11
        if MASKED:
            keep = offs_n[None, :] < N_CTX_K  # keys past Nk load as 0 but must get P = 0
            if CAUSAL:
                keep = keep & (offs_n[None, :] <= offs_m[:, None])
            p = tl.where(keep, p, 0.0)
        dp = tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION)  # line 13: dP = dO V^T
        ds = p * (dp - delta[:, None])  # line 14: dS = P * (dP - D)
        dq = tl.dot(ds.to(k.dtype), k, dq, input_precision=DOT_PRECISION)  # line 15: dQ += dS K
    return dq


@triton.autotune(
    configs=dq_configs(),
    key=["N_CTX_Q", "N_CTX_K", "HEAD_DIM", "CAUSAL", "DOT_PRECISION"],
    prune_configs_by={
        "early_config_prune": prune_configs(DQ_IEEE_CONFIG, DQ_SMALL_CONFIG, DQ_SM75)
    },
    **autotune_kwargs(),
)
@triton.jit
def _attn_bwd_dq(
    Q,
    K,
    V,
    DO,
    Out,
    LSE,
    Delta,
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
    H_Q,
    GROUP_SIZE,
    N_CTX_Q,
    N_CTX_K,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PADDED: tl.constexpr,
    CAUSAL: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    BLOCK_N2: tl.constexpr,
    BLOCK_M2: tl.constexpr,
):
    """dQ (and D) for one query block of one (batch, query head).

    Grid: (cdiv(Nq, BLOCK_M2), B * Hq). Q, dO, O, dQ share strides (stride_q*); K, V share
    strides (stride_k*). Writes D = rowsum(dO * O) (B, Hq, Nq) for the dK/dV kernel.
    """
    start_m = tl.program_id(0) * BLOCK_M2
    off_hz = tl.program_id(1)
    off_z = (off_hz // H_Q).to(tl.int64)
    off_h = (off_hz % H_Q).to(tl.int64)
    off_kvh = off_h // GROUP_SIZE
    q_off = off_z * stride_qz + off_h * stride_qh
    k_base = K + off_z * stride_kz + off_kvh * stride_kh
    v_base = V + off_z * stride_kz + off_kvh * stride_kh

    offs_m = start_m + tl.arange(0, BLOCK_M2)  # (BLOCK_M2,)
    offs_d = tl.arange(0, HEAD_DIM_PADDED)  # (D,)
    m_ok = offs_m[:, None] < N_CTX_Q  # (BLOCK_M2, 1)
    d_ok = offs_d[None, :] < HEAD_DIM  # (1, D)
    q_ptrs = q_off + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qk
    q = _load_tile(Q + q_ptrs, m_ok, d_ok, True, HEAD_DIM != HEAD_DIM_PADDED)  # (BLOCK_M2, D)
    do = _load_tile(DO + q_ptrs, m_ok, d_ok, True, HEAD_DIM != HEAD_DIM_PADDED)  # (BLOCK_M2, D)
    row = off_hz.to(tl.int64) * N_CTX_Q + offs_m  # (BLOCK_M2,)
    lse2 = tl.load(LSE + row, mask=offs_m < N_CTX_Q, other=0.0)
    # FA2 Alg. 2 line 4, fused here: D = rowsum(dO * O) (rows past Nq load as 0).
    o = _load_tile(Out + q_ptrs, m_ok, d_ok, True, HEAD_DIM != HEAD_DIM_PADDED)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1)  # (BLOCK_M2,)
    tl.store(Delta + row, delta, mask=offs_m < N_CTX_Q)
    dq = tl.zeros([BLOCK_M2, HEAD_DIM_PADDED], dtype=tl.float32)
    qk_scale = scale * LOG2E

    if CAUSAL:
        hi = tl.minimum(start_m + BLOCK_M2, N_CTX_K)
        hi_full = (tl.minimum(start_m, N_CTX_K) // BLOCK_N2) * BLOCK_N2
    else:
        hi = N_CTX_K
        hi_full = (N_CTX_K // BLOCK_N2) * BLOCK_N2
    dq = _attn_bwd_dq_inner(
        dq,
        q,
        do,
        lse2,
        delta,
        k_base,
        v_base,
        stride_kn,
        stride_kk,
        offs_m,
        0,
        hi_full,
        qk_scale,
        N_CTX_K,
        BLOCK_N2,
        HEAD_DIM,
        HEAD_DIM_PADDED,
        False,
        CAUSAL,
        DOT_PRECISION,
    )
    dq = _attn_bwd_dq_inner(
        dq,
        q,
        do,
        lse2,
        delta,
        k_base,
        v_base,
        stride_kn,
        stride_kk,
        offs_m,
        hi_full,
        hi,
        qk_scale,
        N_CTX_K,
        BLOCK_N2,
        HEAD_DIM,
        HEAD_DIM_PADDED,
        True,
        CAUSAL,
        DOT_PRECISION,
    )
    tl.store(DQ + q_ptrs, (dq * scale).to(DQ.dtype.element_ty), mask=m_ok & d_ok)
