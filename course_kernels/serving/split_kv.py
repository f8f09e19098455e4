"""Split-KV decoding (Flash-Decoding) in NumPy: the algorithm, without Triton or torch.

Chapter: "Applications" (book part two), section "Inference: prefill vs decode". The Triton
kernels that run the same algorithm are in :mod:`course_kernels.serving.decode`.

Layout (batch, heads, seq, head_dim), like PyTorch's SDPA:

    q: (B, Hq, Nq, d)   Nq = 1 in plain decoding, a few tokens in speculative decoding
    k, v: (B, kv_heads, Nk, d)   the KV cache; Hq = G * kv_heads (GQA; kv_heads = 1 is MQA)
    cache_seqlens: (B,) how many cached keys each sequence really has (<= Nk)

One decode step splits the cache's keys into ``num_splits`` chunks, computes a partial result
``(m, l, acc)`` per chunk with :func:`online_softmax.partial_attention`, and combines them with
the online-softmax :func:`online_softmax.merge` (each side rescaled to the common maximum) and
:func:`online_softmax.finalize`. It is the same merge that makes tiling work, applied across
chunks of keys instead of across steps of one loop.

Causal with Nq > 1 is *bottom-right* aligned, as in decoding: query i (of Nq) sees keys
j <= L - Nq + i, where L is the sequence's cache length.
"""

from __future__ import annotations

import numbers

import numpy as np

from .._validate import as_float_array, check_bool, check_positive_int, resolve_scale
from ..numpy.online_softmax import (
    PartialAttention,
    empty_partial,
    finalize,
    merge,
    partial_attention,
)

MAX_ROWS = 128  # G * Nq query rows share one tile; more than that is prefill, not decoding
# The merge of a row holds every split's partial at once (the Triton combine step loads them as one
# tile), so the split count is bounded; flash-attn's split-KV path stops at 128.
MAX_SPLITS = 256


def check_num_splits(num_splits) -> int:
    """``num_splits`` as an int in 1..MAX_SPLITS, or a clear TypeError / ValueError."""
    accepted = f"in 1..{MAX_SPLITS}"
    n = check_positive_int(num_splits, "num_splits", accepted)
    if n > MAX_SPLITS:
        raise ValueError(
            f"num_splits must be an integer {accepted} (the merge holds every split's partial "
            f"of a row at once; a split past the cache's end only adds an empty one); got {n}"
        )
    return n


