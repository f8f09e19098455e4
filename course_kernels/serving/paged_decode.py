"""Split-KV decoding over a paged KV cache (Triton): the keys are read through a block table.

Chapter: "Serving: KV cache, paged attention, chunked prefill" (book part two).

Layout (flash-attn's ``flash_attn_with_kvcache(..., block_table=...)``, which vLLM's
FlashAttention backend uses; the NumPy twin is :mod:`course_kernels.serving.pages`)::

    q: (B, Hq, Nq, d)                                   the new tokens' queries
    k_cache, v_cache: (num_blocks, block_size, kv_heads, d)   the page pool, shared by the batch
    block_table: (B, max_blocks) int32 page ids          row b: sequence b's pages, in order
    cache_seqlens: (B,) int32                           tokens of each sequence

The kernel is :mod:`.decode`'s split step with one change, the address of a key: token ``j`` of
sequence ``b`` is row ``j % block_size`` of page ``block_table[b, j // block_size]``. A tile of
``BLOCK_N`` keys may span several pages (vLLM's default page is 16 tokens, a GPU tile 64 keys),
so each key looks up its own page: one small integer load per key, next to the ``d`` values it
then reads. The combine step is :mod:`.decode`'s, unchanged.
"""

from __future__ import annotations

from ..triton import _env as _triton_env  # noqa: F401  (first: decides GPU vs interpreter)
from ..triton._env import INTERPRET, next_power_of_2, require_triton
from .pages import check_block_table
from .split_kv import check_num_splits, check_seqlens, check_shapes, split_chunk

require_triton()

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from ..triton._torch_validate import check_causal, check_scale, check_tensors  # noqa: E402
from ..triton.masks import PLAIN  # noqa: E402
from .decode import LN2, _block_k, _combine_splits, default_num_splits  # noqa: E402


@triton.jit
def _paged_attn_inner(
    acc,
    l_i,
    m_i,
    q,  # (BLOCK_M, D), (BLOCK_M,), (BLOCK_M,), (BLOCK_M, D)
    k_base,
    v_base,
    table_row,
    stride_kb,
    stride_ks,
    stride_kk,
    stride_vb,
    stride_vs,
    stride_vk,
    last_key,
    lo,
    hi,
    seqlen,
    qk_mul,
    c2,
    PAGE_SIZE,
    BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PADDED: tl.constexpr,
    CAUSAL: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """The forward's loop over key blocks (``forward._attn_fwd_mask_inner``, the same steps in
    units of c), keys found by page.

    Its own loop, not the forward's: that one addresses a key as one base pointer plus a
    stride, and a page table would need an addressing hook in the forward's loop for this one
    caller. Every block is masked (keys past the sequence; with ``CAUSAL`` keys after
    ``last_key``, bottom-right as in ``decode._decode_split_kv``); no soft cap, no ALiBi, so the
    score hook is ``r = q.k * qk_mul``.
    """
    offs_d = tl.arange(0, HEAD_DIM_PADDED)
    d_ok = offs_d[None, :] < HEAD_DIM  # (1, D)
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)  # (BLOCK_N,) logical token positions
        n_ok = offs_n < seqlen  # table entries past the sequence are never read
        page = tl.load(table_row + offs_n // PAGE_SIZE, mask=n_ok, other=0).to(tl.int64)
        slot = offs_n % PAGE_SIZE
        k_rows = k_base + page * stride_kb + slot * stride_ks  # (BLOCK_N,) pointer per key
        k = tl.load(
            k_rows[:, None] + offs_d[None, :] * stride_kk, mask=n_ok[:, None] & d_ok, other=0.0
        )
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)  # (BLOCK_M, BLOCK_N)
        r = qk * qk_mul  # the score in units of c
        keep = n_ok[None, :]
        if CAUSAL:
            keep = keep & (offs_n[None, :] <= last_key[:, None])
        r = tl.where(keep, r, float("-inf"))
        m_ij = tl.maximum(m_i, tl.max(r, 1))
        m_sub = tl.where(m_ij == float("-inf"), 0.0, m_ij)  # a row with no key yet
        p = tl.math.exp2((r - m_sub[:, None]) * c2)
        alpha = tl.math.exp2((m_i - m_sub) * c2)
        l_i = l_i * alpha + tl.sum(p, 1)
        v_rows = v_base + page * stride_vb + slot * stride_vs
        v = tl.load(
            v_rows[:, None] + offs_d[None, :] * stride_vk, mask=n_ok[:, None] & d_ok, other=0.0
        )
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=DOT_PRECISION)
        m_i = m_ij
    return acc, l_i, m_i


