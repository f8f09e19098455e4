"""The forward's short Python path (notes/kernel.md item 17): memoised metadata checks, the
no-graph path (no_grad, inference_mode, inputs without grad) and the direct C++ apply must give
the same results, errors and autograd behaviour as the long path. CPU: Triton's interpreter.
"""

from __future__ import annotations

import inspect
import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from course_kernels.triton import _env as _triton_env  # noqa: E402
from course_kernels.triton import _torch_validate, flash, launch  # noqa: E402
from course_kernels.triton.flash import flash_attention  # noqa: E402
from course_kernels.triton.varlen import flash_attention_varlen  # noqa: E402

DEVICE = _triton_env.device_kind()


def rand(*shape, dtype=torch.float32, seed=0, grad=False):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g).to(dtype=dtype, device=DEVICE)
    return x.requires_grad_(grad)


def qkv(grad=False, n=9, dtype=torch.float32):
    return rand(2, 4, n, 16, dtype=dtype, grad=grad), *(
        rand(2, 2, 11, 16, dtype=dtype, seed=s, grad=grad) for s in (1, 2)
    )


@pytest.fixture
def count_checks(monkeypatch):
    """How many times flash._check_inputs ran the real checks."""
    calls = []
    real = flash.check_tensors
    monkeypatch.setattr(flash, "check_tensors", lambda *a: (calls.append(1), real(*a))[1])
    return calls


# ---- memoised checks ---------------------------------------------------------------------------


def test_memo_skips_checks_on_a_recorded_signature(count_checks):
    q, k, v = qkv(n=13)
    flash_attention(q, k, v)
    n = len(count_checks)
    flash_attention(q, k, v)
    flash_attention(*qkv(n=13))  # other tensors, the same signature
    assert len(count_checks) == n
    flash_attention(*qkv(n=14))  # a new shape: checked
    assert len(count_checks) == n + 1


BAD_AFTER_GOOD = {
    "k dtype": (lambda q, k, v: (q, k.half(), v), TypeError, r"share one dtype"),
    "all float64": (lambda q, k, v: (q.double(), k.double(), v.double()), TypeError, "float64"),
    "k on meta": (lambda q, k, v: (q, torch.empty_like(k, device="meta"), v), ValueError, "one"),
    "all on meta": (
        lambda q, k, v: tuple(torch.empty_like(x, device="meta") for x in (q, k, v)),
        ValueError,
        r"must be on a \w+ device here",
    ),
    "v longer": (lambda q, k, v: (q, k, rand(2, 2, 12, 16)), ValueError, "same shape"),
    "kv heads": (lambda q, k, v: (q, rand(2, 3, 11, 16), rand(2, 3, 11, 16)), ValueError, "GQA"),
    "rank 3 k": (lambda q, k, v: (q, k[0], v[0]), ValueError, "rank 4"),
    "empty q": (lambda q, k, v: (q[:, :, :0], k, v), ValueError, "must not be empty"),
}


@pytest.mark.parametrize("case", list(BAD_AFTER_GOOD))
def test_memo_lets_no_bad_input_through(case):
    """A valid call first (its signature recorded), then a bad one differing in one fact: the
    same error on the first and the second call, and nothing recorded for it."""
    make, exc, pattern = BAD_AFTER_GOOD[case]
    q, k, v = qkv()
    flash_attention(q, k, v)
    bad = make(q, k, v)
    before = dict(_torch_validate.VALID)
    messages = []
    for _ in range(2):
        with pytest.raises(exc, match=pattern) as info:
            flash_attention(*bad)
        messages.append(str(info.value))
    assert messages[0] == messages[1]
    assert before == _torch_validate.VALID


def test_memo_still_checks_causal_and_scale():
    q, k, v = qkv()
    flash_attention(q, k, v)
    with pytest.raises(TypeError, match="causal must be a bool"):
        flash_attention(q, k, v, causal=1)
    with pytest.raises(ValueError, match="scale must be finite"):
        flash_attention(q, k, v, scale=float("nan"))
    with pytest.raises(TypeError, match="scale must be a finite real number"):
        flash_attention(q, k, v, scale="0.1")


def test_memo_keys_on_all_that_the_checks_read():
    q, k, v = qkv()
    sig = _torch_validate.tensor_signature
    base = sig(q, k, v)
    assert sig(q, k, v) == base and sig(q.clone(), k, v) == base  # values do not matter
    assert sig(q.half(), k, v) != base and sig(q, k, v.half()) != base
    assert sig(q, k, v[:, :, :5]) != base and sig(q[:1], k, v) != base
    assert sig(q, k, torch.empty_like(v, device="meta")) != base
    assert sig(q, k.unsqueeze(0), v) != base  # rank


