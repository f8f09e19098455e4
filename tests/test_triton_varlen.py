"""``flash_attention_varlen`` (packed sequences, cu_seqlens) against the float64 truth per
sequence, and against the dense kernel on each sequence (bit for bit: the same program sees the
same tiles). Triton's CPU interpreter without a GPU. Issue 22.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from variant_cases import DEVICE  # noqa: E402

import course_kernels  # noqa: E402
from course_kernels import flash_attention, flash_attention_varlen  # noqa: E402
from course_kernels.numpy.reference import attention_reference  # noqa: E402
from course_kernels.numpy.tiled_backward import attention_reference_backward  # noqa: E402


def packed(lq, lk, Hq=4, kvh=2, d=32, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(sum(lq), Hq, d, generator=g).to(dtype=dtype, device=DEVICE)
    k = torch.randn(sum(lk), kvh, d, generator=g).to(dtype=dtype, device=DEVICE)
    v = torch.randn(sum(lk), kvh, d, generator=g).to(dtype=dtype, device=DEVICE)
    do = torch.randn(sum(lq), Hq, d, generator=g).to(dtype=dtype, device=DEVICE)

    def cu(lengths):
        return torch.tensor([0, *np.cumsum(lengths)], dtype=torch.int32, device=DEVICE)

    return q, k, v, do, cu(lq), cu(lk)


def run(q, k, v, do, cq, ck, lq, lk, **kw):
    q, k, v = (x.detach().clone().requires_grad_() for x in (q, k, v))
    out, lse = flash_attention_varlen(q, k, v, cq, ck, max(lq), max(lk), return_lse=True, **kw)
    out.backward(do)
    return out.detach(), lse, q.grad, k.grad, v.grad


LQ, LK = [5, 0, 40, 17, 1, 9], [9, 3, 40, 12, 30, 0]


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"causal": True},
        {"causal": True, "causal_alignment": "top_left"},
        {"window_size": (4, 2)},
        {"causal": True, "softcap": 2.0, "alibi_slopes": "per_batch"},
    ],
)
def test_varlen_matches_the_float64_truth_per_sequence(kw):
    q, k, v, do, cq, ck = packed(LQ, LK, seed=len(kw))
    kw = dict(kw)
    slopes = None
    if kw.get("alibi_slopes") == "per_batch":
        slopes = torch.rand(len(LQ), 4, generator=torch.Generator().manual_seed(2))
        kw["alibi_slopes"] = slopes.to(DEVICE)
    out, lse, dq, dk, dv = run(q, k, v, do, cq, ck, LQ, LK, **kw)
    align = kw.pop("causal_alignment", "bottom_right")  # flash-attn's varlen default
    kw.pop("alibi_slopes", None)
    for b, (a, n) in enumerate(zip(LQ, LK, strict=True)):
        qs, ks = slice(int(cq[b]), int(cq[b + 1])), slice(int(ck[b]), int(ck[b + 1]))
        if a == 0:  # keys of a sequence without queries get no gradient
            assert torch.count_nonzero(dk[ks]) == 0 and torch.count_nonzero(dv[ks]) == 0
            continue

        def heads(x, rep=1):
            return x.detach().cpu().double().permute(1, 0, 2).repeat_interleave(rep, 0)[None]

        args = (heads(q[qs]), heads(k[ks], 2), heads(v[ks], 2))
        extra = {"alignment": align, **kw}
        if slopes is not None:
            extra["alibi_slopes"] = slopes[b].double().numpy()
        if n == 0:  # no keys: O = 0, lse = -inf
            assert torch.count_nonzero(out[qs]) == 0 and torch.isneginf(lse[:, qs]).all()
            continue
        r_out, r_lse = attention_reference(*(x.numpy() for x in args), **extra)
        r_dq, r_dk, r_dv = attention_reference_backward(
            *(x.numpy() for x in args), heads(do[qs]).numpy(), **extra
        )
        assert np.abs(out[qs].permute(1, 0, 2).cpu().numpy() - r_out[0]).max() < 2e-6
        fin = np.isfinite(r_lse[0])
        assert np.abs(lse[:, qs].cpu().numpy()[fin] - r_lse[0][fin]).max(initial=0) < 1e-5
        assert (np.isneginf(lse[:, qs].cpu().numpy()) == ~fin).all()
        assert np.abs(dq[qs].permute(1, 0, 2).cpu().numpy() - r_dq[0]).max() < 5e-6
        for got, ref in ((dk, r_dk), (dv, r_dv)):
            ref = ref[0].reshape(2, 2, n, -1).sum(1)  # GQA: two query heads per K/V head
            assert np.abs(got[ks].permute(1, 0, 2).cpu().numpy() - ref).max() < 5e-6


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_varlen_is_the_dense_kernel_on_each_sequence(dtype):
    """Same outputs and gradients, bit for bit, as flash_attention on each sequence alone."""
    lq, lk = [7, 33, 20], [7, 33, 45]
    q, k, v, do, cq, ck = packed(lq, lk, dtype=dtype, seed=3)
    kw = {"causal": True, "window_size": (9, -1)}
    out, _, dq, dk, dv = run(q, k, v, do, cq, ck, lq, lk, **kw)
    for b in range(3):
        qs, ks = slice(int(cq[b]), int(cq[b + 1])), slice(int(ck[b]), int(ck[b + 1]))
        qb, kb, vb = (x[s].detach().transpose(0, 1)[None] for x, s in ((q, qs), (k, ks), (v, ks)))
        qb, kb, vb = (x.contiguous().requires_grad_() for x in (qb, kb, vb))
        ob = flash_attention(qb, kb, vb, causal_alignment="bottom_right", **kw)
        ob.backward(do[qs].transpose(0, 1)[None])
        assert torch.equal(out[qs], ob[0].detach().transpose(0, 1))
        assert torch.equal(dq[qs], qb.grad[0].transpose(0, 1))
        assert torch.equal(dk[ks], kb.grad[0].transpose(0, 1))
        assert torch.equal(dv[ks], vb.grad[0].transpose(0, 1))


def test_varlen_exported_at_the_top_level():
    assert "flash_attention_varlen" in course_kernels.__all__


@pytest.mark.parametrize(
    "change,error,match",
    [
        ("rank4", ValueError, "rank-3"),
        ("cu_float", TypeError, "int32"),
        ("cu_start", ValueError, "start at 0"),
        ("cu_decreasing", ValueError, "never decrease"),
        ("cu_total", ValueError, "end at the number"),
        ("max_small", ValueError, "smaller than the longest"),
        ("max_float", TypeError, "max_seqlen_q must be an int"),
        ("count", ValueError, "same number of sequences"),
        ("heads", ValueError, "multiple of the number of key/value"),
        ("alibi", ValueError, "alibi_slopes"),
        ("window", ValueError, "window_size"),
    ],
)
def test_varlen_bad_input_raises_clearly(change, error, match):
    q, k, v, _, cq, ck = packed([3, 4], [5, 6])
    args = {"q": q, "k": k, "v": v, "cq": cq, "ck": ck, "mq": 4, "mk": 6}
    kw = {}
    if change == "rank4":
        args["q"] = q[None]
    elif change == "cu_float":
        args["cq"] = cq.float()
    elif change == "cu_start":
        args["cq"] = cq + 1
    elif change == "cu_decreasing":
        args["cq"] = torch.tensor([0, 5, 4, 7], dtype=torch.int32)
    elif change == "cu_total":
        args["ck"] = torch.tensor([0, 5, 10], dtype=torch.int32)
    elif change == "max_small":
        args["mq"] = 3
    elif change == "max_float":
        args["mq"] = 4.0
    elif change == "count":
        args["cq"] = torch.tensor([0, 1, 3, 7], dtype=torch.int32)
    elif change == "heads":
        args["q"] = q[:, :3]
    elif change == "alibi":
        kw["alibi_slopes"] = torch.ones(3, 4)
    elif change == "window":
        kw["window_size"] = (-5, 1)
    with pytest.raises(error, match=match):
        flash_attention_varlen(*args.values(), **kw)


def test_varlen_takes_a_flash_attn_call_as_written():
    """flash_attn_varlen_func's keywords as a serving stack passes them: the same bits as the
    course's own names, softmax_scale read (not dropped)."""
    q, k, v, _, cq, ck = packed([3, 4], [5, 6])
    fa_kw = dict(dropout_p=0.0, softmax_scale=0.3, causal=True, window_size=(-1, -1), softcap=0.0,
                 alibi_slopes=None, deterministic=False, return_attn_probs=False)  # fmt: skip
    out = flash_attention_varlen(q, k, v, cq, ck, 4, 6, **fa_kw)
    assert torch.equal(out, flash_attention_varlen(q, k, v, cq, ck, 4, 6, causal=True, scale=0.3))
    assert not torch.allclose(out, flash_attention_varlen(q, k, v, cq, ck, 4, 6, causal=True))
    torch.use_deterministic_algorithms(True)
    try:  # deterministic=True where the kernels follow the flag
        det = flash_attention_varlen(q, k, v, cq, ck, 4, 6, deterministic=True, **{
            kw: val for kw, val in fa_kw.items() if kw != "deterministic"})  # fmt: skip
    finally:
        torch.use_deterministic_algorithms(False)
    assert torch.equal(det, out)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"dropout_p": 0.5}, ValueError, r"dropout_p must be 0.0"),
        ({"scale": 0.3, "softmax_scale": 0.3}, TypeError, r"scale or flash-attn's name.*not both"),
        ({"deterministic": True}, ValueError, r"use_deterministic_algorithms\(True\)"),
        ({"deterministic": 1}, TypeError, r"deterministic must be a bool"),
        ({"return_attn_probs": True}, ValueError, r"no attention probabilities.*return_lse"),
        ({"enable_gqa": False}, ValueError, r"enable_gqa=False.*Hq=4, kv_heads=2"),
    ],
)
def test_varlen_refuses_flash_attn_keywords_it_cannot_honour(kwargs, error, match):
    q, k, v, _, cq, ck = packed([3, 4], [5, 6])
    with pytest.raises(error, match=match):
        flash_attention_varlen(q, k, v, cq, ck, 4, 6, **kwargs)


