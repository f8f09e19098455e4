"""Split-KV decoding (Flash-Decoding): one new query token against a long KV cache.

Chapter: "Applications" (book part two), section "Inference: prefill vs decode".

Layout (batch, heads, seq, head_dim), like PyTorch's SDPA:

    q: (B, Hq, Nq, d)   Nq = 1 in plain decoding, a few tokens in speculative decoding
    k, v: (B, kv_heads, Nk, d)   the KV cache; Hq = G * kv_heads (GQA; kv_heads = 1 is MQA)
    cache_seqlens: (B,) how many cached keys each sequence really has (<= Nk)
    out: (B, Hq, Nq, d)   lse: (B, Hq, Nq) float32, natural log

Why a separate kernel. In decoding there is no N x N matrix to avoid: one query row reads the
whole cache once, so the work is memory-bound and FlashAttention's IO saving (a prefill and
training effect) has nothing to save. What matters is reading the cache at full bandwidth. The
forward kernel gives one program per (query block, batch, head): at batch 1 with 8 KV heads that
is 8 programs on a GPU with 132 SMs, and each streams the whole cache alone. Flash-Decoding
(Dao, Haziza, Massa, Sizov 2023, "Flash-Decoding for long-context inference", PyTorch blog) also
splits the *keys*:

1. ``_decode_split_kv``: grid (num_splits, B * kv_heads). Program (s, b, kv head) reads keys
   [s * chunk, (s + 1) * chunk) and computes the partial result of every query row that uses
   this KV head (the G query heads of the group times Nq tokens, packed into one tile so the
   cache is read once per group, not once per query head)::

       m   = max_j S_j                 (row max of the chunk's scores)
       l   = sum_j exp(S_j - m)
       acc = sum_j exp(S_j - m) V_j    (not normalised)

2. ``_decode_combine``: one program per (b, query head, token) merges the num_splits partials
   with the online-softmax merge (each rescaled by exp(m_s - max_s m_s)), then normalises.

Without the rescaling in step 2 the result is wrong whenever the chunks have different maxima:
``tests/test_decode.py`` checks that such a merge is caught.

:func:`course_kernels.serving.split_kv.split_kv_decode_numpy` is the same algorithm in NumPy (importable
without torch or Triton); :func:`flash_decode` runs the Triton kernels (a CUDA GPU, or Triton's
CPU interpreter). The decode benchmark is :func:`course_kernels.apps.runs.decode_benchmark`.
A paged cache (pages + block table, vLLM's layout) is read by
:func:`course_kernels.serving.paged_decode.flash_decode_paged`, the same kernel pair.

Causal with Nq > 1 is *bottom-right* aligned, as in decoding: the cache already holds the new
tokens, and query i (of Nq) sees keys j <= L - Nq + i, where L is the sequence's cache length.
(``flash_attention``'s ``causal`` is PyTorch's top-left alignment; for Nq = Nk they agree.)
"""

from __future__ import annotations

import functools

from ..triton import _env as _triton_env  # noqa: F401  (first: decides GPU vs interpreter before any kernel)
from .._compat import renamed_kwargs
from ..triton._env import INTERPRET, next_power_of_2, require_triton
from ..numpy.online_softmax import PartialAttention
from .split_kv import MAX_SPLITS, check_num_splits, check_seqlens, check_shapes, split_chunk

require_triton()

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from ..triton._torch_validate import check_causal, check_scale, check_tensors  # noqa: E402
from ..numpy.reference import LN2 as _LN2  # noqa: E402
from ..triton.forward import _attn_fwd_mask_inner  # noqa: E402
from ..triton.masks import BIG as _BIG, PLAIN  # noqa: E402

LN2 = tl.constexpr(_LN2)  # a kernel reads a module global only as a constexpr
BIG = tl.constexpr(_BIG)  # masks.BIG: an unbounded side of the window