def split_chunk(n_keys: int, num_splits: int, multiple: int = 1) -> int:
    """Keys per split: ceil(n_keys / num_splits), rounded up to a multiple of ``multiple``."""
    chunk = -(-n_keys // num_splits)
    return -(-chunk // multiple) * multiple


def visible_keys(lo, hi, lens, n_q, group, causal):
    """Mask (B, 1, G * Nq, hi - lo) of the keys [lo, hi) each query row may see."""
    j = np.arange(lo, hi)[None, None, None, :]  # (1, 1, 1, C)
    lens = lens[:, None, None, None]  # (B, 1, 1, 1)
    ok = j < lens
    if causal:
        i = np.tile(np.arange(n_q), group)[None, None, :, None]  # (1, 1, G * Nq, 1): token index
        ok = ok & (j <= lens - n_q + i)
    return ok


def split_kv_decode_numpy(
    q,
    k,
    v,
    num_splits: int = 4,
    cache_seqlens=None,
    causal=False,
    scale=None,
    chunk: int | None = None,
    return_partials: bool = False,
):
    """Split-KV decoding in NumPy: partial attention per chunk of keys, then the merge.

    Args:
        q: (B, Hq, Nq, d) queries.
        k: (B, kv_heads, Nk, d) key cache; Hq must be a multiple of kv_heads (GQA).
        v: (B, kv_heads, Nk, dv) value cache.
        num_splits: number of key chunks (1..MAX_SPLITS).
        cache_seqlens: (B,) valid cache length of each sequence (1..Nk); None = Nk.
        causal: bottom-right causal for Nq > 1 (query i sees keys j <= L - Nq + i).
        scale: multiplies Q K^T; None = 1/sqrt(d).
        chunk: keys per split; None = ceil(Nk / num_splits).
        return_partials: also return the partials, a :class:`PartialAttention` with
            m, l: (B, Hq, Nq, S) and acc: (B, Hq, Nq, S, dv).

    Returns ``(out, lse)``: (B, Hq, Nq, dv) and (B, Hq, Nq), in float64 for float64 input and
    float32 for float16/float32 input (the accumulator precision of ``partial_attention``).
    """
    q, k, v = (as_float_array(x, name) for x, name in ((q, "q"), (k, "k"), (v, "v")))
    B, Hq, Nq, d = check_shapes(q.shape, k.shape, v.shape, q.dtype, k.dtype, v.dtype)
    kv_heads, Nk, dv = k.shape[1], k.shape[2], v.shape[3]
    G = Hq // kv_heads
    num_splits = check_num_splits(num_splits)
    causal = check_bool(causal, "causal")
    scale = resolve_scale(scale, d)
    lens = check_seqlens(cache_seqlens, B, Nk)
    chunk = split_chunk(Nk, num_splits) if chunk is None else check_positive_int(chunk, "chunk")

    qg = q.reshape(
        B, kv_heads, G * Nq, d
    )  # (B, kv_heads, G*Nq, d): the group's rows share one KV head
    parts = []
    for s in range(num_splits):
        lo, hi = min(s * chunk, Nk), min((s + 1) * chunk, Nk)
        if lo == hi:  # a split past the end of the cache has seen nothing
            acc_t = np.float32 if q.dtype == np.float16 else q.dtype
            parts.append(empty_partial((B, kv_heads, G * Nq), dv, acc_t))
            continue
        mask = visible_keys(lo, hi, lens, Nq, G, causal)  # (B, 1, G*Nq, hi-lo)
        parts.append(partial_attention(qg, k[:, :, lo:hi], v[:, :, lo:hi], scale, mask=mask))
    total = parts[0]
    for p in parts[1:]:
        total = merge(total, p)  # the online-softmax merge: rescale both sides to the new max
    out, lse = finalize(total)  # (B, kv_heads, G*Nq, dv), (B, kv_heads, G*Nq)
    out, lse = out.reshape(B, Hq, Nq, dv), lse.reshape(B, Hq, Nq)
    if not return_partials:
        return out, lse
    stacked = PartialAttention(
        np.stack([p.m.reshape(B, Hq, Nq) for p in parts], axis=-1),  # (B, Hq, Nq, S)
        np.stack([p.l.reshape(B, Hq, Nq) for p in parts], axis=-1),
        np.stack([p.acc.reshape(B, Hq, Nq, dv) for p in parts], axis=-2),  # (B, Hq, Nq, S, dv)
    )
    return out, lse, stacked


def check_shapes(qs, ks, vs, qt, kt, vt):
    if not (len(qs) == len(ks) == len(vs) == 4):
        raise ValueError(
            f"q, k, v must have rank 4, layout (batch, heads, seq, head_dim); got "
            f"shapes {tuple(qs)}, {tuple(ks)}, {tuple(vs)}"
        )
    if not (qt == kt == vt):
        raise TypeError(f"q, k and v must share one dtype; got {qt}, {kt}, {vt}")
    B, Hq, Nq, d = qs
    if ks[0] != B or vs[0] != B:
        raise ValueError(f"q, k, v must share the batch size; got {qs[0]}, {ks[0]}, {vs[0]}")
    if ks[3] != d:
        raise ValueError(f"q and k must share the head dim; got {d} and {ks[3]}")
    if tuple(ks[:3]) != tuple(vs[:3]):
        raise ValueError(
            f"k and v must have the same (batch, heads, seq); got {tuple(ks)} and {tuple(vs)}"
        )
    if Hq % ks[1]:
        raise ValueError(
            f"the number of query heads must be a multiple of the number of key/value "
            f"heads (GQA/MQA); got Hq={Hq}, kv_heads={ks[1]}"
        )
    if (Hq // ks[1]) * Nq > MAX_ROWS:
        raise ValueError(
            f"decoding packs (Hq / kv_heads) * Nq = {(Hq // ks[1]) * Nq} query rows into "
            f"one tile; at most {MAX_ROWS}. For long queries (prefill) use "
            "flash_attention."
        )
    return B, Hq, Nq, d


def check_seqlens(cache_seqlens, B, Nk):
    if cache_seqlens is None:
        return np.full(B, Nk)
    if isinstance(cache_seqlens, numbers.Integral) and not isinstance(cache_seqlens, bool):
        cache_seqlens = [cache_seqlens] * B
    lens = np.asarray(cache_seqlens.cpu() if hasattr(cache_seqlens, "cpu") else cache_seqlens)
    if lens.shape != (B,) or not np.issubdtype(lens.dtype, np.integer):
        raise ValueError(f"cache_seqlens must be B={B} integers; got {lens.dtype} {lens.shape}")
    if lens.min() < 1 or lens.max() > Nk:
        raise ValueError(f"cache_seqlens must lie in 1..Nk={Nk}; got {lens.tolist()}")
    return lens.astype(np.int64)
