"""Split-KV decoding (Flash-Decoding) in Triton against the float64 reference and the NumPy version.

The Triton kernels run in Triton's CPU interpreter when there is no GPU (tiny sizes).
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from course_kernels.serving import decode  # noqa: E402
from course_kernels.serving.split_kv import split_chunk, split_kv_decode_numpy  # noqa: E402
from course_kernels.testing import assert_close_to_reference, max_abs_error  # noqa: E402
from decode_cases import make_cache, naive, peaked, reference  # noqa: E402


# -- Triton -----------------------------------------------------------------------------------
DEV = decode._triton_env.device_kind()


def to_torch(*xs, dtype=torch.float32):
    return [torch.tensor(x, dtype=dtype, device=DEV) for x in xs]


@pytest.mark.parametrize(
    "Hq,kv_heads,Nq,Nk,d,num_splits",
    [
        (4, 4, 1, 37, 16, 3),  # MHA, Nk not a multiple of the chunk
        (8, 2, 1, 100, 24, 4),  # GQA groups of 4, head dim not a power of two
        (4, 1, 2, 50, 32, 2),  # MQA, two query tokens
        (2, 2, 1, 5, 8, 4),  # more splits than key blocks: empty splits
    ],
)
def test_decode_triton_matches_reference(rng, Hq, kv_heads, Nq, Nk, d, num_splits):
    q, k, v = make_cache(rng, Hq=Hq, kv_heads=kv_heads, Nq=Nq, Nk=Nk, d=d, dtype=np.float32)
    out, lse = decode.flash_decode(*to_torch(q, k, v), num_splits=num_splits, return_lse=True)
    ref, ref_lse = reference(q, k, v)
    assert out.shape == (2, Hq, Nq, d) and out.dtype == torch.float32
    assert_close_to_reference(out.cpu().numpy(), ref, naive(q, k, v))
    np.testing.assert_allclose(lse.cpu().numpy(), ref_lse, atol=1e-5)


def test_decode_triton_causal_and_cache_lengths(rng):
    q, k, v = make_cache(rng, B=3, Hq=4, kv_heads=2, Nq=3, Nk=45, d=16, dtype=np.float32)
    lens = [45, 17, 3]  # the last: query 0 sees one key
    out = decode.flash_decode(
        *to_torch(q, k, v), cache_seqlens=torch.tensor(lens), causal=True, num_splits=3
    )
    ref, _ = reference(q, k, v, lens, causal=True)
    assert max_abs_error(out.cpu().numpy(), ref) < 1e-5


def test_decode_triton_partials_match_numpy(rng):
    """The split step on its own: each chunk's (m, l, acc) equals partial_attention's."""
    q, k, v = make_cache(rng, Hq=4, kv_heads=2, Nk=70, d=16, dtype=np.float32)
    _, _, parts = decode.flash_decode(
        *to_torch(q, k, v), num_splits=3, return_lse=True, return_partials=True
    )
    chunk = split_chunk(70, 3, decode._block_k(torch.float32))
    _, _, want = split_kv_decode_numpy(
        q.astype(np.float64),
        k.astype(np.float64),
        v.astype(np.float64),
        3,
        chunk=chunk,
        return_partials=True,
    )
    for got, exp in zip(parts, want, strict=True):
        np.testing.assert_allclose(got.cpu().numpy(), exp, rtol=1e-5, atol=1e-5)


def test_decode_triton_combine_rescales(rng):
    """Chunk maxima differ by ~10: adding the partials without rescaling would be far off."""
    q, k, v = peaked(rng)
    out, _, parts = decode.flash_decode(
        *to_torch(q, k, v), num_splits=4, return_lse=True, return_partials=True
    )
    ref, _ = reference(q, k, v)
    assert max_abs_error(out.cpu().numpy(), ref) < 1e-5
    m, l, acc = (x.cpu().double().numpy() for x in parts)
    assert np.ptp(m) > 5
    unscaled = acc.sum(axis=-2) / l.sum(axis=-1)[..., None]  # (B, Hq, Nq, d)
    assert max_abs_error(unscaled, ref) > 1e-2


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_decode_triton_half_precision(rng, dtype):
    q, k, v = make_cache(rng, Hq=4, kv_heads=2, Nk=40, d=16, dtype=np.float32)
    out = decode.flash_decode(*to_torch(q, k, v, dtype=dtype), num_splits=2)
    assert out.dtype == dtype
    ref, _ = reference(q, k, v)
    qh, kh, vh = (torch.tensor(x).to(dtype).float().numpy() for x in (q, k, v))
    budget = 2 * max_abs_error(
        naive(qh.astype(np.float16), kh.astype(np.float16), vh.astype(np.float16)), ref
    )
    tol = budget if dtype == torch.float16 else 4e-2  # bf16 rounds the output to 8 bits
    assert max_abs_error(out.float().cpu().numpy(), ref) <= max(tol, 1e-3)


def test_decode_default_num_splits():
    n = decode.default_num_splits(batch_kv_heads=8, n_keys=4096)
    assert n >= 1
    assert decode.default_num_splits(8, 1) == 1
    assert split_chunk(100, 3, 16) == 48
    assert split_chunk(100, 3) == 34


def test_decode_bad_input(rng):
    q, k, v = to_torch(*make_cache(rng, Hq=4, kv_heads=2, Nk=10))
    with pytest.raises(TypeError, match="torch.Tensor"):
        decode.flash_decode(q.cpu().numpy(), k, v)
    with pytest.raises(ValueError, match="multiple of the number of key/value"):
        decode.flash_decode(q[:, :3], k, v)
    with pytest.raises(ValueError, match="rank 4"):
        decode.flash_decode(q[0], k[0], v[0])
    with pytest.raises(ValueError, match="cache_seqlens"):
        decode.flash_decode(q, k, v, cache_seqlens=[11, 3])
    with pytest.raises(ValueError, match="cache_seqlens"):
        decode.flash_decode(q, k, v, cache_seqlens=torch.tensor([1.0, 2.0]))
    with pytest.raises(ValueError, match="num_splits"):
        decode.flash_decode(q, k, v, num_splits=0)
    with pytest.raises(ValueError, match=r"num_splits must be an integer in 1\.\.256.*got 10+$"):
        decode.flash_decode(q, k, v, num_splits=10**9)  # refused before any partial is allocated
    with pytest.raises(TypeError, match="causal"):
        decode.flash_decode(q, k, v, causal=1)
    with pytest.raises(TypeError, match="float16, bfloat16 or float32"):
        decode.flash_decode(q.double(), k.double(), v.double())


@pytest.mark.skipif(not decode.INTERPRET, reason="on a GPU the benchmark runs (tests/gpu)")
def test_decode_benchmark_needs_a_gpu():
    from course_kernels.apps import runs as apps

    with pytest.raises(RuntimeError, match="CUDA GPU"):
        apps.decode_benchmark(contexts=(64,))
