"""The direct launch (``course_kernels.triton.configs``) on a GPU: the same bits as
``JITFunction.run``, for the shapes and layouts where Triton specialises differently.

After a shape's first calls a plan calls the compiled kernel's launcher itself, keyed on the
tensors' 16-byte alignment (tests/test_flash_launch_internals.py checks the key against Triton's
own binder on the CPU). Here every case runs forward + backward three times with the direct
launch on (tuning launch, first ``fn.run``, then direct) and once with it off
(``configs.DIRECT = False``: ``fn.run`` every time, the old path), in one process so that
both use the same tuned configs, and the outputs must be equal bit for bit.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")

if not torch.cuda.is_available():  # collected on CPU machines, never run there
    pytest.skip("needs a CUDA GPU", allow_module_level=True)


from course_kernels.triton import configs  # noqa: E402
from course_kernels.triton.backward import _attn_bwd_dkdv, _attn_bwd_dq  # noqa: E402
from course_kernels.triton.flash import flash_attention  # noqa: E402
from course_kernels.triton.forward import _attn_fwd  # noqa: E402
from course_kernels.triton.varlen import flash_attention_varlen  # noqa: E402

KERNELS = (_attn_fwd, _attn_bwd_dq, _attn_bwd_dkdv)


@pytest.fixture(autouse=True)
def _direct_on(monkeypatch):
    """The direct launch is off by default (configs.DIRECT); these tests switch it on."""
    if not configs.DIRECT_SUPPORTED:
        pytest.skip(f"no direct launch with Triton {triton.__version__}")
    monkeypatch.setattr(configs, "DIRECT", True)


def test_direct_launch_is_supported_with_the_pinned_triton():
    assert triton.__version__ in configs.DIRECT_VERSIONS, configs.DIRECT_VERSIONS


def _unaligned(x):
    """x's values in a contiguous tensor starting 2 bytes past a 16-byte boundary."""
    buf = torch.empty(x.numel() + 1, dtype=x.dtype, device=x.device)
    y = buf[1:].view(x.shape)
    y.copy_(x)
    assert y.data_ptr() % 16 != 0
    return y


def _r(*shape, dtype=torch.float16, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed + sum(shape))
    return torch.randn(*shape, device="cuda", generator=g).to(dtype)


def _dense(B, Hq, Hkv, Nq, Nk, d, dtype=torch.float16, unaligned=False, **kw):
    q, k, v = (
        _r(B, Hq, Nq, d, dtype=dtype),
        _r(B, Hkv, Nk, d, dtype=dtype, seed=1),
        _r(B, Hkv, Nk, d, dtype=dtype, seed=2),
    )
    if unaligned:
        q, k, v = map(_unaligned, (q, k, v))
    return (q, k, v), kw


CASES = {
    "N=100 causal": _dense(2, 4, 4, 100, 100, 64, causal=True),
    "Nq=1 Nk=1": _dense(1, 2, 2, 1, 1, 64),
    "Nq=1 Nk=37 bottom-right": _dense(1, 2, 2, 1, 37, 64, causal=True,
                                      causal_alignment="bottom_right"),
    "GQA 8/2 bf16 d=128": _dense(2, 8, 2, 128, 128, 128, dtype=torch.bfloat16, causal=True),
    "MQA 4/1 N=33": _dense(1, 4, 1, 33, 33, 64),
    "unaligned views": _dense(1, 2, 2, 64, 64, 64, unaligned=True, causal=True),
    "unaligned odd N": _dense(1, 3, 3, 17, 29, 32, unaligned=True),
    "fp32 d=40": _dense(1, 2, 2, 50, 50, 40, dtype=torch.float32),
    "window softcap alibi": _dense(1, 2, 2, 96, 96, 64, window_size=(16, 0), softcap=20.0,
                                   alibi_slopes=torch.tensor([0.5, 0.25], device="cuda")),
}  # fmt: skip


