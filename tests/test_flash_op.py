"""``flash_attention`` as a PyTorch op: torch.compile, fake tensors, autocast, double backward,
NaN inputs, and the exact backward with one key. Runs in Triton's interpreter without a GPU
(the GPU versions are in tests/gpu/test_gpu_flash_op.py).
"""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from course_kernels.triton import _env as _triton_env  # noqa: E402
from course_kernels.triton import flash  # noqa: E402
from course_kernels.triton.flash import flash_attention  # noqa: E402

DEVICE = _triton_env.device_kind()
OP = torch.ops.course_kernels.flash_attn_fwd


def rand(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype=dtype, device=DEVICE)


def qkv(B=1, Hq=4, kv_heads=2, Nq=20, Nk=20, d=16, dtype=torch.float32, grad=True):
    q, k, v = (
        rand(B, Hq, Nq, d, dtype=dtype),
        rand(B, kv_heads, Nk, d, dtype=dtype, seed=1),
        rand(B, kv_heads, Nk, d, dtype=dtype, seed=2),
    )
    return tuple(x.requires_grad_(grad) for x in (q, k, v))


def grads(fn, q, k, v, do):
    q, k, v = (x.detach().clone().requires_grad_() for x in (q, k, v))
    out = fn(q, k, v)
    return (out, *torch.autograd.grad(out, (q, k, v), do))


class Block(torch.nn.Module):
    """Projections around the kernel: what torch.compile must trace in one graph."""

    def __init__(self, d=16, heads=4, causal=True):
        super().__init__()
        self.qkv, self.out = (
            torch.nn.Linear(d * heads, 3 * d * heads),
            torch.nn.Linear(d * heads, d * heads),
        )
        self.heads, self.d, self.causal = heads, d, causal

    def forward(self, x):  # x (B, N, heads * d)
        B, N, _ = x.shape
        q, k, v = self.qkv(x).view(B, N, 3, self.heads, self.d).permute(2, 0, 3, 1, 4)
        o = flash_attention(q, k, v, causal=self.causal)  # (B, heads, N, d)
        return self.out(o.transpose(1, 2).reshape(B, N, -1))


@pytest.mark.parametrize("causal", [False, True])
def test_op_compiles_without_graph_breaks(causal):
    torch.manual_seed(0)
    model = Block(causal=causal).to(DEVICE)
    x = rand(2, 24, 64)
    explain = torch._dynamo.explain(model)(x)
    assert explain.graph_break_count == 0 and explain.graph_count == 1, explain.break_reasons
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    out_c = compiled(x)
    out_e = model(x)
    assert torch.equal(out_c, out_e)
    g_c = torch.autograd.grad(out_c.square().sum(), list(model.parameters()))
    g_e = torch.autograd.grad(out_e.square().sum(), list(model.parameters()))
    for a, b in zip(g_c, g_e, strict=True):
        assert torch.equal(a, b)  # the same deterministic kernels ran on both paths


def test_op_compiled_graph_calls_the_op():
    """The traced graph holds the op itself (opaque to the compiler), not a graph break."""
    seen = []

    def backend(gm, example_inputs):
        seen.append(str(gm.graph))
        return gm.forward

    q, k, v = qkv()
    fn = torch.compile(
        lambda q, k, v: flash_attention(q, k, v, causal=True, return_lse=True),
        backend=backend,
        fullgraph=True,
    )
    out, lse = fn(q, k, v)
    assert any("course_kernels.flash_attn_fwd" in g for g in seen), seen
    ref, ref_lse = flash_attention(q, k, v, causal=True, return_lse=True)
    assert torch.equal(out, ref) and torch.equal(lse, ref_lse)
    assert out.requires_grad and not lse.requires_grad


def test_op_fake_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        q = torch.empty(2, 8, 33, 40, dtype=torch.float16)
        k = torch.empty(2, 2, 17, 40, dtype=torch.float16)
        o, lse2 = OP(q, k, k, True, 0.1)
        dq, dk, dv = torch.ops.course_kernels.flash_attn_bwd(o, q, k, k, o, lse2, True, 0.1)
    assert o.shape == (2, 8, 33, 40) and o.dtype == torch.float16 and o.is_contiguous()
    assert lse2.shape == (2, 8, 33) and lse2.dtype == torch.float32
    assert (dq.shape, dk.shape, dv.shape) == ((2, 8, 33, 40), (2, 2, 17, 40), (2, 2, 17, 40))


