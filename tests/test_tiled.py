"""course_kernels.numpy.tiled: the tiled forward pass, both loop orders, against the float64 reference.

The harness ``forward_failures`` is what decides correctness; it is run on the real
implementation (must pass) and on known-wrong variants (each must be caught).
"""

import numpy as np
import pytest
from attention_inputs import make_qkv
from hypothesis import given, settings
from hypothesis import strategies as st

from course_kernels import attention_naive, attention_reference, flash_attention_numpy
from course_kernels.numpy.online_softmax import safe_max
from course_kernels.testing import assert_close_to_reference

# (n_q, n_k, d, causal, block_q, block_k, score_multiplier)
CASES = [
    (1, 1, 8, False, 4, 4, 1.0),
    (7, 7, 1, True, 3, 2, 1.0),
    (113, 113, 8, True, 16, 16, 1.0),
    (113, 203, 40, False, 16, 32, 1.0),
    (113, 203, 40, True, 32, 7, 1.0),
    (33, 33, 16, False, 8, 8, 40.0),  # scores in the thousands: overflow without max-subtraction
]


def forward_failures(impl, rng, loop_order="fa2"):
    """Run impl over CASES; return descriptions of the cases it gets wrong."""
    failures = []
    for n_q, n_k, d, causal, bq, bk, mult in CASES:
        q, k, v = make_qkv(rng, lead=(2,), n_q=n_q, n_k=n_k, d=d, scale=mult)
        ref_out, ref_lse = attention_reference(q, k, v, causal=causal)
        with np.errstate(all="ignore"):
            out, lse = impl(q, k, v, causal=causal, block_q=bq, block_k=bk, loop_order=loop_order)
        ok = np.allclose(out, ref_out, rtol=1e-9, atol=1e-10) and np.allclose(
            lse, ref_lse, rtol=1e-9
        )
        if not ok:
            failures.append((n_q, n_k, d, causal, bq, bk, mult))
    return failures


@pytest.mark.parametrize("loop_order", ["fa1", "fa2"])
def test_tiled_forward_matches_reference(rng, loop_order):
    assert forward_failures(flash_attention_numpy, rng, loop_order) == []


def _mutant(bug):
    """A compact FA2 forward with one classic mistake switched on."""

    def impl(q, k, v, causal=False, scale=None, block_q=16, block_k=16, loop_order="fa2"):
        n_q, n_k = q.shape[-2], k.shape[-2]
        scale = 1 / np.sqrt(q.shape[-1]) if scale is None else scale
        out = np.zeros(q.shape[:-1] + v.shape[-1:])
        lse = np.zeros(q.shape[:-1])
        for i0 in range(0, n_q, block_q):
            i1 = min(i0 + block_q, n_q)
            m = np.full(q.shape[:-2] + (i1 - i0,), -np.inf)
            l = np.zeros_like(m)
            acc = np.zeros(q.shape[:-2] + (i1 - i0, v.shape[-1]))
            for j0 in range(0, n_k, block_k):
                j1 = min(j0 + block_k, n_k)
                s = scale * q[..., i0:i1, :] @ np.swapaxes(k[..., j0:j1, :], -1, -2)
                if causal:
                    rows, cols = np.arange(i0, i1)[:, None], np.arange(j0, j1)[None, :]
                    visible = cols < rows if bug == "causal_off_by_one" else cols <= rows
                    s = np.where(visible, s, -np.inf)
                m_new = np.maximum(m, s.max(-1))
                if bug == "max_not_subtracted":
                    m_new = np.zeros_like(m_new)
                p = np.exp(s - safe_max(m_new)[..., None])
                alpha = np.exp(m - safe_max(m_new))
                if bug == "no_rescale":
                    l, acc = l + p.sum(-1), acc + p @ v[..., j0:j1, :]
                elif bug == "rescale_l_not_o":
                    l, acc = alpha * l + p.sum(-1), acc + p @ v[..., j0:j1, :]
                elif bug == "normalize_every_block":
                    psum = p.sum(-1, keepdims=True)
                    l = alpha * l + 1.0
                    acc = (
                        alpha[..., None] * acc
                        + (p / np.where(psum == 0, 1, psum)) @ v[..., j0:j1, :]
                    )
                else:
                    l, acc = alpha * l + p.sum(-1), alpha[..., None] * acc + p @ v[..., j0:j1, :]
                m = m_new
            out[..., i0:i1, :] = acc / np.where(l == 0, 1, l)[..., None]
            lse[..., i0:i1] = safe_max(m) + np.log(np.where(l == 0, 1, l))
        return out, lse

    return impl


def test_harness_accepts_the_unbugged_mutant(rng):
    assert forward_failures(_mutant(None), rng) == []


