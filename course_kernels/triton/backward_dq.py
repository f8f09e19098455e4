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
from .configs import DQ_IEEE_CONFIG, DQ_SM75, DQ_SMALL_CONFIG, TUNE_KEY, dq_configs  # noqa: E402
from .forward import _load_tile  # noqa: E402
from .masks import _key_blocks, _score_mod, _seq, _step_range, _visible  # noqa: E402


@triton.jit
def _attn_bwd_dq_inner(
    dq,
    q,
    do,
    lse_c,
    delta,  # (BLOCK_M2, D) x 3, (BLOCK_M2,) x 2
    k_base,
    v_base,
    stride_kn,
    stride_kk,
    offs_m,
    lo,
    hi,
    n_k,
    qk_mul,
    c2,
    alibi_r,
    alibi_diag,
    diag_lo,
    diag_hi,
    BLOCK_N2: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PADDED: tl.constexpr,
    MASKED: tl.constexpr,
    BOUNDS: tl.constexpr,
    SOFTCAP: tl.constexpr,
    ALIBI: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """Add the key blocks [lo, hi) into dQ_i (FA2 Alg. 2 lines 10-15 for one query block).
    ``MASKED``: apply the window/causal mask. ``BOUNDS``: a block may hold keys past Nk (the
    tail block): they load as 0 and get P = 0; without it no key is past Nk (no bounds masks)."""
    offs_d = tl.arange(0, HEAD_DIM_PADDED)
    d_ok = offs_d[None, :] < HEAD_DIM  # (1, D)
    for start_n in range(lo, hi, BLOCK_N2):
        start_n = tl.multiple_of(start_n, BLOCK_N2)
        offs_n = start_n + tl.arange(0, BLOCK_N2)  # (BLOCK_N2,)
        n_ok = offs_n[:, None] < n_k  # (BLOCK_N2, 1)
        kv_ptrs = offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kk
        k = _load_tile(k_base + kv_ptrs, n_ok, d_ok, BOUNDS, HEAD_DIM != HEAD_DIM_PADDED)
        v = _load_tile(v_base + kv_ptrs, n_ok, d_ok, BOUNDS, HEAD_DIM != HEAD_DIM_PADDED)
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)  # (BLOCK_M2, BLOCK_N2)
        r, t = _score_mod(
            qk, offs_m[:, None], offs_n[None, :], qk_mul, alibi_r, alibi_diag, SOFTCAP, ALIBI
        )
        p = tl.math.exp2((r - lse_c[:, None]) * c2)  # FA2 Alg. 2 line 11, in units of c
        if BOUNDS:
            keep = offs_n[None, :] < n_k  # keys past Nk load as 0 but must get P = 0
            if MASKED:
                keep = keep & _visible(offs_m[:, None], offs_n[None, :], diag_lo, diag_hi)
            p = tl.where(keep, p, 0.0)
        elif MASKED:  # no key past Nk: only the window/causal mask
            p = tl.where(_visible(offs_m[:, None], offs_n[None, :], diag_lo, diag_hi), p, 0.0)
        dp = tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION)  # line 13: dP = dO V^T
        ds = p * (dp - delta[:, None])  # line 14: dS = P * (dP - D)
        if SOFTCAP:
            ds = ds * (1.0 - t * t)  # d(softcap tanh(x / softcap)) / dx
        dq = tl.dot(ds.to(k.dtype), k, dq, input_precision=DOT_PRECISION)  # line 15: dQ += dS K
    return dq