def test_op_opcheck():
    """torch.library's own checks: schema, fake vs real, autograd registration, AOT dispatch."""
    q, k, v = qkv(Nq=12, Nk=10)
    torch.library.opcheck(OP, (q, k, v, True, 0.25))


def test_op_matches_eager_path_and_gradients():
    q, k, v = qkv(Nq=19, Nk=23)
    do = rand(1, 4, 19, 16, seed=3)
    eager = grads(lambda a, b, c: flash_attention(a, b, c, causal=True), q, k, v, do)
    op = grads(lambda a, b, c: OP(a, b, c, True, 0.25)[0], q, k, v, do)
    for a, b in zip(eager, op, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("path", ["eager", "op", "compiled"])
def test_double_backward_is_a_clear_error(path):
    q, k, v = qkv()
    if path == "eager":
        out = flash_attention(q, k, v, causal=True)
    elif path == "op":
        out = OP(q, k, v, True, 0.25)[0]
    else:
        out = torch.compile(
            lambda a, b, c: flash_attention(a, b, c, causal=True),
            backend="aot_eager",
            fullgraph=True,
        )(q, k, v)
    (dq,) = torch.autograd.grad(out.sum(), q, create_graph=True)
    # Compiled: AOTAutograd's own message ("... does not currently support double backward").
    pattern = "does not support double backward" if path != "compiled" else "double backward"
    with pytest.raises(RuntimeError, match=pattern):
        dq.sum().backward()


def test_single_backward_with_create_graph_still_works():
    """create_graph=True alone (a gradient penalty's first step) gives the same gradients."""
    q, k, v = qkv()
    out = flash_attention(q, k, v)
    g1 = torch.autograd.grad(out.sum(), (q, k, v), create_graph=True)
    out = flash_attention(q, k, v)
    g2 = torch.autograd.grad(out.sum(), (q, k, v))
    for a, b in zip(g1, g2, strict=True):
        assert torch.equal(a.detach(), b)


def test_autocast_casts_like_sdpa():
    """In torch.autocast, fp32 inputs run in the autocast dtype (SDPA's rule), eager and op."""
    q, k, v = qkv(grad=False)
    dev = q.device.type
    dt = torch.bfloat16 if dev == "cpu" else torch.float16
    with torch.autocast(dev, dtype=dt):
        out = flash_attention(q, k, v, causal=True)
        out_op, _ = OP(q, k, v, True, 0.25)
        ref = torch.nn.functional.scaled_dot_product_attention(
            q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), is_causal=True
        )
    assert out.dtype == dt == out_op.dtype == ref.dtype
    assert torch.equal(out, flash_attention(q.to(dt), k.to(dt), v.to(dt), causal=True))
    assert torch.equal(out, out_op)


