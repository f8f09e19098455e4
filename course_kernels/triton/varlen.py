"""``flash_attention_varlen``: many sequences of different lengths packed into one batch, the
layout of flash-attn's ``flash_attn_varlen_func`` and PyTorch's ``varlen_attn``.

Chapter: "Flash Attention in Triton" (variable-length batches; serving).

    q: (total_q, Hq, d)   k, v: (total_k, kv_heads, d)   cu_seqlens_q, cu_seqlens_k: (B + 1,) int32

Sequence b owns query tokens [cu_seqlens_q[b], cu_seqlens_q[b + 1]) and key tokens
[cu_seqlens_k[b], cu_seqlens_k[b + 1]); it attends only to its own keys (a block-diagonal mask
that costs nothing: no padding is computed). The kernels are the dense ones with ``VARLEN`` on:
the grid is (cdiv(max_seqlen_q, BLOCK_M), B * Hq), each program reads its sequence's offset and
length from cu_seqlens and exits at once when its query block is past the sequence's end.

A PyTorch op, as the dense path is (:mod:`.flash`): ``torch.ops.course_kernels.
flash_attn_varlen_fwd`` and ``flash_attn_varlen_bwd`` wrap the same launches (``_forward_c`` / ``_backward_c`` with
``varlen``) with fake implementations, an autograd formula and autocast rules, so
``torch.compile(fullgraph=True)`` traces a model calling ``flash_attention_varlen``. Eagerly the
function takes the shorter ``autograd.Function`` path to the same launches.
"""

from __future__ import annotations

from . import _env as _triton_env  # first: GPU or interpreter
from ._env import require_triton

require_triton()

import numbers  # noqa: E402

import torch  # noqa: E402

from ._torch_validate import check_head_dim, check_scale, flash_attn_keywords  # noqa: E402
from ._torch_validate import sdpa_keywords  # noqa: E402
from .flash import (  # noqa: E402
    _bwd_backward,  # the backward op's own backward raises (no double backward): shared
    _bwd_setup_context,
    _autocast,
    attention_c,
    _op_args,
    _op_variant,
    user_lse,
)
from .launch import Variant, _backward_c, _forward_c  # noqa: E402
from .masks import check_alibi, check_once, check_variant  # noqa: E402
from ..numpy.reference import check_alignment  # noqa: E402
from ._torch_validate import SUPPORTED_DTYPES  # noqa: E402


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
    check_head_dim(d)


def _check_cu(cu, name: str, max_seqlen, max_name: str, device) -> torch.Tensor:
    """cu_seqlens: a 1-D integer tensor on q's device; max_seqlen an int. Shapes and types only
    (nothing data-dependent: this runs under torch.compile too); :func:`_check_offsets` reads
    the values."""
    if not isinstance(cu, torch.Tensor) or cu.dim() != 1 or cu.numel() < 2:
        raise ValueError(
            f"{name} must be a 1-D integer tensor of B + 1 >= 2 offsets [0, ..., total_tokens]; "
            f"got {cu if not isinstance(cu, torch.Tensor) else tuple(cu.shape)}"
        )
    if cu.dtype not in (torch.int32, torch.int64) or cu.device != device:
        raise TypeError(
            f"{name} must be int32 (or int64) on {device}; got {cu.dtype} on {cu.device}"
        )
    if isinstance(max_seqlen, bool) or not isinstance(max_seqlen, (numbers.Integral, torch.SymInt)):
        raise TypeError(f"{max_name} must be an int; got {type(max_seqlen).__name__}")
    return cu.to(torch.int32).contiguous()


# Reading the offsets is a device-to-host copy, a sync that stalls the host until the GPU is
# idle: on the H200 it cost ~0.28 ms of a 0.91 ms varlen forward at d = 128 (notes/kernel.md).
# Every layer of a model step passes the same cu_seqlens, so they are read once per unchanged
# tensor (masks.check_once).


