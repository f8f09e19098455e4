"""Flash Attention forward in Triton: FlashAttention-2's Algorithm 1, one program per query block.

Chapter: "Flash Attention in Triton: the forward kernel". Paper: FlashAttention-2 (Dao 2023,
arXiv 2307.08691), Algorithm 1; line numbers in the comments refer to it.

Layout: every tensor is (batch, heads, seq, head_dim), like PyTorch's SDPA.

    Q: (B, Hq, Nq, d)    K, V: (B, kv_heads, Nk, d)    Hq = GROUP_SIZE * kv_heads (GQA / MQA)
    O: (B, Hq, Nq, d)    LSE: (B, Hq, Nq) float32, the row's logsumexp in units of c (below)

Program (pid_m, pid_bh) owns the query rows [pid_m * BLOCK_M, (pid_m + 1) * BLOCK_M) of one
(batch, query head) and streams K, V of the matching key/value head ``h // GROUP_SIZE`` through
on-chip memory, keeping the running max ``m_i``, the running sum ``l_i`` and the unnormalized
output ``acc`` (FA2 Alg. 1 lines 6-11).

The exp2 domain: exp(x) = exp2(x * log2(e)). The loop over key blocks,
:func:`_attn_fwd_mask_inner`, goes through the score and mask hooks of masks.py: scores r in
units of c (s = c * r, r = q.k * ``qk_mul``), the running max ``m_i`` in the same units, and
``P~ = exp2((r - m) * c2)`` with ``c2 = c * log2(e)``, the multiplication after the subtraction,
so that the backward recomputes P exactly. :func:`_attn_fwd` saves the row statistic in units of
c (+inf for a row that sees no key), which ``launch.py`` converts for users. The decode kernel
``serving/decode.py::_decode_split_kv`` runs the same loop over its chunk of the KV cache (the
paged one repeats its steps with keys found through a page table).

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

from ._env import autotune_kwargs, prune_configs  # noqa: E402
from .configs import (  # noqa: E402,F401  (re-exported)
    FWD_CPU_CONFIG,
    FWD_GPU_TILES,
    FWD_IEEE_CONFIG,
    FWD_SM75,
    FWD_SMALL_CONFIG,
    TUNE_KEY,
    accumulator_registers,
    fwd_configs,
    fwd_gpu_configs,
    smem_estimate,
)
from .masks import BIG, _key_blocks, _score_mod, _seq, _visible  # noqa: E402,F401
from ..numpy.reference import LOG2E as _LOG2E  # noqa: E402

# A kernel reads a module global only as a constexpr: log2(e), for the kernels that fold it
# into the scale (qk_scale = scale * LOG2E; experiments/hopper/hopper_lever_kernel.py).
LOG2E = tl.constexpr(_LOG2E)


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
def _attn_fwd_mask_inner(
    acc,
    l_i,
    m_i,
    q,  # (BLOCK_M, D), (BLOCK_M,), (BLOCK_M,), (BLOCK_M, D); m_i, l_i in units of c (masks.py)
    k_base,
    v_base,
    stride_kn,
    stride_kk,
    stride_vn,
    stride_vk,
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
    BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PADDED: tl.constexpr,
    MASKED: tl.constexpr,
    WINDOWED: tl.constexpr,
    SOFTCAP: tl.constexpr,
    ALIBI: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """Stream key blocks [lo, hi) through the online softmax (FA2 Alg. 1 lines 7-10), with the
    score hook (soft cap, ALiBi) and, with ``MASKED``, the bounds and window masks of masks.py.

    Scores are in units of c (s = c * r, ``c2`` = c * log2 e): P~ = exp2((r - m) * c2). Row i
    (index ``offs_m``) sees keys [i + diag_lo, i + diag_hi] (``_visible``): the training kernel's
    causal / window masks, and decoding's bottom-right causal mask (``decode._decode_split_kv``
    runs this loop over its chunk of the cache with ``n_k`` the chunk's end).
    """
    offs_d = tl.arange(0, HEAD_DIM_PADDED)
    d_ok = offs_d[None, :] < HEAD_DIM  # (1, D)
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        offs_n = start_n + tl.arange(0, BLOCK_N)  # (BLOCK_N,)
        n_ok = offs_n[:, None] < n_k  # (BLOCK_N, 1)
        # FA2 Alg. 1 line 7: load K_j, V_j.
        k_ptrs = k_base + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kk
        k = _load_tile(k_ptrs, n_ok, d_ok, MASKED, HEAD_DIM != HEAD_DIM_PADDED)  # (BLOCK_N, D)
        # FA2 Alg. 1 line 8: S = Q K^T, through the score hook.
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)  # (BLOCK_M, BLOCK_N)
        r, _t = _score_mod(
            qk, offs_m[:, None], offs_n[None, :], qk_mul, alibi_r, alibi_diag, SOFTCAP, ALIBI
        )
        if MASKED:
            keep = offs_n[None, :] < n_k  # (1, BLOCK_N)
            if WINDOWED:
                keep = keep & _visible(offs_m[:, None], offs_n[None, :], diag_lo, diag_hi)
            r = tl.where(keep, r, float("-inf"))
        # FA2 Alg. 1 line 9: new running max, P~ = exp(S - m), rescaled running sum.
        m_ij = tl.maximum(m_i, tl.max(r, 1))  # (BLOCK_M,)
        if MASKED:  # noqa: SIM108 (a constexpr if-statement is pruned at compile time)
            # A row whose keys so far are all masked has m = -inf; -inf - (-inf) would be NaN.
            m_sub = tl.where(m_ij == float("-inf"), 0.0, m_ij)
        else:
            m_sub = m_ij
        p = tl.math.exp2((r - m_sub[:, None]) * c2)  # (BLOCK_M, BLOCK_N)
        alpha = tl.math.exp2((m_i - m_sub) * c2)  # (BLOCK_M,) = exp(m_old - m_new)
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
    key=list(TUNE_KEY),
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
    LSE,
    Out,
    CU_Q,
    CU_K,
    ALIBI_R,
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
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """O = softmax(S) V for one query block of one (sequence, query head), S from the hooks.

    Grid: (cdiv(Nq or max_seqlen_q, BLOCK_M), B * Hq). Dense: Q (B, Hq, Nq, d) by strides.
    ``VARLEN``: Q (total_q, Hq, d) packed, sequence b = tokens [CU_Q[b], CU_Q[b + 1]) (stride_qz
    = 0); a program past its sequence's end exits at once. LSE gets the row statistic in units
    of c (masks.py), +inf for a row that sees no key.
    """
    start_m = tl.program_id(0) * BLOCK_M
    off_hz = tl.program_id(1)
    off_z = off_hz // H_Q
    off_h = (off_hz % H_Q).to(tl.int64)
    q_start, n_q = _seq(CU_Q, off_z, N_CTX_Q, VARLEN)
    if start_m >= n_q:
        return
    k_start, n_k = _seq(CU_K, off_z, N_CTX_K, VARLEN)
    off_kvh = off_h // GROUP_SIZE  # GQA: GROUP_SIZE query heads share one K/V head
    off_z = off_z.to(tl.int64)
    q_base = Q + off_z * stride_qz + off_h * stride_qh + q_start * stride_qm
    k_base = K + off_z * stride_kz + off_kvh * stride_kh + k_start * stride_kn
    v_base = V + off_z * stride_vz + off_kvh * stride_vh + k_start * stride_vn
    o_base = Out + off_z * stride_oz + off_h * stride_oh + q_start * stride_om

    offs_m = start_m + tl.arange(0, BLOCK_M)  # (BLOCK_M,)
    offs_d = tl.arange(0, HEAD_DIM_PADDED)  # (D,)
    m_ok = offs_m[:, None] < n_q  # (BLOCK_M, 1)
    d_ok = offs_d[None, :] < HEAD_DIM  # (1, D)
    # FA2 Alg. 1 lines 4-5: load Q_i; m = -inf, l = 0, O = 0 on chip.
    q_ptrs = q_base + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qk
    q = _load_tile(q_ptrs, m_ok, d_ok, True, HEAD_DIM != HEAD_DIM_PADDED)  # (BLOCK_M, D)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_PADDED], dtype=tl.float32)
    alibi_r = 0.0
    if ALIBI:
        alibi_r = tl.load(ALIBI_R + off_z * stride_az + off_h)  # slope / c
    diag = 0
    if BOTTOM_RIGHT:
        diag = n_k - n_q
    diag_lo, diag_hi = diag + win_lo, diag + win_hi  # row i sees keys [i + diag_lo, i + diag_hi]

    # Masked left edge, unmasked middle, masked right edge (ragged end, diagonal, window).
    lo, full_lo, full_hi, hi = _key_blocks(start_m, n_k, diag_lo, diag_hi, BLOCK_M, BLOCK_N)
    for stage in tl.static_range(3):
        if stage == 0:
            s_lo, s_hi = lo, full_lo
        elif stage == 1:
            s_lo, s_hi = full_lo, full_hi
        else:
            s_lo, s_hi = full_hi, hi
        acc, l_i, m_i = _attn_fwd_mask_inner(
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
            s_lo,
            s_hi,
            n_k,
            qk_mul,
            c2,
            alibi_r,
            n_k - n_q,
            diag_lo,
            diag_hi,
            BLOCK_N,
            HEAD_DIM,
            HEAD_DIM_PADDED,
            stage != 1,
            WINDOWED,
            SOFTCAP,
            ALIBI,
            DOT_PRECISION,
        )

    # FA2 Alg. 1 lines 12-13: O = diag(l)^-1 O, L = m + log l (in units of c here).
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)  # a row that sees no key: O = 0
    acc = acc / l_safe[:, None]
    lse_c = tl.where(l_i == 0.0, float("inf"), m_i + tl.math.log2(l_safe) / c2)  # (BLOCK_M,)
    # FA2 Alg. 1 lines 14-15: write O_i and L_i.
    lse_ptrs = LSE + off_z * stride_lz + off_h * stride_lh + q_start + offs_m
    tl.store(lse_ptrs, lse_c, mask=offs_m < n_q)
    o_ptrs = o_base + offs_m[:, None] * stride_om + offs_d[None, :] * stride_ok
    tl.store(o_ptrs, acc.to(Out.dtype.element_ty), mask=m_ok & d_ok)
