"""Ring attention (course_kernels.distributed): the split, the schedule, the merge, and the ring
itself on 2 and 4 CPU processes joined by gloo (the Triton kernels run in the interpreter).

The spawned checks are grouped (one spawn per world size runs many cases) because starting a
process that imports torch and Triton costs seconds; sizes are tiny for the interpreter.
"""

import importlib
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

import torch.distributed as dist  # noqa: E402

from course_kernels.distributed import ring as rd  # noqa: E402
from course_kernels.distributed.bench import check_case, check_cases, spawn  # noqa: E402

osm = importlib.import_module(
    "course_kernels.numpy.online_softmax"
)  # the package re-exports a function
TIMEOUT = 240  # seconds for one spawn: a hang fails the test instead of blocking CI


# --------------------------------------------------------------------------- the split


@pytest.mark.parametrize("layout", rd.LAYOUTS)
@pytest.mark.parametrize("world,n", [(1, 5), (2, 8), (2, 7), (3, 17), (4, 37), (4, 40)])
def test_distributed_shard_unshard_roundtrip(layout, world, n):
    x = torch.arange(2 * 3 * n * 2).reshape(2, 3, n, 2)
    shards = [rd.shard_sequence(x, world, r, layout) for r in range(world)]
    assert [s.shape[2] for s in shards] == rd.shard_lengths(n, world, layout)
    assert torch.equal(rd.unshard_sequence(shards, layout), x)
    # each rank holds its chunks, in sequence order
    b = rd.chunk_bounds(n, rd.n_chunks(world, layout))
    for r, s in enumerate(shards):
        idx = [t for i in rd.rank_chunks(r, world, layout) for t in range(*b[i])]
        assert torch.equal(s[0, 0, :, 0], x[0, 0, idx, 0])


def test_distributed_zigzag_is_head_tail():
    # rank r holds chunks r and 2W-1-r of 2W (PyTorch CP's head-tail load balancer)
    x = torch.arange(8).reshape(1, 1, 8, 1)
    assert rd.shard_sequence(x, 2, 0, "zigzag").flatten().tolist() == [0, 1, 6, 7]
    assert rd.shard_sequence(x, 2, 1, "zigzag").flatten().tolist() == [2, 3, 4, 5]
    assert rd.shard_sequence(x, 2, 1, "contiguous").flatten().tolist() == [4, 5, 6, 7]


def test_distributed_uneven_last_chunk_shorter_and_empty_refused():
    assert rd.chunk_bounds(10, 4) == [(0, 3), (3, 6), (6, 9), (9, 10)]
    assert rd.shard_lengths(37, 4, "zigzag") == [5 + 2, 10, 10, 10]
    with pytest.raises(ValueError, match="non-empty chunks"):
        rd.chunk_bounds(9, 4)  # 3, 3, 3, 0
    with pytest.raises(ValueError, match="layout must be one of"):
        rd.shard_lengths(8, 2, "ring")
    with pytest.raises(ValueError, match="not the zigzag split"):
        rd.unshard_sequence([torch.zeros(1, 1, 3, 1), torch.zeros(1, 1, 5, 1)], "zigzag")


# --------------------------------------------------------------------------- the schedule


