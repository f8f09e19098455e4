"""Paged KV caches in NumPy: split-KV decoding through a block table equals the float64
reference on the contiguous cache the table describes; bad tables raise (no torch needed)."""

import numpy as np
import pytest
from decode_cases import make_paged, reference
from hypothesis import given, settings
from hypothesis import strategies as st

from course_kernels.serving import pages, split_kv


@pytest.mark.parametrize("block_size", [1, 3, 5, 16])
@pytest.mark.parametrize("causal,Nq", [(False, 1), (True, 3)])
def test_paged_decode_matches_reference(rng, block_size, causal, Nq):
    lens = [37, 3, 20]  # odd lengths: the last page of each sequence is partly used
    q, kp, vp, table, lens, k, v = make_paged(
        rng, lens, Hq=6, kv_heads=2, Nq=Nq, d=8, block_size=block_size
    )
    out, lse = pages.split_kv_decode_paged_numpy(q, kp, vp, table, lens, 3, causal=causal)
    ref, ref_lse = reference(q, k, v, lens.tolist(), causal)
    np.testing.assert_allclose(out, ref, atol=1e-12)
    np.testing.assert_allclose(lse, ref_lse, atol=1e-12)


def test_paged_equals_contiguous_split_kv(rng):
    """Same chunking, same partials: paging changes where keys live, not what is computed."""
    q, kp, vp, table, lens, k, v = make_paged(rng, [11, 29], block_size=4)
    chunk = 8
    got = pages.split_kv_decode_paged_numpy(
        q, kp, vp, table, lens, 4, chunk=chunk, return_partials=True
    )
    want = split_kv.split_kv_decode_numpy(
        q, k, v, 4, cache_seqlens=lens, chunk=chunk, return_partials=True
    )
    np.testing.assert_allclose(got[0], want[0], atol=1e-13)
    for g, w in zip(got[2], want[2], strict=True):
        np.testing.assert_allclose(g, w, atol=1e-13)


@settings(max_examples=25, deadline=None)
@given(
    lens=st.lists(st.integers(3, 30), min_size=1, max_size=3),
    kv_heads=st.integers(1, 2),
    G=st.integers(1, 3),
    Nq=st.integers(1, 3),
    block_size=st.integers(1, 8),
    num_splits=st.integers(1, 5),
    causal=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_paged_decode_property(lens, kv_heads, G, Nq, block_size, num_splits, causal, seed):
    rng = np.random.default_rng(seed)
    q, kp, vp, table, lens, k, v = make_paged(
        rng, lens, Hq=G * kv_heads, kv_heads=kv_heads, Nq=Nq, d=4, block_size=block_size
    )
    out, lse = pages.split_kv_decode_paged_numpy(q, kp, vp, table, lens, num_splits, causal=causal)
    ref, ref_lse = reference(q, k, v, lens.tolist(), causal)
    np.testing.assert_allclose(out, ref, atol=1e-11)
    np.testing.assert_allclose(lse, ref_lse, atol=1e-11)


def test_gather_cache_is_the_table(rng):
    q, kp, vp, table, lens, k, v = make_paged(rng, [7, 12], block_size=3)
    gk, gv = pages.gather_cache(kp, vp, table, lens)
    np.testing.assert_array_equal(gk, k)
    np.testing.assert_array_equal(gv, v)


def test_bad_block_tables(rng):
    q, kp, vp, table, lens, k, v = make_paged(rng, [7, 12], block_size=3)
    run = pages.split_kv_decode_paged_numpy
    bad = table.copy()
    bad[1, 2] = kp.shape[0]  # a page that does not exist, and is read (token 6..8 of seq 1)
    with pytest.raises(ValueError, match=r"block_table\[1\] points at page"):
        run(q, kp, vp, bad, lens)
    bad[1, 2] = -1
    with pytest.raises(ValueError, match="outside the pool"):
        run(q, kp, vp, bad, lens)
    with pytest.raises(ValueError, match=r"cache_seqlens\[0\] = 16.*1\.\.15"):
        run(q, kp, vp, table, np.array([16, 12]))  # 5 pages of 3 tokens hold at most 15
    with pytest.raises(ValueError, match=r"cache_seqlens\[1\] = 0"):
        run(q, kp, vp, table, np.array([7, 0]))
    with pytest.raises(ValueError, match="needs cache_seqlens"):
        run(q, kp, vp, table, None)
    with pytest.raises(ValueError, match="block_table must be"):
        run(q, kp, vp, table.astype(float), lens)
    with pytest.raises(ValueError, match="block_table must be"):
        run(q, kp, vp, table[:1], lens)
    with pytest.raises(ValueError, match="k_pages and v_pages"):
        run(q, kp, vp[:, :2], table, lens)
    # entries past a sequence's last page are never read: anything goes there
    fine = table.copy()
    fine[0, 3:] = 10**6
    run(q, kp, vp, fine, lens)


def test_page_allocator_reuses_freed_pages():
    alloc = pages.PageAllocator(num_blocks=8, block_size=4)
    alloc.append("a", 6)  # pages 0, 1
    alloc.append("b", 9)  # pages 2, 3, 4
    alloc.free("a")
    alloc.append("c", 10)  # takes a's pages back, then a new one
    table, lens = alloc.block_table(["b", "c"])
    assert table.tolist() == [[2, 3, 4], [0, 1, 5]]
    assert lens.tolist() == [9, 10]
    assert alloc.append("c", 3) == [(5, 2), (5, 3), (6, 0)]
    with pytest.raises(MemoryError, match="no free page"):
        alloc.append("d", 8)


def test_slot_counts():
    assert pages.reserved_slots([5, 100, 1], 128) == 384
    assert pages.paged_slots([5, 100, 1], 16) == 16 + 112 + 16
