"""Paged KV caches in NumPy: pages, block tables, and split-KV decoding read through them.

Chapter: "Serving: KV cache, paged attention, chunked prefill" (book part two). The Triton
kernel that reads the same layout is :func:`course_kernels.serving.paged_decode.flash_decode_paged`.

A contiguous cache gives every sequence one slab of ``max_len`` slots, reserved up front. A
*paged* cache (vLLM's PagedAttention, Kwon et al. 2023) cuts the memory into pages of
``block_size`` token slots and gives a sequence a new page only when its last one is full; a
*block table* lists, per sequence, which pages hold its tokens, in order. The layout here is
flash-attn's ``flash_attn_with_kvcache(..., block_table=...)``, which vLLM's FlashAttention
backend passes its cache in:

    k_pages, v_pages: (num_blocks, block_size, kv_heads, d)   every page of the pool
    block_table: (B, max_blocks) integer page ids; row b lists sequence b's pages in order
    cache_seqlens: (B,) tokens of each sequence (1 .. max_blocks * block_size)

Token ``j`` of sequence ``b`` lives in page ``block_table[b, j // block_size]`` at slot
``j % block_size``. Only the first ``ceil(L_b / block_size)`` entries of a row are read; the
rest may hold anything (engines pad with 0 or -1). Nothing else changes: the split-KV
algorithm of :mod:`.split_kv` runs unchanged on keys fetched through the table.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .._validate import as_float_array, check_bool, check_positive_int, resolve_scale
from ..numpy.online_softmax import PartialAttention, empty_partial, finalize, merge
from ..numpy.online_softmax import partial_attention
from .split_kv import check_num_splits, check_shapes, split_chunk, visible_keys


def check_block_table(block_table, cache_seqlens, num_blocks: int, block_size: int, batch: int):
    """Validate a block table and the sequence lengths; return them as int64 arrays.

    Raises ``ValueError`` naming the sequence when a length is out of 1 .. max_blocks *
    block_size, or when a page id that will be read is outside 0 .. num_blocks - 1.
    """
    table = np.asarray(block_table)
    if table.ndim != 2 or table.shape[0] != batch or not np.issubdtype(table.dtype, np.integer):
        raise ValueError(
            f"block_table must be an integer array of shape (B={batch}, max_blocks); got "
            f"{table.dtype} {table.shape}"
        )
    if cache_seqlens is None:
        raise ValueError("a paged cache needs cache_seqlens: (B,) tokens of each sequence")
    lens = np.asarray(cache_seqlens)
    if lens.shape != (batch,) or not np.issubdtype(lens.dtype, np.integer):
        raise ValueError(f"cache_seqlens must be B={batch} integers; got {lens.dtype} {lens.shape}")
    capacity = table.shape[1] * block_size
    for b, n in enumerate(lens.tolist()):
        if not 1 <= n <= capacity:
            raise ValueError(
                f"cache_seqlens[{b}] = {n}: the table holds {table.shape[1]} pages of "
                f"{block_size} tokens, so a length must lie in 1..{capacity}"
            )
        used = table[b, : -(-n // block_size)]
        bad = used[(used < 0) | (used >= num_blocks)]
        if bad.size:
            raise ValueError(
                f"block_table[{b}] points at page {int(bad[0])}, outside the pool's pages "
                f"0..{num_blocks - 1} (it is read: sequence {b} has {n} tokens)"
            )
    return table.astype(np.int64), lens.astype(np.int64)


def gather_keys(pages, block_table, positions):
    """Rows of ``pages`` at logical ``positions`` (C,) of each sequence: (B, kv_heads, C, d).

    The one line that makes a cache paged: token j is ``pages[table[b, j // P], j % P]``.
    Positions past a row's table read its last entry's page, an entry outside the pool (a pad
    of -1) page 0: either way the caller masks them.
    """
    P = pages.shape[1]
    blk = np.minimum(positions // P, block_table.shape[1] - 1)
    page = block_table[:, blk]  # (B, C) page ids
    page = np.where((page >= 0) & (page < pages.shape[0]), page, 0)  # unused entries: any page
    return pages[page, positions % P].transpose(0, 2, 1, 3)  # (B, C, kvh, d) -> (B, kvh, C, d)


def gather_cache(k_pages, v_pages, block_table, cache_seqlens):
    """The contiguous cache a block table describes: k, v (B, kv_heads, max_len, d), zeros past
    each sequence's length (what a test compares the paged result against)."""
    table, lens = check_block_table(
        block_table, cache_seqlens, k_pages.shape[0], k_pages.shape[1], len(block_table)
    )
    pos = np.arange(int(lens.max()))
    keep = (pos[None, :] < lens[:, None])[:, None, :, None]  # (B, 1, N, 1)
    k = np.where(keep, gather_keys(np.asarray(k_pages), table, pos), 0)
    v = np.where(keep, gather_keys(np.asarray(v_pages), table, pos), 0)
    return k, v


def split_kv_decode_paged_numpy(
    q,
    k_pages,
    v_pages,
    block_table,
    cache_seqlens,
    num_splits: int = 4,
    causal=False,
    scale=None,
    chunk: int | None = None,
    return_partials: bool = False,
):
    """Split-KV decoding with the keys and values read through a block table (NumPy).

    Args:
        q: (B, Hq, Nq, d) new queries.
        k_pages, v_pages: (num_blocks, block_size, kv_heads, d[v]) the page pool.
        block_table: (B, max_blocks) integer page ids, in token order.
        cache_seqlens: (B,) tokens of each sequence, 1 .. max_blocks * block_size.
        num_splits, causal, scale, chunk, return_partials: as
            :func:`course_kernels.serving.split_kv.split_kv_decode_numpy`; the splits cut the
            table's capacity max_blocks * block_size into chunks of logical positions.

    Returns ``(out, lse)`` [, partials], as ``split_kv_decode_numpy`` on the gathered cache.
    """
    q, kp, vp = (
        as_float_array(x, n) for x, n in ((q, "q"), (k_pages, "k_pages"), (v_pages, "v_pages"))
    )
    if kp.ndim != 4 or vp.shape[:3] != kp.shape[:3]:
        raise ValueError(
            "k_pages and v_pages must be (num_blocks, block_size, kv_heads, d) with the same "
            f"first three dims; got {kp.shape} and {vp.shape}"
        )
    num_blocks, P, kv_heads, _ = kp.shape
    B, Hq, Nq, d = check_shapes(
        q.shape, (q.shape[0], kv_heads, P, kp.shape[3]), (q.shape[0], kv_heads, P, vp.shape[3]),
        q.dtype, kp.dtype, vp.dtype,
    )  # fmt: skip
    table, lens = check_block_table(block_table, cache_seqlens, num_blocks, P, B)
    G, dv = Hq // kv_heads, vp.shape[3]
    num_splits = check_num_splits(num_splits)
    causal, scale = check_bool(causal, "causal"), resolve_scale(scale, d)
    capacity = table.shape[1] * P
    chunk = (
        split_chunk(capacity, num_splits) if chunk is None else check_positive_int(chunk, "chunk")
    )

    qg = q.reshape(B, kv_heads, G * Nq, d)  # the group's rows share one KV head
    parts = []
    for s in range(num_splits):
        lo, hi = min(s * chunk, capacity), min((s + 1) * chunk, capacity)
        if lo == hi:
            acc_t = np.float32 if q.dtype == np.float16 else q.dtype
            parts.append(empty_partial((B, kv_heads, G * Nq), dv, acc_t))
            continue
        pos = np.arange(lo, hi)
        k, v = gather_keys(kp, table, pos), gather_keys(vp, table, pos)  # (B, kvh, C, d)
        mask = visible_keys(lo, hi, lens, Nq, G, causal)  # keys past L_b are masked here
        parts.append(partial_attention(qg, k, v, scale, mask=mask))
    total = parts[0]
    for p in parts[1:]:
        total = merge(total, p)
    out, lse = finalize(total)
    out, lse = out.reshape(B, Hq, Nq, dv), lse.reshape(B, Hq, Nq)
    if not return_partials:
        return out, lse
    stacked = PartialAttention(
        np.stack([p.m.reshape(B, Hq, Nq) for p in parts], axis=-1),
        np.stack([p.l.reshape(B, Hq, Nq) for p in parts], axis=-1),
        np.stack([p.acc.reshape(B, Hq, Nq, dv) for p in parts], axis=-2),
    )
    return out, lse, stacked


# -- the allocator: how block tables come about ------------------------------------------------
@dataclass
class PageAllocator:
    """A pool of ``num_blocks`` pages of ``block_size`` slots, handed out one page at a time.

    ``append(seq, n)`` adds n tokens to a sequence, taking a free page whenever its last page is
    full; ``free(seq)`` returns its pages to the pool. A sequence that starts after others have
    finished gets their pages back, so its table is not in order: that is the point.
    """

    num_blocks: int
    block_size: int
    tables: dict = field(default_factory=dict)  # seq -> list of page ids
    lengths: dict = field(default_factory=dict)  # seq -> tokens
    free_pages: list = field(default_factory=list)

    def __post_init__(self):
        check_positive_int(self.num_blocks, "num_blocks")
        check_positive_int(self.block_size, "block_size")
        self.free_pages = list(range(self.num_blocks - 1, -1, -1))  # pop() gives 0, 1, 2, ...

    def append(self, seq, n_tokens: int = 1):
        """Add ``n_tokens`` tokens to ``seq``; returns the (page, slot) of each, in order."""
        n_tokens = check_positive_int(n_tokens, "n_tokens")
        table, n = self.tables.get(seq, []), self.lengths.get(seq, 0)
        new_pages = -(-(n + n_tokens) // self.block_size) - len(table)
        if new_pages > len(self.free_pages):  # refused whole: nothing taken, nothing changed
            raise MemoryError(
                f"sequence {seq!r} needs {new_pages} more page(s) for {n_tokens} token(s), "
                f"{len(self.free_pages)} free"
            )
        self.tables[seq] = table
        slots = []
        for j in range(n, n + n_tokens):
            if j % self.block_size == 0:
                table.append(self.free_pages.pop())
            slots.append((table[-1], j % self.block_size))
        self.lengths[seq] = n + n_tokens
        return slots

    def free(self, seq):
        """Return every page of ``seq`` to the pool."""
        self.free_pages.extend(reversed(self.tables.pop(seq)))
        del self.lengths[seq]

    def block_table(self, seqs, pad: int = -1):
        """``(table (B, max_blocks) int32, cache_seqlens (B,) int32)`` for ``seqs``, padded."""
        width = max(len(self.tables[s]) for s in seqs)
        table = np.full((len(seqs), width), pad, dtype=np.int32)
        for b, s in enumerate(seqs):
            table[b, : len(self.tables[s])] = self.tables[s]
        return table, np.array([self.lengths[s] for s in seqs], dtype=np.int32)


def reserved_slots(lengths, max_len: int) -> int:
    """Token slots a contiguous cache reserves: ``max_len`` per sequence, whatever its length."""
    return len(lengths) * check_positive_int(max_len, "max_len")


def paged_slots(lengths, block_size: int) -> int:
    """Token slots a paged cache holds: whole pages, ceil(L / block_size) per sequence."""
    block_size = check_positive_int(block_size, "block_size")
    return sum(-(-int(n) // block_size) * block_size for n in lengths)
