"""The torch.library ops on a GPU: torch.compile with Inductor (fullgraph), autocast, Nk = 1;
the varlen op (``flash_attention_varlen``) compiled the same way.

CPU versions (interpreter, aot_eager backend) are in tests/test_flash_op.py and
tests/test_varlen_op.py.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

if not torch.cuda.is_available():  # collected on CPU machines, never run there
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from course_kernels.triton.flash import flash_attention  # noqa: E402


class Block(torch.nn.Module):
    def __init__(self, d=64, heads=4, kv_heads=2):
        super().__init__()
        self.q = torch.nn.Linear(d * heads, d * heads)
        self.kv = torch.nn.Linear(d * heads, 2 * d * kv_heads)
        self.o = torch.nn.Linear(d * heads, d * heads)
        self.d, self.heads, self.kv_heads = d, heads, kv_heads

    def forward(self, x):  # (B, N, heads * d)
        B, N, _ = x.shape
        q = self.q(x).view(B, N, self.heads, self.d).transpose(1, 2)
        k, v = self.kv(x).view(B, N, 2, self.kv_heads, self.d).permute(2, 0, 3, 1, 4)
        o = flash_attention(q, k, v, causal=True)
        return self.o(o.transpose(1, 2).reshape(B, N, -1))


def test_gpu_inductor_fullgraph_matches_eager():
    torch.manual_seed(0)
    model = Block().cuda().half()
    x = torch.randn(2, 300, 256, device="cuda", dtype=torch.float16)
    explain = torch._dynamo.explain(model)(x)
    assert explain.graph_break_count == 0, explain.break_reasons
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True)  # Inductor
    out_c, out_e = compiled(x), model(x)
    assert (out_c.float() - out_e.float()).abs().max() < 2e-2
    g_c = torch.autograd.grad(out_c.float().square().sum(), list(model.parameters()))
    g_e = torch.autograd.grad(out_e.float().square().sum(), list(model.parameters()))
    for a, b in zip(g_c, g_e, strict=True):
        assert torch.isfinite(a).all()
        assert (a.float() - b.float()).abs().max() <= 5e-2 * max(1.0, b.float().abs().max())


def test_gpu_autocast_runs_fp16():
    q, k, v = (torch.randn(2, 4, 200, 64, device="cuda", requires_grad=True) for _ in range(3))
    with torch.autocast("cuda", dtype=torch.float16):
        out = flash_attention(q, k, v, causal=True)
        ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert out.dtype == torch.float16 == ref.dtype
    assert (out.float() - ref.float()).abs().max() < 5e-3
    out.float().sum().backward()
    assert q.grad.dtype == torch.float32 and torch.isfinite(q.grad).all()


@pytest.mark.parametrize("causal", [False, True])
def test_gpu_one_key_dq_is_exactly_zero(causal):
    """FlashAttention's own test case: Nk = 1, fp16, d = 224: dQ must be exactly 0."""
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(2, 4, 113, 224, device="cuda", generator=g).half().requires_grad_()
    k, v = (
        torch.randn(2, 4, 1, 224, device="cuda", generator=g).half().requires_grad_()
        for _ in range(2)
    )
    do = torch.randn(2, 4, 113, 224, device="cuda", generator=g).half()
    out = flash_attention(q, k, v, causal=causal)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), do)
    assert torch.count_nonzero(dq) == 0 and torch.count_nonzero(dk) == 0
    want = do.float().sum(2, keepdim=True)
    assert torch.allclose(dv.float(), want, rtol=2e-3, atol=2e-3)  # fp16 rounding of a sum


def test_gpu_double_backward_raises():
    q, k, v = (
        torch.randn(1, 2, 128, 64, device="cuda", dtype=torch.float16, requires_grad=True)
        for _ in range(3)
    )
    (dq,) = torch.autograd.grad(flash_attention(q, k, v).sum(), q, create_graph=True)
    with pytest.raises(RuntimeError, match="does not support double backward"):
        dq.float().sum().backward()


def test_gpu_varlen_inductor_fullgraph_matches_eager():
    """The varlen op under Inductor: no graph break, outputs and gradients of the eager path."""
    from course_kernels.triton.varlen import flash_attention_varlen

    lq, lk = [300, 17, 513], [300, 140, 513]
    cq, ck = (
        torch.tensor([0, *torch.tensor(x).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
        for x in (lq, lk)
    )
    g = torch.Generator(device="cuda").manual_seed(0)

    def rand(n, h):
        return torch.randn(n, h, 64, device="cuda", generator=g, dtype=torch.float16)

    q, k, v, do = rand(sum(lq), 8), rand(sum(lk), 2), rand(sum(lk), 2), rand(sum(lq), 8)
    slopes = torch.rand(8, device="cuda", generator=g)

    def fn(a, b, c):
        kw = {"window_size": (128, -1), "softcap": 30.0, "alibi_slopes": slopes}
        return flash_attention_varlen(a, b, c, cq, ck, max(lq), max(lk), causal=True, **kw)

    explain = torch._dynamo.explain(fn)(q, k, v)
    assert explain.graph_break_count == 0, explain.break_reasons
    torch._dynamo.reset()
    results = []
    for f in (torch.compile(fn, fullgraph=True), fn):  # Inductor, then eager
        a, b, c = (x.clone().requires_grad_() for x in (q, k, v))
        out = f(a, b, c)
        results.append((out, *torch.autograd.grad(out, (a, b, c), do)))
    for got, want in zip(*results, strict=True):
        assert torch.isfinite(got).all()
        assert (got.float() - want.float()).abs().max() <= 1e-3  # the same kernels ran
