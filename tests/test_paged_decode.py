"""Split-KV decoding over a paged KV cache in Triton (the interpreter on a CPU): against the
NumPy paged version, the float64 reference and the contiguous ``flash_decode`` on the same data."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from course_kernels.serving import decode, paged_decode, pages  # noqa: E402
from course_kernels.testing import assert_close_to_reference, max_abs_error  # noqa: E402
from decode_cases import make_paged, naive, reference  # noqa: E402

DEV = decode._triton_env.device_kind()


def to_torch(*xs, dtype=torch.float32):
    return [torch.tensor(x, dtype=dtype, device=DEV) for x in xs]


@pytest.mark.parametrize(
    "lens,Hq,kv_heads,Nq,d,block_size,num_splits,causal",
    [
        ([37, 5], 4, 2, 1, 16, 16, 3, False),  # GQA, pages of 16 (vLLM's default)
        ([29, 40, 1], 8, 2, 1, 24, 5, 2, False),  # odd pages: a key tile spans several
        ([23, 9], 4, 1, 2, 32, 7, 4, True),  # MQA, two new tokens, bottom-right causal
        ([3], 2, 2, 1, 8, 1, 4, False),  # pages of one token; more splits than blocks
    ],
)
def test_paged_matches_numpy_and_reference(
    rng, lens, Hq, kv_heads, Nq, d, block_size, num_splits, causal
):
    q, kp, vp, table, lens, k, v = make_paged(
        rng, lens, Hq=Hq, kv_heads=kv_heads, Nq=Nq, d=d, block_size=block_size,
        dtype=np.float32,
    )  # fmt: skip
    out, lse = paged_decode.flash_decode_paged(
        *to_torch(q, kp, vp), torch.tensor(table), torch.tensor(lens),
        num_splits=num_splits, causal=causal, return_lse=True,
    )  # fmt: skip
    ref, ref_lse = reference(q, k, v, lens.tolist(), causal)
    assert out.shape == (len(lens), Hq, Nq, d) and out.dtype == torch.float32
    got = out.cpu().numpy()
    for b, n in enumerate(lens):  # the naive budget per sequence (its own cache length)
        kb, vb = k[b : b + 1, :, :n], v[b : b + 1, :, :n]
        if not causal:
            assert_close_to_reference(got[b : b + 1], ref[b : b + 1], naive(q[b : b + 1], kb, vb))
    assert max_abs_error(got, ref) < 1e-5
    np.testing.assert_allclose(lse.cpu().numpy(), ref_lse, atol=1e-5)
    want, _ = pages.split_kv_decode_paged_numpy(
        q.astype(np.float64), kp.astype(np.float64), vp.astype(np.float64), table, lens,
        num_splits, causal=causal,
    )  # fmt: skip
    assert max_abs_error(got, want) < 1e-5


def test_paged_equals_contiguous_flash_decode(rng):
    """Same data, two layouts: the paged kernel and flash_decode give the same numbers."""
    q, kp, vp, table, lens, k, v = make_paged(
        rng, [45, 17, 30], Hq=4, kv_heads=2, Nq=3, d=16, block_size=6, dtype=np.float32
    )
    for causal in (False, True):
        paged = paged_decode.flash_decode_paged(
            *to_torch(q, kp, vp), table, lens.tolist(), num_splits=3, causal=causal
        )
        contiguous = decode.flash_decode(
            *to_torch(q, k, v), cache_seqlens=torch.tensor(lens), num_splits=3, causal=causal
        )
        assert max_abs_error(paged.cpu().numpy(), contiguous.cpu().numpy()) < 2e-6


def test_paged_partials_match_numpy(rng):
    q, kp, vp, table, lens, k, v = make_paged(rng, [70, 33], block_size=8, dtype=np.float32)
    _, _, parts = paged_decode.flash_decode_paged(
        *to_torch(q, kp, vp), table, lens, num_splits=3, return_lse=True, return_partials=True
    )
    capacity = table.shape[1] * 8
    chunk = pages.split_chunk(capacity, 3, decode._block_k(torch.float32))
    _, _, want = pages.split_kv_decode_paged_numpy(
        *(x.astype(np.float64) for x in (q, kp, vp)), table, lens, 3, chunk=chunk,
        return_partials=True,
    )  # fmt: skip
    for got, exp in zip(parts, want, strict=True):
        np.testing.assert_allclose(got.cpu().numpy(), exp, rtol=1e-5, atol=1e-5)


def test_paged_half_precision(rng):
    q, kp, vp, table, lens, k, v = make_paged(rng, [40, 21], block_size=16, dtype=np.float32)
    out = paged_decode.flash_decode_paged(
        *to_torch(q, kp, vp, dtype=torch.float16), table, lens, num_splits=2
    )
    assert out.dtype == torch.float16
    ref, _ = reference(q, k, v, lens.tolist())
    assert max_abs_error(out.float().cpu().numpy(), ref) < 3e-3


def test_paged_bad_input(rng):
    q, kp, vp, table, lens, k, v = make_paged(rng, [7, 12], block_size=3, dtype=np.float32)
    tq, tkp, tvp = to_torch(q, kp, vp)
    run = paged_decode.flash_decode_paged
    bad = table.copy()
    bad[1, 0] = kp.shape[0]
    with pytest.raises(ValueError, match=r"block_table\[1\] points at page"):
        run(tq, tkp, tvp, bad, lens)
    with pytest.raises(ValueError, match=r"cache_seqlens\[0\] = 16"):
        run(tq, tkp, tvp, table, [16, 12])
    with pytest.raises(ValueError, match="needs cache_seqlens"):
        run(tq, tkp, tvp, table, None)
    with pytest.raises(ValueError, match="block_table must be"):
        run(tq, tkp, tvp, table[:1], lens)
    with pytest.raises(ValueError, match="block_table must be an integer"):
        run(tq, tkp, tvp, torch.tensor(table, dtype=torch.float32), lens)
    with pytest.raises(ValueError, match="rank-4"):
        run(tq, tkp[0], tvp, table, lens)
    with pytest.raises(ValueError, match="same first three dims"):
        run(tq, tkp, tvp[:, :2], table, lens)
    with pytest.raises(ValueError, match="multiple of the number of key/value"):
        run(tq[:, :3], tkp, tvp, table, lens)
    with pytest.raises(TypeError, match="check_table"):
        run(tq, tkp, tvp, table, lens, check_table=1)
    with pytest.raises(ValueError, match=r"num_splits must be an integer in 1\.\.256.*got 257"):
        run(tq, tkp, tvp, table, lens, num_splits=257)


def test_benchmark_pages_hold_the_cache(rng):
    """The GPU benchmark's scatter (apps.paged_runs.to_pages), checked here on the CPU."""
    from course_kernels.apps.paged_runs import to_pages

    q, k, v = to_torch(
        *(rng.standard_normal(s) for s in ((2, 4, 1, 16), (2, 2, 45, 16), (2, 2, 45, 16)))
    )
    table = torch.randperm(2 * 6, dtype=torch.int32).view(2, 6)  # pages of 8: 6 hold 45 tokens
    kp, vp = to_pages(k, table, 8), to_pages(v, table, 8)
    gk, _ = pages.gather_cache(kp.numpy(), vp.numpy(), table.numpy(), [45, 45])
    np.testing.assert_array_equal(gk, k.numpy())
    paged = paged_decode.flash_decode_paged(q, kp, vp, table, [45, 45], num_splits=2)
    assert max_abs_error(paged.numpy(), decode.flash_decode(q, k, v, num_splits=2).numpy()) < 2e-6
