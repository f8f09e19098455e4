"""Split-KV decoding (Flash-Decoding) in NumPy against the float64 reference (no torch needed)."""

import numpy as np
import pytest
from decode_cases import make_cache, peaked, reference
from hypothesis import given, settings
from hypothesis import strategies as st

from course_kernels.serving import split_kv
from course_kernels.numpy.online_softmax import PartialAttention
from course_kernels.testing import max_abs_error


@pytest.mark.parametrize("Hq,kv_heads", [(3, 3), (6, 2), (4, 1)])
@pytest.mark.parametrize("Nk,num_splits", [(1, 1), (37, 3), (64, 4), (13, 8)])
def test_decode_numpy_matches_reference(rng, Hq, kv_heads, Nk, num_splits):
    q, k, v = make_cache(rng, Hq=Hq, kv_heads=kv_heads, Nk=Nk, d=8)
    out, lse = split_kv.split_kv_decode_numpy(q, k, v, num_splits=num_splits)
    ref, ref_lse = reference(q, k, v)
    np.testing.assert_allclose(out, ref, atol=1e-12)
    np.testing.assert_allclose(lse, ref_lse, atol=1e-12)


@settings(max_examples=25, deadline=None)
@given(
    B=st.integers(1, 3),
    kv_heads=st.integers(1, 2),
    G=st.integers(1, 3),
    Nq=st.integers(1, 3),
    Nk=st.integers(3, 40),
    num_splits=st.integers(1, 6),
    causal=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_decode_numpy_property(B, kv_heads, G, Nq, Nk, num_splits, causal, seed):
    rng = np.random.default_rng(seed)
    q, k, v = make_cache(
        rng, B=B, Hq=G * kv_heads, kv_heads=kv_heads, Nq=Nq, Nk=Nk, d=4, spread=3.0
    )
    lens = rng.integers(Nq, Nk + 1, size=B)
    out, lse = split_kv.split_kv_decode_numpy(
        q, k, v, num_splits, cache_seqlens=lens, causal=causal
    )
    ref, ref_lse = reference(q, k, v, lens.tolist(), causal)
    np.testing.assert_allclose(out, ref, atol=1e-11)
    np.testing.assert_allclose(lse, ref_lse, atol=1e-11)


def test_decode_numpy_merge_without_rescaling_is_caught(rng, monkeypatch):
    """A merge that adds the partials as they are (no exp(m_s - m) factors) must fail."""
    q, k, v = peaked(rng)
    ref, _ = reference(q, k, v)
    good, _ = split_kv.split_kv_decode_numpy(q, k, v, num_splits=4)
    assert max_abs_error(good, ref) < 1e-12

    def merge_no_rescale(a, b):
        return PartialAttention(np.maximum(a.m, b.m), a.l + b.l, a.acc + b.acc)

    monkeypatch.setattr(split_kv, "merge", merge_no_rescale)
    bad, _ = split_kv.split_kv_decode_numpy(q, k, v, num_splits=4)
    assert max_abs_error(bad, ref) > 1e-2


def test_decode_numpy_one_split_is_plain_attention(rng):
    q, k, v = make_cache(rng, Nk=20)
    out1, _ = split_kv.split_kv_decode_numpy(q, k, v, num_splits=1)
    out5, _ = split_kv.split_kv_decode_numpy(q, k, v, num_splits=5)
    np.testing.assert_allclose(out1, out5, atol=1e-13)


def test_split_kv_takes_up_to_max_splits(rng):
    """The bound is inclusive: 256 splits of 20 keys (236 of them empty) still give the answer."""
    q, k, v = make_cache(rng, Nk=20)
    out1, _ = split_kv.split_kv_decode_numpy(q, k, v, num_splits=1)
    out_max, _ = split_kv.split_kv_decode_numpy(q, k, v, num_splits=split_kv.MAX_SPLITS)
    np.testing.assert_allclose(out1, out_max, atol=1e-13)


def test_split_kv_chunks():
    assert split_kv.split_chunk(100, 3, 16) == 48
    assert split_kv.split_chunk(100, 3) == 34
    assert split_kv.split_chunk(1, 4) == 1


def test_split_kv_bad_input():
    with pytest.raises(ValueError, match="prefill"):
        split_kv.split_kv_decode_numpy(
            np.zeros((1, 2, 100, 8)), np.zeros((1, 1, 4, 8)), np.zeros((1, 1, 4, 8))
        )
    q, k, v = make_cache(np.random.default_rng(0), Hq=4, kv_heads=2, Nk=10)
    with pytest.raises(TypeError, match="num_splits"):
        split_kv.split_kv_decode_numpy(q, k, v, num_splits=2.0)
    with pytest.raises(ValueError, match=r"num_splits must be an integer in 1\.\.256.*got 257"):
        split_kv.split_kv_decode_numpy(q, k, v, num_splits=split_kv.MAX_SPLITS + 1)
    with pytest.raises(ValueError, match="cache_seqlens"):
        split_kv.split_kv_decode_numpy(q, k, v, cache_seqlens=[11, 3])


def test_split_kv_imports_without_triton():
    """The NumPy rung must not pull in torch or Triton (the ladder's order)."""
    import subprocess
    import sys

    code = (
        "import sys; import course_kernels.serving.split_kv; "
        "bad = [m for m in ('torch', 'triton') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# -- mutation audit: defaults, scale, every shape check, cache lengths, the row limit -------------


def test_split_kv_defaults_are_four_splits_and_no_causal_mask(rng):
    q, k, v = make_cache(rng, Nq=3, Nk=21)
    out, lse, parts = split_kv.split_kv_decode_numpy(q, k, v, return_partials=True)
    assert parts.m.shape == (2, 4, 3, 4) and parts.acc.shape == (2, 4, 3, 4, 16)
    ref, ref_lse = reference(q, k, v)
    np.testing.assert_allclose(out, ref, atol=1e-12)
    np.testing.assert_allclose(lse, ref_lse, atol=1e-12)
    causal, _ = reference(q, k, v, causal=True)
    assert np.abs(out - causal).max() > 1e-3  # the default is really not causal


def test_split_kv_applies_the_scale(rng):
    from course_kernels import attention_reference

    q, k, v = make_cache(rng, Hq=2, kv_heads=2, Nk=13, d=8)
    out, lse = split_kv.split_kv_decode_numpy(q, k, v, 3, scale=-0.4)
    want, want_lse = attention_reference(q, k, v, scale=-0.4)
    np.testing.assert_allclose(out, want, atol=1e-12)
    np.testing.assert_allclose(lse, want_lse, atol=1e-12)


def test_split_kv_cache_seqlens_forms():
    """One int is every sequence's length; lengths are B integers in 1..Nk."""
    q, k, v = make_cache(np.random.default_rng(1), B=2, Nk=10)
    one, _ = split_kv.split_kv_decode_numpy(q, k, v, 2, cache_seqlens=6)
    ref, _ = reference(q, k, v, [6, 6])
    np.testing.assert_allclose(one, ref, atol=1e-12)
    for bad in ([0, 3], [3.0, 4.0], np.array([3, 4, 5])):
        with pytest.raises(ValueError, match="cache_seqlens"):
            split_kv.split_kv_decode_numpy(q, k, v, cache_seqlens=bad)


@pytest.mark.parametrize(
    "shapes,dtypes,error,match",
    [
        (((1, 2, 1, 8), (1, 2, 4, 8), (1, 2, 4, 8)), ("f8", "f4", "f8"), TypeError, "one dtype"),
        (((1, 2, 1, 8), (2, 2, 4, 8), (2, 2, 4, 8)), ("f8",) * 3, ValueError, "batch size"),
        (((1, 2, 1, 8), (1, 2, 4, 6), (1, 2, 4, 8)), ("f8",) * 3, ValueError, "head dim"),
        (((1, 2, 1, 8), (1, 2, 4, 8), (1, 2, 5, 8)), ("f8",) * 3, ValueError, r"\(batch, heads"),
        (((1, 2, 1, 8), (1, 2, 4, 8), (1, 1, 4, 8)), ("f8",) * 3, ValueError, r"\(batch, heads"),
        (((2, 1, 8), (2, 4, 8), (2, 4, 8)), ("f8",) * 3, ValueError, "rank 4"),
    ],
)
def test_split_kv_shape_checks(shapes, dtypes, error, match):
    q, k, v = (np.ones(s, dtype=t) for s, t in zip(shapes, dtypes, strict=True))
    with pytest.raises(error, match=match):
        split_kv.split_kv_decode_numpy(q, k, v)


def test_split_kv_row_limit_is_inclusive():
    """(Hq / kv_heads) * Nq = 128 rows is still decoding; 129 is not."""
    rng = np.random.default_rng(2)
    k, v = rng.standard_normal((2, 1, 1, 3, 4))
    q = rng.standard_normal((1, 64, 2, 4))  # 64 x 2 = 128 rows
    out, _ = split_kv.split_kv_decode_numpy(q, k, v, 2)
    np.testing.assert_allclose(out, reference(q, k, v)[0], atol=1e-12)
    with pytest.raises(ValueError, match="129 query rows"):
        split_kv.split_kv_decode_numpy(rng.standard_normal((1, 43, 3, 4)), k, v)


def test_split_kv_checks_causal_and_chunk():
    q, k, v = make_cache(np.random.default_rng(3), Nk=10)
    with pytest.raises(TypeError, match="causal"):
        split_kv.split_kv_decode_numpy(q, k, v, causal=1)
    with pytest.raises(ValueError, match="chunk"):
        split_kv.split_kv_decode_numpy(q, k, v, chunk=0)
    with pytest.raises(TypeError, match="chunk"):
        split_kv.split_kv_decode_numpy(q, k, v, chunk=2.0)


def test_check_shapes_is_the_shared_shape_check():
    """check_shapes also guards the Triton decode kernels (decode.py, paged_decode.py), which
    have no head-dim check of their own: (B, Hq, Nq, d) back, or a clear error."""
    f = np.float32
    got = split_kv.check_shapes((2, 4, 3, 8), (2, 2, 9, 8), (2, 2, 9, 5), f, f, f)
    assert got == (2, 4, 3, 8)
    with pytest.raises(TypeError, match="one dtype"):
        split_kv.check_shapes((1, 2, 1, 8), (1, 2, 4, 8), (1, 2, 4, 8), f, np.float16, f)
    with pytest.raises(ValueError, match="share the head dim; got 16 and 8"):
        split_kv.check_shapes((1, 2, 1, 16), (1, 2, 8, 8), (1, 2, 8, 8), f, f, f)
