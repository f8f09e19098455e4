"""Exercise 11, serving maps: the chunked-prefill mask, the varlen program map and the paged lookup.

What a spec module holds and how it is used: ``course_kernels/grading/specs/__init__.py``. The
chapter is "Serving: KV cache, paged attention, chunked prefill"; the truths here are written
out in the builders (no ``course_kernels.serving`` code is used, so the exercise stands alone).
"""

# The solutions use the typing names the notebook's setup cell imports (Optional, Tuple).
# ruff: noqa: UP006, UP035, UP045

from __future__ import annotations

from typing import Tuple

import numpy as np

from ..builders import as_int, name_of
from ..feedback import Case, Fail, unpack
from . import source_of

NAME = "11_serving_maps"
TITLE = "Serving maps: chunked-prefill masks, cu_seqlens programs, paged lookups"
TIMEOUT = 20.0
TRITON = False

INTRO = (
    "Three small maps every serving kernel gets right or silently wrong. (1) Chunked prefill: a "
    "chunk of n_q prompt tokens attends to n_k >= n_q keys (the cache of the earlier chunks, then "
    "its own), so query i is token n_k - n_q + i and sees keys j <= i + n_k - n_q: the causal "
    "mask is aligned to the bottom-right corner, not the top-left one of PyTorch's is_causal. "
    "(2) A variable-length batch is packed end to end with cu_seqlens (B + 1 cumulative "
    "lengths, starting at 0); a kernel runs one program per (sequence, block of block_m "
    "queries) that holds at least one query. (3) A paged KV cache keeps tokens in pages of "
    "block_size slots; row b of the block table lists sequence b's pages in order, so token j "
    "is slot j % block_size of page block_table[b, j // block_size]."
)


# -- the solution (real code: the notebook's solution cells are these functions' source) -------
# fmt: off
def chunk_mask(n_q: int, n_k: int) -> np.ndarray:
    """Causal mask of the last n_q tokens of a sequence against all n_k of its keys.

    Returns:
        (n_q, n_k) bool, True where query i may see key j: j <= i + (n_k - n_q)
        (aligned to the bottom-right corner).
    """
    i = np.arange(n_q)[:, None]
    j = np.arange(n_k)[None, :]
    return j <= i + (n_k - n_q)


