"""course_kernels.numpy.online_softmax: the update, the merge (exact, associative), the -inf guard."""

import itertools

import numpy as np
import pytest
from attention_inputs import make_qkv
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from course_kernels import attention_reference, causal_mask
from course_kernels.numpy.online_softmax import (
    empty_partial,
    finalize,
    init_state,
    merge,
    online_softmax,
    partial_attention,
    update,
)

finite = st.floats(-50, 50, allow_nan=False, width=64)
rows = arrays(np.float64, st.tuples(st.integers(1, 4), st.integers(1, 40)), elements=finite)


def softmax_direct(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


@settings(max_examples=60, deadline=None)
@given(x=rows, block=st.integers(1, 50))
def test_online_softmax_equals_direct_softmax(x, block):
    np.testing.assert_allclose(
        online_softmax(x, block_k=block), softmax_direct(x), rtol=1e-12, atol=1e-15
    )


@settings(max_examples=40, deadline=None)
@given(x=rows, shift=st.floats(-1e3, 1e3), block=st.integers(1, 7))
def test_online_softmax_is_shift_invariant(x, shift, block):
    np.testing.assert_allclose(
        online_softmax(x + shift, block_k=block), online_softmax(x, block_k=block), atol=1e-10
    )


def test_online_softmax_does_not_overflow_on_large_scores():
    x = np.array([[1000.0, 999.0, 998.0]])
    out = online_softmax(x, block_k=1)
    assert np.all(np.isfinite(out))
    np.testing.assert_allclose(out, softmax_direct(x))


def test_online_softmax_keeps_float32():
    x = np.random.default_rng(0).standard_normal((3, 50)).astype(np.float32)
    out = online_softmax(x, block_k=8)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, softmax_direct(x.astype(np.float64)), rtol=2e-6)


def test_fully_masked_row_gives_zeros_not_nan():
    x = np.array([[-np.inf, -np.inf, -np.inf], [0.0, -np.inf, 1.0]])
    out = online_softmax(x, block_k=1)
    assert not np.isnan(out).any()
    np.testing.assert_array_equal(out[0], 0.0)
    np.testing.assert_allclose(out[1], softmax_direct(x[1:])[0])


def test_update_rescales_the_running_sum():
    state = init_state((1,))
    state, p1, alpha1 = update(state, np.array([[1.0, 2.0]]))
    assert alpha1[0] == 0.0  # nothing was accumulated before
    state, p2, alpha2 = update(state, np.array([[5.0]]))
    np.testing.assert_allclose(alpha2, np.exp(2.0 - 5.0))
    np.testing.assert_allclose(state.m, [5.0])
    np.testing.assert_allclose(state.l, [np.exp(1 - 5) + np.exp(2 - 5) + 1.0])
    np.testing.assert_allclose(p2, [[1.0]])


def test_update_of_all_masked_block_keeps_state_finite():
    state, p, alpha = update(init_state((2,)), np.full((2, 3), -np.inf))
    assert np.isneginf(state.m).all() and (state.l == 0).all()
    assert not np.isnan(p).any() and not np.isnan(alpha).any()


def _split_partials(rng, n_parts, n_q=5, n_k=23, d=4):
    q, k, v = make_qkv(rng, lead=(2,), n_q=n_q, n_k=n_k, d=d, dv=3)
    cuts = np.sort(rng.choice(np.arange(1, n_k), size=n_parts - 1, replace=False))
    bounds = [0, *cuts.tolist(), n_k]
    parts = [
        partial_attention(q, k[..., a:b, :], v[..., a:b, :]) for a, b in itertools.pairwise(bounds)
    ]
    return (q, k, v), parts


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31), n_parts=st.integers(2, 6))
def test_merge_of_all_chunks_equals_full_attention(seed, n_parts):
    (q, k, v), parts = _split_partials(np.random.default_rng(seed), n_parts)
    acc = parts[0]
    for p in parts[1:]:
        acc = merge(acc, p)
    out, lse = finalize(acc)
    ref_out, ref_lse = attention_reference(q, k, v)
    np.testing.assert_allclose(out, ref_out, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-12, atol=1e-13)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31))