def test_memo_skips_tensor_subclasses_and_non_tensors():
    class Sub(torch.Tensor):
        pass

    q, k, v = qkv()
    assert _torch_validate.tensor_signature(q.as_subclass(Sub), k, v) is None
    assert _torch_validate.tensor_signature(q, k.detach().numpy(), v) is None
    with pytest.raises(TypeError, match="k must be a torch.Tensor"):
        flash_attention(q, k.detach().numpy(), v)


def test_memo_keys_bf16_on_the_current_gpu(monkeypatch):
    """bf16 on a GPU: _check_shapes reads the current device's capability, so the key holds it."""
    monkeypatch.setattr(_triton_env, "HAS_GPU", True)
    monkeypatch.setattr(_triton_env, "INTERPRET", False)
    gpu = [0]
    monkeypatch.setattr(torch.cuda, "current_device", lambda: gpu[0])
    q, k, v = qkv(dtype=torch.bfloat16)
    a = _torch_validate.tensor_signature(q, k, v)
    gpu[0] = 1
    assert _torch_validate.tensor_signature(q, k, v) != a
    assert _torch_validate.tensor_signature(*qkv())[-1] is None  # fp32: no capability read


def test_memo_is_bounded(monkeypatch):
    monkeypatch.setattr(_torch_validate, "MAX_VALID", 3)
    for n in range(1, 9):
        q, k, v = qkv(n=n)
        flash._check_inputs(q, k, v, False, None)
        assert len(_torch_validate.VALID) <= 3
    assert _torch_validate.tensor_signature(q, k, v) in _torch_validate.VALID


# ---- the no-graph path and the direct apply ----------------------------------------------------


@pytest.fixture
def count_function(monkeypatch):
    """How many times _FlashAttention.forward ran (the autograd.Function path)."""
    calls = []
    real = flash._FlashAttention.forward

    def forward(ctx, *args):
        calls.append(1)
        return real(ctx, *args)

    monkeypatch.setattr(flash._FlashAttention, "forward", staticmethod(forward))
    return calls


KWARGS = [
    {},
    {"causal": True, "return_lse": True},
    {"window_size": (3, 2), "softcap": 5.0, "return_lse": True},
    {"alibi_slopes": torch.tensor([0.5, 0.25, 0.125, 0.0625])},
]


@pytest.mark.parametrize("kw", KWARGS)
@pytest.mark.parametrize("mode", ["no_grad", "inference_mode", "no_requires_grad"])
def test_no_graph_path_is_bit_identical_without_grad_fn(kw, mode, count_function):
    ref = flash_attention(*qkv(grad=True), **kw)
    assert len(count_function) == 1
    ref = ref if isinstance(ref, tuple) else (ref,)
    assert ref[0].grad_fn is not None and "_FlashAttention" in type(ref[0].grad_fn).__name__
    if mode == "no_requires_grad":
        out = flash_attention(*qkv(), **kw)
    else:
        with getattr(torch, mode)():
            out = flash_attention(*qkv(grad=True), **kw)
    assert len(count_function) == 1  # the Function did not run
    out = out if isinstance(out, tuple) else (out,)
    assert len(out) == len(ref)
    for o, r in zip(out, ref, strict=True):
        assert torch.equal(o, r.detach()) and o.dtype == r.dtype and o.shape == r.shape
        assert o.grad_fn is None and not o.requires_grad
        assert o.is_inference() == (mode == "inference_mode")


def test_graph_path_when_one_input_requires_grad(count_function):
    q, k, v = qkv()
    out = flash_attention(q, k.requires_grad_(), v)
    assert len(count_function) == 1 and out.requires_grad
    (dk,) = torch.autograd.grad(out.sum(), (k,))
    assert dk.shape == k.shape


def test_direct_apply_equals_function_apply():
    """The C++ apply (flash._APPLY) against torch.autograd.Function.apply: the same outputs,
    node type and gradients, bit for bit."""
    assert flash._APPLY is not None
    variant, scale = launch.CAUSAL, 0.25
    do = rand(2, 4, 9, 16, seed=5)
    res = []
    for apply in (flash._FlashAttention.apply, flash.attention_c):
        q, k, v = qkv(grad=True)
        o, lse = apply(q, k, v, variant, scale, True, None)
        assert not lse.requires_grad
        res.append((o, lse, type(o.grad_fn), *torch.autograd.grad(o, (q, k, v), do)))
    for a, b in zip(*res, strict=True):
        assert a is b if isinstance(a, type) else torch.equal(a, b)


