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
    with pytest.raises(ValueError, match=r"num_splits must be an integer in 1\.\.256.*got 257"):
        run(q, kp, vp, table, lens, num_splits=257)
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
    with pytest.raises(MemoryError, match="needs 2 more page.* 1 free"):
        alloc.append("d", 8)


def test_page_allocator_refuses_an_append_whole_when_the_pool_runs_out():
    """A refused append takes no page and changes no length, so the sequence goes on where it
    was (and a sequence refused at its first append does not exist)."""
    alloc = pages.PageAllocator(num_blocks=2, block_size=4)
    alloc.append("a", 3)
    with pytest.raises(MemoryError, match="sequence 'a' needs 3 more page"):
        alloc.append("a", 10)
    first = alloc.tables["a"][0]
    assert alloc.append("a", 1) == [(first, 3)]  # token 3: the last slot of its first page
    assert alloc.block_table(["a"])[0].tolist() == [[first]] and len(alloc.free_pages) == 1
    with pytest.raises(MemoryError, match="sequence 'x' needs 2 more page"):
        alloc.append("x", 5)
    assert "x" not in alloc.tables and "x" not in alloc.lengths
    alloc.free("a")
    assert sorted(alloc.free_pages) == [0, 1]


def test_slot_counts():
    assert pages.reserved_slots([5, 100, 1], 128) == 384
    assert pages.paged_slots([5, 100, 1], 16) == 16 + 112 + 16


# -- mutation audit: the table's edges, defaults, scale and the allocator's bookkeeping ---------


def _reference_scaled(q, k, v, lens, scale):
    """float64 attention per sequence and token with an explicit scale (no causal mask)."""
    from course_kernels import attention_reference

    G = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, G, axis=1), np.repeat(v, G, axis=1)
    out = np.stack(
        [
            attention_reference(q[b], k[b, :, :n], v[b, :, :n], scale=scale)[0]
            for b, n in enumerate(lens)
        ]
    )
    return out


def test_a_full_table_is_accepted(rng):
    """A sequence that fills every page of its row (length = max_blocks * block_size) is legal."""
    alloc = pages.PageAllocator(num_blocks=6, block_size=4)
    alloc.append("a", 8)  # exactly two full pages
    alloc.append("b", 5)
    table, lens = alloc.block_table(["a", "b"])
    assert table.shape == (2, 2)  # no spare column: "a" uses its whole row
    t64, l64 = pages.check_block_table(table, lens, 6, 4, 2)
    assert l64.tolist() == [8, 5] and t64.dtype == np.int64
    kp, vp = (rng.standard_normal((6, 4, 1, 8)) for _ in range(2))
    q = rng.standard_normal((2, 2, 1, 8))
    out, _ = pages.split_kv_decode_paged_numpy(q, kp, vp, table, lens, 2)
    k, v = pages.gather_cache(kp, vp, table, lens)
    ref, _ = reference(q, k, v, [8, 5])
    np.testing.assert_allclose(out, ref, atol=1e-12)


def test_a_bad_page_in_a_partly_used_last_page_is_caught(rng):
    """Sequence 0 has 7 tokens in pages of 3: its third page holds token 6 and is read."""
    q, kp, vp, table, lens, k, v = make_paged(rng, [7, 12], block_size=3)
    bad = table.copy()
    bad[0, 2] = kp.shape[0]
    with pytest.raises(ValueError, match=r"block_table\[0\] points at page"):
        pages.split_kv_decode_paged_numpy(q, kp, vp, bad, lens)


def test_bad_cache_seqlens_raise_value_error(rng):
    q, kp, vp, table, lens, k, v = make_paged(rng, [7, 12], block_size=3)
    with pytest.raises(ValueError, match="cache_seqlens must be B=2 integers"):
        pages.check_block_table(table, np.array([7.0, 12.0]), kp.shape[0], 3, 2)
    with pytest.raises(ValueError, match="cache_seqlens must be B=2 integers"):
        pages.check_block_table(table, np.array([7, 12, 3]), kp.shape[0], 3, 2)


def test_gather_keys_reads_through_the_table_and_tolerates_unused_entries():
    """Token j of row b is pages[table[b, j // P], j % P]; an unused (padded) entry reads page 0
    instead of failing, and positions past the table do not raise (the caller masks them)."""
    pool = np.arange(5 * 2).reshape(5, 2, 1, 1).astype(float)  # page p, slot s holds 2p + s
    table = np.array([[3, 1], [2, -1]])
    got = pages.gather_keys(pool, table, np.arange(4))[:, 0, :, 0]
    assert got.tolist() == [[6, 7, 2, 3], [4, 5, 0, 1]]  # row 1's second entry is padding
    assert pages.gather_keys(pool, table, np.arange(7)).shape == (2, 1, 7, 1)