# -- Triton -----------------------------------------------------------------------------------
@triton.jit
def _decode_split_kv(
    Q,
    K,
    V,
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
    stride_kz,
    stride_kh,
    stride_kn,
    stride_kk,
    stride_vz,
    stride_vh,
    stride_vn,
    stride_vk,
    KV_HEADS,
    GROUP_SIZE,
    N_Q,
    N_KEYS,
    KEYS_PER_SPLIT,
    NUM_SPLITS,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PADDED: tl.constexpr,
    CAUSAL: tl.constexpr,
    HAS_SEQLENS: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """Partial (m, l, acc) of the G * Nq query rows of one KV head over one chunk of keys.

    Grid (NUM_SPLITS, B * KV_HEADS). Row r of the tile is query head kvh * G + r // N_Q, token
    r % N_Q. Scores in units of c (``qk_mul``, ``c2`` = c log2 e: ``masks.PLAIN.units(scale)``).
    Writes m (natural log), l: (B, Hq, Nq, S) and acc: (B, Hq, Nq, S, HEAD_DIM) float32.
    """
    split = tl.program_id(0)
    off_zkv = tl.program_id(1)
    off_z = (off_zkv // KV_HEADS).to(tl.int64)
    off_kvh = (off_zkv % KV_HEADS).to(tl.int64)
    # A constexpr if-statement is pruned by Triton at compile time; it stays a statement.
    if HAS_SEQLENS:  # noqa: SIM108
        seqlen = tl.load(SEQLENS + off_z)  # keys this sequence really has
    else:
        seqlen = N_KEYS  # every cache is full: no lengths tensor to build or read

    offs_r = tl.arange(0, BLOCK_M)  # (BLOCK_M,) packed query rows
    offs_d = tl.arange(0, HEAD_DIM_PADDED)  # (D,)
    r_ok = offs_r < GROUP_SIZE * N_Q
    tok = offs_r % N_Q  # token index i within the Nq new tokens
    off_h = off_kvh * GROUP_SIZE + offs_r // N_Q  # (BLOCK_M,) query head of each row
    d_ok = offs_d[None, :] < HEAD_DIM  # (1, D)

    q_ptrs = (
        Q
        + off_z * stride_qz
        + off_h[:, None] * stride_qh
        + tok[:, None] * stride_qm
        + offs_d[None, :] * stride_qk
    )
    q = tl.load(q_ptrs, mask=r_ok[:, None] & d_ok, other=0.0)  # (BLOCK_M, D)
    k_base = K + off_z * stride_kz + off_kvh * stride_kh
    v_base = V + off_z * stride_vz + off_kvh * stride_vh

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)  # units of c, like triton_forward
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_PADDED], dtype=tl.float32)

    lo = split * KEYS_PER_SPLIT  # a multiple of BLOCK_N (split_kv.split_chunk)
    hi = tl.minimum(lo + KEYS_PER_SPLIT, seqlen)
    # The forward's loop over key blocks (FA2 Alg. 1 lines 7-10), every block masked: keys past
    # this chunk (or the sequence) and, with causal, keys after seqlen - N_Q + tok (the window
    # predicate with no left edge: bottom-right causal). No soft cap, no ALiBi.
    acc, l_i, m_i = _attn_fwd_mask_inner(
        acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_kk, stride_vn, stride_vk,
        tok, lo, hi, hi,  # offs_m: the row index the mask reads; keys [lo, hi); n_k = hi
        qk_mul, c2, 0.0, 0,  # units of c; alibi_r, alibi_diag (no ALiBi)
        -BIG, seqlen - N_Q,  # diag_lo, diag_hi: row tok sees keys j <= seqlen - N_Q + tok
        BLOCK_N, HEAD_DIM, HEAD_DIM_PADDED,
        True, CAUSAL, False, False, DOT_PRECISION,  # MASKED, WINDOWED, SOFTCAP, ALIBI
    )  # fmt: skip

    # Partials go to (B, Hq, Nq, S[, d]); m in natural log (units of c times c = c2 ln 2) so
    # they read like online_softmax's. -inf (a row that saw no key) stays -inf.
    h_q = KV_HEADS * GROUP_SIZE
    row = ((off_z * h_q + off_h) * N_Q + tok) * NUM_SPLITS + split  # (BLOCK_M,)
    tl.store(M_part + row, m_i * c2 * LN2, mask=r_ok)
    tl.store(L_part + row, l_i, mask=r_ok)
    tl.store(Acc_part + row[:, None] * HEAD_DIM + offs_d[None, :], acc, mask=r_ok[:, None] & d_ok)