def test_function_apply_source_is_what_the_direct_apply_copies():
    """flash.attention_c calls the C++ apply as Function.apply does without setup_context and
    outside functorch transforms. If this fails, torch changed Function.apply: re-check."""
    src = inspect.getsource(torch.autograd.Function.apply)
    for piece in flash.APPLY_SOURCE:
        assert piece in src
    assert flash._APPLY is not None  # so the import-time check turned the direct apply on
    assert not flash._FlashAttention.__dict__.get("setup_context")


def test_direct_apply_is_off_where_function_apply_reads_otherwise(monkeypatch):
    """Another torch whose Function.apply no longer reads as copied: Function.apply is used."""

    def apply(cls, *args, **kwargs):  # a stand-in with different source
        return cls.forward(None, *args, **kwargs)

    monkeypatch.setattr(torch.autograd.Function, "apply", classmethod(apply))
    assert flash._direct_apply() is None


@pytest.mark.parametrize("grad_mode", [torch.enable_grad, torch.no_grad])
def test_forward_ad_still_raises(grad_mode):
    import torch.autograd.forward_ad as fwAD

    q, k, v = qkv()
    with fwAD.dual_level(), grad_mode():
        qd = fwAD.make_dual(q, torch.randn_like(q))
        with pytest.raises(NotImplementedError, match="jvp"):
            flash_attention(qd, k, v)


@pytest.mark.parametrize("grad", [False, True])
def test_vmap_still_raises(grad):
    q, k, v = qkv(grad=grad)
    with pytest.raises(RuntimeError, match="setup_context"):
        torch.func.vmap(lambda x: flash_attention(x, k, v))(q.unsqueeze(0))


def test_varlen_no_graph_path_is_bit_identical(count_function):
    cu_q = torch.tensor([0, 4, 9], dtype=torch.int32, device=DEVICE)
    cu_k = torch.tensor([0, 6, 11], dtype=torch.int32, device=DEVICE)
    q, k, v = rand(9, 4, 16, grad=True), rand(11, 2, 16, seed=1), rand(11, 2, 16, seed=2)
    args = (cu_q, cu_k, 5, 6)
    ref, ref_lse = flash_attention_varlen(q, k, v, *args, causal=True, return_lse=True)
    assert len(count_function) == 1 and ref.grad_fn is not None
    with torch.no_grad():
        out, lse = flash_attention_varlen(q, k, v, *args, causal=True, return_lse=True)
    assert len(count_function) == 1 and out.grad_fn is None
    assert torch.equal(out, ref.detach()) and torch.equal(lse, ref_lse)


# ---- the environment read ----------------------------------------------------------------------


@pytest.mark.parametrize("value", [None, "", "triton", "gluon", "é"])
def test_environ_get_reads_every_call(monkeypatch, value):
    name = "COURSE_KERNELS_TEST_ENV_READ"
    if value is None:
        monkeypatch.delenv(name, raising=False)
    else:
        monkeypatch.setenv(name, value)
    assert launch._environ_get is _triton_env.environ_get
    assert launch._environ_get(name, "auto") == os.environ.get(name, "auto")
    monkeypatch.setenv(name, "changed")
    assert launch._environ_get(name, "auto") == "changed"


def test_v_is_checked_like_k_and_only_plain_tensors_are_memoised(monkeypatch):
    """v's dtype and device are compared with q's (not only k's); a subclass v, or a call being
    traced by torch.compile, gets no memoised signature."""
    from course_kernels.triton import _torch_validate

    q, k, v = qkv()
    with pytest.raises(TypeError, match="share one dtype"):
        _torch_validate.check_tensors(q, k, v.double().float().half())
    with pytest.raises(ValueError, match="on one device"):
        _torch_validate.check_tensors(q, k, v.to("meta"))

    class Sub(torch.Tensor):
        pass

    assert _torch_validate.tensor_signature(q, k, v.as_subclass(Sub)) is None
    assert _torch_validate.tensor_signature(q, k, v) is not None
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert _torch_validate.tensor_signature(q, k, v) is None
