"""Split-KV decoding (Flash-Decoding) against the float64 reference, in NumPy and in Triton.

The Triton kernels run in Triton's CPU interpreter when there is no GPU (tiny sizes).
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from course_kernels import attention_naive, attention_reference, decode  # noqa: E402
from course_kernels.online_softmax import PartialAttention  # noqa: E402
from course_kernels.testing import assert_close_to_reference, max_abs_error  # noqa: E402


def make_cache(rng, B=2, Hq=4, Hkv=2, Nq=1, Nk=37, d=16, dtype=np.float64, spread=1.0):
    q = (spread * rng.standard_normal((B, Hq, Nq, d))).astype(dtype)
    k = rng.standard_normal((B, Hkv, Nk, d)).astype(dtype)
    v = rng.standard_normal((B, Hkv, Nk, d)).astype(dtype)
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


# -- NumPy ------------------------------------------------------------------------------------
@pytest.mark.parametrize("Hq,Hkv", [(3, 3), (6, 2), (4, 1)])
@pytest.mark.parametrize("Nk,num_splits", [(1, 1), (37, 3), (64, 4), (13, 8)])
def test_decode_numpy_matches_reference(rng, Hq, Hkv, Nk, num_splits):
    q, k, v = make_cache(rng, Hq=Hq, Hkv=Hkv, Nk=Nk, d=8)
    out, lse = decode.split_kv_decode_numpy(q, k, v, num_splits=num_splits)
    ref, ref_lse = reference(q, k, v)
    np.testing.assert_allclose(out, ref, atol=1e-12)
    np.testing.assert_allclose(lse, ref_lse, atol=1e-12)


@settings(max_examples=25, deadline=None)
@given(
    B=st.integers(1, 3), Hkv=st.integers(1, 2), G=st.integers(1, 3), Nq=st.integers(1, 3),
    Nk=st.integers(3, 40), num_splits=st.integers(1, 6), causal=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_decode_numpy_property(B, Hkv, G, Nq, Nk, num_splits, causal, seed):
    rng = np.random.default_rng(seed)
    q, k, v = make_cache(rng, B=B, Hq=G * Hkv, Hkv=Hkv, Nq=Nq, Nk=Nk, d=4, spread=3.0)
    lens = rng.integers(Nq, Nk + 1, size=B)
    out, lse = decode.split_kv_decode_numpy(q, k, v, num_splits, cache_seqlens=lens, causal=causal)
    ref, ref_lse = reference(q, k, v, lens.tolist(), causal)
    np.testing.assert_allclose(out, ref, atol=1e-11)
    np.testing.assert_allclose(lse, ref_lse, atol=1e-11)


def test_decode_numpy_merge_without_rescaling_is_caught(rng, monkeypatch):
    """A merge that adds the partials as they are (no exp(m_s - m) factors) must fail."""
    q, k, v = peaked(rng)
    ref, _ = reference(q, k, v)
    good, _ = decode.split_kv_decode_numpy(q, k, v, num_splits=4)
    assert max_abs_error(good, ref) < 1e-12

    def merge_no_rescale(a, b):
        return PartialAttention(np.maximum(a.m, b.m), a.l + b.l, a.acc + b.acc)

    monkeypatch.setattr(decode, "merge", merge_no_rescale)
    bad, _ = decode.split_kv_decode_numpy(q, k, v, num_splits=4)
    assert max_abs_error(bad, ref) > 1e-2


def test_decode_numpy_one_split_is_plain_attention(rng):
    q, k, v = make_cache(rng, Nk=20)
    out1, _ = decode.split_kv_decode_numpy(q, k, v, num_splits=1)
    out5, _ = decode.split_kv_decode_numpy(q, k, v, num_splits=5)
    np.testing.assert_allclose(out1, out5, atol=1e-13)


# -- Triton -----------------------------------------------------------------------------------
DEV = decode._triton_env.device_kind()


def to_torch(*xs, dtype=torch.float32):
    return [torch.tensor(x, dtype=dtype, device=DEV) for x in xs]


@pytest.mark.parametrize(
    "Hq,Hkv,Nq,Nk,d,num_splits",
    [
        (4, 4, 1, 37, 16, 3),  # MHA, Nk not a multiple of the chunk
        (8, 2, 1, 100, 24, 4),  # GQA groups of 4, head dim not a power of two
        (4, 1, 2, 50, 32, 2),  # MQA, two query tokens
        (2, 2, 1, 5, 8, 4),  # more splits than key blocks: empty splits
    ],
)
def test_decode_triton_matches_reference(rng, Hq, Hkv, Nq, Nk, d, num_splits):
    q, k, v = make_cache(rng, Hq=Hq, Hkv=Hkv, Nq=Nq, Nk=Nk, d=d, dtype=np.float32)
    out, lse = decode.flash_decode(*to_torch(q, k, v), num_splits=num_splits, return_lse=True)
    ref, ref_lse = reference(q, k, v)
    assert out.shape == (2, Hq, Nq, d) and out.dtype == torch.float32
    assert_close_to_reference(out.cpu().numpy(), ref, naive(q, k, v))
    np.testing.assert_allclose(lse.cpu().numpy(), ref_lse, atol=1e-5)


def test_decode_triton_causal_and_cache_lengths(rng):
    q, k, v = make_cache(rng, B=3, Hq=4, Hkv=2, Nq=3, Nk=45, d=16, dtype=np.float32)
    lens = [45, 17, 3]  # the last: query 0 sees one key
    out = decode.flash_decode(*to_torch(q, k, v), cache_seqlens=torch.tensor(lens),
                              causal=True, num_splits=3)
    ref, _ = reference(q, k, v, lens, causal=True)
    assert max_abs_error(out.cpu().numpy(), ref) < 1e-5


def test_decode_triton_partials_match_numpy(rng):
    """The split step on its own: each chunk's (m, l, acc) equals partial_attention's."""
    q, k, v = make_cache(rng, Hq=4, Hkv=2, Nk=70, d=16, dtype=np.float32)
    _, _, parts = decode.flash_decode(*to_torch(q, k, v), num_splits=3, return_lse=True,
                                      return_partials=True)
    chunk = decode.split_chunk(70, 3, decode._block_n(torch.float32))
    _, _, want = decode.split_kv_decode_numpy(q.astype(np.float64), k.astype(np.float64),
                                              v.astype(np.float64), 3, chunk=chunk,
                                              return_partials=True)
    for got, exp in zip(parts, want):
        np.testing.assert_allclose(got.cpu().numpy(), exp, rtol=1e-5, atol=1e-5)


def test_decode_triton_combine_rescales(rng):
    """Chunk maxima differ by ~10: adding the partials without rescaling would be far off."""
    q, k, v = peaked(rng)
    out, _, parts = decode.flash_decode(*to_torch(q, k, v), num_splits=4, return_lse=True,
                                        return_partials=True)
    ref, _ = reference(q, k, v)
    assert max_abs_error(out.cpu().numpy(), ref) < 1e-5
    m, l, acc = (x.cpu().double().numpy() for x in parts)
    assert np.ptp(m) > 5
    unscaled = acc.sum(axis=-2) / l.sum(axis=-1)[..., None]  # (B, Hq, Nq, d)
    assert max_abs_error(unscaled, ref) > 1e-2


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_decode_triton_half_precision(rng, dtype):
    q, k, v = make_cache(rng, Hq=4, Hkv=2, Nk=40, d=16, dtype=np.float32)
    out = decode.flash_decode(*to_torch(q, k, v, dtype=dtype), num_splits=2)
    assert out.dtype == dtype
    ref, _ = reference(q, k, v)
    qh, kh, vh = (torch.tensor(x).to(dtype).float().numpy() for x in (q, k, v))
    budget = 2 * max_abs_error(naive(qh.astype(np.float16), kh.astype(np.float16),
                                      vh.astype(np.float16)), ref)
    tol = budget if dtype == torch.float16 else 4e-2  # bf16 rounds the output to 8 bits
    assert max_abs_error(out.float().cpu().numpy(), ref) <= max(tol, 1e-3)


def test_decode_default_num_splits():
    n = decode.default_num_splits(batch_kv_heads=8, n_keys=4096)
    assert n >= 1
    assert decode.default_num_splits(8, 1) == 1
    assert decode.split_chunk(100, 3, 16) == 48
    assert decode.split_chunk(100, 3) == 34


def test_decode_bad_input(rng):
    q, k, v = to_torch(*make_cache(rng, Hq=4, Hkv=2, Nk=10))
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
    with pytest.raises(TypeError, match="causal"):
        decode.flash_decode(q, k, v, causal=1)
    with pytest.raises(TypeError, match="float16, bfloat16 or float32"):
        decode.flash_decode(q.double(), k.double(), v.double())
    with pytest.raises(ValueError, match="prefill"):
        decode.split_kv_decode_numpy(np.zeros((1, 2, 100, 8)), np.zeros((1, 1, 4, 8)),
                                     np.zeros((1, 1, 4, 8)))
    with pytest.raises(TypeError, match="num_splits"):
        decode.split_kv_decode_numpy(q.cpu().numpy(), k.cpu().numpy(), v.cpu().numpy(),
                                     num_splits=2.0)


@pytest.mark.skipif(not decode.INTERPRET, reason="on a GPU the benchmark runs (tests/gpu)")
def test_decode_benchmark_needs_a_gpu():
    with pytest.raises(RuntimeError, match="CUDA GPU"):
        decode.benchmark(contexts=(64,))