@triton.jit
def _decode_combine(
    M_part,
    L_part,
    Acc_part,
    Out,
    LSE,
    stride_oz,
    stride_oh,
    stride_om,
    stride_ok,
    H_Q,
    N_Q,
    NUM_SPLITS,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PADDED: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    """Merge the NUM_SPLITS partials of one (batch, query head, token) row and normalise.

    Grid (B * Hq * Nq,). The online-softmax merge of all splits at once:
    m = max_s m_s, w_s = exp(m_s - m), out = sum_s w_s acc_s / sum_s w_s l_s.
    """
    row = tl.program_id(0).to(tl.int64)
    offs_s = tl.arange(0, BLOCK_S)  # (BLOCK_S,)
    offs_d = tl.arange(0, HEAD_DIM_PADDED)  # (D,)
    s_ok = offs_s < NUM_SPLITS
    d_ok = offs_d < HEAD_DIM
    m = tl.load(M_part + row * NUM_SPLITS + offs_s, mask=s_ok, other=float("-inf"))
    l = tl.load(L_part + row * NUM_SPLITS + offs_s, mask=s_ok, other=0.0)
    acc = tl.load(
        Acc_part + (row * NUM_SPLITS + offs_s[:, None]) * HEAD_DIM + offs_d[None, :],
        mask=s_ok[:, None] & d_ok[None, :],
        other=0.0,
    )  # (BLOCK_S, D)
    m_max = tl.max(m, 0)
    m_safe = tl.where(m_max == float("-inf"), 0.0, m_max)
    w = tl.exp(m - m_safe)  # (BLOCK_S,) the rescaling; 0 for splits that saw no key
    l_tot = tl.sum(w * l, 0)
    o = tl.sum(w[:, None] * acc, 0)  # (D,)
    l_safe = tl.where(l_tot == 0.0, 1.0, l_tot)
    o = o / l_safe
    lse = tl.where(l_tot == 0.0, float("-inf"), m_safe + tl.log(l_safe))
    z = row // (H_Q * N_Q)
    h = (row // N_Q) % H_Q
    i = row % N_Q
    tl.store(
        Out + z * stride_oz + h * stride_oh + i * stride_om + offs_d * stride_ok,
        o.to(Out.dtype.element_ty),
        mask=d_ok,
    )
    tl.store(LSE + row, lse)


def _block_k(dtype=None) -> int:
    """Keys per step: 16 in the interpreter; on a GPU 64, or 32 for fp32 inputs (IEEE products
    run on FMA units and big tiles spill, see ``_triton_env.pick_configs``)."""
    if INTERPRET:
        return 16
    return 32 if dtype == torch.float32 else 64


@functools.cache
def _sm_count(device_index: int) -> int:
    """Multiprocessors of a GPU (asked once: the query costs time on every decode step)."""
    return torch.cuda.get_device_properties(device_index).multi_processor_count


@renamed_kwargs(block_n="block_k")
def default_num_splits(batch_kv_heads: int, n_keys: int, block_k: int | None = None) -> int:
    """How many chunks to split the keys into.

    On a GPU: enough programs for about two per SM, but no chunk shorter than two key blocks.
    Under the interpreter (every program costs CPU time): at most 4.
    """
    block_k = block_k or _block_k()
    blocks = -(-n_keys // block_k)
    if INTERPRET:
        return max(1, min(4, blocks))
    want = -(-2 * _sm_count(torch.cuda.current_device()) // batch_kv_heads)
    return max(1, min(want, blocks // 2, MAX_SPLITS))


def _check_torch(q, k, v, cache_seqlens, num_splits, causal, scale):
    check_tensors(q, k, v)
    B, Hq, Nq, d = check_shapes(q.shape, k.shape, v.shape, q.dtype, k.dtype, v.dtype)
    if d > 256:
        raise ValueError(f"head dim must be at most 256; got {d}")
    check_causal(causal)
    Nk = k.shape[2]
    if cache_seqlens is None:
        # The common decode step: every cache is full. No check, so no GPU -> CPU sync: a sync
        # per call stalls the host until the GPU is idle, and the next launch's overhead then
        # adds to every step instead of hiding behind the running kernel. No lengths tensor
        # either (the kernel uses Nk): one fill kernel fewer per step.
        lens = None
    elif isinstance(cache_seqlens, torch.Tensor):
        if cache_seqlens.shape != (B,) or cache_seqlens.dtype not in (torch.int32, torch.int64):
            raise ValueError(
                f"cache_seqlens must be an integer tensor of shape ({B},); got "
                f"{cache_seqlens.dtype} {tuple(cache_seqlens.shape)}"
            )
        lens = cache_seqlens.to(device=q.device, dtype=torch.int32)
        lo, hi = (int(x) for x in torch.aminmax(lens))  # one sync, only for user-given lengths
        if lo < 1 or hi > Nk:
            raise ValueError(f"cache_seqlens must lie in 1..Nk={Nk}; got {lens.tolist()}")
    else:
        lens = torch.as_tensor(
            check_seqlens(cache_seqlens, B, Nk), dtype=torch.int32, device=q.device
        )
    if num_splits is None:
        num_splits = default_num_splits(B * k.shape[1], Nk)
    num_splits = check_num_splits(num_splits)
    return lens, num_splits, check_scale(scale, d)


def flash_decode(
    q,
    k,
    v,
    cache_seqlens=None,
    num_splits=None,
    causal: bool = False,
    scale=None,
    return_lse: bool = False,
    return_partials: bool = False,
):
    """Attention of a few new query tokens over a KV cache, split over the keys (Triton).

    The same result as ``scaled_dot_product_attention(q, k[:, :, :L], v[:, :, :L],
    enable_gqa=True)`` for each sequence's cache length L.

    Args:
        q: (B, Hq, Nq, d) new queries; (Hq / kv_heads) * Nq <= 128.
        k, v: (B, kv_heads, Nk, d) the cache (GQA: Hq a multiple of kv_heads). Any Nk >= 1.
        cache_seqlens: (B,) int tensor or list, valid length of each sequence; None = Nk.
        num_splits: chunks of keys (1..256, ``split_kv.MAX_SPLITS``); None =
            :func:`default_num_splits`.
        causal: bottom-right causal for Nq > 1 (query i sees keys j <= L - Nq + i).
        scale: None = 1/sqrt(d).
        return_lse: also return lse (B, Hq, Nq) float32, natural log.
        return_partials: also return the split step's :class:`PartialAttention` (torch tensors;
            m, l: (B, Hq, Nq, S); acc: (B, Hq, Nq, S, d); m in natural log).

    Returns out (B, Hq, Nq, d) in q's dtype [, lse] [, partials].
    """
    lens, num_splits, scale = _check_torch(q, k, v, cache_seqlens, num_splits, causal, scale)
    if not isinstance(return_lse, bool) or not isinstance(return_partials, bool):
        raise TypeError("return_lse and return_partials must be bools")
    out_dtype = q.dtype
    if INTERPRET and q.dtype == torch.bfloat16:
        # triton-lang/triton#11584: bf16 tl.dot is wrong in the interpreter; compute in fp32.
        q, k, v = q.float(), k.float(), v.float()
    B, Hq, Nq, d = q.shape
    kv_heads, Nk = k.shape[1], k.shape[2]
    G = Hq // kv_heads
    block_k = _block_k(q.dtype)
    chunk = split_chunk(Nk, num_splits, block_k)
    dpad = max(16, next_power_of_2(d))
    f32 = dict(device=q.device, dtype=torch.float32)
    m_part = torch.empty((B, Hq, Nq, num_splits), **f32)
    l_part = torch.empty((B, Hq, Nq, num_splits), **f32)
    acc_part = torch.empty((B, Hq, Nq, num_splits, d), **f32)
    launch = {} if INTERPRET else {"num_warps": 4, "num_stages": 2}
    qk_mul, _, c2 = PLAIN.units(scale)  # scores in units of c (masks.py), as the forward's
    _decode_split_kv[(num_splits, B * kv_heads)](
        q,
        k,
        v,
        k if lens is None else lens,
        m_part,
        l_part,
        acc_part,
        qk_mul,
        c2,
        *q.stride(),
        *k.stride(),
        *v.stride(),
        kv_heads,
        G,
        Nq,
        Nk,
        chunk,
        num_splits,
        HEAD_DIM=d,
        HEAD_DIM_PADDED=dpad,
        CAUSAL=causal,
        HAS_SEQLENS=lens is not None,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        BLOCK_M=max(16, next_power_of_2(G * Nq)),
        BLOCK_N=block_k,
        **launch,
    )
    return _combine_splits(
        m_part, l_part, acc_part, q, dpad, num_splits, out_dtype, return_lse, return_partials
    )


def _combine_splits(
    m_part, l_part, acc_part, q, dpad, num_splits, out_dtype, return_lse, return_partials
):
    """Merge the splits (``_decode_combine``); out, then lse / partials if asked (also paged)."""
    B, Hq, Nq, d = q.shape
    out = torch.empty(q.shape, device=q.device, dtype=q.dtype)
    lse = torch.empty((B, Hq, Nq), device=q.device, dtype=torch.float32)
    _decode_combine[(B * Hq * Nq,)](
        m_part,
        l_part,
        acc_part,
        out,
        lse,
        *out.stride(),
        Hq,
        Nq,
        num_splits,
        HEAD_DIM=d,
        HEAD_DIM_PADDED=dpad,
        BLOCK_S=max(2, next_power_of_2(num_splits)),
    )
    result = [out.to(out_dtype)] + [lse] * bool(return_lse)
    result += [PartialAttention(m_part, l_part, acc_part)] * bool(return_partials)
    return result[0] if len(result) == 1 else tuple(result)
