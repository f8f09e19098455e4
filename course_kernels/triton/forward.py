"""Flash Attention forward in Triton: FlashAttention-2's Algorithm 1, one program per query block.

Chapter: "Flash Attention in Triton: the forward kernel". Paper: FlashAttention-2 (Dao 2023,
arXiv 2307.08691), Algorithm 1; line numbers in the comments refer to it.

Layout: every tensor is (batch, heads, seq, head_dim), like PyTorch's SDPA.

    Q: (B, Hq, Nq, d)    K, V: (B, kv_heads, Nk, d)    Hq = GROUP_SIZE * kv_heads (GQA / MQA)
    O: (B, Hq, Nq, d)    LSE: (B, Hq, Nq) float32, the logsumexp in base 2 (see below)

Program (pid_m, pid_bh) owns the query rows [pid_m * BLOCK_M, (pid_m + 1) * BLOCK_M) of one
(batch, query head) and streams K, V of the matching key/value head ``h // GROUP_SIZE`` through
on-chip memory, keeping the running max ``m_i``, the running sum ``l_i`` and the unnormalized
output ``acc`` (FA2 Alg. 1 lines 6-11).

The exp2 domain: exp(x) = exp2(x * log2(e)), so the kernel folds ``log2(e)`` into the scale once
(``qk_scale = scale * log2(e)``) and uses the faster ``exp2``. ``m_i`` and the saved LSE are
therefore in base 2: ``lse2 = lse * log2(e)``; ``flash.py`` converts to natural log for users.

Causal (PyTorch ``is_causal``, top-left aligned; query i sees keys j <= i, also when Nq != Nk).
For Nq = 4, Nk = 6::

    key j:  0 1 2 3 4 5
    q 0     1 0 0 0 0 0
    q 1     1 1 0 0 0 0
    q 2     1 1 1 0 0 0
    q 3     1 1 1 1 0 0

The loop over key blocks is split in two stages so that most blocks pay for no mask:
stage 1 covers whole key blocks left of the diagonal (and, without causal, every whole block);
stage 2 covers the blocks that touch the diagonal or the ragged end of the sequence, with the
causal and bounds masks. Head dims that are not powers of two (40, 80, 96) are padded to
``HEAD_DIM_PADDED`` with masked loads: the zero columns add nothing to any dot product.
"""

from __future__ import annotations

from . import _env as _triton_env  # noqa: F401  (sets TRITON_INTERPRET before any @triton.jit)

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from ._env import autotune_kwargs, pick_configs, prune_configs  # noqa: E402
from ..numpy.reference import LOG2E as _LOG2E  # noqa: E402

# A kernel reads a module global only as a constexpr: log2(e), for qk_scale = scale * LOG2E.
LOG2E = tl.constexpr(_LOG2E)


# fp32 inputs (IEEE products on FMA units): small tiles, see _triton_env.pick_configs.
FWD_IEEE_CONFIG = triton.Config({"BLOCK_M": 32, "BLOCK_N": 32}, num_warps=4, num_stages=1)
# Head dim 256, and a T4's 64 KB of shared memory.
FWD_SMALL_CONFIG = triton.Config({"BLOCK_M": 64, "BLOCK_N": 32}, num_warps=4, num_stages=2)


# A T4 (sm_75): the largest tiles that fit 64 KiB, measured for sm_75 (notes/t4_sm75.md).
FWD_SM75 = {
    (128, False): FWD_SMALL_CONFIG,  # 49,152 bytes at d = 128
    (256, False): triton.Config({"BLOCK_M": 32, "BLOCK_N": 16}, num_warps=4, num_stages=1),
    (128, True): FWD_IEEE_CONFIG,
    (256, True): triton.Config({"BLOCK_M": 16, "BLOCK_N": 16}, num_warps=4, num_stages=1),
}


# The GPU autotuning space for fp16/bf16 as data: (BLOCK_M, BLOCK_N, num_warps, num_stages).
# The last is the best forward config of the H200 sweep (course_kernels/data/bench/sweep.json).
FWD_GPU_TILES = ((128, 64, 4, 3), (128, 128, 8, 3), (128, 64, 8, 4), (64, 64, 4, 3))
# Under the interpreter, one config: BLOCK_M = 2 * BLOCK_N crosses several diagonal blocks.
FWD_CPU_CONFIG = triton.Config({"BLOCK_M": 32, "BLOCK_N": 16}, num_warps=4, num_stages=1)


def fwd_configs() -> list[triton.Config]:
    """The autotuning space: a few configs known to do well on Hopper/Ampere, and a small one.

    Under the interpreter one config (several would each run): BLOCK_M = 2 * BLOCK_N, so that
    small CPU tests cross several diagonal blocks.
    """
    return pick_configs(fwd_gpu_configs(), FWD_CPU_CONFIG, FWD_IEEE_CONFIG)