def test_default_splits_cut_the_table_capacity(rng):
    """The default chunk is ceil(max_blocks * block_size / num_splits), whatever the lengths: a
    table of 4 pages of 3 tokens and 3 splits gives chunks of 4 positions, so a sequence of 5
    tokens leaves the third split [8, 12) empty (l = 0, m = -inf)."""
    kp, vp = (rng.standard_normal((6, 3, 1, 4)) for _ in range(2))
    q = rng.standard_normal((1, 1, 1, 4))
    table = np.array([[4, 0, 5, 1]])
    out, lse, parts = pages.split_kv_decode_paged_numpy(
        q, kp, vp, table, [5], 3, return_partials=True
    )
    assert parts.l.shape == (1, 1, 1, 3)
    assert parts.l[0, 0, 0, 2] == 0 and np.isneginf(parts.m[0, 0, 0, 2])
    assert parts.l[0, 0, 0, 0] > 0 and parts.l[0, 0, 0, 1] > 0  # [0, 4) and [4, 5)
    k, v = pages.gather_cache(kp, vp, table, [5])
    want = split_kv.split_kv_decode_numpy(q, k, v, 2, chunk=4, return_partials=True)
    np.testing.assert_allclose(parts.l[..., :2], want[2].l, atol=1e-13)


def test_paged_defaults_are_four_splits_and_no_causal_mask(rng):
    q, kp, vp, table, lens, k, v = make_paged(rng, [9, 14], Nq=3, block_size=4)
    out, lse, parts = pages.split_kv_decode_paged_numpy(
        q, kp, vp, table, lens, return_partials=True
    )
    assert parts.m.shape[-1] == 4
    ref, ref_lse = reference(q, k, v, lens.tolist(), causal=False)
    np.testing.assert_allclose(out, ref, atol=1e-12)
    causal, _ = reference(q, k, v, lens.tolist(), causal=True)
    assert np.abs(out - causal).max() > 1e-3  # the default is really not causal


def test_paged_decode_applies_the_scale(rng):
    q, kp, vp, table, lens, k, v = make_paged(rng, [9, 14], block_size=4)
    out, _ = pages.split_kv_decode_paged_numpy(q, kp, vp, table, lens, 3, scale=0.7)
    np.testing.assert_allclose(out, _reference_scaled(q, k, v, lens, 0.7), atol=1e-12)


def test_page_allocator_lengths_padding_and_reuse_of_a_name():
    alloc = pages.PageAllocator(num_blocks=6, block_size=2)
    alloc.append("a", 3)  # pages 0, 1
    assert alloc.append("a", 2) == [(1, 1), (2, 0)]  # token 3 fills page 1, token 4 opens 2
    alloc.append("b", 1)  # page 3
    table, lens = alloc.block_table(["a", "b"])
    assert table.dtype == np.int32 and lens.dtype == np.int32
    assert table.tolist() == [[0, 1, 2], [3, -1, -1]] and lens.tolist() == [5, 1]
    assert alloc.block_table(["b", "a"], pad=0)[0].tolist() == [[3, 0, 0], [0, 1, 2]]
    alloc.free("a")
    assert alloc.append("a", 1) == [(0, 0)]  # a new sequence: slot 0 of a free page
    assert alloc.block_table(["a"])[1].tolist() == [1]


def test_page_allocator_and_slot_counts_refuse_bad_sizes():
    with pytest.raises(ValueError, match="num_blocks"):
        pages.PageAllocator(num_blocks=0, block_size=4)
    with pytest.raises(ValueError, match="block_size"):
        pages.PageAllocator(num_blocks=4, block_size=0)
    alloc = pages.PageAllocator(num_blocks=4, block_size=4)
    with pytest.raises(ValueError, match="n_tokens"):
        alloc.append("a", 0)
    with pytest.raises(ValueError, match="max_len"):
        pages.reserved_slots([1, 2], 0)
    with pytest.raises(ValueError, match="block_size"):
        pages.paged_slots([1, 2], 0)


def test_paged_slots_of_whole_pages():
    """A sequence that fills its pages exactly needs no extra page; an empty one needs none."""
    assert pages.paged_slots([32, 16, 0], 16) == 48
    assert pages.paged_slots([33], 16) == 48
    assert pages.reserved_slots([0, 1, 2], 7) == 21
