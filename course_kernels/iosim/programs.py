"""An IO simulator: a two-level memory (HBM and an SRAM of M elements) that counts traffic.

Chapter: "IO complexity" (book/chapters/05_io_complexity.ipynb).

Modules: :mod:`.memory` (the memory: :class:`TwoLevelMemory`, :class:`Virtual`,
:class:`IOCount`, :class:`SRAMOverflowError`); this module runs the programs against it and
holds their closed forms, and every name of that module is importable from here.

:class:`TwoLevelMemory` holds named arrays in HBM. ``load`` copies rows of one into SRAM and
counts the elements read; ``store`` writes rows back and counts the elements written; ``alloc``
reserves on-chip scratch (an accumulator) without traffic; ``free`` releases SRAM. A load or
alloc that would make the resident tiles exceed M raises :class:`SRAMOverflowError`.

The model (the article's, and the paper's Theorem 2 up to constants): blocks of Q, K, V and O
are charged to M; the score tile S/P and the per-row statistics m, l live in registers and are
not charged, unless ``model="paper"`` is asked for, which charges the block_q x block_k score tile and
uses the paper's block_k = M/4d, block_q = min(block_k, d). Elements are counted, not bytes.

Three programs run against it: standard attention (three passes that write S and P),
FlashAttention's loop order (FA1, outer loop over K/V) and FlashAttention-2's (FA2, outer loop
over Q). What is simulated and what is charged: every outer-loop iteration and the first of
each run of identical inner-loop iterations run against the memory (loads, stores, capacity
checks); the remaining identical inner iterations are charged by multiplying the measured
traffic of the first (``exact=True`` simulates every iteration; the tests check both agree).
A student's own tiled function runs through :func:`count_io` on real data.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from .._validate import check_positive_int
from .._compat import renamed_kwargs
from ..numpy.blocks import _block_size, _paper_block_sizes
from .memory import (  # re-exported: the chapters and exercises import them from here
    IOCount as IOCount,
    SRAMOverflowError as SRAMOverflowError,
    TwoLevelMemory,
    Virtual,
    _rows as _rows,
)

MODELS = ("article", "paper")


def _check_sizes(n: int, d: int, n_k: int | None, dv: int | None):
    n = check_positive_int(n, "N")
    d = check_positive_int(d, "d")
    n_k = n if n_k is None else check_positive_int(n_k, "n_k")
    dv = d if dv is None else check_positive_int(dv, "dv")
    return n, d, n_k, dv


def _runs(start: int, stop: int, block: int):
    """Split [start, stop) into (count, size) runs of equal-size blocks: full ones, then the tail."""
    length = max(0, stop - start)
    full, tail = divmod(length, block)
    return [(full, block)] + ([(1, tail)] if tail else [])


# -- standard attention ---------------------------------------------------------------------
def standard_attention_io(N: int, d: int, n_k: int | None = None, dv: int | None = None) -> IOCount:
    """Standard attention's HBM traffic, by simulation: three passes that write S and P.

    Pass 1 reads Q, K and writes S = Q K^T; pass 2 reads S and writes P = softmax(S); pass 3
    reads P, V and writes O = P V (FlashAttention Alg. 0). Each pass moves each matrix once, the
    textbook count 4N^2 + 4Nd; SRAM is not bounded here, because a real, bounded tiled matmul
    only re-reads more. (PyTorch adds a separate scale pass: 6N^2, measured in the book.)
    """
    n_q, d, n_k, dv = _check_sizes(N, d, n_k, dv)
    mem = TwoLevelMemory(
        None,
        Q=Virtual((n_q, d)),
        K=Virtual((n_k, d)),
        V=Virtual((n_k, dv)),
        S=Virtual((n_q, n_k)),
        P=Virtual((n_q, n_k)),
        O=Virtual((n_q, dv)),
    )
    every = slice(None)
    q, k = mem.load("Q", every), mem.load("K", every)  # pass 1: S = Q K^T
    mem.store("S", every)
    mem.free(q, k)
    s = mem.load("S", every)  # pass 2: P = softmax(S)
    mem.store("P", every)
    mem.free(s)
    p, v = mem.load("P", every), mem.load("V", every)  # pass 3: O = P V
    mem.store("O", every)
    mem.free(p, v)
    return mem.count()


def standard_attention_io_formula(N: int, d: int, n_k: int | None = None, dv: int | None = None):
    """Closed form of :func:`standard_attention_io`: (reads, writes). Nq = Nk = N, dv = d: 4N^2 + 4Nd."""
    n_q, d, n_k, dv = _check_sizes(N, d, n_k, dv)
    reads = n_q * d + n_k * d + 2 * n_q * n_k + n_k * dv
    writes = 2 * n_q * n_k + n_q * dv
    return reads, writes


# -- flash attention ------------------------------------------------------------------------
def flash_block_sizes(d: int, M: int, model: str = "article") -> tuple[int, int]:
    """(block_q, block_k) of a model: "article" uses B = floor(M/4d) for both; "paper" has
    block_k = that and block_q = min(block_k, d)."""
    _check_model(model)
    m = check_positive_int(M, "sram_elements")
    return _flash_block_sizes(check_positive_int(d, "head_dim"), m, model)


def _check_model(model) -> None:
    if model not in MODELS:
        raise ValueError(f"model must be one of {MODELS}; got {model!r}")


def _flash_block_sizes(d: int, M: int, model: str) -> tuple[int, int]:
    """:func:`flash_block_sizes` for checked arguments."""
    if model == "article":
        b = _block_size(M, d)
        return b, b
    pb = _paper_block_sizes(M, d)
    return pb.block_q, pb.block_k


def flash_attention_io(
    N: int,
    d: int,
    M: int,
    loop_order: str = "fa2",
    causal: bool = False,
    model: str = "article",
    n_k: int | None = None,
    dv: int | None = None,
    exact: bool = False,
) -> IOCount:
    """Flash Attention's HBM traffic under an SRAM of M elements, by simulation.

    Args:
        N: query length (Nq); ``n_k`` the key length (default N).
        d: head dim; ``dv`` the value width (default d).
        M: SRAM capacity in elements.
        loop_order: "fa2" (outer loop over Q blocks) or "fa1" (outer loop over K/V blocks).
        causal: skip key blocks a query block cannot see (PyTorch ``is_causal``).
        model: "article" (blocks of B = block_size(M, d); S in registers) or "paper"
            (block_q x block_k score tile charged to SRAM too).
        exact: simulate every inner iteration instead of charging repetitions.
    """
    n_q, d, n_k, dv = _check_sizes(N, d, n_k, dv)
    M = check_positive_int(M, "M")  # checked once: the helpers below trust it
    if loop_order not in ("fa1", "fa2"):
        raise ValueError(f"loop_order must be 'fa1' or 'fa2'; got {loop_order!r}")
    _check_model(model)
    block_q, block_k = _flash_block_sizes(d, M, model)
    mem = TwoLevelMemory._trusted(
        M,
        Q=Virtual((n_q, d)),
        K=Virtual((n_k, d)),
        V=Virtual((n_k, dv)),
        O=Virtual((n_q, dv)),
        L=Virtual((n_q,)),
        m=Virtual((n_q,)),
    )
    program = _fa2_program if loop_order == "fa2" else _fa1_program
    program(mem, n_q, n_k, block_q, block_k, bool(causal), model == "paper", exact)
    return mem.count()


def _fa2_program(mem, n_q, n_k, block_q, block_k, causal, charge_scores, exact):
    """FlashAttention-2 Alg. 1 against the memory (article model: Q_i, O_i, K_j, V_j in SRAM)."""
    dv = mem.hbm["V"].shape[-1]
    for i0 in range(0, n_q, block_q):  # line 3
        i1 = min(i0 + block_q, n_q)
        q_i = mem.load("Q", slice(i0, i1))  # line 4
        o_i = mem.alloc((i1 - i0, dv))  # line 5: the accumulator stays on chip
        key_end = min(n_k, i1) if causal else n_k
        for count, size in _runs(0, key_end, block_k):

            def body(size=size, i0=i0, i1=i1):
                k_j = mem.load("K", slice(0, size))  # line 7 (rows stand in for any block)
                v_j = mem.load("V", slice(0, size))
                s_ij = mem.alloc((i1 - i0, size)) if charge_scores else None  # line 8
                mem.free(k_j, v_j, *([s_ij] if s_ij is not None else []))

            mem.repeat(count, body, exact)
        mem.store("O", slice(i0, i1))  # line 14
        mem.store("L", slice(i0, i1))  # line 15: the logsumexp, for the backward pass
        mem.free(q_i, o_i)


def _fa1_program(mem, n_q, n_k, block_q, block_k, causal, charge_scores, exact):
    """FlashAttention Alg. 1 against the memory: K_j, V_j once; Q_i, O_i, l_i, m_i re-read."""
    mem.store("O", slice(None))  # line 2: initialise O = 0, l = 0, m = -inf in HBM
    mem.store("L", slice(None))
    mem.store("m", slice(None))
    for j0 in range(0, n_k, block_k):  # line 5
        j1 = min(j0 + block_k, n_k)
        k_j, v_j = mem.load("K", slice(j0, j1)), mem.load("V", slice(j0, j1))  # line 6
        first_i = (j0 // block_q) * block_q if causal else 0
        for count, size in _runs(first_i, n_q, block_q):

            def body(size=size, j0=j0, j1=j1):
                rows = slice(0, size)
                q_i, o_i = mem.load("Q", rows), mem.load("O", rows)  # line 8
                mem.load("L", rows, registers=True)  # l_i, m_i: per-row statistics
                mem.load("m", rows, registers=True)
                s_ij = mem.alloc((size, j1 - j0)) if charge_scores else None  # line 9
                mem.store("O", rows)  # line 12
                mem.store("L", rows)  # line 13
                mem.store("m", rows)
                mem.free(q_i, o_i, *([s_ij] if s_ij is not None else []))

            mem.repeat(count, body, exact)
        mem.free(k_j, v_j)


def flash_attention_io_formula(
    N: int,
    d: int,
    M: int,
    loop_order: str = "fa2",
    model: str = "article",
    n_k: int | None = None,
    dv: int | None = None,
):
    """Closed form (non-causal) of :func:`flash_attention_io`: (reads, writes), exact for any N.

    With Tr = ceil(Nq/block_q), Tc = ceil(Nk/block_k):
      FA2: reads = Nq d + Tr Nk (d + dv);          writes = Nq dv + Nq
      FA1: reads = Nk (d + dv) + Tc Nq (d + dv + 2); writes = (1 + Tc) Nq (dv + 2)
    """
    n_q, d, n_k, dv = _check_sizes(N, d, n_k, dv)
    M = check_positive_int(M, "M")
    _check_model(model)
    block_q, block_k = _flash_block_sizes(d, M, model)
    return flash_attention_io_blocks(n_q, d, block_q, block_k, loop_order, n_k=n_k, dv=dv)


@renamed_kwargs(block_r="block_q", block_c="block_k")
def flash_attention_io_blocks(
    N: int,
    d: int,
    block_q: int,
    block_k: int,
    loop_order: str = "fa2",
    n_k: int | None = None,
    dv: int | None = None,
):
    """(reads, writes) in elements of the tiled loops with blocks block_q x block_k (non-causal).

    What a kernel with these tiles *asks* HBM for, whatever SRAM it has (no capacity check): a real
    kernel's tiles (64 or 128 rows) are set by tuning, not by M/4d. Term by term, with
    Tr = ceil(Nq/block_q), Tc = ceil(Nk/block_k):
      FA2: Q once (Nq d) + K, V once per query block (Tr Nk (d + dv)); O and L written once.
      FA1: K, V once (Nk (d + dv)) + Q, O, l, m once per key block (Tc Nq (d + dv + 2));
           O, l, m initialised once and rewritten once per key block ((1 + Tc) Nq (dv + 2)).
    """
    n_q, d, n_k, dv = _check_sizes(N, d, n_k, dv)
    block_q = check_positive_int(block_q, "block_q")
    block_k = check_positive_int(block_k, "block_k")
    t_r, t_c = math.ceil(n_q / block_q), math.ceil(n_k / block_k)
    if loop_order == "fa2":
        return n_q * d + t_r * n_k * (d + dv), n_q * dv + n_q
    if loop_order == "fa1":
        return n_k * (d + dv) + t_c * n_q * (d + dv + 2), (1 + t_c) * n_q * (dv + 2)
    raise ValueError(f"loop_order must be 'fa1' or 'fa2'; got {loop_order!r}")


def flash_attention_io_asymptotic(N: int, d: int, M: int, loop_order: str = "fa2") -> float:
    """The leading term: 8 N^2 d^2 / M for FA2, 12 N^2 d^2 / M for FA1 (B = M/4d)."""
    factor = {"fa2": 8, "fa1": 12}.get(loop_order)
    if factor is None:
        raise ValueError(f"loop_order must be 'fa1' or 'fa2'; got {loop_order!r}")
    return factor * N**2 * d**2 / M


def count_io(fn: Callable, q, k, v, sram_elements: int, **kwargs):
    """Run a student's tiled forward against the memory and count its traffic.

    ``fn(mem, **kwargs)`` finds ``Q``, ``K``, ``V`` (arrays (..., N, d)) in ``mem.hbm`` and must
    write its output into ``O`` (..., Nq, dv) and its logsumexp into ``L`` (Nq,) for 2-D inputs,
    using only ``mem.load``/``mem.store``/``mem.alloc``/``mem.free``.

    Returns ``(IOCount, out, lse)``.
    """
    q, k, v = (np.asarray(x) for x in (q, k, v))
    acc = np.float32 if q.dtype == np.float16 else q.dtype
    mem = TwoLevelMemory(
        sram_elements,
        Q=q,
        K=k,
        V=v,
        O=np.zeros((*q.shape[:-1], v.shape[-1]), dtype=acc),
        L=np.full(q.shape[:-1], -np.inf, dtype=acc),
    )
    fn(mem, **kwargs)
    return mem.count(), mem.hbm["O"], mem.hbm["L"]
