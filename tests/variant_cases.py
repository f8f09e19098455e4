"""Shared helpers for the variant tests (bottom-right causal, window, softcap, ALiBi, varlen):
inputs, the float64 NumPy truth with GQA, and the naive same-dtype bar of FlashAttention's rule.
"""

from __future__ import annotations

import numpy as np
import torch

from course_kernels.numpy.reference import alibi_bias, attention_mask, attention_reference
from course_kernels.numpy.tiled_backward import attention_reference_backward
from course_kernels.testing import assert_close_to_reference
from course_kernels.triton._env import device_kind

DEVICE = device_kind()


def make(B=1, Hq=2, kv_heads=2, Nq=33, Nk=33, d=32, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    shapes = [(B, Hq, Nq, d), (B, kv_heads, Nk, d), (B, kv_heads, Nk, d), (B, Hq, Nq, d)]
    return [torch.randn(s, generator=g).to(dtype=dtype, device=DEVICE) for s in shapes]


def ref_kwargs(kw: dict) -> dict:
    """flash_attention's variant keywords -> attention_reference's."""
    out = {k: v for k, v in kw.items() if k not in ("causal_alignment", "alibi_slopes")}
    out["alignment"] = kw.get("causal_alignment", "top_left")
    if kw.get("alibi_slopes") is not None:
        out["alibi_slopes"] = kw["alibi_slopes"].detach().cpu().double().numpy()
    return out


def _expand(x, hq):
    return x.detach().cpu().repeat_interleave(hq // x.shape[1], dim=1)


def reference(q, k, v, do, kw):
    """float64 (out, lse, dq, dk, dv); dk, dv summed over each GQA group."""
    hq, kvh = q.shape[1], k.shape[1]
    qn, kn, vn = q.detach().cpu().double().numpy(), _expand(k, hq).double().numpy(), None
    vn = _expand(v, hq).double().numpy()
    rk = ref_kwargs(kw)
    out, lse = attention_reference(qn, kn, vn, **rk)
    dq, dk, dv = attention_reference_backward(qn, kn, vn, do.cpu().double().numpy(), **rk)
    B, _, Nk, d = k.shape
    g = hq // kvh
    return out, lse, dq, dk.reshape(B, kvh, g, Nk, d).sum(2), dv.reshape(B, kvh, g, Nk, d).sum(2)


def naive(q, k, v, do, kw):
    """Standard attention with the same variant, differentiated by PyTorch in the inputs' dtype."""
    q, k, v = (x.detach().cpu().requires_grad_() for x in (q, k, v))
    hq = q.shape[1]
    kk, vv = k.repeat_interleave(hq // k.shape[1], 1), v.repeat_interleave(hq // v.shape[1], 1)
    scale = kw.get("scale") or q.shape[-1] ** -0.5
    s = (q @ kk.transpose(-1, -2)) * scale
    cap = kw.get("softcap") or 0.0
    if cap:
        s = cap * torch.tanh(s / cap)
    if kw.get("alibi_slopes") is not None:
        slopes = kw["alibi_slopes"].detach().cpu().double().numpy()
        s = s + torch.from_numpy(alibi_bias(slopes, tuple(s.shape))).to(s.dtype)
    rk = ref_kwargs(kw)
    keep = attention_mask(
        q.shape[2], k.shape[2], rk.get("causal", False), rk["alignment"], rk.get("window_size")
    )
    s = s.masked_fill(~torch.from_numpy(keep), float("-inf"))
    p = torch.nan_to_num(torch.softmax(s, -1))  # a row that sees nothing: 0
    out = p @ vv
    out.backward(do.cpu())
    return out.detach(), q.grad, k.grad, v.grad


def _np(x):
    """The naive result as NumPy in its own dtype (its ulp sets the rule's floor); bf16 -> fp32."""
    return (x.float() if x.dtype == torch.bfloat16 else x).numpy()


def check(q, k, v, do, kw, flash_attention):
    """Kernel vs the float64 truth: 2x (O) and 3x (gradients) the naive same-dtype error."""
    q, k, v = (x.detach().clone().requires_grad_() for x in (q, k, v))
    out, lse = flash_attention(q, k, v, return_lse=True, **kw)
    out.backward(do)
    r_out, r_lse, *r_grads = reference(q, k, v, do, kw)
    n_out, *n_grads = naive(q, k, v, do, kw)
    assert_close_to_reference(out.detach().float().cpu().numpy(), r_out, _np(n_out), 2.0, "O")
    lse = lse.cpu().numpy()
    assert (np.isneginf(lse) == np.isneginf(r_lse)).all(), "rows that see no key: lse = -inf"
    fin = np.isfinite(r_lse)
    assert np.abs(lse[fin] - r_lse[fin]).max(initial=0) <= 1e-4 * max(1, np.abs(r_lse[fin]).max())
    for name, x, r, n in zip("QKV", (q, k, v), r_grads, n_grads, strict=True):
        got = x.grad.float().cpu().numpy()
        assert_close_to_reference(got, r, _np(n), 3.0, f"d{name}")
    return out, q.grad, k.grad, v.grad
