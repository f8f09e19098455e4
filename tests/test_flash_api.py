"""The public API ``course_kernels.flash_attention``: input validation, return values, autograd.

Every bad input must raise TypeError/ValueError naming what was given and what is accepted,
before any kernel runs. Runs in Triton's interpreter on a machine without a GPU.
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

import course_kernels  # noqa: E402
from course_kernels.triton import _env as _triton_env  # noqa: E402
from course_kernels.triton import _torch_validate, flash  # noqa: E402
from course_kernels.triton.flash import flash_attention  # noqa: E402

DEVICE = _triton_env.device_kind()


def rand(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype=dtype, device=DEVICE)


def good(**over):
    """A valid (q, k, v) with GQA and Nq != Nk; keyword overrides replace one of them."""
    qkv = {"q": rand(2, 4, 9, 16), "k": rand(2, 2, 11, 16, seed=1), "v": rand(2, 2, 11, 16, seed=2)}
    qkv.update(over)
    return qkv["q"], qkv["k"], qkv["v"]


BAD_INPUTS = {
    "q not a tensor": (lambda: good(q=[[1.0]]), TypeError, r"q must be a torch.Tensor.*got list"),
    "rank 3": (lambda: good(q=rand(4, 9, 16)), ValueError, r"rank 4.*got shape \(4, 9, 16\)"),
    "rank 5": (lambda: good(k=rand(2, 2, 1, 11, 16)), ValueError, r"k must have rank 4"),
    "batch mismatch": (
        lambda: good(k=rand(3, 2, 11, 16), v=rand(3, 2, 11, 16)),
        ValueError,
        r"batch size; got q 2 and k/v 3",
    ),
    "head dim mismatch": (
        lambda: good(k=rand(2, 2, 11, 24), v=rand(2, 2, 11, 24)),
        ValueError,
        r"head dim; got q 16 and k/v 24",
    ),
    "k v shapes differ": (
        lambda: good(v=rand(2, 2, 12, 16)),
        ValueError,
        r"k and v must have the same shape",
    ),
    "dtype mismatch": (
        lambda: good(k=rand(2, 2, 11, 16, dtype=torch.float16)),
        TypeError,
        r"share one dtype; got torch.float32, torch.float16",
    ),
    "float64": (
        lambda: good(q=rand(2, 4, 9, 16).double()),
        TypeError,
        r"float16, bfloat16 or float32; got torch.float64",
    ),
    "integer": (
        lambda: good(q=torch.ones(2, 4, 9, 16, dtype=torch.int32, device=DEVICE)),
        TypeError,
        r"got torch.int32",
    ),
    "device mismatch": (
        lambda: good(k=torch.empty(2, 2, 11, 16, device="meta")),
        ValueError,
        r"one device; got",
    ),
    "heads not a multiple": (
        lambda: good(k=rand(2, 3, 11, 16), v=rand(2, 3, 11, 16)),
        ValueError,
        r"multiple of the number of key/value heads.*Hq=4, kv_heads=3",
    ),
    "head dim not multiple of 8": (
        lambda: good(q=rand(2, 4, 9, 12), k=rand(2, 2, 11, 12), v=rand(2, 2, 11, 12)),
        ValueError,
        r"multiple of 8 and at most 256; got 12",
    ),
    "head dim too large": (
        lambda: good(q=rand(1, 1, 2, 264), k=rand(1, 1, 2, 264), v=rand(1, 1, 2, 264)),
        ValueError,
        r"at most 256; got 264",
    ),
    "empty seq": (lambda: good(q=rand(2, 4, 0, 16)), ValueError, r"must not be empty.*0, 16"),
    "empty batch": (lambda: good(k=rand(0, 2, 11, 16)), ValueError, r"k must not be empty"),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_flash_api_rejects_bad_input(case):
    make, exc, pattern = BAD_INPUTS[case]
    q, k, v = make()
    with pytest.raises(exc, match=pattern):
        flash_attention(q, k, v)


def test_flash_api_rejects_wrong_device_for_backend():
    q, k, v = (torch.empty(1, 1, 4, 16, device="meta") for _ in range(3))
    with pytest.raises(ValueError, match=rf"must be on a {DEVICE} device here.*got meta"):
        flash_attention(q, k, v)


@pytest.mark.parametrize(
    "kwargs, pattern",
    [
        ({"causal": 1}, r"causal must be a bool; got int"),
        ({"scale": "0.1"}, r"scale must be a finite real number or None; got '0.1'"),
        ({"return_lse": None}, r"return_lse must be a bool"),
    ],
)
def test_flash_api_rejects_bad_options(kwargs, pattern):
    with pytest.raises(TypeError, match=pattern):
        flash_attention(*good(), **kwargs)


@pytest.mark.parametrize("scale", [float("nan"), float("inf"), -float("inf")])
def test_flash_api_rejects_non_finite_scale(scale):
    with pytest.raises(ValueError, match=r"scale must be finite \(or None for 1/sqrt\(d\)\)"):
        flash_attention(*good(), scale=scale)


def test_flash_api_bf16_needs_sm80(monkeypatch):
    """On a pre-Ampere GPU (a T4 is sm_75) bf16 is a clear error, not a crash."""
    monkeypatch.setattr(_torch_validate, "INTERPRET", False)
    monkeypatch.setattr(_torch_validate, "capability", lambda: (7, 5))
    # a GPU's capability is fixed in a process; this test changes it: forget the valid signatures
    monkeypatch.setattr(flash, "VALID", {})
    q, k, v = (x.to(torch.bfloat16) for x in good())
    with pytest.raises(ValueError, match=r"bfloat16 needs.*8.0 or newer.*sm_75.*float16"):
        flash_attention(q, k, v)


def test_flash_api_no_backend_is_a_runtime_error(monkeypatch):
    monkeypatch.setattr(_triton_env, "HAS_GPU", False)
    monkeypatch.setattr(_triton_env, "INTERPRET", False)
    with pytest.raises(RuntimeError, match=r"no CUDA GPU and TRITON_INTERPRET=0"):
        _triton_env.require_triton()


def test_flash_api_returns_shapes_and_lse():
    q, k, v = good()
    out = flash_attention(q, k, v)
    out2, lse = flash_attention(q, k, v, return_lse=True)
    assert out.shape == (2, 4, 9, 16) and out.dtype == q.dtype
    assert torch.equal(out, out2)
    assert lse.shape == (2, 4, 9) and lse.dtype == torch.float32
    # Natural-log logsumexp of the scaled scores.
    kk = k.repeat_interleave(2, dim=1)
    expect = torch.logsumexp((q.double() @ kk.double().transpose(-1, -2)) / 4.0, dim=-1)
    assert torch.allclose(lse.double(), expect, atol=1e-5, rtol=0)


def test_flash_api_top_level_matches_module():
    q, k, v = good()
    assert torch.equal(
        course_kernels.flash_attention(q, k, v, causal=True), flash_attention(q, k, v, causal=True)
    )


@pytest.mark.parametrize("causal", [False, True])
def test_flash_api_matches_sdpa(causal):
    """Same function as SDPA with is_causal and enable_gqa (top-left causal, Nq != Nk)."""
    q, k, v = good()
    expect = torch.nn.functional.scaled_dot_product_attention(
        q.cpu().double(), k.cpu().double(), v.cpu().double(), is_causal=causal, enable_gqa=True
    )
    out = flash_attention(q, k, v, causal=causal)
    assert torch.allclose(out.cpu().double(), expect, atol=1e-5, rtol=0)


def test_flash_api_default_scale_is_inverse_sqrt_d():
    q, k, v = good()
    assert torch.equal(flash_attention(q, k, v), flash_attention(q, k, v, scale=1 / math.sqrt(16)))
    assert not torch.equal(flash_attention(q, k, v), flash_attention(q, k, v, scale=0.5))


def test_flash_api_non_contiguous_inputs():
    """(B, N, H, d) storage viewed as (B, H, N, d), as after a projection + transpose."""
    q, k, v = good()
    qt, kt, vt = (x.transpose(1, 2).contiguous().transpose(1, 2) for x in (q, k, v))
    assert not qt.is_contiguous()
    assert torch.equal(
        flash_attention(qt, kt, vt, causal=True), flash_attention(q, k, v, causal=True)
    )


def test_flash_api_saves_nothing_n_by_n():
    """Autograd keeps q, k, v, O and the lse: no tensor with Nq x Nk elements per head."""
    q, k, v = (
        x.requires_grad_()
        for x in good(q=rand(1, 2, 48, 16), k=rand(1, 2, 48, 16), v=rand(1, 2, 48, 16))
    )
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(
        lambda t: saved.append(t.shape) or t, lambda t: t
    ):
        out = flash_attention(q, k, v, causal=True)
    assert saved, "autograd saved nothing: is the Function wired up?"
    for shape in saved:
        assert math.prod(shape) <= 1 * 2 * 48 * 16, f"saved a tensor of shape {tuple(shape)}"
    out.sum().backward()
    assert q.grad is not None and k.grad.shape == k.shape and v.grad.shape == v.shape


def test_flash_api_lse_is_not_differentiable():
    q, k, v = (x.requires_grad_() for x in good())
    out, lse = flash_attention(q, k, v, return_lse=True)
    assert out.requires_grad and not lse.requires_grad


# ---- SDPA's own keywords: a call site written for SDPA runs unchanged ----------------------------


@pytest.mark.parametrize("causal", [False, True])
def test_flash_api_takes_an_sdpa_call_as_written(causal):
    """SDPA's keywords as a model passes them (attn_mask, dropout_p, is_causal, scale,
    enable_gqa): the same numbers as SDPA, the same bits as the course's own keywords."""
    q, k, v = good()
    sdpa_kw = dict(attn_mask=None, dropout_p=0.0, is_causal=causal, scale=0.3, enable_gqa=True)
    expect = torch.nn.functional.scaled_dot_product_attention(
        q.cpu().double(), k.cpu().double(), v.cpu().double(), **sdpa_kw
    )
    out = flash_attention(q, k, v, **sdpa_kw)
    assert torch.allclose(out.cpu().double(), expect, atol=1e-5, rtol=0)
    assert torch.equal(out, course_kernels.flash_attention(q, k, v, causal=causal, scale=0.3))
    other = flash_attention(q, k, v, **{**sdpa_kw, "is_causal": not causal})
    assert not torch.allclose(out, other, atol=1e-3)  # is_causal is read, not dropped