def fwd_gpu_configs() -> list[triton.Config]:
    """The GPU's fp16/bf16 autotuning list (:data:`FWD_GPU_TILES` and the small config), the same
    whether or not this process has a GPU: what the chapters tabulate."""
    return [
        triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s)
        for bm, bn, w, s in FWD_GPU_TILES
    ] + [FWD_SMALL_CONFIG]


def smem_estimate(
    block_q: int, block_k: int, num_stages: int, head_dim: int, dtype_bytes: int = 2
) -> int:
    """Shared memory of one forward program, estimated in bytes: the Q tile (block_q x d) once,
    a K and a V tile (block_k x d each) per pipeline stage. Triton's compiled kernel reports
    the exact figure (``metadata.shared``); this is the arithmetic that says what can fit."""
    return dtype_bytes * (block_q * head_dim + num_stages * 2 * block_k * head_dim)


def accumulator_registers(block_q: int, head_dim: int, num_warps: int) -> int:
    """fp32 values of the (block_q x d) output accumulator each thread holds (32 threads a warp)."""
    return block_q * head_dim // (32 * num_warps)


@triton.jit
def _load_tile(ptrs, row_ok, col_ok, CHECK_ROWS: tl.constexpr, CHECK_COLS: tl.constexpr):
    """Load a 2-D tile, masking rows and/or columns only where needed (zeros elsewhere)."""
    if CHECK_ROWS and CHECK_COLS:
        x = tl.load(ptrs, mask=row_ok & col_ok, other=0.0)
    elif CHECK_ROWS:
        x = tl.load(ptrs, mask=row_ok, other=0.0)
    elif CHECK_COLS:
        x = tl.load(ptrs, mask=col_ok, other=0.0)
    else:
        x = tl.load(ptrs)
    return x


