"""The Triton kernels on a real GPU at real sizes (skipped without CUDA; see conftest.py).

Rule (``course_kernels.testing``): error vs a float64 reference at most 2x (O) or 3x (dQ, dK, dV)
the error of naive attention computed in the same dtype on the same GPU.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from course_kernels.testing import error_budget, max_abs_error  # noqa: E402

if not torch.cuda.is_available():  # collected on CPU machines, never run there
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from course_kernels.bench import naive_attention  # noqa: E402
from course_kernels.triton.flash import flash_attention  # noqa: E402


def make(B, Hq, kv_heads, Nq, Nk, d, dtype, seed=0, spread=1.0):
    g = torch.Generator(device="cuda").manual_seed(seed)

    def r(*s):
        return torch.randn(*s, device="cuda", generator=g)

    q = (r(B, Hq, Nq, d) * spread).to(dtype)  # (B, Hq, Nq, d)
    k, v = r(B, kv_heads, Nk, d).to(dtype), r(B, kv_heads, Nk, d).to(dtype)  # (B, kv_heads, Nk, d)
    do = r(B, Hq, Nq, d).to(dtype)  # (B, Hq, Nq, d)
    return q, k, v, do


def assert_rule(x, ref, naive, factor, what):
    """``testing.assert_close_to_reference`` on tensors: the error floor (8 ulps of max|ref|) is
    taken from the naive result's own dtype, which NumPy lacks for bf16."""
    ref = ref.detach().double().cpu().numpy()
    floor = 8 * torch.finfo(naive.dtype).eps * max(1.0, float(abs(ref).max()))
    err = max_abs_error(x.detach().float().cpu().numpy(), ref)
    budget = error_budget(naive.detach().float().cpu().numpy(), ref, factor, floor=floor)
    assert err <= budget, (
        f"{what}: max abs error {err:.3e} exceeds {factor}x the naive "
        f"same-dtype error (budget {budget:.3e})"
    )


def expand(x, hq):
    return x.repeat_interleave(hq // x.shape[1], dim=1)


def grads_of(fn, q, k, v, do):
    q, k, v = (x.detach().clone().requires_grad_() for x in (q, k, v))
    out = fn(q, k, v)
    return (out.detach(), *torch.autograd.grad(out, (q, k, v), do))


def check(q, k, v, do, causal, backward=True):
    """Kernel vs float64 reference, budget from naive attention in q's dtype."""
    hq = q.shape[1]

    def naive(qq, kk, vv):
        return naive_attention(qq, expand(kk, hq), expand(vv, hq), causal)

    def ours(qq, kk, vv):
        return flash_attention(qq, kk, vv, causal=causal)

    names = ("O", "dQ", "dK", "dV") if backward else ("O",)
    if backward:
        got = grads_of(ours, q, k, v, do)
        ref = grads_of(naive, *(x.double() for x in (q, k, v)), do.double())
        bar = grads_of(naive, q, k, v, do)
    else:
        with torch.no_grad():
            got, ref, bar = (
                (ours(q, k, v),),
                (naive(q.double(), k.double(), v.double()),),
                (naive(q, k, v),),
            )
    for name, x, r, n in zip(names, got, ref, bar, strict=True):
        assert x.dtype == q.dtype and x.shape == r.shape, name
        assert_rule(
            x, r, n, factor=2.0 if name == "O" else 3.0, what=f"{name} ({q.dtype}, causal={causal})"
        )
    return got


@pytest.mark.parametrize("n", [1000, 2048])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_gpu_matrix(dtype, causal, d, n):
    check(*make(2, 4, 4, n, n, d, dtype, seed=n + d), causal)


@pytest.mark.parametrize("d", [8, 40, 80, 96, 256])
def test_gpu_head_dim(d):
    check(*make(1, 3, 3, 777, 777, d, torch.float16, seed=d), causal=True)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("heads", [(8, 2), (8, 1)])
def test_gpu_gqa(heads, causal):
    check(*make(2, heads[0], heads[1], 1500, 1500, 64, torch.bfloat16, seed=heads[1]), causal)


@pytest.mark.parametrize("lengths", [(1, 4096), (4096, 1), (1000, 3001), (3001, 1000)])
def test_gpu_cross_lengths(lengths):
    nq, nk = lengths
    check(*make(1, 4, 2, nq, nk, 128, torch.float16, seed=nq), causal=True)


def test_gpu_deterministic():
    q, k, v, do = make(2, 8, 2, 3000, 3000, 64, torch.bfloat16, seed=1)
    a = grads_of(lambda *x: flash_attention(*x, causal=True), q, k, v, do)
    b = grads_of(lambda *x: flash_attention(*x, causal=True), q, k, v, do)
    for x, y in zip(a, b, strict=True):
        assert torch.equal(x, y)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gpu_extreme_scores_no_nan(dtype):
    q, k, v, do = make(1, 2, 2, 1025, 1025, 64, dtype, seed=3, spread=30.0)
    got = check(q, k, v, do, causal=True)
    assert all(torch.isfinite(x).all() for x in got)


def test_gpu_saves_nothing_n_by_n():
    n = 4096
    q, k, v, _ = make(1, 2, 2, n, n, 64, torch.float16)
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(
        lambda t: saved.append(t.numel()) or t, lambda t: t
    ):
        flash_attention(q, k, v, causal=True)
    assert saved and max(saved) <= 2 * n * 64


def test_gpu_extra_memory_is_linear():
    """One forward at N = 16K, 8 heads: O + lse, megabytes; naive would need 4 GiB for S."""
    q, k, v, _ = make(1, 8, 8, 16384, 16384, 64, torch.float16)
    flash_attention(q, k, v)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out = flash_attention(q, k, v)
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - base
    o_bytes = out.numel() * out.element_size()
    assert extra <= o_bytes + 8 * 16384 * 4 * 2 + 2**20, f"extra {extra / 2**20:.1f} MiB"