@triton.jit
def _paged_decode_split_kv(
    Q,
    K,
    V,
    BLOCK_TABLE,
    SEQLENS,
    M_part,
    L_part,
    Acc_part,
    qk_mul,
    c2,
    stride_qz,
    stride_qh,
    stride_qm,
    stride_qk,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_kk,
    stride_vb,
    stride_vs,
    stride_vh,
    stride_vk,
    stride_tz,
    KV_HEADS,
    GROUP_SIZE,
    N_Q,
    KEYS_PER_SPLIT,
    NUM_SPLITS,
    PAGE_SIZE,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PADDED: tl.constexpr,
    CAUSAL: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """``decode._decode_split_kv`` over pages: grid (NUM_SPLITS, B * KV_HEADS), same partials."""
    split = tl.program_id(0)
    off_zkv = tl.program_id(1)
    off_z = (off_zkv // KV_HEADS).to(tl.int64)
    off_kvh = (off_zkv % KV_HEADS).to(tl.int64)
    seqlen = tl.load(SEQLENS + off_z)

    offs_r = tl.arange(0, BLOCK_M)  # packed query rows: (query head of the group, token)
    offs_d = tl.arange(0, HEAD_DIM_PADDED)
    r_ok = offs_r < GROUP_SIZE * N_Q
    tok = offs_r % N_Q
    off_h = off_kvh * GROUP_SIZE + offs_r // N_Q
    d_ok = offs_d[None, :] < HEAD_DIM
    q_ptrs = Q + off_z * stride_qz + off_h[:, None] * stride_qh + tok[:, None] * stride_qm
    q = tl.load(q_ptrs + offs_d[None, :] * stride_qk, mask=r_ok[:, None] & d_ok, other=0.0)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_PADDED], dtype=tl.float32)
    lo = split * KEYS_PER_SPLIT  # a multiple of BLOCK_N: no key block crosses two splits
    hi = tl.minimum(lo + KEYS_PER_SPLIT, seqlen)
    acc, l_i, m_i = _paged_attn_inner(
        acc,
        l_i,
        m_i,
        q,
        K + off_kvh * stride_kh,
        V + off_kvh * stride_vh,
        BLOCK_TABLE + off_z * stride_tz,
        stride_kb,
        stride_ks,
        stride_kk,
        stride_vb,
        stride_vs,
        stride_vk,
        seqlen - N_Q + tok,  # bottom-right causal: row i sees keys j <= L - Nq + i
        lo,
        hi,
        seqlen,
        qk_mul,
        c2,
        PAGE_SIZE,
        BLOCK_N,
        HEAD_DIM,
        HEAD_DIM_PADDED,
        CAUSAL,
        DOT_PRECISION,
    )
    row = ((off_z * KV_HEADS * GROUP_SIZE + off_h) * N_Q + tok) * NUM_SPLITS + split
    tl.store(M_part + row, m_i * c2 * LN2, mask=r_ok)  # natural log, as decode's
    tl.store(L_part + row, l_i, mask=r_ok)
    tl.store(Acc_part + row[:, None] * HEAD_DIM + offs_d[None, :], acc, mask=r_ok[:, None] & d_ok)


def _as_int32(x, name, device):
    if isinstance(x, torch.Tensor):
        if x.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"{name} must be an integer tensor; got {x.dtype}")
        return x.to(device=device, dtype=torch.int32).contiguous()
    return torch.as_tensor(x, dtype=torch.int32, device=device).contiguous()


def _check_paged(q, k_cache, v_cache, block_table, cache_seqlens, check_table):
    check_tensors(q, k_cache, v_cache)
    nb, P, kv_heads, dk = k_cache.shape
    if tuple(v_cache.shape[:3]) != (nb, P, kv_heads):
        raise ValueError(
            "k_cache and v_cache must be (num_blocks, block_size, kv_heads, d) with the same "
            f"first three dims; got {tuple(k_cache.shape)} and {tuple(v_cache.shape)}"
        )
    B = q.shape[0]
    ks, vs = (B, kv_heads, P, dk), (B, kv_heads, P, v_cache.shape[3])
    check_shapes(q.shape, ks, vs, q.dtype, k_cache.dtype, v_cache.dtype)
    if dk > 256 or v_cache.shape[3] != dk:
        raise ValueError(
            f"k and v head dims must be equal, at most 256; got {dk}, {v_cache.shape[3]}"
        )
    if cache_seqlens is None:
        raise ValueError("a paged cache needs cache_seqlens: (B,) tokens of each sequence")
    if not isinstance(cache_seqlens, torch.Tensor):
        cache_seqlens = check_seqlens(cache_seqlens, B, 2**62)  # integers, one per sequence
    table = _as_int32(block_table, "block_table", q.device)
    lens = _as_int32(cache_seqlens, "cache_seqlens", q.device)
    if table.dim() != 2 or table.shape[0] != B or lens.shape != (B,):
        raise ValueError(
            f"block_table must be (B={B}, max_blocks) and cache_seqlens ({B},); got "
            f"{tuple(table.shape)} and {tuple(lens.shape)}"
        )
    if check_table:  # one device -> host copy: a step captured in a CUDA graph passes False
        check_block_table(table.cpu().numpy(), lens.cpu().numpy(), nb, P, B)
    return table, lens


