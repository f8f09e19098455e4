"""course_kernels.numpy.reference: the float64 truth, checked against PyTorch's SDPA in float64."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from attention_inputs import make_qkv

from course_kernels import attention_naive, attention_reference, causal_mask


def sdpa64(q, k, v, causal, scale):
    t = [torch.from_numpy(np.ascontiguousarray(x, dtype=np.float64)) for x in (q, k, v)]
    return F.scaled_dot_product_attention(*t, is_causal=causal, scale=scale).numpy()


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n_q,n_k", [(1, 1), (7, 7), (113, 203), (203, 113)])
@pytest.mark.parametrize("d,dv", [(1, 1), (40, 40), (80, 24)])
def test_reference_matches_torch_sdpa(rng, causal, n_q, n_k, d, dv):
    q, k, v = make_qkv(rng, n_q=n_q, n_k=n_k, d=d, dv=dv)
    out, lse = attention_reference(q, k, v, causal=causal)
    np.testing.assert_allclose(out, sdpa64(q, k, v, causal, None), rtol=1e-12, atol=1e-12)
    assert out.shape == (2, 3, n_q, dv) and lse.shape == (2, 3, n_q)
    assert out.dtype == np.float64 and lse.dtype == np.float64


@pytest.mark.parametrize("causal", [False, True])
def test_reference_lse_is_logsumexp_of_scaled_masked_scores(rng, causal):
    q, k, v = make_qkv(rng, n_q=13, n_k=11, d=5)
    _, lse = attention_reference(q, k, v, causal=causal, scale=0.3)
    s = 0.3 * q @ np.swapaxes(k, -1, -2)
    if causal:
        s = np.where(causal_mask(13, 11), s, -np.inf)
    np.testing.assert_allclose(lse, np.logaddexp.reduce(s, axis=-1), rtol=1e-13, atol=1e-13)


def test_reference_scale_defaults_to_inverse_sqrt_d(rng):
    q, k, v = make_qkv(rng, d=16)
    a, _ = attention_reference(q, k, v)
    b, _ = attention_reference(q, k, v, scale=1 / math.sqrt(16))
    c, _ = attention_reference(q, k, v, scale=1.0)
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, c)


def test_reference_scale_zero_averages_values(rng):
    q, k, v = make_qkv(rng)
    out, _ = attention_reference(q, k, v, scale=0.0)
    np.testing.assert_allclose(out, np.broadcast_to(v.mean(axis=-2, keepdims=True), out.shape))


def test_causal_mask_is_top_left_aligned():
    expected = np.array(
        [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [1, 1, 1, 1, 0]], dtype=bool
    )
    np.testing.assert_array_equal(causal_mask(4, 5), expected)
    assert causal_mask(5, 3)[4].all()  # a query past the last key sees every key


def test_causal_first_query_sees_only_first_key(rng):
    q, k, v = make_qkv(rng, n_q=9)
    out, _ = attention_reference(q, k, v, causal=True)
    np.testing.assert_allclose(out[..., 0, :], v[..., 0, :], rtol=1e-14)


def test_reference_accepts_any_leading_dims(rng):
    q, k, v = make_qkv(rng, lead=(), n_q=6)
    out2d, _ = attention_reference(q, k, v)
    out4d, _ = attention_reference(q[None, None], k[None, None], v[None, None])
    np.testing.assert_allclose(out4d[0, 0], out2d, rtol=1e-14)


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_naive_keeps_dtype_and_is_close(rng, dtype):
    q, k, v = make_qkv(rng, n_q=33, d=16, dtype=dtype)
    naive = attention_naive(q, k, v, causal=True)
    assert naive.dtype == dtype
    ref, _ = attention_reference(q, k, v, causal=True)
    tol = 1e-2 if dtype == np.float16 else 1e-5
    np.testing.assert_allclose(naive, ref, atol=tol)


@pytest.mark.parametrize(
    "args,exc,match",
    [
        ((np.ones(3), np.ones((3, 2)), np.ones((3, 2))), ValueError, "q must have rank >= 2"),
        ((np.ones((3, 2)), np.ones((3, 4)), np.ones((3, 2))), ValueError, "same head dim"),
        ((np.ones((3, 2)), np.ones((4, 2)), np.ones((5, 2))), ValueError, "same sequence length"),
        ((np.ones((1, 3, 2)), np.ones((2, 3, 2)), np.ones((2, 3, 2))), ValueError, "leading"),
        ((np.ones((3, 2)), np.ones((3, 2)), np.ones((1, 3, 2))), ValueError, "same rank"),
        ((np.ones((0, 2)), np.ones((3, 2)), np.ones((3, 2))), ValueError, "must not be empty"),
        ((np.ones((3, 2), int), np.ones((3, 2)), np.ones((3, 2))), TypeError, "floating dtype"),
        (
            (np.ones((3, 2), np.float32), np.ones((3, 2)), np.ones((3, 2))),
            TypeError,
            "share one dtype",
        ),
        (("abc", np.ones((3, 2)), np.ones((3, 2))), TypeError, "q must"),
    ],
)
def test_reference_bad_input_names_the_problem(args, exc, match):
    with pytest.raises(exc, match=match):
        attention_reference(*args)


@pytest.mark.parametrize("scale", [float("nan"), float("inf"), -float("inf")])
def test_reference_rejects_non_finite_scale(scale):
    x = np.ones((3, 2))
    with pytest.raises(ValueError, match="scale must be finite"):
        attention_reference(x, x, x, scale=scale)


def test_reference_rejects_non_bool_causal():
    x = np.ones((3, 2))
    with pytest.raises(TypeError, match="causal must be True or False"):
        attention_reference(x, x, x, causal="yes")


# ---- issue 22: alignment, sliding window, soft cap, ALiBi (the truth the kernels are tested on)


@pytest.mark.parametrize("n_q,n_k", [(1, 1), (4, 5), (5, 4), (7, 19), (19, 7)])
def test_causal_mask_bottom_right_is_sdpas_causal_lower_right(rng, n_q, n_k):
    from torch.nn.attention.bias import causal_lower_right, causal_upper_left

    q, k, v = make_qkv(rng, n_q=n_q, n_k=n_k, d=8, dv=8)
    t = [torch.from_numpy(np.ascontiguousarray(x, dtype=np.float64)) for x in (q, k, v)]
    for align, bias in (("bottom_right", causal_lower_right), ("top_left", causal_upper_left)):
        out, _ = attention_reference(q, k, v, causal=True, alignment=align)
        want = F.scaled_dot_product_attention(*t, attn_mask=bias(n_q, n_k)).numpy()
        rows = causal_mask(n_q, n_k, align).any(1)  # SDPA's empty rows are NaN, ours 0
        np.testing.assert_allclose(out[..., rows, :], want[..., rows, :], rtol=1e-12, atol=1e-12)
        assert (out[..., ~rows, :] == 0).all()
    assert causal_mask(4, 5, "bottom_right").tolist()[0] == [1, 1, 0, 0, 0]
    assert not np.array_equal(causal_mask(4, 5), causal_mask(4, 5, "bottom_right"))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("align", ["top_left", "bottom_right"])
@pytest.mark.parametrize("window", [None, (0, 0), (3, -1), (-1, 2), (2, 5)])
def test_attention_mask_brute_force(causal, align, window):
    from course_kernels import attention_mask

    n_q, n_k = 6, 11
    got = attention_mask(n_q, n_k, causal, align, window)
    left, right = window or (-1, -1)
    off = 0 if align == "top_left" else n_k - n_q
    for i in range(n_q):
        for j in range(n_k):
            ok = (left < 0 or j >= i + off - left) and (right < 0 or j <= i + off + right)
            ok = ok and (not causal or j <= i + off)
            assert got[i, j] == ok, (i, j)


def _torch_variant(q, k, v, scale, softcap, slopes, keep):
    t = [
        torch.from_numpy(np.ascontiguousarray(x, dtype=np.float64)).requires_grad_()
        for x in (q, k, v)
    ]
    s = t[0] @ t[1].transpose(-1, -2) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    if slopes is not None:
        n_q, n_k = s.shape[-2:]
        i, j = torch.arange(n_q)[:, None], torch.arange(n_k)[None, :]
        sl = torch.from_numpy(np.asarray(slopes, dtype=np.float64)).reshape(-1, s.shape[1])
        s = s - sl[..., None, None] * (i + n_k - n_q - j).abs()
    s = s.masked_fill(~torch.from_numpy(keep), float("-inf"))
    out = torch.nan_to_num(torch.softmax(s, -1)) @ t[2]
    return out, t


@pytest.mark.parametrize("softcap", [None, 0.5, 4.0])
@pytest.mark.parametrize("slopes", [None, "per_head", "per_batch"])
def test_softcap_alibi_window_forward_and_backward_match_torch_float64(rng, softcap, slopes):
    from course_kernels import attention_mask, attention_reference_backward

    q, k, v = make_qkv(rng, n_q=9, n_k=13, d=8, dv=8)  # (2, 3, N, d)
    s = {None: None, "per_head": rng.random(3), "per_batch": rng.random((2, 3))}[slopes]
    kw = {"softcap": softcap, "alibi_slopes": s, "window_size": (4, 1), "scale": 0.9}
    kw.update(causal=True, alignment="bottom_right")
    out, lse = attention_reference(q, k, v, **kw)
    keep = attention_mask(9, 13, True, "bottom_right", (4, 1))
    want, t = _torch_variant(q, k, v, 0.9, softcap, s, keep)
    np.testing.assert_allclose(out, want.detach().numpy(), rtol=1e-12, atol=1e-12)
    dout = rng.standard_normal(out.shape)
    grads = attention_reference_backward(q, k, v, dout, **kw)
    want_grads = torch.autograd.grad(want, t, torch.from_numpy(dout))
    for g, w in zip(grads, want_grads, strict=True):
        np.testing.assert_allclose(g, w.numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(
    "kw,error,match",
    [
        ({"alignment": "bottom-right"}, ValueError, "alignment"),
        ({"window_size": (1,)}, ValueError, "window_size"),
        ({"window_size": (0, -3)}, ValueError, "window_size"),
        ({"softcap": -2.0}, ValueError, "softcap"),
        ({"softcap": True}, TypeError, "softcap"),
        ({"alibi_slopes": np.ones(4)}, ValueError, "alibi_slopes"),
    ],
)
def test_variant_arguments_checked(rng, kw, error, match):
    q, k, v = make_qkv(rng, n_q=3, n_k=3, d=4, dv=4)
    with pytest.raises(error, match=match):
        attention_reference(q, k, v, **kw)


# ---- mutation audit: behaviour a wrong implementation could change without any test failing


def test_ln2_and_log2e_change_the_exponent_base():
    """exp(x) = exp2(x * LOG2E) and ln(y) = log2(y) * LN2: the kernels' base-2 exponent and
    their base-2 logsumexp rest on these two constants."""
    from course_kernels.numpy import LN2, LOG2E

    x = np.linspace(-30.0, 30.0, 61)
    np.testing.assert_allclose(np.exp2(x * LOG2E), np.exp(x), rtol=1e-13)
    np.testing.assert_allclose(np.log2(np.exp(x)) * LN2, x, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("n_q,n_k", [(5, 5), (4, 7), (7, 4)])
def test_scores_are_scaled_qk_with_minus_inf_above_the_diagonal(rng, n_q, n_k):
    """``scores`` (chapter 2's S): scale * Q K^T, 1/sqrt(d) by default; causal sets j > i to -inf."""
    from course_kernels.numpy.reference import scores

    q, k, _ = make_qkv(rng, n_q=n_q, n_k=n_k, d=16)
    qk = np.einsum("bhid,bhjd->bhij", q, k)
    np.testing.assert_allclose(scores(q, k), qk / 4.0, rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(scores(q, k, scale=0.3), 0.3 * qk, rtol=1e-13, atol=1e-13)
    s = scores(q, k, causal=True)
    above = np.triu(np.ones((n_q, n_k), dtype=bool), k=1)  # key j > query i
    assert np.isneginf(s[..., above]).all()
    np.testing.assert_allclose(s[..., ~above], qk[..., ~above] / 4.0, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize(
    "kw,error,match",
    [
        ({"window_size": (-2, 0)}, ValueError, "window_size"),
        ({"window_size": (True, 1)}, ValueError, "window_size"),
        ({"softcap": float("inf")}, ValueError, "softcap"),
        ({"softcap": float("nan")}, ValueError, "softcap"),
    ],
)
def test_variant_arguments_out_of_range_are_refused(rng, kw, error, match):
    """-1 is the only negative window side (unbounded); a bool is not a window; softcap finite."""
    q, k, v = make_qkv(rng, n_q=3, n_k=3, d=4, dv=4)
    with pytest.raises(error, match=match):
        attention_reference(q, k, v, **kw)


@pytest.mark.parametrize("softcap", [0, 0.0])
def test_softcap_zero_means_off(rng, softcap):
    q, k, v = make_qkv(rng, n_q=9, n_k=13)
    out, _ = attention_reference(q, k, v, softcap=softcap)
    np.testing.assert_allclose(out, sdpa64(q, k, v, False, None), rtol=1e-12, atol=1e-12)


def test_naive_subtracts_the_row_max(rng):
    """Scores in the hundreds: exp overflows float32 unless the row max is subtracted first."""
    q, k, v = make_qkv(rng, n_q=33, d=16, dtype=np.float32, scale=10.0)
    naive = attention_naive(q, k, v)
    assert np.isfinite(naive).all()
    np.testing.assert_allclose(naive, attention_reference(q, k, v)[0], atol=1e-3)


def test_naive_applies_the_scale(rng):
    q, k, v = make_qkv(rng, n_q=33, d=16, dtype=np.float32)
    out = attention_naive(q, k, v, causal=True, scale=0.9)
    ref, _ = attention_reference(q, k, v, causal=True, scale=0.9)
    np.testing.assert_allclose(out, ref, atol=1e-5)


def test_naive_carries_the_error_of_its_dtype(rng):
    """The naive baseline computes in float32: its error is several times the mere rounding of
    the exact output to float32 (a float64 computation rounded at the end would not be)."""
    q, k, v = make_qkv(rng, lead=(2,), n_q=64, d=32, dtype=np.float32)
    ref, _ = attention_reference(q, k, v)
    err = np.abs(attention_naive(q, k, v) - ref).max()
    rounding = np.abs(ref.astype(np.float32) - ref).max()
    assert err > 3 * rounding


# ---- mutation audit: the shared NumPy input checks (course_kernels._validate) -------------------


def test_inputs_may_be_nested_lists_but_not_scalars():
    out, lse = attention_reference([[1.0, 0.0]], [[1.0, 0.0]], [[2.0, 3.0]])  # one key
    assert out.tolist() == [[2.0, 3.0]] and lse.tolist() == [1.0 / math.sqrt(2)]
    with pytest.raises(TypeError, match="q must be an array of shape"):
        attention_reference(3.0, np.ones((3, 2)), np.ones((3, 2)))


def test_k_and_v_must_share_their_leading_dims():
    q, k = np.ones((2, 3, 2)), np.ones((2, 3, 2))
    with pytest.raises(ValueError, match="leading"):
        attention_reference(q, k, np.ones((1, 3, 2)))


@pytest.mark.parametrize("scale", [True, "0.5", None])
def test_scale_must_be_a_real_number(scale):
    from course_kernels._validate import resolve_scale

    if scale is None:
        assert resolve_scale(None, 16) == 0.25
        return
    with pytest.raises(TypeError, match="scale must be a finite real number"):
        resolve_scale(scale, 16)


def test_validated_values_come_back_as_python_types(rng):
    """resolve_scale gives a Python float: a NumPy float64 scale must not promote fp16 work
    (float32 accumulators) to float64. check_positive_int gives an int, check_bool a bool."""
    from course_kernels._validate import check_bool, check_positive_int, resolve_scale
    from course_kernels.numpy.online_softmax import partial_attention

    assert type(resolve_scale(np.float64(0.3), 4)) is float
    assert type(resolve_scale(2, 4)) is float
    q, k, v = (rng.standard_normal((2, 5, 4)).astype(np.float16) for _ in range(3))
    p = partial_attention(q, k, v, scale=np.float64(0.3))
    assert p.m.dtype == p.l.dtype == p.acc.dtype == np.float32
    assert type(check_positive_int(np.int64(3), "n")) is int
    assert check_bool(np.True_, "causal") is True and check_bool(np.False_, "causal") is False
