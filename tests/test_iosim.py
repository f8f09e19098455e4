"""course_kernels.iosim: counts equal closed forms exactly; capacity is enforced; a student's
function can be counted."""

import numpy as np
import pytest
from attention_inputs import make_qkv

from course_kernels import attention_reference, block_size, iosim
from course_kernels.iosim import IOCount, SRAMOverflowError, TwoLevelMemory


@pytest.mark.parametrize("n,d", [(1, 1), (7, 3), (113, 40), (1024, 64), (4096, 128)])
def test_standard_attention_counts_4n2_plus_4nd(n, d):
    c = iosim.standard_attention_io(n, d)
    assert c.total == 4 * n * n + 4 * n * d
    assert (c.reads, c.writes) == iosim.standard_attention_io_formula(n, d)
    assert (c.reads, c.writes) == (2 * n * n + 3 * n * d, 2 * n * n + n * d)


def test_standard_attention_cross_attention_formula():
    c = iosim.standard_attention_io(113, 40, n_k=203, dv=24)
    assert (c.reads, c.writes) == iosim.standard_attention_io_formula(113, 40, n_k=203, dv=24)
    assert c.writes == 2 * 113 * 203 + 113 * 24


@pytest.mark.parametrize("loop_order", ["fa1", "fa2"])
@pytest.mark.parametrize(
    "n,d,m,n_k,dv",
    [
        (1, 1, 4, None, None),
        (113, 40, 20_000, 203, 24),
        (1000, 64, 100_000, None, None),
        (4096, 64, 100_000, None, None),
        (777, 128, 65_536, None, None),
    ],
)
def test_flash_counts_equal_closed_form(loop_order, n, d, m, n_k, dv):
    c = iosim.flash_attention_io(n, d, m, loop_order, n_k=n_k, dv=dv)
    formula = iosim.flash_attention_io_formula(n, d, m, loop_order, n_k=n_k, dv=dv)
    assert (c.reads, c.writes) == formula
    assert c.peak_sram <= m