def test_varlen_flash_attn_positional_order_is_named_in_the_error():
    """flash-attn's eighth positional argument is dropout_p; here it is causal."""
    q, k, v, _, cq, ck = packed([3, 4], [5, 6])
    with pytest.raises(TypeError, match=r"got float.*eighth positional.*dropout_p.*keyword"):
        flash_attention_varlen(q, k, v, cq, ck, 4, 6, 0.0, 0.3, True)


def test_offsets_are_read_once_per_unchanged_tensor():
    """The offsets are a device-to-host copy (a sync on a GPU): read on the first call, not again
    for the same unchanged tensor with the same sizes; read again after an in-place change (and
    its error raised), and after a change of max_seqlen."""
    lq = lk = [5, 0, 9]
    q, k, v, _, cq, ck = packed(lq, lk, Hq=2, kvh=2, d=16)
    flash_attention_varlen(q, k, v, cq, ck, 9, 9)

    def no_read():
        raise AssertionError("read the offsets again")

    cq.tolist = ck.tolist = no_read  # the instance attribute shadows Tensor.tolist
    flash_attention_varlen(q, k, v, cq, ck, 9, 9)  # same tensors, unchanged: not read
    with pytest.raises(AssertionError, match="read the offsets again"):
        flash_attention_varlen(q, k, v, cq, ck, 10, 10)  # another max_seqlen: read
    del cq.tolist, ck.tolist
    with pytest.raises(ValueError, match="max_seqlen_q = 4 is smaller"):
        flash_attention_varlen(q, k, v, cq, ck, 4, 9)
    cq[1] = 7  # an in-place write bumps the version counter: read again, and refused
    with pytest.raises(ValueError, match="must start at 0, never decrease"):
        flash_attention_varlen(q, k, v, cq, ck, 9, 9)


def test_offsets_under_inference_mode_are_checked_every_call():
    """Inference tensors have no version counter: no stamp, the offsets are read (and refused
    when bad) on every call, and good ones run."""
    lq = lk = [5, 0, 9]
    with torch.inference_mode():
        q, k, v, _, cq, ck = packed(lq, lk, Hq=2, kvh=2, d=16)
        out = flash_attention_varlen(q, k, v, cq, ck, 9, 9)
        assert out.shape == q.shape and torch.isfinite(out).all()
        bad = cq.clone()
        bad[1] = 7  # [0, 7, 5, 14]: decreasing
        with pytest.raises(ValueError, match="must start at 0, never decrease"):
            flash_attention_varlen(q, k, v, bad, ck, 9, 9)
        cq[1] = 7  # in place on an inference tensor (no version counter): read again
        with pytest.raises(ValueError, match="must start at 0, never decrease"):
            flash_attention_varlen(q, k, v, cq, ck, 9, 9)