def varlen_programs(cu_seqlens: np.ndarray, block_m: int) -> list[Tuple[int, int]]:
    """The (sequence, query block) pairs of a varlen launch, sequence by sequence.

    Args:
        cu_seqlens: (B + 1,) ints, cu_seqlens[0] = 0; sequence b is packed rows
            cu_seqlens[b] .. cu_seqlens[b + 1] - 1 (it may be empty).
        block_m: queries per program.
    Returns:
        [(b, m), ...]: every block m of every sequence b that holds at least one query.
    """
    programs = []
    for b in range(len(cu_seqlens) - 1):
        length = int(cu_seqlens[b + 1] - cu_seqlens[b])
        for m in range((length + block_m - 1) // block_m):  # ceil: the last block may be partial
            programs.append((b, m))
    return programs


def gather_sequence(
    pages: np.ndarray, block_table: np.ndarray, cache_seqlens: np.ndarray, b: int
) -> np.ndarray:
    """The keys of sequence b, in token order, read from a paged cache.

    Args:
        pages: (num_blocks, block_size, kv_heads, d) the page pool.
        block_table: (B, max_blocks) ints; row b lists sequence b's pages in order (entries
            past its last page are -1).
        cache_seqlens: (B,) tokens of each sequence.
        b: which sequence.
    Returns:
        (L, kv_heads, d) with L = cache_seqlens[b]: row j is token j.
    """
    block_size = pages.shape[1]
    j = np.arange(int(cache_seqlens[b]))
    return pages[block_table[b, j // block_size], j % block_size]
# fmt: on


def solution_source(name: str) -> str:
    return source_of(SOLUTIONS, name)


SOLUTIONS = [chunk_mask, varlen_programs, gather_sequence]

EXERCISES = [
    {
        "name": "chunk_mask",
        "text": (
            "The causal mask of a chunk: n_q queries that are the last n_q of n_k keys. Query i "
            "sees keys j <= i + (n_k - n_q). With n_q = n_k it is the usual lower triangle."
        ),
    },
    {
        "name": "varlen_programs",
        "text": (
            "One program per block of `block_m` queries of each sequence: ceil(L_b / block_m) "
            "for sequence b, none for an empty one. L_b = cu_seqlens[b + 1] - cu_seqlens[b]. Any "
            "order is accepted; no duplicates."
        ),
    },
    {
        "name": "gather_sequence",
        "text": (
            "Read sequence b's keys through the block table: token j is "
            "pages[block_table[b, j // block_size], j % block_size]. Return exactly "
            "cache_seqlens[b] rows."
        ),
    },
]

VISIBLE = {
    "chunk_mask": [
        {"name": "second chunk of four: n_q=4, n_k=8", "n_q": 4, "n_k": 8, "points": 2},
        {"name": "one new token sees every key", "n_q": 1, "n_k": 6},
        {"name": "n_q = n_k: the lower triangle", "n_q": 5, "n_k": 5},
    ],
    "varlen_programs": [
        {"name": "three sequences", "cu": [0, 5, 12, 13], "block_m": 4, "points": 2},
        {
            "name": "an empty sequence gets no program",
            "cu": [0, 3, 3, 9],
            "block_m": 4,
            "points": 2,
        },
        {"name": "lengths that are multiples of block_m", "cu": [0, 8, 16], "block_m": 8},
    ],
    "gather_sequence": [
        {
            "name": "pages in random order",
            "lens": [7, 12],
            "block_size": 3,
            "b": 1,
            "seed": 1,
            "points": 2,
        },  # fmt: skip
        {"name": "a partly filled last page", "lens": [10, 5], "block_size": 4, "b": 0, "seed": 2},
        {"name": "pages of one token", "lens": [3, 4], "block_size": 1, "b": 1, "seed": 3},
    ],
}

HIDDEN = {
    "chunk_mask": [
        {"name": "hidden: third chunk, n_q=3, n_k=9", "n_q": 3, "n_k": 9, "points": 1},
        {"name": "hidden: n_q=16, n_k=17", "n_q": 16, "n_k": 17, "points": 1},
    ],
    "varlen_programs": [
        {
            "name": "hidden: empty sequences at both ends",
            "cu": [0, 0, 40, 41, 41],
            "block_m": 16,
            "points": 1,
        },  # fmt: skip
        {"name": "hidden: one long sequence", "cu": [0, 300], "block_m": 64, "points": 1},
    ],
    "gather_sequence": [
        {
            "name": "hidden: three sequences, pages of 16",
            "lens": [40, 17, 33],
            "block_size": 16,
            "b": 2,
            "seed": 21,
            "points": 1,
        },  # fmt: skip
        {
            "name": "hidden: a sequence of one token",
            "lens": [9, 1],
            "block_size": 4,
            "b": 1,
            "seed": 22,
            "points": 1,
        },  # fmt: skip
    ],
}


# -- tests: builders and the mistakes they name ------------------------------------------------
def _bottom_right(n_q, n_k, shift=0, offset=None):
    off = n_k - n_q if offset is None else offset
    return np.arange(n_k)[None, :] <= np.arange(n_q)[:, None] + off + shift


def build_chunk_mask(params) -> Case:
    n_q, n_k = int(params["n_q"]), int(params["n_k"])
    want = _bottom_right(n_q, n_k)
    wrong = {
        "the mask is aligned to the top-left corner (j <= i, PyTorch's is_causal): query i of "
        "a chunk is token n_k - n_q + i, so it sees j <= i + (n_k - n_q)": _bottom_right(n_q, n_k, offset=0),
        "the diagonal is off by one: query i sees key i + (n_k - n_q), itself (use <=, "
        "not <)": _bottom_right(n_q, n_k, shift=-1),
        "off by one the other way: query i sees one key in its future": _bottom_right(n_q, n_k, shift=1),
        "the offset has the wrong sign: it is n_k - n_q, not n_q - n_k": _bottom_right(
            n_q, n_k, offset=n_q - n_k
        ),
    }  # fmt: skip

    def judge(out, outcome):
        got = np.asarray(out)
        if got.shape == (n_k, n_q) and n_q != n_k:
            raise Fail(
                f"shape {got.shape} is transposed: rows are queries, (n_q, n_k) = {want.shape}"
            )
        if got.shape != want.shape:
            raise Fail(f"expected shape (n_q, n_k) = {want.shape}; got {got.shape}")
        if got.dtype != bool:
            raise Fail(f"should be a bool array; got dtype {got.dtype}")
        if np.array_equal(got, want):
            return f"{int(want.sum())} visible (query, key) pairs, bottom-right aligned"
        for why, mask in wrong.items():
            if np.array_equal(got, mask):
                raise Fail(why)
        bad = np.argwhere(got != want)[0]
        raise Fail(
            f"query {bad[0]}, key {bad[1]}: got {bool(got[tuple(bad)])}; query i sees keys "
            f"j <= i + (n_k - n_q) = i + {n_k - n_q}"
        )

    return Case("chunk_mask", name_of(params, f"n_q={n_q}, n_k={n_k}"),
                float(params.get("points", 1)), "chunk_mask", (n_q, n_k), {}, judge)  # fmt: skip


def _int(x, what):
    return int(x) if isinstance(x, np.integer) else as_int(x, what)  # np.int64 from NumPy code


def _programs(cu, block_m, count):
    return sorted(
        (b, m) for b in range(len(cu) - 1) for m in range(count(cu[b + 1] - cu[b], block_m))
    )


def build_varlen_programs(params) -> Case:
    cu, block_m = [int(x) for x in params["cu"]], int(params["block_m"])
    lens = np.diff(cu)
    want = _programs(cu, block_m, lambda n, m: -(-n // m))
    wrong = {
        "an empty sequence got a program (it has no query: a kernel would read the next "
        "sequence's rows or write nothing; launch none)": _programs(
            cu, block_m, lambda n, m: max(1, -(-n // m))
        ),
        "the last, partial block of a sequence is missing: round the number of blocks up, "
        "ceil(L / block_m)": _programs(cu, block_m, lambda n, m: n // m),
        "off by one in cu_seqlens: the length of sequence b is cu_seqlens[b + 1] - "
        "cu_seqlens[b], and there are B = len(cu_seqlens) - 1 sequences": sorted(
            (b, m) for b in range(len(cu)) for m in range(-(-cu[b] // block_m))
        ),
        "every sequence got the longest one's blocks, as if padded: launch only the blocks a "
        "sequence has": sorted(
            (b, m) for b in range(len(lens)) for m in range(-(-int(lens.max()) // block_m))
        ),
    }

    def judge(out, outcome):
        if not isinstance(out, (tuple, list)):
            raise Fail(f"should return a list of (sequence, block) pairs; got {type(out).__name__}")
        got = []
        for item in out:
            b, m = unpack(item, 2, "(sequence, block)")
            got.append((_int(b, "sequence"), _int(m, "block")))
        if len(set(got)) != len(got):
            raise Fail("some programs appear twice: each (sequence, block) runs once")
        got = sorted(got)
        if got == want:
            return f"{len(want)} programs, none empty"
        for why, programs in wrong.items():
            if got == programs:
                raise Fail(why)
        raise Fail(f"expected {len(want)} programs {want[:6]}{'...' if len(want) > 6 else ''}; "
                   f"got {len(got)}: {got[:6]}{'...' if len(got) > 6 else ''}")  # fmt: skip

    return Case("varlen_programs", name_of(params, f"cu_seqlens={cu}, block_m={block_m}"),
                float(params.get("points", 1)), "varlen_programs",
                (np.array(cu, dtype=np.int64), block_m), {}, judge)  # fmt: skip


def paged_inputs(params):
    """A page pool holding the sequences in random page order, its table (-1 padded), lengths."""
    rng = np.random.default_rng(int(params["seed"]))
    lens, P = [int(n) for n in params["lens"]], int(params["block_size"])
    need = [-(-n // P) for n in lens]
    order = rng.permutation(sum(need) + 2)  # two spare pages nobody owns
    table = np.full((len(lens), max(need) + 1), -1, dtype=np.int64)
    at = 0
    for b, n in enumerate(need):
        table[b, :n] = order[at : at + n]
        at += n
    pages = rng.standard_normal((len(order), P, 2, 4))
    return pages, table, np.array(lens, dtype=np.int64)


def build_gather_sequence(params) -> Case:
    pages, table, lens = paged_inputs(params)
    b, P = int(params["b"]), int(params["block_size"])
    j = np.arange(lens[b])
    want = pages[table[b, j // P], j % P]
    wrong = {
        "the pages were read in sorted order: the block table lists them in token order, which "
        "is not the order of their ids": pages[np.sort(table[b, : -(-lens[b] // P)])[j // P], j % P],
        "the block table was ignored: token j is in page block_table[b, j // block_size], not "
        "page j // block_size": pages[np.minimum(j // P, len(pages) - 1), j % P],
        "// and % are swapped: the page is block_table[b, j // block_size], the slot "
        "j % block_size": pages[table[b, np.minimum(j % P, table.shape[1] - 1)],
                                np.minimum(j // P, P - 1)],
    }  # fmt: skip

    def judge(out, outcome):
        got = np.asarray(out)
        if got.ndim == 3 and got.shape[0] == -(-lens[b] // P) * P and got.shape[0] != lens[b]:
            raise Fail(
                f"returned {got.shape[0]} rows, whole pages: sequence {b} has {lens[b]} tokens; "
                "the rest of its last page is empty (or another sequence's future)"
            )
        if got.shape != want.shape:
            raise Fail(f"expected shape (L, kv_heads, d) = {want.shape}; got {got.shape}")
        if np.array_equal(got, want):
            return f"{lens[b]} tokens from {-(-lens[b] // P)} pages, in order"
        for why, x in wrong.items():
            if x.shape == got.shape and np.array_equal(got, x):
                raise Fail(why)
        bad = int(np.argwhere((got != want).any(axis=(1, 2)))[0, 0])
        raise Fail(
            f"token {bad} is wrong: it lives in page block_table[{b}, {bad // P}] = "
            f"{table[b, bad // P]}, slot {bad % P}"
        )

    return Case("gather_sequence", name_of(params, f"lens={lens.tolist()}, b={b}"),
                float(params.get("points", 1)), "gather_sequence",
                (pages, table, lens, b), {}, judge)  # fmt: skip


BUILDERS = {
    "chunk_mask": build_chunk_mask,
    "varlen_programs": build_varlen_programs,
    "gather_sequence": build_gather_sequence,
}