def test_flash_api_enable_gqa_false_is_sdpas_rule():
    """enable_gqa=False (SDPA's default) with equal head counts runs; with grouped heads it is
    SDPA's error, said plainly; left out or True, grouped heads run."""
    q, k, v = good(q=rand(2, 2, 9, 16))
    assert torch.equal(flash_attention(q, k, v, enable_gqa=False), flash_attention(q, k, v))
    with pytest.raises(ValueError, match=r"enable_gqa=False.*Hq=4, kv_heads=2.*enable_gqa=True"):
        flash_attention(*good(), enable_gqa=False)
    assert torch.equal(flash_attention(*good(), enable_gqa=True), flash_attention(*good()))


@pytest.mark.parametrize(
    "kwargs, error, pattern",
    [
        ({"dropout_p": 0.1}, ValueError, r"dropout_p must be 0.0: .*no attention dropout.*got 0.1"),
        ({"dropout_p": "0"}, TypeError, r"dropout_p must be a number \(0.0\); got str"),
        ({"dropout_p": True}, TypeError, r"dropout_p must be a number"),
        ({"is_causal": 1}, TypeError, r"is_causal must be a bool; got int"),
        ({"causal": True, "is_causal": True}, TypeError, r"causal or SDPA's name.*not both"),
        ({"causal": True, "is_causal": False}, TypeError, r"not both"),
        ({"enable_gqa": "yes"}, TypeError, r"enable_gqa must be a bool; got str"),
    ],
)
def test_flash_api_refuses_sdpa_keywords_it_cannot_honour(kwargs, error, pattern):
    with pytest.raises(error, match=pattern):
        flash_attention(*good(), **kwargs)


def test_flash_api_sdpa_positional_order_is_named_in_the_error():
    """SDPA's fourth positional argument is attn_mask; here it is causal: a positional SDPA call
    (q, k, v, None, 0.0, True) is refused with the reason, never run with other semantics."""
    with pytest.raises(TypeError, match=r"got NoneType.*fourth positional.*attn_mask.*keyword"):
        flash_attention(*good(), None, 0.0, True)