def test_autocast_gradients_reach_fp32_leaves():
    q, k, v = qkv()
    dev = q.device.type
    with torch.autocast(dev, dtype=torch.bfloat16 if dev == "cpu" else torch.float16):
        out = flash_attention(q, k, v)
    out.float().sum().backward()
    assert q.grad.dtype == torch.float32 and k.grad.shape == k.shape
    assert torch.isfinite(q.grad).all() and v.grad.abs().sum() > 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_nan_inputs_raise_no_numpy_warnings(dtype):
    """NaN in one query row: that row's output is NaN, the others are not, and the interpreter
    leaks no NumPy RuntimeWarning (warnings are errors here)."""
    q, k, v = qkv(dtype=dtype, grad=False)
    q[0, 1, 3, 0] = float("nan")
    q.requires_grad_()
    k.requires_grad_()
    v.requires_grad_()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = flash_attention(q, k, v, causal=True)
        out.float().sum().backward()
    assert torch.isnan(out[0, 1, 3]).all()
    assert not torch.isnan(out[0, 0]).any() and not torch.isnan(out[0, 1, :3]).any()
    assert torch.isnan(k.grad[0, 0]).any()  # head 1 reads K/V head 0 (GQA group of 2)
    assert not torch.isnan(k.grad[0, 1]).any()


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(
    "dtype,d", [(torch.float16, 224), (torch.float32, 64), (torch.bfloat16, 40)]
)
def test_one_key_backward_is_exact(causal, dtype, d):
    """Nk = 1: P = 1 in every row, so dQ = dK = 0 exactly and dV = the sum of dO over the
    query rows of the GQA group (the case a FlashAttention test found 2e-5 of noise in).
    This fails on the kernels' general path (1e-6..3e-6 of noise in dQ and dK here)."""
    q, k, v = qkv(B=2, Hq=4, kv_heads=2, Nq=7, Nk=1, d=d, dtype=dtype)
    do = rand(2, 4, 7, d, dtype=dtype, seed=5)
    out, dq, dk, dv = grads(lambda a, b, c: flash_attention(a, b, c, causal=causal), q, k, v, do)
    assert torch.equal(out, v.detach().repeat_interleave(2, 1).expand(2, 4, 7, d))
    assert dq.dtype == dtype and dk.dtype == dtype and dv.dtype == dtype
    assert torch.count_nonzero(dq) == 0 and torch.count_nonzero(dk) == 0
    expect = do.float().view(2, 2, 2, 7, d).sum((2, 3)).view(2, 2, 1, d)
    # P = exp2(s - lse) is 1 up to an ulp of fp32: dV within one rounding of its dtype
    mass = do.float().abs().view(2, 2, 2, 7, d).sum((2, 3)).view(2, 2, 1, d)
    tol = torch.finfo(dtype).eps * expect.abs() + 1e-6 * mass
    assert ((dv.float() - expect).abs() <= tol).all()


def test_one_key_backward_propagates_nan():
    q, k, v = qkv(Nq=5, Nk=1)
    do = rand(1, 4, 5, 16, seed=5)
    do[0, 2, 1, 3] = float("nan")  # head 2 -> K/V head 1
    _, dq, dk, dv = grads(flash_attention, q, k, v, do)
    assert torch.isnan(dq[0, 2, 1]).all() and torch.count_nonzero(dq[0, :2]) == 0
    assert torch.isnan(dk[0, 1]).all() and torch.isnan(dv[0, 1, 0, 3])
    assert not torch.isnan(dk[0, 0]).any() and not torch.isnan(dv[0, 0]).any()


def test_private_forward_backward_signatures():
    """``flash._forward(q, k, v, causal, scale)`` and ``flash._backward(do, q, k, v, o, lse2,
    causal, scale)`` (used block by block by ring attention) keep their signatures."""
    q, k, v = qkv(grad=False)
    o, lse2 = flash._forward(q, k, v, True, 0.25)
    ref, lse = flash_attention(q, k, v, causal=True, scale=0.25, return_lse=True)
    assert torch.equal(o, ref) and torch.allclose(lse2 * flash.LN2, lse)
    do = rand(*q.shape, seed=4)
    got = flash._backward(do, q, k, v, o, lse2, True, 0.25)
    want = grads(lambda a, b, c: flash_attention(a, b, c, causal=True, scale=0.25), q, k, v, do)
    # The kernels keep the statistic in units of c (masks.py); _backward converts lse2 back,
    # which rounds: equal to within fp32 rounding, not bit for bit.
    for a, b in zip(got, want[1:], strict=True):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6)


def test_one_key_block_with_global_statistics():
    """Ring attention calls ``_backward`` per key/value block with the *global* O and lse: a
    block of one key then needs the general formula, not dQ = dK = 0."""
    q, k, v = (x.detach().double() for x in qkv(Nq=6, Nk=5))
    do = rand(1, 4, 6, 16, seed=7).double()
    qf, kf, vf, dof = (x.float() for x in (q, k, v, do))
    o, lse2 = flash._forward(qf, kf, vf, False, 0.25)  # global statistics over all 5 keys
    parts = [
        flash._backward(dof, qf, kf[:, :, :4], vf[:, :, :4], o, lse2, False, 0.25),
        flash._backward(dof, qf, kf[:, :, 4:], vf[:, :, 4:], o, lse2, False, 0.25),
    ]
    qr, kr, vr = (x.clone().requires_grad_() for x in (q, k, v))
    s = qr @ kr.repeat_interleave(2, 1).transpose(-1, -2) * 0.25
    ref = torch.softmax(s, -1) @ vr.repeat_interleave(2, 1)
    dq, dk, dv = torch.autograd.grad(ref, (qr, kr, vr), do)
    assert torch.allclose((parts[0][0] + parts[1][0]).double(), dq, atol=1e-5)
    assert torch.allclose(parts[1][1].double(), dk[:, :, 4:], atol=1e-5)
    assert torch.allclose(parts[1][2].double(), dv[:, :, 4:], atol=1e-5)
    assert torch.count_nonzero(parts[1][0]) > 0  # not the one-key shortcut's zeros