def flash_decode_paged(
    q,
    k_cache,
    v_cache,
    block_table,
    cache_seqlens,
    num_splits=None,
    causal: bool = False,
    scale=None,
    return_lse: bool = False,
    return_partials: bool = False,
    check_table: bool = True,
):
    """Decode attention over a paged KV cache, split over the keys (Triton).

    The same result as :func:`course_kernels.serving.decode.flash_decode` on the contiguous
    cache the block table describes (:func:`course_kernels.serving.pages.gather_cache`).

    Args:
        q: (B, Hq, Nq, d) new queries; (Hq / kv_heads) * Nq <= 128.
        k_cache, v_cache: (num_blocks, block_size, kv_heads, d) the page pool (any block size).
        block_table: (B, max_blocks) int tensor or array of page ids; entries past a
            sequence's last page are not read.
        cache_seqlens: (B,) int tensor or list, tokens of each sequence (<= max_blocks * block_size).
        num_splits: chunks of the table's capacity (1..256); None = ``default_num_splits``.
        causal: bottom-right causal for Nq > 1 (query i sees keys j <= L - Nq + i).
        scale: None = 1/sqrt(d).
        return_lse, return_partials: as ``flash_decode``.
        check_table: validate page ids and lengths on the host (one GPU -> CPU copy; pass
            False inside a CUDA graph capture, where the caller vouches for the table).

    Returns out (B, Hq, Nq, d) in q's dtype [, lse] [, partials].
    """
    if not isinstance(k_cache, torch.Tensor) or k_cache.dim() != 4:
        raise ValueError(
            "k_cache must be a rank-4 tensor (num_blocks, block_size, kv_heads, d); got "
            f"{getattr(k_cache, 'shape', type(k_cache).__name__)}"
        )
    if not all(isinstance(x, bool) for x in (return_lse, return_partials, check_table)):
        raise TypeError("return_lse, return_partials and check_table must be bools")
    table, lens = _check_paged(q, k_cache, v_cache, block_table, cache_seqlens, check_table)
    check_causal(causal)
    B, Hq, Nq, d = q.shape
    scale = check_scale(scale, d)
    out_dtype = q.dtype
    if INTERPRET and q.dtype == torch.bfloat16:  # triton-lang/triton#11584, as in decode.py
        q, k_cache, v_cache = q.float(), k_cache.float(), v_cache.float()
    P, kv_heads = k_cache.shape[1], k_cache.shape[2]
    G = Hq // kv_heads
    capacity = table.shape[1] * P
    block_k = _block_k(q.dtype)
    if num_splits is None:
        num_splits = default_num_splits(B * kv_heads, capacity, block_k)
    num_splits = check_num_splits(num_splits)
    chunk = split_chunk(capacity, num_splits, block_k)
    dpad = max(16, next_power_of_2(d))
    f32 = dict(device=q.device, dtype=torch.float32)
    m_part = torch.empty((B, Hq, Nq, num_splits), **f32)
    l_part = torch.empty((B, Hq, Nq, num_splits), **f32)
    acc_part = torch.empty((B, Hq, Nq, num_splits, d), **f32)
    launch = {} if INTERPRET else {"num_warps": 4, "num_stages": 2}
    qk_mul, _, c2 = PLAIN.units(scale)  # scores in units of c, as decode's
    _paged_decode_split_kv[(num_splits, B * kv_heads)](
        q,
        k_cache,
        v_cache,
        table,
        lens,
        m_part,
        l_part,
        acc_part,
        qk_mul,
        c2,
        *q.stride(),
        *k_cache.stride(),
        *v_cache.stride(),
        table.stride(0),
        kv_heads,
        G,
        Nq,
        chunk,
        num_splits,
        P,
        HEAD_DIM=d,
        HEAD_DIM_PADDED=dpad,
        CAUSAL=causal,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        BLOCK_M=max(16, next_power_of_2(G * Nq)),
        BLOCK_N=block_k,
        **launch,
    )
    return _combine_splits(
        m_part, l_part, acc_part, q, dpad, num_splits, out_dtype, return_lse, return_partials
    )