def _check_offsets(cu, name: str, total: int, max_seqlen: int, max_name: str) -> None:
    """[0, ..., total], non-decreasing, max_seqlen >= every length: else the kernels would read
    out of bounds. One small copy (a device sync on a GPU); inside the op under torch.compile.

    Once per tensor (:func:`.masks.check_once`): a later call with the same tensor, unchanged,
    the same packed length and max_seqlen, is not read again; inference tensors are read every
    call. int32 contiguous offsets (flash-attn's) are the tensor the caller passed; others are
    converted first, so they are read on every call.
    """

    def read():
        offsets = cu.tolist()
        lengths = [b - a for a, b in zip(offsets, offsets[1:], strict=False)]
        if offsets[0] != 0 or offsets[-1] != total or min(lengths) < 0:
            raise ValueError(
                f"{name} must start at 0, never decrease and end at the number of packed "
                f"tokens ({total}); got {offsets if len(offsets) <= 12 else offsets[:6] + ['...']}"
            )
        if max_seqlen < max(lengths):
            raise ValueError(
                f"{max_name} = {max_seqlen} is smaller than the longest sequence in {name} "
                f"({max(lengths)}): the grid would miss its tokens"
            )

    check_once(cu, "_course_kernels_checked_offsets", (total, max_seqlen), read)


def _check_count(cu_q, cu_k) -> None:
    if cu_q.numel() != cu_k.numel():
        raise ValueError(
            f"cu_seqlens_q and cu_seqlens_k must describe the same number of sequences; got "
            f"{cu_q.numel() - 1} and {cu_k.numel() - 1}"
        )


def _varlen_args(q, k, cu_q, cu_k, max_q: int, max_k: int, check: bool = True) -> tuple:
    """The ``varlen`` tuple the launches take: (cu_q, cu_k, max_q, max_k) as int32 offsets and
    ints >= 1; ``check``: the offsets first (the data-dependent checks)."""
    if check:
        _check_offsets(cu_q, "cu_seqlens_q", q.shape[0], max_q, "max_seqlen_q")
        _check_offsets(cu_k, "cu_seqlens_k", k.shape[0], max_k, "max_seqlen_k")
        _check_count(cu_q, cu_k)
    cu_q, cu_k = (cu.to(torch.int32).contiguous() for cu in (cu_q, cu_k))
    return cu_q, cu_k, int(max(max_q, 1)), int(max(max_k, 1))


# ---- the torch.library op: what torch.compile sees -------------------------------------------
# The schema follows flash-attn's ``flash_attn::_flash_attn_varlen_forward`` (flash_attn/
# flash_attn_interface.py) and PyTorch's ``torch_attn::_varlen_attn`` (torch/nn/attention/
# varlen.py): cu_seqlens are int32 *tensors* (data the kernels read on the device), the
# max_seqlens plain ``int``s (they size the grid on the host; a SymInt under dynamic shapes),
# the variant spelled out in scalars. ``bottom_right`` defaults to flash-attn's varlen causal.