@pytest.mark.parametrize("loop_order", ["fa1", "fa2"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("model", ["article", "paper"])
def test_charged_repetitions_equal_full_simulation(loop_order, causal, model):
    kw = dict(N=301, d=16, M=4_000, loop_order=loop_order, causal=causal, model=model)
    fast, exact = iosim.flash_attention_io(**kw), iosim.flash_attention_io(**kw, exact=True)
    assert (fast.reads, fast.writes, fast.peak_sram) == (exact.reads, exact.writes, exact.peak_sram)
    assert exact.charged_steps == 0 and fast.charged_steps > 0


@pytest.mark.parametrize("loop_order,factor", [("fa2", 8), ("fa1", 12)])
def test_counts_approach_the_asymptotic_constant(loop_order, factor):
    d, m = 64, 100_000
    ratios = [
        iosim.flash_attention_io(n, d, m, loop_order).total
        / iosim.flash_attention_io_asymptotic(n, d, m, loop_order)
        for n in (4096, 16384, 65536)
    ]
    assert ratios[0] > ratios[1] > ratios[2] > 1.0
    assert ratios[2] < 1.05
    assert iosim.flash_attention_io_asymptotic(10, 2, 40, loop_order) == factor * 100 * 4 / 40


def test_fa1_moves_more_than_fa2_and_both_far_less_than_standard():
    n, d, m = 8192, 64, 100_000
    fa1 = iosim.flash_attention_io(n, d, m, "fa1").total
    fa2 = iosim.flash_attention_io(n, d, m, "fa2").total
    std = iosim.standard_attention_io(n, d).total
    assert fa2 < fa1 < std / 5


def test_causal_moves_about_half():
    full = iosim.flash_attention_io(8192, 64, 100_000).total
    causal = iosim.flash_attention_io(8192, 64, 100_000, causal=True).total
    assert 0.5 < causal / full < 0.6  # half the tiles, plus the diagonal ones and Q, O once


def test_paper_model_charges_the_score_tile_and_can_overflow():
    with pytest.raises(SRAMOverflowError, match="> M"):
        iosim.flash_attention_io(512, 64, 20_000, model="paper")
    c = iosim.flash_attention_io(512, 64, 100_000, model="paper")
    b = block_size(100_000, 64)
    assert c.peak_sram == 2 * 64 * 64 + 2 * b * 64 + 64 * b


def test_sweep_to_65536_is_cheap_in_simulated_steps():
    c = iosim.flash_attention_io(65536, 64, 100_000)
    assert c.simulated_steps <= 2 * (65536 // block_size(100_000, 64) + 1)


def test_memory_refuses_to_exceed_capacity():
    mem = TwoLevelMemory(10, X=np.zeros((4, 3)))
    a = mem.load("X", slice(0, 2))  # 6 elements
    with pytest.raises(SRAMOverflowError, match="needs 6 elements but SRAM holds 10"):
        mem.load("X", slice(2, 4))
    mem.free(a)
    mem.load("X", slice(2, 4))
    assert mem.reads == 12 and mem.peak == 6


def test_memory_load_and_store_move_real_data():
    x = np.arange(12.0).reshape(4, 3)
    mem = TwoLevelMemory(None, X=x.copy())
    t = mem.load("X", slice(1, 3))
    np.testing.assert_array_equal(t, x[1:3])
    mem.store("X", slice(1, 3), -t)
    np.testing.assert_array_equal(mem.hbm["X"][1:3], -x[1:3])
    assert (mem.reads, mem.writes) == (6, 6)


def test_memory_errors_are_clear():
    mem = TwoLevelMemory(100, X=np.zeros((4, 3)))
    with pytest.raises(KeyError, match="no array named 'Y'"):
        mem.load("Y")
    with pytest.raises(TypeError, match="rows must be a slice"):
        mem.load("X", 2)
    with pytest.raises(ValueError, match="not resident"):
        mem.free(np.zeros(3))
    with pytest.raises(ValueError, match="sram_elements must be an integer >= 1"):
        TwoLevelMemory(0)
    with pytest.raises(ValueError, match="needs data"):
        mem.store("X", slice(0, 1))


@pytest.mark.parametrize(
    "kwargs,exc,match",
    [
        (dict(N=0, d=64, M=1000), ValueError, "N must be an integer >= 1"),
        (dict(N=10, d=64, M=100), ValueError, "too small for one block"),
        (dict(N=10, d=64, M=1000, loop_order="fa3"), ValueError, "loop_order"),
        (dict(N=10, d=64, M=1000, model="fast"), ValueError, "model must be one of"),
        (dict(N=10, d=64, M=1000, n_k=0), ValueError, "n_k must be an integer >= 1"),
        (dict(N=10, d=64, M=1000, dv=0), ValueError, "dv must be an integer >= 1"),
    ],
)
def test_flash_io_bad_input(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        iosim.flash_attention_io(**kwargs)


def test_count_io_counts_a_students_function_and_checks_its_answer(rng):
    q, k, v = make_qkv(rng, lead=(), n_q=100, d=16)
    m = 4 * 25 * 16
    # A student's FA2 written against the memory: exercise 05's model answer.
    from course_kernels.grading.specs.count_io import fa2_forward_io as student_fa2

    count, out, lse = iosim.count_io(student_fa2, q, k, v, m, block_q=25, block_k=25)
    ref_out, ref_lse = attention_reference(q, k, v)
    np.testing.assert_allclose(out, ref_out, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-12)
    assert (count.reads, count.writes) == iosim.flash_attention_io_formula(100, 16, m, "fa2")


def test_count_io_refuses_a_function_that_loads_everything(rng):
    q, k, v = make_qkv(rng, lead=(), n_q=100, d=16)

    def untiled(mem):
        mem.load("Q")
        mem.load("K")

    with pytest.raises(SRAMOverflowError):
        iosim.count_io(untiled, q, k, v, 2000)


def test_iosim_io_blocks_by_hand_and_agrees_with_the_formula():
    # FA2, N = 10, d = 4, block_q = 3 (Tr = 4), block_k = 5: Q once 40 + K, V four times 4 * 10 * 8 = 320.
    assert iosim.flash_attention_io_blocks(10, 4, 3, 5, "fa2") == (40 + 320, 40 + 10)
    # FA1, Tc = 2: K, V once 80 + 2 * 10 * (4 + 4 + 2) = 200; writes (1 + 2) * 10 * 6 = 180.
    assert iosim.flash_attention_io_blocks(10, 4, 3, 5, "fa1") == (80 + 200, 180)
    for order in ("fa1", "fa2"):
        block_q, block_k = iosim.flash_block_sizes(64, 20_000, "paper")
        assert iosim.flash_attention_io_blocks(
            1000, 64, block_q, block_k, order
        ) == iosim.flash_attention_io_formula(1000, 64, 20_000, order, model="paper")
    with pytest.raises(ValueError, match="block_q"):
        iosim.flash_attention_io_blocks(10, 4, 0, 5)
    with pytest.raises(ValueError, match="loop_order"):
        iosim.flash_attention_io_blocks(10, 4, 3, 5, "fa3")


def test_causal_counts_by_hand():
    # FA2, article model, N = 8, d = 1, M = 8: B = 2. Query block i sees key blocks 0..i, so
    # 1 + 2 + 3 + 4 = 10 loads of a K and a V block of 2 rows; Q read once; O and L written once.
    c = iosim.flash_attention_io(8, 1, 8, "fa2", causal=True)
    assert (c.reads, c.writes) == (8 + 10 * (2 + 2), 8 + 8)
    # FA1, paper model, N = 10, d = 2, M = 40: block_k = 5, block_q = 2. Key block 0 meets all 10
    # query rows; key block 1 (keys 5..9) starts at the query block holding row 5, rows 4..9.
    # Each of the 16 rows reads Q, O (2 each), l, m and writes O, l, m; O, l, m initialised once.
    c = iosim.flash_attention_io(10, 2, 40, "fa1", causal=True, model="paper")
    assert (c.reads, c.writes) == (2 * 5 * (2 + 2) + 16 * 6, 10 * 4 + 16 * 4)


def test_flash_block_sizes_of_each_model():
    assert iosim.flash_block_sizes(64, 100_000) == (390, 390)  # article: B = floor(M / 4d)
    assert iosim.flash_block_sizes(64, 100_000, "paper") == (64, 390)  # min(B, d), B
    assert iosim.flash_block_sizes(16, 100_000, "paper") == (16, 1562)
    with pytest.raises(ValueError, match="model must be one of"):
        iosim.flash_block_sizes(64, 100_000, "fast")


def test_asymptotic_rejects_an_unknown_loop_order():
    with pytest.raises(ValueError, match="loop_order"):
        iosim.flash_attention_io_asymptotic(1024, 64, 100_000, "fa3")


def test_count_io_output_buffers_start_empty_in_the_accumulator_dtype(rng):
    """fp16 inputs: O and L are float32 (the accumulator), O = 0 and L = -inf before any store."""
    q, k, v = make_qkv(rng, lead=(), n_q=6, d=4, dv=3, dtype=np.float16)
    count, out, lse = iosim.count_io(lambda mem: None, q, k, v, 1000)
    assert count.total == 0
    assert out.dtype == np.float32 and lse.dtype == np.float32 and out.shape == (6, 3)
    assert (out == 0).all() and np.isneginf(lse).all()


def test_memory_rows_are_a_contiguous_slice_and_an_empty_one_moves_nothing():
    mem = TwoLevelMemory(100, X=np.zeros((4, 3)))
    with pytest.raises(ValueError, match="contiguous slice"):
        mem.load("X", slice(0, 4, 2))
    tile = mem.load("X", slice(3, 1))
    assert tile.shape == (0, 3) and (mem.reads, mem.in_use) == (0, 0)
    mem.free(tile)


def test_memory_rows_index_the_sequence_axis_of_batched_arrays():
    x = np.arange(24.0).reshape(2, 4, 3)  # (batch, N, d)
    mem = TwoLevelMemory(None, X=x.copy())
    tile = mem.load("X", slice(1, 3))
    np.testing.assert_array_equal(tile, x[:, 1:3])
    mem.store("X", slice(1, 3), -tile)
    np.testing.assert_array_equal(mem.hbm["X"][:, 1:3], -x[:, 1:3])
    assert (mem.reads, mem.writes) == (12, 12)


def test_memory_load_is_a_copy_until_stored():
    x = np.arange(12.0).reshape(4, 3)
    mem = TwoLevelMemory(None, X=x.copy())
    tile = mem.load("X", slice(0, 2))
    tile += 100.0  # work on chip
    np.testing.assert_array_equal(mem.hbm["X"], x)


def test_memory_alloc_is_filled_scratch_without_traffic():
    mem = TwoLevelMemory(100, X=np.zeros((4, 3)))
    acc = mem.alloc((2, 3), fill=-np.inf, dtype=np.float32)
    assert acc.dtype == np.float32 and acc.shape == (2, 3) and np.isneginf(acc).all()
    assert (mem.reads, mem.writes, mem.in_use) == (0, 0, 6)


def test_repeat_simulates_once_and_charges_the_rest():
    mem = TwoLevelMemory(100, X=np.zeros((4, 3)))
    calls = []

    def body():
        calls.append(1)
        mem.free(mem.load("X", slice(0, 2)))  # 6 elements read

    mem.repeat(0, body)
    assert calls == [] and mem.count() == IOCount(0, 0, 0, 0, 0)
    mem.repeat(5, body)  # run once, charged four more times
    assert len(calls) == 1 and mem.count() == IOCount(30, 0, 6, 1, 4)
    mem.repeat(3, body, exact=True)  # run every time
    assert len(calls) == 4 and mem.count() == IOCount(48, 0, 6, 4, 4)

    def leaky():
        mem.load("X", slice(0, 1))

    with pytest.raises(RuntimeError, match="must free"):
        mem.repeat(2, leaky)
    leak_free = TwoLevelMemory(100, X=np.zeros((4, 3)))
    with pytest.raises(RuntimeError, match="must free"):  # the same rule when run every time
        leak_free.repeat(2, lambda: leak_free.load("X", slice(0, 1)), exact=True)
