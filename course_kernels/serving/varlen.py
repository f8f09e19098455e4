"""Chunked prefill and variable-length batches in NumPy: masks, cu_seqlens, program maps.

Chapter: "Serving: KV cache, paged attention, chunked prefill" (book part two); exercise 11.

**Causal alignment.** When a block of ``Nq`` queries attends to ``Nk >= Nq`` keys and the queries
are the *last* ``Nq`` tokens of the keys' sequence (a decode step with a few new tokens, a chunk of
a prompt whose earlier chunks are already in the cache), query i is token ``Nk - Nq + i`` and may
see keys ``j <= i + Nk - Nq``: the mask is aligned to the *bottom-right* corner of the
``Nq x Nk`` score matrix. PyTorch's ``is_causal`` (and this course's ``causal=True``) aligns it
to the *top-left*, ``j <= i``, which is right only when ``Nq == Nk``; SDPA offers the other one
as ``torch.nn.attention.bias.causal_lower_right``, flash-attn uses it for every ``Nq != Nk``.

**Variable-length batches.** A batch of sequences of different lengths is packed along the
token axis, ``(total_tokens, heads, d)``, with ``cu_seqlens`` (B + 1,), the cumulative lengths
starting at 0: sequence b is rows ``cu_seqlens[b] : cu_seqlens[b + 1]``. A kernel launches one
program per (sequence, block of ``BLOCK_M`` queries) that holds at least one query, so no work is
spent on padding (:func:`varlen_programs`).
"""

from __future__ import annotations

import numpy as np

from .._validate import check_positive_int
from .._validate import resolve_scale
from ..numpy.reference import _softmax_times_v, causal_mask, check_alignment


def masked_attention(q, k, v, mask=None, scale=None):
    """float64 attention with a boolean mask (..., Nq, Nk) (True = visible); ``(out, lse)``."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    s = resolve_scale(scale, q.shape[-1]) * (q @ np.swapaxes(k, -1, -2))
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    return _softmax_times_v(s, v)


def chunked_prefill(q, k, v, chunk: int, alignment: str = "bottom_right", scale=None):
    """Causal attention of a prompt (..., N, d) computed ``chunk`` queries at a time.

    Chunk c holds queries ``[c * chunk, c * chunk + C)`` and attends to every key written so far,
    ``[0, c * chunk + C)`` (the cache plus its own keys): Nq = C, Nk = c * chunk + C. With
    ``alignment="bottom_right"`` the result equals causal attention over the whole prompt; with
    ``"top_left"`` (``is_causal`` applied to a chunk) every chunk after the first is wrong. The
    mask is :func:`course_kernels.numpy.reference.causal_mask`.
    """
    chunk = check_positive_int(chunk, "chunk")
    check_alignment(alignment)
    n = q.shape[-2]
    outs = []
    for lo in range(0, n, chunk):
        hi = min(lo + chunk, n)
        mask = causal_mask(hi - lo, hi, alignment)  # (C, lo + C): the cache and the chunk itself
        outs.append(
            masked_attention(q[..., lo:hi, :], k[..., :hi, :], v[..., :hi, :], mask, scale)[0]
        )
    return np.concatenate(outs, axis=-2)


def check_cu_seqlens(cu_seqlens, name: str = "cu_seqlens") -> np.ndarray:
    """``cu_seqlens`` as an int64 array: 1-D, at least two entries, starts at 0, non-decreasing."""
    cu = np.asarray(cu_seqlens)
    if cu.ndim != 1 or cu.size < 2 or not np.issubdtype(cu.dtype, np.integer):
        raise ValueError(f"{name} must be B + 1 integers (B >= 1); got {cu.dtype} {cu.shape}")
    if cu[0] != 0 or np.any(np.diff(cu) < 0):
        raise ValueError(f"{name} must start at 0 and never decrease; got {cu.tolist()}")
    return cu.astype(np.int64)


def varlen_programs(cu_seqlens_q, block_m: int) -> list[tuple[int, int]]:
    """The (sequence, query block) programs of a varlen launch: ceil(L_b / block_m) blocks for
    sequence b, none for an empty one. Block m of sequence b holds packed rows
    ``cu[b] + m * block_m`` up to ``min(cu[b] + (m + 1) * block_m, cu[b + 1])``."""
    cu = check_cu_seqlens(cu_seqlens_q, "cu_seqlens_q")
    block_m = check_positive_int(block_m, "block_m")
    lens = np.diff(cu)
    return [(b, m) for b, n in enumerate(lens.tolist()) for m in range(-(-n // block_m))]


def padded_programs(cu_seqlens_q, block_m: int) -> int:
    """Programs of the same batch padded to its longest sequence: B * ceil(max L / block_m)."""
    lens = np.diff(check_cu_seqlens(cu_seqlens_q, "cu_seqlens_q"))
    return len(lens) * -(-int(lens.max()) // check_positive_int(block_m, "block_m"))


def varlen_attention_numpy(q, k, v, cu_seqlens_q, cu_seqlens_k, causal=False, scale=None):
    """float64 attention of packed sequences: q (total_q, Hq, d), k, v (total_k, kv_heads, d).

    Sequence b's queries ``q[cu_q[b]:cu_q[b+1]]`` attend to its keys ``k[cu_k[b]:cu_k[b+1]]``
    only; ``causal`` is bottom-right aligned (flash-attn's varlen convention). GQA: Hq a
    multiple of kv_heads. Returns ``(out (total_q, Hq, dv), lse (total_q, Hq))``.
    """
    cu_q, cu_k = (
        check_cu_seqlens(cu_seqlens_q, "cu_seqlens_q"),
        check_cu_seqlens(cu_seqlens_k, "cu_seqlens_k"),
    )
    if len(cu_q) != len(cu_k) or cu_q[-1] != len(q) or cu_k[-1] != len(k):
        raise ValueError(
            f"cu_seqlens_q ({cu_q.tolist()}) and cu_seqlens_k ({cu_k.tolist()}) must describe "
            f"the same number of sequences and end at the packed lengths {len(q)} and {len(k)}"
        )
    G = q.shape[1] // k.shape[1]
    out = np.zeros(q.shape[:2] + v.shape[2:])
    lse = np.zeros(q.shape[:2])
    for b in range(len(cu_q) - 1):
        qs = np.swapaxes(q[cu_q[b] : cu_q[b + 1]], 0, 1)  # (Hq, Lq, d)
        ks, vs = (np.repeat(np.swapaxes(x[cu_k[b] : cu_k[b + 1]], 0, 1), G, 0) for x in (k, v))
        mask = causal_mask(qs.shape[1], ks.shape[1], "bottom_right") if causal else None
        o, l = masked_attention(qs, ks, vs, mask, scale)
        out[cu_q[b] : cu_q[b + 1]], lse[cu_q[b] : cu_q[b + 1]] = np.swapaxes(o, 0, 1), l.T
    return out, lse