@triton.autotune(
    configs=dq_configs(),
    key=list(TUNE_KEY),
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
    CU_Q,
    CU_K,
    ALIBI_R,
    scale,
    stride_qz,
    stride_qh,
    stride_qm,
    stride_qk,
    stride_kz,
    stride_kh,
    stride_kn,
    stride_kk,
    stride_lz,
    stride_lh,
    stride_az,
    qk_mul,
    c2,
    win_lo,
    win_hi,
    H_Q,
    GROUP_SIZE,
    N_CTX_Q,
    N_CTX_K,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PADDED: tl.constexpr,
    WINDOWED: tl.constexpr,
    BOTTOM_RIGHT: tl.constexpr,
    SOFTCAP: tl.constexpr,
    ALIBI: tl.constexpr,
    VARLEN: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    BLOCK_N2: tl.constexpr,
    BLOCK_M2: tl.constexpr,
    PEEL: tl.constexpr = False,
    EVEN_BLOCKS: tl.constexpr = False,
):
    """dQ (and D) for one query block of one (sequence, query head).

    Grid: (cdiv(Nq or max_seqlen_q, BLOCK_M2), B * Hq). Q, dO, O, dQ share strides (stride_q*);
    K, V share strides (stride_k*); LSE and Delta share strides (stride_l*). Writes D =
    rowsum(dO * O) for the dK/dV kernel. Dense and ``VARLEN`` as in ``forward._attn_fwd``.
    ``PEEL`` (session 9; off in the package's launch: peeled, this kernel ran 1-5% slower on the
    H200, notes/kernel.md session 10): in the key loop only the
    tail block (the one that can cross Nk) carries bounds masks (``masks._step_range``). The
    program's own rows (Q, dO, O, L, once per program) stay masked: a runtime branch between
    masked and unmasked loads cost 26 registers on sm_90a. Off: every key block masked, the
    session-8 kernel (a reference for tests and benchmarks). ``EVEN_BLOCKS`` (session 8, set by
    the launch for dense lengths that are multiples of every block): the caller promises no
    tail, so the tail step is not compiled and Q, dO, O load unmasked.
    """
    start_m = tl.program_id(0) * BLOCK_M2
    off_hz = tl.program_id(1)
    off_z = off_hz // H_Q
    off_h = (off_hz % H_Q).to(tl.int64)
    q_start, n_q = _seq(CU_Q, off_z, N_CTX_Q, VARLEN)
    if start_m >= n_q:
        return
    k_start, n_k = _seq(CU_K, off_z, N_CTX_K, VARLEN)
    off_kvh = off_h // GROUP_SIZE
    off_z = off_z.to(tl.int64)
    q_off = off_z * stride_qz + off_h * stride_qh + q_start * stride_qm
    k_base = K + off_z * stride_kz + off_kvh * stride_kh + k_start * stride_kn
    v_base = V + off_z * stride_kz + off_kvh * stride_kh + k_start * stride_kn

    offs_m = start_m + tl.arange(0, BLOCK_M2)  # (BLOCK_M2,)
    offs_d = tl.arange(0, HEAD_DIM_PADDED)  # (D,)
    m_ok = offs_m[:, None] < n_q  # (BLOCK_M2, 1)
    d_ok = offs_d[None, :] < HEAD_DIM  # (1, D)
    q_ptrs = q_off + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qk
    q = _load_tile(Q + q_ptrs, m_ok, d_ok, not EVEN_BLOCKS, HEAD_DIM != HEAD_DIM_PADDED)
    do = _load_tile(DO + q_ptrs, m_ok, d_ok, not EVEN_BLOCKS, HEAD_DIM != HEAD_DIM_PADDED)
    row = off_z * stride_lz + off_h * stride_lh + q_start + offs_m  # (BLOCK_M2,)
    lse_c = tl.load(LSE + row, mask=offs_m < n_q, other=float("inf"))
    # FA2 Alg. 2 line 4, fused here: D = rowsum(dO * O) (rows past Nq load as 0), as the
    # diagonal of the dot dO O^T: the same tensor-core sum as dP = dO V^T, so a row with one
    # visible key (O_i = V_j bitwise) gets D_i = dP_ij bitwise and dS = 0 exactly (issue 22).
    o = _load_tile(Out + q_ptrs, m_ok, d_ok, not EVEN_BLOCKS, HEAD_DIM != HEAD_DIM_PADDED)
    od = tl.dot(do, tl.trans(o), input_precision=DOT_PRECISION)  # (BLOCK_M2, BLOCK_M2)
    rows = tl.arange(0, BLOCK_M2)
    delta = tl.sum(tl.where(rows[:, None] == rows[None, :], od, 0.0), axis=1)  # (BLOCK_M2,)
    tl.store(Delta + row, delta, mask=offs_m < n_q)
    dq = tl.zeros([BLOCK_M2, HEAD_DIM_PADDED], dtype=tl.float32)
    alibi_r = 0.0
    if ALIBI:
        alibi_r = tl.load(ALIBI_R + off_z * stride_az + off_h)
    diag = 0
    if BOTTOM_RIGHT:
        diag = n_k - n_q
    diag_lo, diag_hi = diag + win_lo, diag + win_hi

    lo, full_lo, full_hi, hi = _key_blocks(start_m, n_k, diag_lo, diag_hi, BLOCK_M2, BLOCK_N2)
    # Masked edge, unmasked middle, masked edge, then (PEEL) the key block that crosses Nk.
    peel: tl.constexpr = PEEL and not EVEN_BLOCKS  # (EVEN_BLOCKS: there is no tail)
    for stage in tl.static_range(4 if peel else 3):
        s_lo, s_hi = _step_range(stage, lo, full_lo, full_hi, hi, n_k, BLOCK_N2, peel)
        dq = _attn_bwd_dq_inner(
            dq,
            q,
            do,
            lse_c,
            delta,
            k_base,
            v_base,
            stride_kn,
            stride_kk,
            offs_m,
            s_lo,
            s_hi,
            n_k,
            qk_mul,
            c2,
            alibi_r,
            n_k - n_q,
            diag_lo,
            diag_hi,
            BLOCK_N2,
            HEAD_DIM,
            HEAD_DIM_PADDED,
            WINDOWED and stage != 1,
            not EVEN_BLOCKS and (stage == 3 or (not PEEL and stage != 1)),  # bounds masks
            SOFTCAP,
            ALIBI,
            DOT_PRECISION,
        )
    tl.store(DQ + q_ptrs, (dq * scale).to(DQ.dtype.element_ty), mask=m_ok & d_ok)
