"""``flash_attention_varlen``: many sequences of different lengths packed into one batch, the
layout of flash-attn's ``flash_attn_varlen_func`` and PyTorch's ``varlen_attn``.

Chapter: "Flash Attention in Triton" (variable-length batches; serving).

    q: (total_q, Hq, d)   k, v: (total_k, kv_heads, d)   cu_seqlens_q, cu_seqlens_k: (B + 1,) int32

Sequence b owns query tokens [cu_seqlens_q[b], cu_seqlens_q[b + 1]) and key tokens
[cu_seqlens_k[b], cu_seqlens_k[b + 1]); it attends only to its own keys (a block-diagonal mask
that costs nothing: no padding is computed). The kernels are the dense ones with ``VARLEN`` on:
the grid is (cdiv(max_seqlen_q, BLOCK_M), B * Hq), each program reads its sequence's offset and
length from cu_seqlens and exits at once when its query block is past the sequence's end.
"""

from __future__ import annotations

from . import _env as _triton_env  # first: GPU or interpreter
from ._env import require_triton

require_triton()

import numbers  # noqa: E402

import torch  # noqa: E402

from ._torch_validate import check_scale  # noqa: E402
from .flash import MAX_HEAD_DIM, _NoDoubleBackward, _autocast, user_lse  # noqa: E402
from .launch import Variant, _backward_c, _forward_c  # noqa: E402
from .masks import check_alibi, check_variant  # noqa: E402
from ..numpy.reference import check_alignment  # noqa: E402
from ._torch_validate import SUPPORTED_DTYPES  # noqa: E402


class _FlashVarlen(torch.autograd.Function):
    """Saves q, k, v, O and the row statistic (Hq, total_q); nothing N x N."""

    @staticmethod
    def forward(ctx, q, k, v, varlen, variant, scale, return_lse, alibi):
        o, lse_c = _forward_c(q, k, v, variant, scale, alibi, varlen)
        ctx.save_for_backward(q, k, v, o, lse_c)
        ctx.varlen, ctx.variant, ctx.scale, ctx.alibi = varlen, variant, scale, alibi
        if not return_lse:
            return o
        lse = user_lse(lse_c, variant, scale)
        ctx.mark_non_differentiable(lse)
        return o, lse

    @staticmethod
    def backward(ctx, do, *_dlse):
        q, k, v, o, lse_c = ctx.saved_tensors
        dq, dk, dv = _backward_c(
            do, q, k, v, o, lse_c, ctx.variant, ctx.scale, ctx.alibi, ctx.varlen
        )
        if torch.is_grad_enabled():
            dq, dk, dv = _NoDoubleBackward.apply(dq, dk, dv, q, k, v, do)
        return dq, dk, dv, None, None, None, None, None


def _check_packed(q, k, v) -> None:
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(
                f"{name} must be a torch.Tensor of shape (total_tokens, heads, d); got "
                f"{type(x).__name__}"
            )
        if x.dim() != 3 or x.numel() == 0:
            raise ValueError(
                f"{name} must be a non-empty rank-3 tensor (total_tokens, heads, d), the packed "
                f"layout of flash_attn_varlen_func; got shape {tuple(x.shape)}"
            )
        if x.dtype not in SUPPORTED_DTYPES:
            raise TypeError(f"{name} must be float16, bfloat16 or float32; got {x.dtype}")
    if not (q.dtype == k.dtype == v.dtype) or not (q.device == k.device == v.device):
        raise TypeError(
            f"q, k, v must share one dtype and device; got {q.dtype}/{q.device}, "
            f"{k.dtype}/{k.device}, {v.dtype}/{v.device}"
        )
    want = _triton_env.device_kind()
    if q.device.type != want:
        raise ValueError(f"tensors must be on a {want} device here (see _env.py); got {q.device}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have one shape; got {tuple(k.shape)}, {tuple(v.shape)}")
    d, hq, kv_heads = q.shape[2], q.shape[1], k.shape[1]
    if k.shape[2] != d:
        raise ValueError(f"q, k, v must share the head dim; got q {d} and k/v {k.shape[2]}")
    if hq % kv_heads != 0:
        raise ValueError(
            f"the number of query heads must be a multiple of the number of key/value heads "
            f"(GQA/MQA); got Hq={hq}, kv_heads={kv_heads}"
        )
    if d % 8 != 0 or d > MAX_HEAD_DIM:
        raise ValueError(f"head dim must be a multiple of 8 and at most {MAX_HEAD_DIM}; got {d}")


