"""Flash Attention backward in Triton: FlashAttention-2's Algorithm 2, split into three kernels.

Chapter: "Flash Attention in Triton: the backward kernel". Paper: FlashAttention-2 (Dao 2023,
arXiv 2307.08691), Algorithm 2; line numbers in the comments refer to it.

Layout (batch, heads, seq, head_dim); all tensors contiguous:

    Q, dO, dQ: (B, Hq, Nq, d)    K, V, dK, dV: (B, kv_heads, Nk, d)    LSE, D: (B, Hq, Nq) float32

The forward saved only O and the row statistic L (the logsumexp in units of c, see
:mod:`.masks`), so P is recomputed block by block: P = exp2((r - L) * c log2 e), with r from the
same score hook as the forward's; a row with one visible key gets P = 1 exactly.

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

Masks (causal either alignment, sliding window), soft cap and ALiBi are the forward's hooks
(:mod:`.masks`); a key block visits only the query blocks that see it. Rows past Nq load as
Q = dO = 0, D = 0 and L = +inf in the dK/dV kernel, so they add exactly nothing (the +inf
alone would suffice: P = exp2(-inf) = 0; the zeros alone too: dO = 0 and dS = P * 0).

The autotuning space (block sizes per GPU, dtype and head dim) is in
:mod:`.configs`; its names are importable from here.
"""

from __future__ import annotations

