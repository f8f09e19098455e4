"""``flash_attention_varlen`` as a PyTorch op (``course_kernels::flash_attn_varlen_fwd/bwd``):
torch.compile without graph breaks, fake tensors, opcheck, autograd against the eager path and
the float64 truth, autocast, double backward. Mirrors tests/test_flash_op.py (the dense op).
Triton's interpreter without a GPU, the aot_eager backend; the Inductor version is in
tests/gpu/test_gpu_flash_op.py. Tiny cases: the interpreter is slow.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from variant_cases import DEVICE  # noqa: E402

import course_kernels.triton.varlen  # noqa: E402,F401  (registers the ops)
from course_kernels import flash_attention_varlen  # noqa: E402  (the public name, as users call it)
from course_kernels.numpy.reference import attention_reference  # noqa: E402
from course_kernels.numpy.tiled_backward import attention_reference_backward  # noqa: E402

OP = torch.ops.course_kernels.flash_attn_varlen_fwd
BWD = torch.ops.course_kernels.flash_attn_varlen_bwd
LQ, LK = [5, 19, 11], [9, 19, 24]  # Nq != Nk in two sequences: bottom-right matters
MAX_Q, MAX_K = max(LQ), max(LK)  # Python ints, as the op's schema takes them
HQ, KVH, D = 4, 2, 16
SLOPES = [0.5, 0.25, 0.125, 0.0625]


def packed(lq=LQ, lk=LK, dtype=torch.float32, seed=0, grad=True):
    g = torch.Generator().manual_seed(seed)

    def rand(n, h):
        return torch.randn(n, h, D, generator=g).to(dtype=dtype, device=DEVICE)

    q, k, v, do = rand(sum(lq), HQ), rand(sum(lk), KVH), rand(sum(lk), KVH), rand(sum(lq), HQ)

    def cu(lengths):
        return torch.tensor([0, *np.cumsum(lengths)], dtype=torch.int32, device=DEVICE)

    q, k, v = (x.requires_grad_(grad) for x in (q, k, v))
    return q, k, v, do, cu(lq), cu(lk)


# every variant at once: causal (bottom-right, flash-attn's varlen default), window, softcap,
# ALiBi per head; max_seqlens are Python ints
KW = {"causal": True, "scale": 0.3, "window_size": (7, -1), "softcap": 2.0}
OP_VARIANT = (True, 0.3, True, 7, 0, 2.0)  # causal, scale, bottom_right, window l/r, softcap


def call(q, k, v, cq, ck, return_lse=False, max_q=MAX_Q, max_k=MAX_K):
    slopes = torch.tensor(SLOPES, device=q.device)
    return flash_attention_varlen(
        q, k, v, cq, ck, max_q, max_k, return_lse=return_lse, alibi_slopes=slopes, **KW
    )


def grads(fn, q, k, v, do):
    q, k, v = (x.detach().clone().requires_grad_() for x in (q, k, v))
    out = fn(q, k, v)
    return (out, *torch.autograd.grad(out, (q, k, v), do))


def op_out(q, k, v, cq, ck):
    slopes = torch.tensor([SLOPES], device=q.device)  # (1, Hq): what check_alibi hands the op
    return OP(q, k, v, cq, ck, max(LQ), max(LK), *OP_VARIANT, slopes)


class Packed(torch.nn.Module):
    """Projections around the varlen kernel: what torch.compile must trace in one graph."""

    def __init__(self):
        super().__init__()
        self.qkv = torch.nn.Linear(HQ * D, (HQ + 2 * KVH) * D)
        self.out = torch.nn.Linear(HQ * D, HQ * D)

    def forward(self, x, cq, ck):  # x (total, HQ * D), one packed batch (cu_q = cu_k here)
        q, k, v = self.qkv(x).split([HQ * D, KVH * D, KVH * D], dim=-1)
        q, k, v = q.view(-1, HQ, D), k.reshape(-1, KVH, D), v.reshape(-1, KVH, D)
        o = call(q, k, v, cq, ck, max_q=max(LK), max_k=max(LK))
        return self.out(o.reshape(-1, HQ * D))


def test_varlen_op_compiles_without_graph_breaks():
    torch.manual_seed(0)
    model = Packed().to(DEVICE)
    _, _, _, _, cu, _ = packed(LK, LK)
    x = torch.randn(sum(LK), HQ * D, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    torch._dynamo.reset()
    explain = torch._dynamo.explain(model)(x, cu, cu)
    assert explain.graph_break_count == 0 and explain.graph_count == 1, explain.break_reasons
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    out_c, out_e = compiled(x, cu, cu), model(x, cu, cu)
    assert torch.equal(out_c, out_e)
    g_c = torch.autograd.grad(out_c.square().sum(), list(model.parameters()))
    g_e = torch.autograd.grad(out_e.square().sum(), list(model.parameters()))
    for a, b in zip(g_c, g_e, strict=True):
        assert torch.equal(a, b)  # the same deterministic kernels on both paths


def test_varlen_compiled_graph_calls_the_op_and_matches_eager():
    """The graph holds the op (opaque); outputs, lse and gradients equal the eager path's."""
    seen = []

    def backend(gm, example_inputs):
        seen.append(str(gm.graph))
        return gm.forward

    q, k, v, do, cq, ck = packed()
    torch._dynamo.reset()
    fn = torch.compile(lambda a, b, c: call(a, b, c, cq, ck, True), backend=backend, fullgraph=True)
    out, lse = fn(q, k, v)
    assert any("course_kernels.flash_attn_varlen_fwd" in g for g in seen), seen
    ref, ref_lse = call(q, k, v, cq, ck, True)
    assert torch.equal(out, ref) and torch.equal(lse, ref_lse)
    assert out.requires_grad and not lse.requires_grad
    torch._dynamo.reset()
    compiled = torch.compile(lambda a, b, c: call(a, b, c, cq, ck), backend="aot_eager")
    got = grads(compiled, q, k, v, do)
    want = grads(lambda a, b, c: call(a, b, c, cq, ck), q, k, v, do)
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a, b)