@pytest.mark.parametrize(
    "bug",
    [
        "no_rescale",
        "rescale_l_not_o",
        "normalize_every_block",
        "max_not_subtracted",
        "causal_off_by_one",
    ],
)
def test_harness_catches_known_wrong_variant(rng, bug):
    assert forward_failures(_mutant(bug), rng) != []


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**31),
    n_q=st.integers(1, 40),
    n_k=st.integers(1, 40),
    bq1=st.integers(1, 45),
    bk1=st.integers(1, 45),
    bq2=st.integers(1, 45),
    bk2=st.integers(1, 45),
    causal=st.booleans(),
    loop_order=st.sampled_from(["fa1", "fa2"]),
)
def test_output_is_independent_of_block_sizes(
    seed, n_q, n_k, bq1, bk1, bq2, bk2, causal, loop_order
):
    q, k, v = make_qkv(np.random.default_rng(seed), lead=(2,), n_q=n_q, n_k=n_k, d=5, dv=3)
    a = flash_attention_numpy(
        q, k, v, causal=causal, block_q=bq1, block_k=bk1, loop_order=loop_order
    )
    b = flash_attention_numpy(q, k, v, causal=causal, block_q=bq2, block_k=bk2)
    np.testing.assert_allclose(a[0], b[0], rtol=1e-11, atol=1e-13)
    np.testing.assert_allclose(a[1], b[1], rtol=1e-11, atol=1e-13)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31), n=st.integers(1, 30), causal=st.booleans())
def test_lse_equals_logsumexp_of_scores(seed, n, causal):
    q, k, v = make_qkv(np.random.default_rng(seed), lead=(), n_q=n, d=4)
    _, lse = flash_attention_numpy(q, k, v, causal=causal, scale=0.7, block_q=4, block_k=3)
    s = 0.7 * q @ k.T
    if causal:
        s = np.where(np.tril(np.ones((n, n), bool)), s, -np.inf)
    np.testing.assert_allclose(lse, np.logaddexp.reduce(s, axis=-1), rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("loop_order", ["fa1", "fa2"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_low_precision_within_twice_naive_error(rng, dtype, causal, loop_order):
    q, k, v = make_qkv(rng, lead=(2,), n_q=113, n_k=203 if not causal else 113, d=40, dtype=dtype)
    out, lse = flash_attention_numpy(
        q, k, v, causal=causal, block_q=32, block_k=16, loop_order=loop_order
    )
    assert out.dtype == dtype  # fp16 in, fp16 out; fp32 stays fp32
    assert lse.dtype == np.float32  # accumulated in fp32, not silently upcast to float64
    ref, ref_lse = attention_reference(q, k, v, causal=causal)
    assert_close_to_reference(out, ref, attention_naive(q, k, v, causal=causal), factor=2.0)
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-5 if dtype == np.float32 else 1e-3)


def test_float64_in_float64_out(rng):
    q, k, v = make_qkv(rng)
    out, lse = flash_attention_numpy(q, k, v)
    assert out.dtype == np.float64 and lse.dtype == np.float64


def test_value_width_may_differ_from_head_dim(rng):
    q, k, v = make_qkv(rng, n_q=9, n_k=14, d=6, dv=11)
    out, _ = flash_attention_numpy(q, k, v, block_q=4, block_k=5, loop_order="fa1")
    np.testing.assert_allclose(out, attention_reference(q, k, v)[0], rtol=1e-12, atol=1e-13)
    assert out.shape == (2, 3, 9, 11)


def test_scale_is_applied(rng):
    q, k, v = make_qkv(rng)
    out, _ = flash_attention_numpy(q, k, v, scale=2.5, block_q=5, block_k=5)
    np.testing.assert_allclose(
        out, attention_reference(q, k, v, scale=2.5)[0], rtol=1e-12, atol=1e-13
    )


@pytest.mark.parametrize(
    "kwargs,exc,match",
    [
        ({"block_q": 0}, ValueError, "block_q must be an integer >= 1"),
        ({"block_k": -4}, ValueError, "block_k must be an integer >= 1"),
        ({"block_k": 2.0}, TypeError, "block_k must be an integer"),
        ({"loop_order": "fa3"}, ValueError, "loop_order must be one of"),
        ({"scale": float("nan")}, ValueError, "scale must be finite"),
        ({"causal": 1}, TypeError, "causal must be True or False"),
    ],
)
def test_bad_arguments_raise_clear_errors(rng, kwargs, exc, match):
    q, k, v = make_qkv(rng)
    with pytest.raises(exc, match=match):
        flash_attention_numpy(q, k, v, **kwargs)