from . import _env as _triton_env  # noqa: F401  (sets TRITON_INTERPRET before any @triton.jit)

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from ._env import autotune_kwargs, prune_configs  # noqa: E402
from .configs import (  # noqa: E402  (re-exported)
    TUNE_KEY,
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
from .forward import _load_tile  # noqa: E402
from .masks import PLAIN, Variant, _query_blocks, _score_mod, _seq, _step_range, _visible  # noqa: E402

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
def _attn_bwd_dkdv_step(
    dk, dv, k, v, q_base, do_base, lse_base, delta_base, dq_base, stride_qm, stride_qk, offs_n,
    start_m, n_q, qk_mul, c2, alibi_r, alibi_diag, diag_lo, diag_hi, full_lo, full_hi,
    BLOCK_M1: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PADDED: tl.constexpr,
    MASKED: tl.constexpr, SOFTCAP: tl.constexpr, ALIBI: tl.constexpr,
    DOT_PRECISION: tl.constexpr, ATOMIC_DQ: tl.constexpr, BOUNDS: tl.constexpr,
):  # fmt: skip
    """One query block of :func:`_attn_bwd_dkdv_inner` (FA2 Alg. 2 lines 9-17)."""
    offs_d = tl.arange(0, HEAD_DIM_PADDED)
    d_ok = offs_d[None, :] < HEAD_DIM  # (1, D)
    pad_d: tl.constexpr = HEAD_DIM != HEAD_DIM_PADDED
    start_m = tl.multiple_of(start_m, BLOCK_M1)
    offs_m = start_m + tl.arange(0, BLOCK_M1)  # (BLOCK_M1,)
    m_ok = offs_m < n_q
    # FA2 Alg. 2 line 9: load Q_i, dO_i, L_i, D_i. Rows past Nq: L = +inf gives P = 0.
    row_ptrs = offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qk
    q = _load_tile(q_base + row_ptrs, m_ok[:, None], d_ok, BOUNDS, pad_d)
    if BOUNDS:
        lse_c = tl.load(lse_base + offs_m, mask=m_ok, other=float("inf"))  # (BLOCK_M1,)
    else:
        lse_c = tl.load(lse_base + offs_m)
    # FA2 Alg. 2 lines 10-11, transposed: P^T = exp2((r^T - L) * c log2 e).
    qkT = tl.dot(k, tl.trans(q), input_precision=DOT_PRECISION)  # (BLOCK_N1, BLOCK_M1)
    rT, tT = _score_mod(
        qkT, offs_m[None, :], offs_n[:, None], qk_mul, alibi_r, alibi_diag, SOFTCAP, ALIBI
    )
    pT = tl.math.exp2((rT - lse_c[None, :]) * c2)  # (BLOCK_N1, BLOCK_M1)
    if MASKED:  # noqa: SIM102 (constexpr, then run time: one loop holds both kinds of block)
        if (start_m < full_lo) | (start_m >= full_hi):
            pT = tl.where(_visible(offs_m[None, :], offs_n[:, None], diag_lo, diag_hi), pT, 0.0)
    do = _load_tile(do_base + row_ptrs, m_ok[:, None], d_ok, BOUNDS, pad_d)
    # FA2 Alg. 2 line 12: dV_j += P^T dO_i.
    dv = tl.dot(pT.to(do.dtype), do, dv, input_precision=DOT_PRECISION)  # (BLOCK_N1, D)
    if BOUNDS:
        delta = tl.load(delta_base + offs_m, mask=m_ok, other=0.0)  # (BLOCK_M1,)
    else:
        delta = tl.load(delta_base + offs_m)
    # FA2 Alg. 2 lines 13-14, transposed: dP^T = V dO^T, dS^T = P^T * (dP^T - D).
    dpT = tl.dot(v, tl.trans(do), input_precision=DOT_PRECISION)  # (BLOCK_N1, BLOCK_M1)
    dsT = pT * (dpT - delta[None, :])  # (BLOCK_N1, BLOCK_M1)
    if SOFTCAP:
        dsT = dsT * (1.0 - tT * tT)  # d(softcap tanh(x / softcap)) / dx
    # FA2 Alg. 2 line 16: dK_j += dS^T Q_i (the scale is applied once at the end).
    dk = tl.dot(dsT.to(q.dtype), q, dk, input_precision=DOT_PRECISION)  # (BLOCK_N1, D)
    if ATOMIC_DQ:  # FA2 Alg. 2 line 15 as the paper has it: dQ_i += dS K_j, in fp32 atomics
        dq = tl.dot(tl.trans(dsT.to(k.dtype)), k, input_precision=DOT_PRECISION)
        tl.atomic_add(dq_base + row_ptrs, dq, mask=m_ok[:, None] & d_ok, sem="relaxed")
    return dk, dv


@triton.jit
def _attn_bwd_dkdv_inner(
    dk, dv, k, v,  # (BLOCK_N1, D) x 4
    q_base, do_base, lse_base, delta_base, dq_base, stride_qm, stride_qk, offs_n,
    lo, hi, n_q, qk_mul, c2, alibi_r, alibi_diag, diag_lo, diag_hi, full_lo, full_hi,
    BLOCK_M1: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PADDED: tl.constexpr,
    MASKED: tl.constexpr, SOFTCAP: tl.constexpr, ALIBI: tl.constexpr,
    DOT_PRECISION: tl.constexpr, ATOMIC_DQ: tl.constexpr, BOUNDS: tl.constexpr,
    TAIL: tl.constexpr = False,
):  # fmt: skip
    """Add the query blocks [lo, hi) of one query head into dK, dV (FA2 Alg. 2 lines 8-17).

    ``MASKED``: mask the blocks outside [full_lo, full_hi) (keys past Nk are never stored, rows
    past Nq have L = +inf: neither needs a mask). ``BOUNDS``: a block may hold rows past Nq (the
    tail block): they load as Q = dO = 0, L = +inf, D = 0; without it no bounds masks. ``TAIL``:
    [lo, hi) is at most one block, run as straight-line code (no loop carrying dK, dV).
    """
    if TAIL:  # at most one block, no loop: dK, dV pass no loop boundary (C7515)
        if lo < hi:
            dk, dv = _attn_bwd_dkdv_step(
                dk, dv, k, v, q_base, do_base, lse_base, delta_base, dq_base, stride_qm, stride_qk,
                offs_n, lo, n_q, qk_mul, c2, alibi_r, alibi_diag, diag_lo, diag_hi, full_lo,
                full_hi, BLOCK_M1, HEAD_DIM, HEAD_DIM_PADDED, MASKED, SOFTCAP, ALIBI,
                DOT_PRECISION, ATOMIC_DQ, BOUNDS,
            )  # fmt: skip
    else:
        for start_m in range(lo, hi, BLOCK_M1):
            dk, dv = _attn_bwd_dkdv_step(
                dk, dv, k, v, q_base, do_base, lse_base, delta_base, dq_base, stride_qm, stride_qk,
                offs_n, start_m, n_q, qk_mul, c2, alibi_r, alibi_diag, diag_lo, diag_hi, full_lo,
                full_hi, BLOCK_M1, HEAD_DIM, HEAD_DIM_PADDED, MASKED, SOFTCAP, ALIBI,
                DOT_PRECISION, ATOMIC_DQ, BOUNDS,
            )  # fmt: skip
    return dk, dv


@triton.autotune(
    configs=dkdv_configs(),
    key=[*TUNE_KEY, "GROUP_SIZE", "ATOMIC_DQ"],
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
    KV_HEADS,
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
    ATOMIC_DQ: tl.constexpr,
    BLOCK_M1: tl.constexpr,
    BLOCK_N1: tl.constexpr,
    PEEL: tl.constexpr = False,
    EVEN_BLOCKS: tl.constexpr = False,
    ONE_LOOP: tl.constexpr = False,
):
    """dK, dV for one key block of one (sequence, K/V head).

    Grid: (cdiv(Nk or max_seqlen_k, BLOCK_N1), B * kv_heads). Q and dO share strides (stride_q*);
    K, V, dK, dV share strides (stride_k*); LSE and Delta (stride_l*). Dense and ``VARLEN`` as
    in ``forward._attn_fwd``; a program past its sequence's keys exits at once.

    ``ONE_LOOP`` (session 9, on in the package's launch): one loop over all the query blocks, the
    mask decided per block at run time, instead of three loops (masked edge, unmasked middle,
    masked edge). With three, ptxas serialises every wgmma of the kernel (warning C7515: the
    accumulators dK, dV pass between pipelined loops), one wait per tensor-core instruction.
    ``PEEL`` (session 9; on in the package's launch since session 10's measurement, notes/kernel.md): only
    the query block that can cross Nq carries bounds masks (``masks._step_range``); with
    ``ONE_LOOP`` that block runs after the loop as straight-line code. K, V and the final stores
    (once per program) stay masked. ``EVEN_BLOCKS`` (session 8): the caller promises no tail, so
    no bounds masks at all (FlexAttention's ``IS_DIVISIBLE``); the final stores keep theirs.
    """
    start_n = tl.program_id(0) * BLOCK_N1
    off_hz = tl.program_id(1)
    off_z = off_hz // KV_HEADS
    k_start, n_k = _seq(CU_K, off_z, N_CTX_K, VARLEN)
    if start_n >= n_k:
        return
    q_start, n_q = _seq(CU_Q, off_z, N_CTX_Q, VARLEN)
    off_z = off_z.to(tl.int64)
    off_kvh = (off_hz % KV_HEADS).to(tl.int64)
    kv_off = off_z * stride_kz + off_kvh * stride_kh + k_start * stride_kn

    offs_n = start_n + tl.arange(0, BLOCK_N1)  # (BLOCK_N1,)
    offs_d = tl.arange(0, HEAD_DIM_PADDED)  # (D,)
    n_ok = offs_n[:, None] < n_k  # (BLOCK_N1, 1)
    d_ok = offs_d[None, :] < HEAD_DIM  # (1, D)
    kv_ptrs = kv_off + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kk
    # FA2 Alg. 2 lines 6-7: load K_j, V_j; dK_j = dV_j = 0. Rows past Nk load as 0, never stored.
    k = _load_tile(K + kv_ptrs, n_ok, d_ok, not EVEN_BLOCKS, HEAD_DIM != HEAD_DIM_PADDED)
    v = _load_tile(V + kv_ptrs, n_ok, d_ok, not EVEN_BLOCKS, HEAD_DIM != HEAD_DIM_PADDED)
    dk = tl.zeros([BLOCK_N1, HEAD_DIM_PADDED], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N1, HEAD_DIM_PADDED], dtype=tl.float32)
    diag = 0
    if BOTTOM_RIGHT:
        diag = n_k - n_q
    diag_lo, diag_hi = diag + win_lo, diag + win_hi
    # The query rows that see these keys: masked edges, unmasked middle (masks.py).
    lo, full_lo, full_hi, hi = _query_blocks(start_n, n_q, diag_lo, diag_hi, BLOCK_N1, BLOCK_M1)
    # GQA: the GROUP_SIZE query heads that read this K/V head, summed in a fixed order.
    for g in range(0, GROUP_SIZE):
        off_h = off_kvh * GROUP_SIZE + g  # query head
        q_off = off_z * stride_qz + off_h * stride_qh + q_start * stride_qm
        l_off = off_z * stride_lz + off_h * stride_lh + q_start  # LSE and D rows
        alibi_r = 0.0
        if ALIBI:
            alibi_r = tl.load(ALIBI_R + off_z * stride_az + off_h)
        # ONE_LOOP: the query blocks [lo, hi); else masked edge, unmasked middle, masked edge. PEEL:
        # those stop at the block crossing Nq, a last step (TAIL: no loop with ONE_LOOP) takes it.
        peel: tl.constexpr = PEEL and not EVEN_BLOCKS  # (EVEN_BLOCKS: there is no tail)
        n_steps: tl.constexpr = (1 if ONE_LOOP else 3) + (1 if peel else 0)
        for stage in tl.static_range(n_steps):
            if ONE_LOOP:  # stage 1 (PEEL): the tail, _step_range's step 3
                s_lo, s_hi = _step_range(3 * stage, lo, hi, hi, hi, n_q, BLOCK_M1, peel)
            else:
                s_lo, s_hi = _step_range(stage, lo, full_lo, full_hi, hi, n_q, BLOCK_M1, peel)
            dk, dv = _attn_bwd_dkdv_inner(
                dk,
                dv,
                k,
                v,
                Q + q_off,
                DO + q_off,
                LSE + l_off,
                Delta + l_off,
                DQ + q_off,  # fp32, only with ATOMIC_DQ
                stride_qm,
                stride_qk,
                offs_n,
                s_lo,
                s_hi,
                n_q,
                qk_mul,
                c2,
                alibi_r,
                n_k - n_q,
                diag_lo,
                diag_hi,
                full_lo,
                full_hi,
                BLOCK_M1,
                HEAD_DIM,
                HEAD_DIM_PADDED,
                WINDOWED & (ONE_LOOP | (stage != 1)),
                SOFTCAP,
                ALIBI,
                DOT_PRECISION,
                ATOMIC_DQ,
                not EVEN_BLOCKS and (stage == n_steps - 1 or not peel),  # bounds: the tail, or all
                ONE_LOOP and peel and stage == 1,  # the tail: straight-line code (C7515)
            )

    # FA2 Alg. 2 line 18: write dK_j, dV_j. S = scale * Q K^T, so dK carries the scale.
    mask = n_ok & d_ok  # (always masked: once per program, outside the loop)
    tl.store(DK + kv_ptrs, (dk * scale).to(DK.dtype.element_ty), mask=mask)
    tl.store(DV + kv_ptrs, dv.to(DV.dtype.element_ty), mask=mask)


# ---- the backward when there is one key (Nk = 1): a closed form in PyTorch ops ----------------


def _one_key_closed_form(k, variant: Variant, alibi, varlen) -> bool:
    """Nk = 1 and every row sees key 0 with the plain score: the closed form applies."""
    if varlen is not None or k.shape[2] != 1:  # the usual case, decided first
        return False
    plain = variant.softcap == 0 and alibi is None and variant.window == (-1, -1)
    return plain and not variant.bottom_right


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