@pytest.mark.parametrize("layout", rd.LAYOUTS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_distributed_schedule_covers_every_visible_pair_once(layout, causal, world):
    plan = rd.ring_schedule(world, layout, causal)
    assert len(plan) == world
    for r in range(world):
        seen = [(t.q_chunk, t.k_chunk) for s in range(world) for t in plan[s][r].tasks]
        assert [plan[s][r].kv_rank for s in range(world)] == [(r - s) % world for s in range(world)]
        want = {
            (i, j)
            for i in rd.rank_chunks(r, world, layout)
            for j in range(rd.n_chunks(world, layout))
            if not causal or i >= j
        }
        assert sorted(seen) == sorted(want)  # each pair exactly once
        for s in range(world):
            for t in plan[s][r].tasks:
                assert t.causal == (causal and t.q_chunk == t.k_chunk)


def test_distributed_balance_contiguous_vs_zigzag():
    # contiguous causal, W = 4: step 0 is half a block everywhere, then rank 3 always works
    b = rd.ring_balance(4, "contiguous", causal=True)
    assert b["critical_path"] == 0.5 + 3 and b["ideal"] == (4 * 0.5 + 6) / 4
    assert b["imbalance"] == pytest.approx(1.75)
    z = rd.ring_balance(4, "zigzag", causal=True)
    assert z["imbalance"] == 1.0 and all(w == 2.0 for row in z["work"] for w in row)
    assert rd.ring_balance(4, "contiguous", causal=False)["imbalance"] == 1.0


def test_distributed_local_calls_coalesce():
    world, layout = 2, "zigzag"
    b = rd.chunk_bounds(8, 4)  # chunks of 2; rank 0 holds 0 and 3, rank 1 holds 1 and 2
    plan = rd.ring_schedule(world, layout, causal=True)
    calls = [
        rd._local_calls(
            plan[s][0].tasks, [0, 3], list(rd.rank_chunks(plan[s][0].kv_rank, world, layout)), b
        )
        for s in range(world)
    ]
    assert calls[0] == [(0, 4, 0, 4, True)]  # diagonal: one causal call over the whole shard
    assert calls[1] == [(2, 4, 0, 4, False)]  # chunk 3 sees chunks 1 and 2 fully; chunk 0 none
    calls1 = rd._local_calls(plan[1][1].tasks, [1, 2], [0, 3], b)
    assert calls1 == [(0, 4, 0, 2, False)]  # chunks 1 and 2 see chunk 0; chunk 3 is later


def test_distributed_ring_bytes_model():
    # forward: W-1 K/V shards; backward: W-1 K/V shards + W fp32 dK/dV shards
    assert rd.ring_bytes(1, 2, 64, 16, 4, 2) == 3 * 2 * 2 * 16 * 16 * 2
    assert rd.ring_bytes(1, 2, 64, 16, 4, 2, backward=True) == (3 * 2 + 4 * 4) * 2 * 2 * 16 * 16


def test_distributed_overlap_model():
    from course_kernels.hardware import H200_MEASURED, LINKS

    nvlink = LINKS["NVLink 4 (H200 SXM)"].per_direction
    assert nvlink == 450e9 and LINKS["PCIe Gen5 x16"].per_direction == 64e9
    F = H200_MEASURED.fp16_matmul_flops
    L = rd.ring_min_shard(16, 16, F, nvlink)
    assert pytest.approx(F / nvlink) == L  # fp16, no GQA: L* = F / bw
    assert rd.ring_min_shard(16, 4, F, nvlink) == pytest.approx(L / 4)  # GQA: 4x less to send
    below = rd.ring_step_times(int(L * 0.9), 16, 16, 128, F, nvlink)
    above = rd.ring_step_times(int(L * 1.1), 16, 16, 128, F, nvlink)
    assert not below["hidden"] and above["hidden"]
    assert above["step_s"] == above["compute_s"] and below["step_s"] == below["transfer_s"]
    # compute grows as L^2, transfer as L
    t1, t2 = (
        rd.ring_step_times(1000, 8, 8, 64, F, nvlink),
        rd.ring_step_times(2000, 8, 8, 64, F, nvlink),
    )
    assert t2["compute_s"] == pytest.approx(4 * t1["compute_s"])
    assert t2["transfer_s"] == pytest.approx(2 * t1["transfer_s"])


def test_distributed_memory_model_scales_as_n_over_w():
    one = rd.ring_memory_bytes(8192, 1, 1, 16, 4, 128)
    two = rd.ring_memory_bytes(16384, 2, 1, 16, 4, 128)
    assert one == two  # same tokens per rank, same bytes
    assert sum(rd.ring_memory_bytes(16384, 4, 1, 16, 4, 128).values()) * 2 == sum(two.values())
    # q, k, v, dO of 2048 tokens: (2 x 16 + 2 x 4) heads x 128 x 2 bytes
    assert rd.ring_memory_bytes(8192, 4, 1, 16, 4, 128)["q, k, v, dO shards"] == 2048 * 40 * 256


def test_distributed_ring_bytes_batch_and_default_element_size():
    # 2 (K and V) x B = 3 x 2 KV heads x 16 tokens x 16 dims per shard, 3 of them sent, 2 bytes
    assert rd.ring_bytes(3, 2, 64, 16, 4) == 3 * (2 * 3 * 2 * 16 * 16) * 2
    assert rd.ring_bytes(3, 2, 64, 16, 4, backward=True) == (3 * 2 + 4 * 4) * 2 * 3 * 2 * 16 * 16


def test_distributed_step_times_by_hand():
    """B = 2, H = 4, kv_heads = 2, L = 100, d = 8, F = 1000 flop/s, 10 B/s, 2-byte elements:
    compute 4 x 2 x 4 x 100^2 x 8 / 1000 = 2560 s, transfer 2 x 2 x 2 x 100 x 8 x 2 / 10 = 1280 s."""
    t = rd.ring_step_times(100, 4, 2, 8, 1000.0, 10.0, batch=2)
    assert t == {"compute_s": 2560.0, "transfer_s": 1280.0, "step_s": 2560.0, "hidden": True}
    t = rd.ring_step_times(100, 4, 2, 8, 1000.0, 10.0, element_bytes=8, batch=2)
    assert t["transfer_s"] == 5120.0 and t["step_s"] == 5120.0 and not t["hidden"]


def test_distributed_min_shard_is_where_compute_equals_transfer():
    """At L = ring_min_shard exactly, compute = transfer and the transfer counts as hidden."""
    L = rd.ring_min_shard(1, 1, 100.0, 1.0)  # e F / (2 bw) = 2 x 100 / 2
    assert L == 100.0
    t = rd.ring_step_times(100, 1, 1, 1, 100.0, 1.0)
    assert t["compute_s"] == t["transfer_s"] == 400.0 and t["hidden"]
    assert rd.ring_min_shard(8, 2, 1e12, 1e9) == 2 / 8 * 2 * 1e12 / 2e9  # default 2 bytes
    assert not rd.ring_step_times(99, 1, 1, 1, 100.0, 1.0)["hidden"]


def test_distributed_memory_model_term_by_term():
    """N = 12 over W = 3 (L = 4), B = 2, H = 4, kv_heads = 2, d = 8, 2-byte elements:
    a Q-shaped shard is 2 x 4 x 4 x 8 = 256 elements, a K/V-shaped one 128."""
    got = rd.ring_memory_bytes(12, 3, 2, 4, 2, 8, element_bytes=2)
    assert got == {
        "q, k, v, dO shards": (256 + 128 + 128 + 256) * 2,
        "saved O and logsumexp": 256 * 2 + 2 * 4 * 4 * 4,  # lse: B x H x L floats
        "K/V in use and arriving": (128 + 128) * 2 * 2,  # (K + V) x (in use, arriving)
        "fp32 dQ, dK/dV in use and arriving": 256 * 4 + (128 + 128) * 2 * 4,
    }


def test_distributed_plan_arguments_are_checked():
    for world in (0, -1, True, 2.0):
        with pytest.raises(ValueError, match="world"):
            rd.n_chunks(world)
        with pytest.raises(ValueError, match="world"):
            rd.ring_schedule(world)
    for n in (0, True, 8.0):
        with pytest.raises(ValueError, match="sequence length must be a positive int"):
            rd.chunk_bounds(n, 2)
    for chunks in (0, -1, True, 2.0):  # (0 was a ZeroDivisionError, -1 an IndexError)
        with pytest.raises(ValueError, match="chunks must be a positive int"):
            rd.chunk_bounds(5, chunks)
    for rank in (2, -1):
        with pytest.raises(ValueError, match="rank must be in"):
            rd.rank_chunks(rank, 2)
    with pytest.raises(ValueError, match="layout must be one of"):
        rd.rank_chunks(0, 2, "ring")
    with pytest.raises(TypeError, match="causal must be a bool"):
        rd.ring_schedule(2, causal=1)


def test_distributed_shard_is_a_new_contiguous_tensor():
    x = torch.arange(2 * 2 * 8 * 3.0).reshape(2, 2, 8, 3)
    for layout in rd.LAYOUTS:
        s = rd.shard_sequence(x, 2, 1, layout)
        assert s.is_contiguous()
        s.zero_()
        assert x.flatten()[1:].ne(0).all(), layout  # x is untouched
    one = torch.arange(8.0).reshape(1, 1, 8, 1)
    s = rd.shard_sequence(one, 2, 0)
    s.fill_(-1.0)
    assert one.flatten().tolist() == list(range(8))


# --------------------------------------------------------------------------- the merge


def _np_partials(rng, nq=5, nk=11, d=4, split=6, masked_row=True):
    q, k, v = (rng.standard_normal((2, n, d)) for n in (nq, nk, nk))
    mask = np.ones((nq, nk), bool)
    if masked_row:
        mask[1, :split] = False  # row 1 sees nothing in the first part
    a = osm.partial_attention(q, k[:, :split], v[:, :split], mask=mask[:, :split])
    b = osm.partial_attention(q, k[:, split:], v[:, split:], mask=mask[:, split:])
    return a, b


def test_distributed_merge_matches_numpy_merge(rng):
    a, b = _np_partials(rng)
    want_o, want_lse = osm.finalize(osm.merge(a, b))
    oa, la = osm.finalize(a)
    ob, lb = osm.finalize(b)
    o, lse = rd.merge_attention(*(torch.from_numpy(x) for x in (oa, la, ob, lb)))
    assert np.isneginf(la[:, 1]).all()  # a side with nothing visible enters as lse = -inf
    np.testing.assert_allclose(o.numpy(), want_o, atol=1e-6)
    np.testing.assert_allclose(lse.numpy(), want_lse, atol=1e-6)
    # merging with the empty partial is the identity; both sides empty stays (0, -inf)
    o2, l2 = rd.merge_attention(o, lse, torch.zeros_like(o), torch.full_like(lse, -math.inf))
    assert torch.allclose(o2, o) and torch.equal(l2, lse)
    o3, l3 = rd.merge_attention(
        torch.zeros(1, 2),
        torch.full((1,), -math.inf),
        torch.zeros(1, 2),
        torch.full((1,), -math.inf),
    )
    assert not o3.isnan().any() and torch.isneginf(l3).all()


def _merge_without_rescale(o_a, lse_a, o_b, lse_b):
    """A deliberately wrong merge: averages the outputs instead of weighting by e^(lse - lse)."""
    return (o_a.float() + o_b.float()) / 2, torch.logaddexp(lse_a.float(), lse_b.float())


def test_distributed_wrong_merge_is_caught(rng):
    a, b = _np_partials(rng, masked_row=False)
    want_o, _ = osm.finalize(osm.merge(a, b))
    (oa, la), (ob, lb) = osm.finalize(a), osm.finalize(b)
    o, _ = _merge_without_rescale(*(torch.from_numpy(x) for x in (oa, la, ob, lb)))
    assert np.abs(o.numpy() - want_o).max() > 1e-2


def test_distributed_needs_process_group():
    x = torch.zeros(1, 1, 8, 16)
    if dist.is_initialized():
        pytest.skip("a process group is initialised in this process")
    with pytest.raises(RuntimeError, match="process group"):
        rd.ring_attention(x, x, x)


# --------------------------------------------------------------------------- on 2 and 4 ranks

# fp32 (IEEE in the interpreter), GQA (2 query heads share 1 K/V head), even and uneven N
CASES_2 = [
    dict(n=n, causal=c, layout=lay, Hq=2, kv_heads=1)
    for n in (24, 21)
    for c in (False, True)
    for lay in rd.LAYOUTS
]
CASES_4 = [
    dict(n=37, causal=c, layout=lay, Hq=2, kv_heads=1) for c in (False, True) for lay in rd.LAYOUTS
] + [
    dict(n=40, causal=True, layout="zigzag", dtype="float16"),
    dict(n=40, causal=True, layout="contiguous", dtype="bfloat16", Hq=3, kv_heads=3),
]


def _ids(cases):
    return [
        f"n{c['n']}-{'causal' if c['causal'] else 'full'}-{c['layout']}-{c.get('dtype', 'float32')}"
        for c in cases
    ]


def _two_rank_worker(cases):
    """Everything the 2-rank tests need, in one spawn (a spawn costs seconds of imports)."""
    out = {"rows": check_cases(cases), "errors": _errors_worker()}
    out["wrong merge"] = _wrong_merge_worker()  # last: it breaks merge_attention in this process
    return out


@pytest.fixture(scope="module")
def two_ranks():
    return spawn(_two_rank_worker, 2, (CASES_2,), timeout_s=TIMEOUT)


@pytest.fixture(scope="module")
def rows_2(two_ranks):
    return two_ranks[0]["rows"]


def _subgroup_worker():
    """Two rings of 2 inside 4 ranks ({0, 1} and {2, 3}), each on its own sequence."""
    from course_kernels.triton.flash import flash_attention

    rank = dist.get_rank()
    groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    group, local = groups[rank // 2], rank % 2
    g = torch.Generator().manual_seed(rank // 2)
    q, k, v = (torch.randn(1, 2, 10, 16, generator=g) for _ in range(3))
    sh = [rd.shard_sequence(x, 2, local, "zigzag") for x in (q, k, v)]
    out = rd.ring_attention(*sh, causal=True, group=group, layout="zigzag")
    full = rd.gather_sequence(out, "zigzag", group=group)
    return (full - flash_attention(q, k, v, causal=True)).abs().max().item()


def _four_rank_worker(cases):
    return {"rows": check_cases(cases), "subgroups": _subgroup_worker()}


@pytest.fixture(scope="module")
def four_ranks():
    return spawn(_four_rank_worker, 4, (CASES_4,), timeout_s=TIMEOUT)


@pytest.fixture(scope="module")
def rows_4(four_ranks):
    return four_ranks[0]["rows"]


def test_distributed_ring_on_subgroups(four_ranks):
    assert all(r["subgroups"] < 1e-5 for r in four_ranks)


def _assert_row(row):
    errs = {k: f"{v:.2e}" for k, v in row.items() if k.endswith("err")}
    assert row["ok"], f"ring_attention differs from the reference more than flash does: {errs}"
    assert row["o_vs_flash"] < 0.05 and row["dq_vs_flash"] < 0.05


@pytest.mark.parametrize("i", range(len(CASES_2)), ids=_ids(CASES_2))
def test_distributed_ring_matches_reference_2_ranks(rows_2, i):
    _assert_row(rows_2[i])


@pytest.mark.parametrize("i", range(len(CASES_4)), ids=_ids(CASES_4))
def test_distributed_ring_matches_reference_4_ranks(rows_4, i):
    _assert_row(rows_4[i])


def _wrong_merge_worker():
    """In a spawned rank: the ring with a merge that forgets the rescale must fail the check."""
    rd.merge_attention = _merge_without_rescale
    return check_case(n=16, causal=False, layout="contiguous", backward=False)


def _errors_worker():
    """In a spawned rank: bad inputs on one rank raise on every rank (no hang)."""
    rank, out = dist.get_rank(), {}
    x = torch.randn(1, 2, 4, 16)

    def attempt(name, **kw):
        try:
            rd.ring_attention(**kw)
            out[name] = "no error"
        except (ValueError, TypeError) as exc:
            out[name] = str(exc)

    wrong_len = torch.randn(1, 2, 4 + rank, 16)  # lengths 4 and 5: not the split of 9 tokens
    attempt("lengths", q=wrong_len, k=wrong_len, v=wrong_len)
    wrong_dtype = x.half() if rank == 1 else x
    attempt("dtype", q=wrong_dtype, k=wrong_dtype, v=wrong_dtype)
    attempt("one rank bad", q=x if rank == 0 else x[0], k=x, v=x)
    attempt("causal", q=x, k=x, v=x, causal=bool(rank))
    stats = rd.RingStats()
    q = torch.randn(1, 2, 8, 16, requires_grad=True)
    rd.ring_attention(q, q, q, stats=stats).sum().backward()
    out["bytes_sent"] = stats.bytes_sent
    out["steps"] = len(stats.rows())
    return out


def test_distributed_wrong_merge_fails_the_ring_check(two_ranks):
    row = two_ranks[0]["wrong merge"]
    assert not row["ok"] and row["o_err"] > 1e-2


def test_distributed_errors_are_raised_on_every_rank(two_ranks):
    res = [r["errors"] for r in two_ranks]
    for r in res:
        assert "not the contiguous split" in r["lengths"]
        assert "same dtype" in r["dtype"]
        assert "same causal" in r["causal"]
        # 1 forward K/V shard (fp32, q is k is v: 2 x 1x2x8x16 x 4 B), backward: 1 K/V + 2 dK/dV
        shard = 2 * 2 * 8 * 16 * 4
        assert r["bytes_sent"] == {"fwd": shard, "bwd": shard + 2 * shard}
        assert r["steps"] == 4
    assert "rank(s) [1] are invalid" in res[0]["one rank bad"]  # the others say who
    assert "must have rank 4" in res[1]["one rank bad"]  # the bad rank says what


def test_the_package_resolves_the_ring_public_names():
    import course_kernels.distributed as pkg

    for name in rd.__all__:
        assert getattr(pkg, name) is getattr(rd, name), name
    with pytest.raises(AttributeError):
        _ = pkg._local_calls  # private names stay in their module