def test_varlen_op_fake_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        q = torch.empty(37, 8, 40, dtype=torch.float16)
        k = torch.empty(29, 2, 40, dtype=torch.float16)
        cq, ck = torch.empty(4, dtype=torch.int32), torch.empty(4, dtype=torch.int32)
        slopes = torch.empty(1, 8)
        o, lse = OP(q, k, k, cq, ck, 20, 15, True, 0.1, True, 4, -1, 2.0, slopes)
        dq, dk, dv = BWD(o, q, k, k, o, lse, cq, ck, 20, 15, True, 0.1, True, 4, -1, 2.0, slopes)
    assert o.shape == (37, 8, 40) and o.dtype == torch.float16 and o.is_contiguous()
    assert lse.shape == (8, 37) and lse.dtype == torch.float32  # (Hq, total_q), as varlen_attn
    assert (dq.shape, dk.shape, dv.shape) == ((37, 8, 40), (29, 2, 40), (29, 2, 40))
    assert dq.dtype == dk.dtype == dv.dtype == torch.float16


def test_varlen_fake_matches_the_kernel():
    """The fake's shapes, dtypes and strides are the real op's (bf16 too: rounded on CPU)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    q, k, v, _, cq, ck = packed(dtype=torch.bfloat16, grad=False)
    real = OP(q, k, v, cq, ck, max(LQ), max(LK), False, 0.25)
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fq, fk, fv, fcq, fck = (mode.from_tensor(x) for x in (q, k, v, cq, ck))
        fake = OP(fq, fk, fv, fcq, fck, max(LQ), max(LK), False, 0.25)
    for r, f in zip(real, fake, strict=True):
        assert (r.shape, r.dtype, r.stride()) == (f.shape, f.dtype, f.stride())


def test_varlen_op_opcheck():
    """torch.library's own checks: schema, fake vs real, autograd registration, AOT dispatch."""
    q, k, v, _, cq, ck = packed()
    slopes = torch.tensor([SLOPES], device=DEVICE)
    torch.library.opcheck(OP, (q, k, v, cq, ck, max(LQ), max(LK), *OP_VARIANT, slopes))