def _check_cu(cu, name: str, total: int, max_seqlen, max_name: str, device) -> torch.Tensor:
    """cu_seqlens: 1-D integer tensor [0, ..., total], non-decreasing; max_seqlen >= every length."""
    if not isinstance(cu, torch.Tensor) or cu.dim() != 1 or cu.numel() < 2:
        raise ValueError(
            f"{name} must be a 1-D integer tensor of B + 1 >= 2 offsets [0, ..., total_tokens]; "
            f"got {cu if not isinstance(cu, torch.Tensor) else tuple(cu.shape)}"
        )
    if cu.dtype not in (torch.int32, torch.int64) or cu.device != device:
        raise TypeError(
            f"{name} must be int32 (or int64) on {device}; got {cu.dtype} on {cu.device}"
        )
    if isinstance(max_seqlen, bool) or not isinstance(max_seqlen, numbers.Integral):
        raise TypeError(f"{max_name} must be an int; got {type(max_seqlen).__name__}")
    offsets = cu.tolist()  # one small copy (a device sync on a GPU)
    lengths = [b - a for a, b in zip(offsets, offsets[1:], strict=False)]
    if offsets[0] != 0 or offsets[-1] != total or min(lengths) < 0:
        raise ValueError(
            f"{name} must start at 0, never decrease and end at the number of packed tokens "
            f"({total}); got {offsets if len(offsets) <= 12 else offsets[:6] + ['...']}"
        )
    if max_seqlen < max(lengths):
        raise ValueError(
            f"{max_name} = {max_seqlen} is smaller than the longest sequence in {name} "
            f"({max(lengths)}): the grid would miss its tokens"
        )
    return cu.to(torch.int32).contiguous()


def flash_attention_varlen(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q: int,
    max_seqlen_k: int,
    causal: bool = False,
    scale: float | None = None,
    return_lse: bool = False,
    *,
    causal_alignment: str = "bottom_right",
    window_size=None,
    softcap=None,
    alibi_slopes=None,
):
    """Exact attention over packed sequences of different lengths (flash-attn's varlen layout).

    Args:
        q: (total_q, Hq, d) the queries of every sequence, one after another.
        k, v: (total_k, kv_heads, d); Hq a multiple of kv_heads (GQA/MQA).
        cu_seqlens_q, cu_seqlens_k: (B + 1,) int32 offsets: sequence b is tokens
            [cu[b], cu[b + 1]). Lengths may be 0.
        max_seqlen_q, max_seqlen_k: the longest sequence (sets the grid).
        causal: within each sequence; **bottom-right aligned by default** as in flash-attn's
            ``flash_attn_varlen_func`` (query i sees keys j <= i + Nk_b - Nq_b; for Nq_b = Nk_b
            the usual causal mask). ``causal_alignment="top_left"`` gives PyTorch's.
        scale, window_size, softcap, alibi_slopes ((Hq,) or (B, Hq)), return_lse: as in
            :func:`course_kernels.flash_attention` (window and ALiBi per sequence).

    Returns:
        out: (total_q, Hq, d), differentiable w.r.t. q, k, v; with ``return_lse`` also lse
        (Hq, total_q) float32, natural log, -inf for a row that sees no key.
    """
    _check_packed(q, k, v)
    q, k, v = _autocast(q, k, v)
    dev = q.device
    cu_q = _check_cu(cu_seqlens_q, "cu_seqlens_q", q.shape[0], max_seqlen_q, "max_seqlen_q", dev)
    cu_k = _check_cu(cu_seqlens_k, "cu_seqlens_k", k.shape[0], max_seqlen_k, "max_seqlen_k", dev)
    if cu_q.numel() != cu_k.numel():
        raise ValueError(
            f"cu_seqlens_q and cu_seqlens_k must describe the same number of sequences; got "
            f"{cu_q.numel() - 1} and {cu_k.numel() - 1}"
        )
    if not isinstance(causal, bool) or not isinstance(return_lse, bool):
        raise TypeError("causal and return_lse must be bools")
    check_alignment(causal_alignment)
    scale = check_scale(scale, q.shape[2])
    variant: Variant = check_variant(causal, causal_alignment, window_size, softcap, None, 0, 0)
    batch = cu_q.numel() - 1
    alibi = check_alibi(alibi_slopes, q, batch=batch, heads=q.shape[1])
    varlen = (cu_q, cu_k, int(max(max_seqlen_q, 1)), int(max(max_seqlen_k, 1)))
    return _FlashVarlen.apply(q, k, v, varlen, variant, scale, return_lse, alibi)