def test_merge_is_associative_and_commutative(seed):
    _, (a, b, c) = _split_partials(np.random.default_rng(seed), 3)
    left = finalize(merge(merge(a, b), c))
    right = finalize(merge(a, merge(b, c)))
    swapped = finalize(merge(c, merge(b, a)))
    for x, y in [(left, right), (left, swapped)]:
        np.testing.assert_allclose(x[0], y[0], rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(x[1], y[1], rtol=1e-12, atol=1e-13)


def test_merge_with_empty_partial_is_identity(rng):
    _, (a, _b) = _split_partials(rng, 2)
    e = empty_partial(a.m.shape, a.acc.shape[-1])
    for merged in (merge(a, e), merge(e, a)):
        np.testing.assert_array_equal(merged.m, a.m)
        np.testing.assert_allclose(merged.l, a.l)
        np.testing.assert_allclose(merged.acc, a.acc)


def test_merge_catches_missing_rescale(rng):
    """A merge that adds accumulators without rescaling is wrong; the exactness test sees it."""
    (q, k, v), (a, b) = _split_partials(rng, 2)
    wrong = a._replace(m=np.maximum(a.m, b.m), l=a.l + b.l, acc=a.acc + b.acc)
    ref_out, _ = attention_reference(q, k, v)
    assert not np.allclose(finalize(wrong)[0], ref_out, atol=1e-6)


def test_partial_with_fully_masked_rows_merges_without_nan(rng):
    q, k, v = make_qkv(rng, lead=(), n_q=6, n_k=6, d=4)
    mask = causal_mask(6, 6)
    # keys 3..5 are invisible to queries 0..2: those rows of the second chunk are fully masked
    a = partial_attention(q, k[:3], v[:3], mask=mask[:, :3])
    b = partial_attention(q, k[3:], v[3:], mask=mask[:, 3:])
    assert np.isneginf(b.m[:3]).all()
    out, lse = finalize(merge(a, b))
    ref_out, ref_lse = attention_reference(q, k, v, causal=True)
    assert not np.isnan(out).any()
    np.testing.assert_allclose(out, ref_out, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-12, atol=1e-13)


def test_finalize_of_empty_partial_is_zero_with_minus_inf_lse():
    out, lse = finalize(empty_partial((3,), 2))
    np.testing.assert_array_equal(out, 0.0)
    assert np.isneginf(lse).all()


@pytest.mark.parametrize("bad,exc", [(0, ValueError), (-3, ValueError), (2.5, TypeError)])
def test_online_softmax_rejects_bad_block(bad, exc):
    with pytest.raises(exc, match="block_k must be an integer >= 1"):
        online_softmax(np.ones((2, 3)), block_k=bad)


@pytest.mark.parametrize(
    "x,exc,match",
    [
        (np.ones((2, 0)), ValueError, "non-empty last axis"),
        (np.float64(1.0), ValueError, "non-empty last axis"),
        (np.arange(6).reshape(2, 3), TypeError, "floating point"),
    ],
)
def test_online_softmax_rejects_empty_or_integer_input(x, exc, match):
    with pytest.raises(exc, match=match):
        online_softmax(x)


def test_partial_attention_applies_the_scale(rng):
    q, k, v = make_qkv(rng, lead=(2,), n_q=5, n_k=9, d=4, dv=3)
    out, lse = finalize(partial_attention(q, k, v, scale=0.9))
    ref_out, ref_lse = attention_reference(q, k, v, scale=0.9)
    np.testing.assert_allclose(out, ref_out, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_partial_and_finalize_work_in_float32_for_low_precision(rng, dtype):
    """fp16 and fp32 inputs: m, l, acc and the finalized (out, lse) are float32, never float64."""
    q, k, v = make_qkv(rng, lead=(2,), n_q=5, n_k=9, d=4, dv=3, dtype=dtype)
    a = partial_attention(q, k[..., :4, :], v[..., :4, :])
    b = partial_attention(q, k[..., 4:, :], v[..., 4:, :])
    assert all(x.dtype == np.float32 for x in (*a, *b))
    out, lse = finalize(merge(a, b))
    assert out.dtype == np.float32 and lse.dtype == np.float32
    ref_out, ref_lse = attention_reference(q, k, v)
    tol = 1e-5 if dtype == np.float32 else 1e-3
    np.testing.assert_allclose(out, ref_out, atol=tol)
    np.testing.assert_allclose(lse, ref_lse, rtol=tol)