def test_varlen_op_gradients_match_eager_and_the_float64_truth():
    q, k, v, do, cq, ck = packed(seed=3)
    eager = grads(lambda a, b, c: call(a, b, c, cq, ck), q, k, v, do)
    op = grads(lambda a, b, c: op_out(a, b, c, cq, ck)[0], q, k, v, do)
    for a, b in zip(eager, op, strict=True):
        assert torch.equal(a, b)
    out, dq, dk, dv = op
    kw = {
        "causal": True,
        "scale": 0.3,
        "window_size": (7, -1),
        "softcap": 2.0,
        "alignment": "bottom_right",
        "alibi_slopes": np.array(SLOPES),
    }
    # tolerances of tests/test_triton_varlen.py
    for b in range(len(LQ)):
        qs, ks = slice(int(cq[b]), int(cq[b + 1])), slice(int(ck[b]), int(ck[b + 1]))

        def heads(x, rep=1):
            return x.detach().cpu().double().permute(1, 0, 2).repeat_interleave(rep, 0)[None]

        args = [x.numpy() for x in (heads(q[qs]), heads(k[ks], 2), heads(v[ks], 2))]
        r_out, _ = attention_reference(*args, **kw)
        r_dq, r_dk, r_dv = attention_reference_backward(*args, heads(do[qs]).numpy(), **kw)
        assert np.abs(out[qs].detach().permute(1, 0, 2).cpu().numpy() - r_out[0]).max() < 2e-6
        assert np.abs(dq[qs].permute(1, 0, 2).cpu().numpy() - r_dq[0]).max() < 5e-6
        for got, ref in ((dk, r_dk), (dv, r_dv)):
            ref = ref[0].reshape(KVH, HQ // KVH, LK[b], D).sum(1)  # GQA groups
            assert np.abs(got[ks].permute(1, 0, 2).cpu().numpy() - ref).max() < 5e-6


def test_varlen_op_checks_the_offsets():
    """Under torch.compile the wrapper cannot read cu_seqlens; the op does (no read out of
    bounds)."""
    q, k, v, _, cq, ck = packed(grad=False)
    with pytest.raises(ValueError, match="end at the number"):
        OP(q, k, v, cq, ck[:-1].contiguous(), max(LQ), max(LK), False, 0.25)
    with pytest.raises(ValueError, match="smaller than the longest"):
        OP(q, k, v, cq, ck, max(LQ) - 1, max(LK), False, 0.25)
    bad = cq.clone()
    bad[1] = 30  # decreasing offsets
    torch._dynamo.reset()
    fn = torch.compile(
        lambda a, b: flash_attention_varlen(q, k, v, a, b, max(LQ), max(LK)),
        backend="aot_eager",
        fullgraph=True,
    )
    with pytest.raises(ValueError, match="never decrease"):
        fn(bad, ck)


def test_varlen_autocast_casts_like_the_dense_op():
    q, k, v, _, cq, ck = packed(grad=False)
    dev = q.device.type
    dt = torch.bfloat16 if dev == "cpu" else torch.float16
    with torch.autocast(dev, dtype=dt):
        out = flash_attention_varlen(q, k, v, cq, ck, max(LQ), max(LK), causal=True)
        out_op, _ = OP(q, k, v, cq, ck, max(LQ), max(LK), True, 0.25)
    assert out.dtype == dt == out_op.dtype
    cast = (x.to(dt) for x in (q, k, v))
    assert torch.equal(out, flash_attention_varlen(*cast, cq, ck, max(LQ), max(LK), causal=True))
    assert torch.equal(out, out_op)


@pytest.mark.parametrize("path", ["eager", "op"])
def test_varlen_double_backward_is_a_clear_error(path):
    q, k, v, _, cq, ck = packed()
    out = call(q, k, v, cq, ck) if path == "eager" else op_out(q, k, v, cq, ck)[0]
    (dq,) = torch.autograd.grad(out.sum(), q, create_graph=True)
    with pytest.raises(RuntimeError, match="does not support double backward"):
        dq.sum().backward()


def test_varlen_compiles_with_dynamic_packing():
    """Two packings (other total tokens, offsets and max_seqlens): one compiled graph."""
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    counter = CompileCounter()

    def fn(q, k, v, cq, ck, mq, mk):
        return flash_attention_varlen(q, k, v, cq, ck, mq, mk, causal=True)

    compiled = torch.compile(fn, backend=counter, dynamic=True, fullgraph=True)
    for lq, lk in (([3, 9], [5, 9]), ([7, 2, 12], [7, 6, 12])):
        q, k, v, _, cq, ck = packed(lq, lk, grad=False)
        args = (q, k, v, cq, ck, max(lq), max(lk))
        assert torch.equal(compiled(*args), fn(*args))
    assert counter.frame_count == 1
