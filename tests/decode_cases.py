"""Shared inputs and float64 truths for the split-KV tests (test_split_kv.py, test_decode.py)."""

import numpy as np

from course_kernels import attention_naive, attention_reference


def make_cache(rng, B=2, Hq=4, kv_heads=2, Nq=1, Nk=37, d=16, dtype=np.float64, spread=1.0):
    q = (spread * rng.standard_normal((B, Hq, Nq, d))).astype(dtype)
    k = rng.standard_normal((B, kv_heads, Nk, d)).astype(dtype)
    v = rng.standard_normal((B, kv_heads, Nk, d)).astype(dtype)
    return q, k, v


def reference(q, k, v, lens=None, causal=False):
    """float64 attention per sequence and token: each query sees keys j <= L - Nq + i (causal)."""
    B, Hq, Nq, _ = q.shape
    G = Hq // k.shape[1]
    k, v = np.repeat(k, G, axis=1), np.repeat(v, G, axis=1)  # (B, Hq, Nk, d)
    lens = [k.shape[2]] * B if lens is None else lens
    out = np.zeros(q.shape[:3] + (v.shape[-1],))
    lse = np.zeros(q.shape[:3])
    for b in range(B):
        for i in range(Nq):
            n = lens[b] - Nq + i + 1 if causal else lens[b]
            o, l = attention_reference(q[b, :, i : i + 1], k[b, :, :n], v[b, :, :n])
            out[b, :, i], lse[b, :, i] = o[:, 0], l[:, 0]
    return out, lse


def naive(q, k, v):
    """Standard attention in the inputs' own dtype (the error budget of testing.py)."""
    G = q.shape[1] // k.shape[1]
    return attention_naive(q, np.repeat(k, G, axis=1), np.repeat(v, G, axis=1))


def peaked(rng, Nk=64, d=16):
    """One sequence whose later keys score far higher: chunk maxima differ by ~10 or more."""
    q = np.ones((1, 2, 1, d))
    k = rng.standard_normal((1, 1, Nk, d)) * 0.1 + np.linspace(0, 3, Nk)[None, None, :, None]
    v = rng.standard_normal((1, 1, Nk, d))
    return q, k, v


def make_paged(
    rng, lens, B=None, Hq=4, kv_heads=2, Nq=1, d=16, block_size=5, spare=3, dtype=np.float64, pad=-1
):
    """A page pool holding ``len(lens)`` sequences in pages of ``block_size`` tokens, assigned in
    random order (as after other sequences finished), a block table padded with ``pad`` and one
    spare column, and the contiguous cache it describes: (q, k_pages, v_pages, table, lens, k, v).
    """
    lens = np.asarray(lens)
    B = len(lens)
    need = [-(-int(n) // block_size) for n in lens]
    num_blocks = sum(need) + spare
    order = rng.permutation(num_blocks)
    table = np.full((B, max(need) + 1), pad, dtype=np.int32)
    at = 0
    for b, n in enumerate(need):
        table[b, :n] = order[at : at + n]
        at += n
    k_pages = rng.standard_normal((num_blocks, block_size, kv_heads, d)).astype(dtype)
    v_pages = rng.standard_normal((num_blocks, block_size, kv_heads, d)).astype(dtype)
    q = rng.standard_normal((B, Hq, Nq, d)).astype(dtype)
    Nk = int(lens.max())
    k = np.zeros((B, kv_heads, Nk, d), dtype)
    v = np.zeros((B, kv_heads, Nk, d), dtype)
    for b in range(B):
        for j in range(int(lens[b])):
            page, slot = table[b, j // block_size], j % block_size
            k[b, :, j], v[b, :, j] = k_pages[page, slot], v_pages[page, slot]
    return q, k_pages, v_pages, table, lens, k, v