def test_op_compiles_with_dynamic_sequence_length():
    """The fake implementation works with symbolic shapes: two lengths, one compiled graph."""
    torch._dynamo.reset()
    from torch._dynamo.testing import CompileCounter

    counter = CompileCounter()
    fn = torch.compile(
        lambda q, k, v: flash_attention(q, k, v, causal=True),
        backend=counter,
        dynamic=True,
        fullgraph=True,
    )
    for n in (19, 27):
        q, k, v = qkv(Nq=n, Nk=n, grad=False)
        assert torch.equal(fn(q, k, v), flash_attention(q, k, v, causal=True))
    assert counter.frame_count == 1


# ---- issue 22: the variants through the op (torch.compile, fake tensors, opcheck)


def _variant_kwargs():
    from torch.nn.attention.bias import causal_lower_right

    return {
        "attn_mask": causal_lower_right(9, 14),
        "window_size": (5, -1),
        "softcap": 3.0,
        "alibi_slopes": torch.tensor([0.5, 0.25, 0.125, 0.0625], device=DEVICE),
    }


def _compiles_to(fn, expect):
    """fn traced without a graph break; compiled (fullgraph) its output and gradients equal
    expect's, bit for bit (Nq = 9, Nk = 14, GQA)."""
    q, k, v = qkv(Nq=9, Nk=14)
    torch._dynamo.reset()
    explain = torch._dynamo.explain(fn)(q, k, v)
    assert explain.graph_break_count == 0, explain.break_reasons
    torch._dynamo.reset()
    do = rand(1, 4, 9, 16, seed=3)
    compiled = grads(torch.compile(fn, backend="aot_eager", fullgraph=True), q, k, v, do)
    for a, b in zip(compiled, grads(expect, q, k, v, do), strict=True):
        assert torch.equal(a, b)


def test_op_compiles_with_variants_without_graph_breaks():
    kw = _variant_kwargs()

    def fn(a, b, c):
        return flash_attention(a, b, c, scale=0.3, **kw)

    _compiles_to(fn, fn)


def test_op_compiles_an_sdpa_call_as_written():
    """SDPA's keywords (is_causal, dropout_p, enable_gqa) are resolved in Python before the op:
    no graph break, and the compiled call equals the course's own keywords' result."""

    def fn(a, b, c):
        return flash_attention(
            a, b, c, attn_mask=None, dropout_p=0.0, is_causal=True, scale=None, enable_gqa=True
        )

    _compiles_to(fn, lambda a, b, c: flash_attention(a, b, c, causal=True))


def test_op_fake_shapes_with_variants():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        q = torch.empty(2, 8, 33, 40, dtype=torch.float16)
        k = torch.empty(2, 2, 17, 40, dtype=torch.float16)
        slopes = torch.empty(8, dtype=torch.float32)
        o, lse = OP(q, k, k, True, 0.1, True, 4, -1, 2.0, slopes)
        grads_ = torch.ops.course_kernels.flash_attn_bwd(
            o, q, k, k, o, lse, True, 0.1, True, 4, -1, 2.0, slopes
        )
    assert o.shape == (2, 8, 33, 40) and lse.shape == (2, 8, 33)
    assert [g.shape for g in grads_] == [(2, 8, 33, 40), (2, 2, 17, 40), (2, 2, 17, 40)]


def test_op_opcheck_with_variants():
    q, k, v = qkv(Nq=12, Nk=10)
    slopes = torch.tensor([[0.5, 0.25, 0.1, 0.05]], device=DEVICE)
    torch.library.opcheck(OP, (q, k, v, True, 0.25, True, 3, -1, 2.0, slopes))