@torch.library.custom_op("course_kernels::flash_attn_varlen_fwd", mutates_args=())
def flash_attn_varlen_fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    causal: bool,
    scale: float,
    bottom_right: bool = True,
    window_left: int = -1,
    window_right: int = -1,
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(o, L): the forward kernel on packed q (total_q, Hq, d); L (Hq, total_q) in units of c.
    The offsets are checked here (the caller's checks under torch.compile cannot read them)."""
    varlen = _varlen_args(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    variant = _op_variant(causal, bottom_right, window_left, window_right, softcap)
    return _forward_c(q, k, v, variant, scale, alibi_slopes, varlen)


@flash_attn_varlen_fwd.register_fake
def _flash_attn_varlen_fwd_fake(q, *_args):
    total_q, Hq, _ = q.shape
    return q.new_empty(q.shape), q.new_empty((Hq, total_q), dtype=torch.float32)


@torch.library.custom_op("course_kernels::flash_attn_varlen_bwd", mutates_args=())
def flash_attn_varlen_bwd(
    do: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    o: torch.Tensor,
    lse: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    causal: bool,
    scale: float,
    bottom_right: bool = True,
    window_left: int = -1,
    window_right: int = -1,
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv): the backward kernels on the forward op's (o, L) and its checked offsets."""
    varlen = _varlen_args(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, False)
    variant = _op_variant(causal, bottom_right, window_left, window_right, softcap)
    return _backward_c(do, q, k, v, o, lse, variant, scale, alibi_slopes, varlen)


@flash_attn_varlen_bwd.register_fake
def _flash_attn_varlen_bwd_fake(do, q, k, v, *_args):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _fwd_setup_context(ctx, inputs, output):
    q, k, v, cu_q, cu_k, max_q, max_k, *variant_args = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse, cu_q, cu_k)
    ctx.max_seqlens, ctx.variant_args = (max_q, max_k), variant_args
    ctx.mark_non_differentiable(lse)


def _fwd_backward(ctx, do, _dlse):
    q, k, v, o, lse, cu_q, cu_k = ctx.saved_tensors
    dq, dk, dv = torch.ops.course_kernels.flash_attn_varlen_bwd(
        do, q, k, v, o, lse, cu_q, cu_k, *ctx.max_seqlens, *ctx.variant_args
    )
    # no gradient for cu_seqlens, max_seqlens and the variant's scalars
    return dq, dk, dv, None, None, None, None, *([None] * len(ctx.variant_args))


flash_attn_varlen_fwd.register_autograd(_fwd_backward, setup_context=_fwd_setup_context)
flash_attn_varlen_bwd.register_autograd(_bwd_backward, setup_context=_bwd_setup_context)
for _dev, _dt in (("cuda", torch.float16), ("cpu", torch.bfloat16)):  # as the dense op
    torch.library.register_autocast("course_kernels::flash_attn_varlen_fwd", _dev, _dt)


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
    softmax_scale=None,
    dropout_p=0.0,
    deterministic=False,
    return_attn_probs=False,
    enable_gqa=None,
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
        softmax_scale, dropout_p, deterministic, return_attn_probs: flash-attn's keywords, so
            its call sites run unchanged: ``softmax_scale`` is ``scale`` (one of the two);
            ``dropout_p`` must be 0; ``deterministic=True`` needs
            ``torch.use_deterministic_algorithms(True)``, which the kernels follow;
            ``return_attn_probs`` must be False. ``enable_gqa``: PyTorch's ``varlen_attn``'s
            (False: Hq must equal kv_heads; None, True: GQA).

    Inside ``torch.autocast`` q, k, v are first cast to its dtype (as SDPA's are).
    ``torch.compile(fullgraph=True)`` traces it without a graph break, through the op
    ``torch.ops.course_kernels.flash_attn_varlen_fwd`` (which checks the offsets itself).

    Returns:
        out: (total_q, Hq, d), differentiable w.r.t. q, k, v; with ``return_lse`` also lse
        (Hq, total_q) float32, natural log, -inf for a row that sees no key.
    """
    _check_packed(q, k, v)
    q, k, v = _autocast(q, k, v)
    dev = q.device
    cu_q = _check_cu(cu_seqlens_q, "cu_seqlens_q", max_seqlen_q, "max_seqlen_q", dev)
    cu_k = _check_cu(cu_seqlens_k, "cu_seqlens_k", max_seqlen_k, "max_seqlen_k", dev)
    cu_k = cu_q if cu_seqlens_k is cu_seqlens_q else cu_k  # one tensor: the Gluon documents path
    compiling = torch.compiler.is_compiling()
    if compiling:  # the op checks the offsets (data) itself
        _check_count(cu_q, cu_k)
    else:
        varlen = _varlen_args(q, k, cu_q, cu_k, max_seqlen_q, max_seqlen_k)
    if not isinstance(causal, bool) or not isinstance(return_lse, bool):
        raise TypeError(
            f"causal and return_lse must be bools; got {type(causal).__name__} and "
            f"{type(return_lse).__name__} (the eighth positional argument here is causal, "
            f"flash-attn's is dropout_p: pass flash-attn's arguments by keyword)"
        )
    sdpa_keywords(q, k, causal, None, 0.0, enable_gqa)
    scale = flash_attn_keywords(scale, softmax_scale, dropout_p, deterministic, return_attn_probs)
    check_alignment(causal_alignment)
    scale = check_scale(scale, q.shape[2])
    variant: Variant = check_variant(causal, causal_alignment, window_size, softcap, None, 0, 0)
    batch = cu_q.numel() - 1
    alibi = check_alibi(alibi_slopes, q, batch=batch, heads=q.shape[1])
    if compiling:  # the op: one node in the graph
        o, lse_c = torch.ops.course_kernels.flash_attn_varlen_fwd(
            q, k, v, cu_q, cu_k, max_seqlen_q, max_seqlen_k, *_op_args(variant, scale), alibi
        )
        return (o, user_lse(lse_c, variant, scale)) if return_lse else o
    return attention_c(q, k, v, variant, scale, return_lse, alibi, varlen)