@triton.jit
def _attn_fwd_inner(
    acc,
    l_i,
    m_i,
    q,  # (BLOCK_M, D), (BLOCK_M,), (BLOCK_M,), (BLOCK_M, D)
    k_base,
    v_base,
    stride_kn,
    stride_kk,
    stride_vn,
    stride_vk,
    last_key,
    lo,
    hi,
    qk_scale,
    N_CTX_K,
    BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PADDED: tl.constexpr,
    MASKED: tl.constexpr,
    CAUSAL: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """Stream key blocks [lo, hi) through the online softmax (the body of FA2 Alg. 1's loop over j: lines 7-10).

    With ``MASKED``, keys >= N_CTX_K are masked, and with ``CAUSAL`` also keys after
    ``last_key`` (BLOCK_M,), the last key each row may see: the row's own index for the
    top-left causal mask of :func:`_attn_fwd`, ``seqlen - Nq + token`` for decoding
    (``decode._decode_split_kv`` runs this same loop over its chunk of the cache).
    """
    offs_d = tl.arange(0, HEAD_DIM_PADDED)
    d_ok = offs_d[None, :] < HEAD_DIM  # (1, D)
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        offs_n = start_n + tl.arange(0, BLOCK_N)  # (BLOCK_N,)
        n_ok = offs_n[:, None] < N_CTX_K  # (BLOCK_N, 1)
        # FA2 Alg. 1 line 7: load K_j, V_j.
        k_ptrs = k_base + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kk
        k = _load_tile(k_ptrs, n_ok, d_ok, MASKED, HEAD_DIM != HEAD_DIM_PADDED)  # (BLOCK_N, D)
        # FA2 Alg. 1 line 8: S = Q K^T, scaled into the exp2 domain.
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale  # (BLOCK_M, BLOCK_N)
        if MASKED:
            keep = offs_n[None, :] < N_CTX_K  # (1, BLOCK_N)
            if CAUSAL:
                keep = keep & (offs_n[None, :] <= last_key[:, None])  # (BLOCK_M, BLOCK_N)
            qk = tl.where(keep, qk, float("-inf"))
        # FA2 Alg. 1 line 9: new running max, P~ = exp(S - m), rescaled running sum.
        m_ij = tl.maximum(m_i, tl.max(qk, 1))  # (BLOCK_M,)
        if MASKED:  # noqa: SIM108 (a constexpr if-statement is pruned at compile time)
            # A row whose keys so far are all masked has m = -inf; -inf - (-inf) would be NaN.
            m_sub = tl.where(m_ij == float("-inf"), 0.0, m_ij)
        else:
            m_sub = m_ij
        p = tl.math.exp2(qk - m_sub[:, None])  # (BLOCK_M, BLOCK_N)
        alpha = tl.math.exp2(m_i - m_sub)  # (BLOCK_M,) = exp(m_old - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        # FA2 Alg. 1 line 10: O = diag(alpha) O + P~ V_j (unnormalized).
        v_ptrs = v_base + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vk
        v = _load_tile(v_ptrs, n_ok, d_ok, MASKED, HEAD_DIM != HEAD_DIM_PADDED)  # (BLOCK_N, D)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PRECISION)  # (BLOCK_M, D)
        m_i = m_ij
    return acc, l_i, m_i


@triton.autotune(
    configs=fwd_configs(),
    key=["N_CTX_Q", "N_CTX_K", "HEAD_DIM", "CAUSAL", "DOT_PRECISION"],
    prune_configs_by={
        "early_config_prune": prune_configs(FWD_IEEE_CONFIG, FWD_SMALL_CONFIG, FWD_SM75)
    },
    **autotune_kwargs(),
)
@triton.jit
def _attn_fwd(
    Q,
    K,
    V,
    scale,
    LSE,
    Out,
    stride_qz,
    stride_qh,
    stride_qm,
    stride_qk,
    stride_kz,
    stride_kh,
    stride_kn,
    stride_kk,
    stride_vz,
    stride_vh,
    stride_vn,
    stride_vk,
    stride_oz,
    stride_oh,
    stride_om,
    stride_ok,
    H_Q,
    GROUP_SIZE,
    N_CTX_Q,
    N_CTX_K,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PADDED: tl.constexpr,
    CAUSAL: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """O = softmax(scale * Q K^T) V for one query block of one (batch, head).

    Grid: (cdiv(Nq, BLOCK_M), B * Hq). LSE is written contiguous (B, Hq, Nq) in base 2.
    """
    start_m = tl.program_id(0) * BLOCK_M
    off_hz = tl.program_id(1)
    off_z = (off_hz // H_Q).to(tl.int64)
    off_h = (off_hz % H_Q).to(tl.int64)
    off_kvh = off_h // GROUP_SIZE  # GQA: GROUP_SIZE query heads share one K/V head
    q_base = Q + off_z * stride_qz + off_h * stride_qh
    k_base = K + off_z * stride_kz + off_kvh * stride_kh
    v_base = V + off_z * stride_vz + off_kvh * stride_vh
    o_base = Out + off_z * stride_oz + off_h * stride_oh

    offs_m = start_m + tl.arange(0, BLOCK_M)  # (BLOCK_M,)
    offs_d = tl.arange(0, HEAD_DIM_PADDED)  # (D,)
    m_ok = offs_m[:, None] < N_CTX_Q  # (BLOCK_M, 1)
    d_ok = offs_d[None, :] < HEAD_DIM  # (1, D)

    # FA2 Alg. 1 lines 4-5: load Q_i; m = -inf, l = 0, O = 0 on chip.
    q_ptrs = q_base + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qk
    q = _load_tile(q_ptrs, m_ok, d_ok, True, HEAD_DIM != HEAD_DIM_PADDED)  # (BLOCK_M, D)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_PADDED], dtype=tl.float32)
    qk_scale = scale * LOG2E  # exp(x) = exp2(x * log2 e)

    # Stage 1: whole key blocks that no mask touches. Stage 2: the diagonal and the ragged end.
    if CAUSAL:
        hi = tl.minimum(start_m + BLOCK_M, N_CTX_K)  # the last key any row of this block sees
        hi_full = (tl.minimum(start_m, N_CTX_K) // BLOCK_N) * BLOCK_N  # keys < start_m: all visible
    else:
        hi = N_CTX_K
        hi_full = (N_CTX_K // BLOCK_N) * BLOCK_N
    acc, l_i, m_i = _attn_fwd_inner(
        acc,
        l_i,
        m_i,
        q,
        k_base,
        v_base,
        stride_kn,
        stride_kk,
        stride_vn,
        stride_vk,
        offs_m,  # last_key: top-left causal, row i sees the keys j <= i
        0,
        hi_full,
        qk_scale,
        N_CTX_K,
        BLOCK_N,
        HEAD_DIM,
        HEAD_DIM_PADDED,
        False,
        CAUSAL,
        DOT_PRECISION,
    )
    acc, l_i, m_i = _attn_fwd_inner(
        acc,
        l_i,
        m_i,
        q,
        k_base,
        v_base,
        stride_kn,
        stride_kk,
        stride_vn,
        stride_vk,
        offs_m,
        hi_full,
        hi,
        qk_scale,
        N_CTX_K,
        BLOCK_N,
        HEAD_DIM,
        HEAD_DIM_PADDED,
        True,
        CAUSAL,
        DOT_PRECISION,
    )

    # FA2 Alg. 1 lines 12-13: O = diag(l)^-1 O, L = m + log l (base 2 here).
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)  # only rows past Nq (never stored) can have l = 0
    acc = acc / l_safe[:, None]
    lse2 = m_i + tl.math.log2(l_safe)  # (BLOCK_M,)
    # FA2 Alg. 1 lines 14-15: write O_i and L_i.
    tl.store(LSE + off_hz.to(tl.int64) * N_CTX_Q + offs_m, lse2, mask=offs_m < N_CTX_Q)
    o_ptrs = o_base + offs_m[:, None] * stride_om + offs_d[None, :] * stride_ok
    tl.store(o_ptrs, acc.to(Out.dtype.element_ty), mask=m_ok & d_ok)