def _call(qkv, kw, do_seed=3):
    q, k, v = (x.detach().requires_grad_() for x in qkv)
    o, lse = flash_attention(q, k, v, return_lse=True, **kw)
    do = _r(*o.shape, dtype=o.dtype, seed=do_seed)
    dq, dk, dv = torch.autograd.grad(o, (q, k, v), do)
    return o, lse, dq, dk, dv


def _count_fn_run(monkeypatch):
    calls = []
    for kernel in KERNELS:
        real = kernel.fn.run

        def spy(*a, _real=real, **kw):
            calls.append(1)
            return _real(*a, **kw)

        monkeypatch.setattr(kernel.fn, "run", spy)
    return calls


def _assert_bitwise(got, want, what):
    for name, g, w in zip(("o", "lse", "dq", "dk", "dv"), got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape, (what, name)
        assert torch.equal(g, w) or (torch.isnan(w).any() and torch.equal(g.isnan(), w.isnan())), (
            f"{what}: {name} differs from JITFunction.run's"
        )


@pytest.mark.parametrize("case", CASES)
def test_direct_launch_gives_fn_runs_bits(case, monkeypatch):
    if not configs.DIRECT:
        pytest.skip("the direct launch is off here")
    qkv, kw = CASES[case]
    for _ in range(2):  # tune, then the first fn.run per alignment: the direct launch is ready
        _call(qkv, kw)
    calls = _count_fn_run(monkeypatch)
    direct = _call(qkv, kw)
    assert calls == [], f"{case}: the direct launch still went through fn.run {len(calls)} times"
    monkeypatch.setattr(configs, "DIRECT", False)
    reference = _call(qkv, kw)
    assert calls, "DIRECT = False did not reach fn.run"
    torch.cuda.synchronize()
    _assert_bitwise(direct, reference, case)


def test_alignment_changes_between_calls_of_one_shape(monkeypatch):
    """One plan, tensors aligned, then not, then aligned: each call gets its own compiled kernel."""
    if not configs.DIRECT:
        pytest.skip("the direct launch is off here")
    (q, k, v), kw = _dense(1, 2, 2, 48, 48, 64, causal=True)
    inputs = [(q, k, v), tuple(map(_unaligned, (q, k, v))), (q, _unaligned(k), v)] * 2
    got = [_call(x, kw) for x in inputs]
    monkeypatch.setattr(configs, "DIRECT", False)
    for i, x in enumerate(inputs):
        _assert_bitwise(got[i], _call(x, kw), f"call {i}")


def test_varlen_direct_launch(monkeypatch):
    if not configs.DIRECT:
        pytest.skip("the direct launch is off here")
    cu = torch.tensor([0, 5, 37, 100], dtype=torch.int32, device="cuda")
    q, k, v = (_r(100, 4, 64, seed=s) for s in range(3))

    def call():
        qq, kk, vv = (x.detach().requires_grad_() for x in (q, k, v))
        o = flash_attention_varlen(qq, kk, vv, cu, cu, 63, 63, causal=True)
        return (o, *torch.autograd.grad(o, (qq, kk, vv), torch.ones_like(o)))

    for _ in range(3):
        got = call()
    monkeypatch.setattr(configs, "DIRECT", False)
    want = call()
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g, w)


def test_direct_launch_on_a_side_stream_and_in_a_cuda_graph():
    """The launcher gets the current stream on every call: a side stream, a graph capture."""
    if not configs.DIRECT:
        pytest.skip("the direct launch is off here")
    (q, k, v), kw = _dense(2, 4, 4, 256, 256, 64, causal=True)
    want = flash_attention(q, k, v, **kw)
    flash_attention(q, k, v, **kw)  # the direct launch is ready
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            side = flash_attention(q, k, v, **kw)
    torch.cuda.current_stream().wait_stream(s)
    assert torch.equal(side, want)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = flash_attention(q, k, v, **kw)
    q.copy_(torch.flip(q, dims=(2,)))
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, flash_attention(q, k, v, **kw))
