"""course_kernels.numpy.tiled_backward: gradients from the saved logsumexp, checked three ways:
finite differences, torch autograd in float64, and the dense float64 backward."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from attention_inputs import make_qkv

from course_kernels import attention_reference, flash_attention_numpy
from course_kernels.testing import assert_close_to_reference
from course_kernels.numpy.tiled_backward import (
    attention_reference_backward,
    flash_attention_numpy_backward,
)


def finite_difference_grads(q, k, v, dout, causal, scale, eps=1e-6):
    """d/dx of sum(out * dout) by central differences, for each of q, k, v."""
    grads = []
    for which in range(3):
        args = [q.copy(), k.copy(), v.copy()]
        g = np.zeros_like(args[which])
        for idx in np.ndindex(g.shape):
            plus, minus = [a.copy() for a in args], [a.copy() for a in args]
            plus[which][idx] += eps
            minus[which][idx] -= eps
            f_plus = (attention_reference(*plus, causal=causal, scale=scale)[0] * dout).sum()
            f_minus = (attention_reference(*minus, causal=causal, scale=scale)[0] * dout).sum()
            g[idx] = (f_plus - f_minus) / (2 * eps)
        grads.append(g)
    return grads


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n_q,n_k", [(1, 1), (5, 7), (7, 5)])
def test_tiled_backward_matches_finite_differences(rng, causal, n_q, n_k):
    q, k, v = make_qkv(rng, lead=(1,), n_q=n_q, n_k=n_k, d=3, dv=2)
    out, lse = flash_attention_numpy(q, k, v, causal=causal, block_q=2, block_k=3)
    dout = rng.standard_normal(out.shape)
    got = flash_attention_numpy_backward(
        q, k, v, out, lse, dout, causal=causal, block_q=2, block_k=3
    )
    expected = finite_difference_grads(q, k, v, dout, causal, None)
    for name, g, e in zip("qkv", got, expected, strict=True):
        np.testing.assert_allclose(g, e, rtol=1e-6, atol=1e-8, err_msg=f"d{name}")


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(
    "n_q,n_k,d,dv,bq,bk", [(113, 113, 8, 8, 16, 16), (113, 203, 40, 24, 32, 7), (7, 7, 1, 1, 3, 2)]
)
def test_tiled_backward_matches_torch_autograd(rng, causal, n_q, n_k, d, dv, bq, bk):
    q, k, v = make_qkv(rng, lead=(2,), n_q=n_q, n_k=n_k, d=d, dv=dv)
    dout = rng.standard_normal((2, n_q, dv))
    out, lse = flash_attention_numpy(q, k, v, causal=causal, scale=0.3, block_q=bq, block_k=bk)
    got = flash_attention_numpy_backward(
        q, k, v, out, lse, dout, causal=causal, scale=0.3, block_q=bq, block_k=bk
    )
    tq, tk, tv = (torch.tensor(x, requires_grad=True) for x in (q, k, v))
    F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal, scale=0.3).backward(
        torch.from_numpy(dout)
    )
    for name, g, t in zip("qkv", got, (tq, tk, tv), strict=True):
        np.testing.assert_allclose(g, t.grad.numpy(), rtol=1e-9, atol=1e-11, err_msg=f"d{name}")
    dense = attention_reference_backward(q, k, v, dout, causal=causal, scale=0.3)
    for g, e in zip(got, dense, strict=True):
        np.testing.assert_allclose(g, e, rtol=1e-9, atol=1e-11)


def test_wrong_saved_lse_is_caught(rng):
    """Saving the row max m instead of the logsumexp gives wrong gradients."""
    q, k, v = make_qkv(rng, lead=(1,), n_q=20, d=4)
    out, lse = flash_attention_numpy(q, k, v, block_q=8, block_k=8)
    s = q @ np.swapaxes(k, -1, -2) / 2.0
    dout = rng.standard_normal(out.shape)
    good = flash_attention_numpy_backward(q, k, v, out, lse, dout)
    bad = flash_attention_numpy_backward(q, k, v, out, s.max(-1), dout)
    dense = attention_reference_backward(q, k, v, dout)
    np.testing.assert_allclose(good[0], dense[0], rtol=1e-9, atol=1e-12)
    assert not np.allclose(bad[0], dense[0], atol=1e-3)


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("causal", [False, True])
def test_low_precision_gradients_within_three_times_naive_error(rng, dtype, causal):
    q, k, v = make_qkv(rng, lead=(2,), n_q=67, n_k=67, d=16, dtype=dtype)
    dout = rng.standard_normal((2, 67, 16)).astype(dtype)
    out, lse = flash_attention_numpy(q, k, v, causal=causal, block_q=16, block_k=16)
    got = flash_attention_numpy_backward(
        q, k, v, out, lse, dout, causal=causal, block_q=16, block_k=16
    )
    assert all(g.dtype == dtype for g in got)
    ref = attention_reference_backward(q, k, v, dout, causal=causal)
    # the naive same-dtype backward: torch autograd in the low precision (fp16 matmuls on CPU)
    t = [torch.tensor(x, requires_grad=True) for x in (q, k, v)]
    s = (t[0] @ t[1].transpose(-1, -2)) * (1 / 4.0)
    if causal:
        s = s.masked_fill(~torch.ones(67, 67, dtype=torch.bool).tril(), float("-inf"))
    (torch.softmax(s, -1) @ t[2]).backward(torch.from_numpy(dout))
    for name, g, r, tt in zip("qkv", got, ref, t, strict=True):
        assert_close_to_reference(g, r, tt.grad.numpy(), factor=3.0, what=f"d{name}")


@pytest.mark.parametrize(
    "which,shape,match",
    [
        ("out", (2, 3, 17, 5), "out must have shape"),
        ("dout", (2, 3, 16, 8), "dout must have shape"),
        ("lse", (2, 3, 16), "lse must have shape"),
    ],
)
def test_backward_rejects_mismatched_saved_tensors(rng, which, shape, match):
    q, k, v = make_qkv(rng, n_q=17)
    out, lse = flash_attention_numpy(q, k, v)
    args = {"out": out, "lse": lse, "dout": np.ones_like(out)}
    args[which] = np.ones(shape)
    with pytest.raises(ValueError, match=match):
        flash_attention_numpy_backward(q, k, v, args["out"], args["lse"], args["dout"])


@pytest.mark.parametrize("causal", [False, True])
def test_torch_attention_grads_equal_the_numpy_reference(causal):
    """course_kernels.testing.attention_grads (the GPU tests' float64 side) against the float64
    NumPy backward, per (batch, head): a mask on the wrong side or a lost scale fails."""
    from course_kernels.testing import attention_grads

    g = torch.Generator().manual_seed(4)
    q, k, v, do = (torch.randn(2, 3, 9, 8, generator=g) for _ in range(4))
    grads = attention_grads(q, k, v, do, causal, 0.3)
    for b in range(2):
        for h in range(3):
            want = attention_reference_backward(
                *(x[b, h].numpy() for x in (q, k, v, do)), causal=causal, scale=0.3
            )
            for got, w in zip(grads, want, strict=True):
                np.testing.assert_allclose(got[b, h].numpy(), w, rtol=1e-10, atol=1e-12)
    sdpa = attention_grads(q, k, v, do, causal, 0.3, f64=False)  # SDPA in float32
    assert all(s.dtype == torch.float32 for s in sdpa)
    assert max((s.double() - r).abs().max().item() for s, r in zip(sdpa, grads, strict=True)) < 1e-4


def test_dense_backward_rows_that_see_no_key_get_zero_gradients(rng):
    """Bottom-right causal with Nq > Nk: the first Nq - Nk queries see no key (out 0, lse -inf).
    Their gradients are 0, not NaN, and the other rows' are those of the visible rows alone
    (torch autograd in float64; bottom-right on the last Nk queries is plain is_causal)."""
    q, k, v = make_qkv(rng, lead=(2,), n_q=7, n_k=4, d=3, dv=2)
    dout = rng.standard_normal((2, 7, 2))
    dq, dk, dv = attention_reference_backward(q, k, v, dout, causal=True, alignment="bottom_right")
    np.testing.assert_array_equal(dq[..., :3, :], 0.0)
    tq, tk, tv = (torch.tensor(x, requires_grad=True) for x in (q[..., 3:, :], k, v))
    F.scaled_dot_product_attention(tq, tk, tv, is_causal=True).backward(
        torch.from_numpy(dout[..., 3:, :])
    )
    for g, t in zip((dq[..., 3:, :], dk, dv), (tq, tk, tv), strict=True):
        np.testing.assert_allclose(g, t.grad.numpy(), rtol=1e-10, atol=1e-12)


def test_tiled_backward_rows_with_minus_inf_lse_contribute_nothing(rng):
    """A saved lse of -inf marks a row that saw no key (P = 0, out = 0): its dq is 0 and it adds
    nothing to dk, dv, which are then those of the other queries alone."""
    q, k, v = make_qkv(rng, lead=(1,), n_q=9, n_k=9, d=4)
    out, lse = flash_attention_numpy(q, k, v, block_q=4, block_k=4)
    dout = rng.standard_normal(out.shape)
    empty = [1, 6]
    lse[..., empty] = -np.inf
    out[..., empty, :] = 0.0
    dq, dk, dv = flash_attention_numpy_backward(q, k, v, out, lse, dout, block_q=4, block_k=4)
    np.testing.assert_array_equal(dq[..., empty, :], 0.0)
    rest = np.setdiff1d(np.arange(9), empty)
    want = attention_reference_backward(q[..., rest, :], k, v, dout[..., rest, :])
    for g, w in zip((dq[..., rest, :], dk, dv), want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-12)
