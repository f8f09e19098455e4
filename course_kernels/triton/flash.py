"""``flash_attention``: the Triton kernels behind a drop-in for PyTorch's SDPA, differentiable.

Chapter: "Flash Attention in Triton" (forward, backward, the autograd wrapper).

    flash_attention -> _FlashAttention (torch.autograd.Function) -> _forward / _backward
                    -> triton_forward._attn_fwd, triton_backward._attn_bwd_dq / _attn_bwd_dkdv kernels

Semantics are those of ``torch.nn.functional.scaled_dot_product_attention(q, k, v,
is_causal=causal, scale=scale, enable_gqa=True)``. The forward saves q, k, v (the inputs), O and
the logsumexp: nothing N x N. The backward recomputes P the FlashAttention-2 way, deterministic
(no atomics) but for the Gluon backward ``launch._use_gluon`` picks on Hopper at d = 64 and 128
(dQ sums in no fixed order; never under ``torch.use_deterministic_algorithms(True)``).

Where it runs (``_triton_env``): a CUDA GPU, or, without one, Triton's CPU interpreter (CPU
tensors; slow; for tests and laptops). On GPUs below sm_80 (Colab's T4, sm_75) Triton >= 3.3
runs ``tl.dot`` on FMA units rather than tensor cores (triton-lang/triton#5066): correct, not
fast; there is no bf16 there.

A PyTorch op (``torch.library``): ``torch.ops.course_kernels.flash_attn_fwd`` and
``flash_attn_bwd`` wrap ``_forward`` / ``_backward`` with fake (meta) implementations for
shapes, an autograd formula and autocast rules, so ``torch.compile`` traces a model that calls
``flash_attention`` without a graph break (the op is opaque to the compiler: the Triton kernels
run as they do eagerly). In eager mode ``flash_attention`` takes a shorter path to the same
``_forward`` / ``_backward`` (a plain ``autograd.Function``, or ``_forward`` alone when autograd
records nothing: :func:`attention_c`): the dispatcher's Python op call costs ~20 us per call,
which matters at N = 1K (notes/kernel.md items 14, 17). Under ``torch.autocast`` the inputs are
cast to the autocast dtype first, as SDPA's are. Double backward raises.

The launches live in :mod:`.launch`; this module validates, differentiates and registers the op.
"""

from __future__ import annotations

from ._env import require_triton  # first: GPU or interpreter

require_triton()

import torch  # noqa: E402
import torch.autograd.forward_ad as _forward_ad  # noqa: E402

from ._torch_validate import VALID, check_causal, check_scale, check_shapes  # noqa: E402
from ._torch_validate import check_tensors, sdpa_keywords  # noqa: E402
from ._torch_validate import remember_valid, tensor_signature  # noqa: E402
from .masks import check_alibi, check_variant  # noqa: E402
from ..numpy.reference import LN2  # noqa: E402
from .launch import (  # noqa: E402  (re-exported: ring attention, benchmarks, tests)
    _TUNED as _TUNED,
    _backward as _backward,
    _backward_one_key as _backward_one_key,
    _cdiv as _cdiv,
    _backward_c,
    _forward as _forward,
    _forward_c,
    _launch as _launch,
    Variant,
    head_dim_padded as head_dim_padded,
    lse_to_base2,
)


def _check_inputs(q, k, v, causal, scale) -> float:
    """Validate the arguments; return the scale. Raises TypeError / ValueError, never crashes."""
    sig = tensor_signature(q, k, v)
    if sig is None or sig not in VALID:  # memoised: metadata-only checks (_torch_validate)
        check_tensors(q, k, v)
        check_shapes(q, k, v)
        remember_valid(sig)
    check_causal(causal)
    return check_scale(scale, q.shape[3])


DOUBLE_BACKWARD_MESSAGE = (
    "flash_attention does not support double backward (a gradient of its gradients, e.g. "
    "torch.autograd.grad(..., create_graph=True) followed by another backward): its backward "
    "kernels are not differentiable. Use torch.nn.functional.scaled_dot_product_attention's math "
    "backend for higher-order gradients."
)


class _NoDoubleBackward(torch.autograd.Function):
    """Identity on (dq, dk, dv) whose own backward raises: recorded only under create_graph.

    q, k, v, dO come in too so that the gradients depend on them in the graph, as they do in
    the mathematics (a second backward reaches this node and fails clearly).
    """

    @staticmethod
    def forward(ctx, dq, dk, dv, *_inputs):
        return dq, dk, dv

    @staticmethod
    def backward(ctx, *_grads):
        raise RuntimeError(DOUBLE_BACKWARD_MESSAGE)


class _FlashAttention(torch.autograd.Function):
    """Saves q, k, v, O and the row statistic (B, Hq, Nq), or (Hq, total_q) for packed
    ``varlen`` batches (the logsumexp in units of c, masks.py); nothing N x N. The eager path of
    :func:`flash_attention` and of ``flash_attention_varlen`` (fewer Python layers than the ops
    below). ``alibi`` (slopes) is a constant: it gets no gradient. ``varlen``: None (dense) or
    the checked (cu_q, cu_k, max_q, max_k) of ``launch._forward_c``.
    """

    @staticmethod
    def forward(ctx, q, k, v, variant, scale, return_lse, alibi, varlen=None):
        o, lse_c = _forward_c(q, k, v, variant, scale, alibi, varlen)
        ctx.save_for_backward(q, k, v, o, lse_c)
        ctx.variant, ctx.scale, ctx.alibi, ctx.varlen = variant, scale, alibi, varlen
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
        if torch.is_grad_enabled():  # create_graph=True: make a second backward fail clearly
            dq, dk, dv = _NoDoubleBackward.apply(dq, dk, dv, q, k, v, do)
        return dq, dk, dv, None, None, None, None, None


def attention_c(q, k, v, variant: Variant, scale: float, return_lse: bool, alibi, varlen=None):
    """O (and the user's lse) on checked inputs: through :class:`_FlashAttention` when autograd
    records a node, else ``_forward_c`` alone (no_grad, inference_mode, inputs that do not
    require grad: the serving case; the same tensors, no ``grad_fn``). Under a functorch
    transform or a forward-AD level ``_FlashAttention.apply`` decides (it raises)."""
    if not torch._C._are_functorch_transforms_active():
        if _forward_ad_off() and not (
            torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
        ):
            o, lse_c = _forward_c(q, k, v, variant, scale, alibi, varlen)
            return (o, user_lse(lse_c, variant, scale)) if return_lse else o
        if _APPLY is not None:  # what Function.apply does here, minus its Python (~5 us)
            q, k, v = _unwrap_if_dead(q), _unwrap_if_dead(k), _unwrap_if_dead(v)
            alibi = alibi if alibi is None else _unwrap_if_dead(alibi)
            return _APPLY(q, k, v, variant, scale, return_lse, alibi, varlen)
    return _FlashAttention.apply(q, k, v, variant, scale, return_lse, alibi, varlen)


def _forward_ad_off() -> bool:
    """No forward-AD (dual tensor) level is open, so no input carries a tangent."""
    return getattr(_forward_ad, "_current_level", 0) < 0


# Function.apply without setup_context, outside functorch: unwrap dead wrappers, call the C++
# apply. _APPLY does that only where the installed torch's source still reads so (else None).
APPLY_SOURCE = (
    "_is_setup_context_defined(cls.setup_context)",
    "if not torch._C._are_functorch_transforms_active():",
    "args = _functorch.utils.unwrap_dead_wrappers(args)",
    "return super().apply(*args, **kwargs)",
)
_unwrap_if_dead = getattr(getattr(torch._C, "_functorch", None), "unwrap_if_dead", None)


def _direct_apply():
    import inspect

    try:
        src = inspect.getsource(torch.autograd.Function.apply)
    except (OSError, TypeError):  # no source (a frozen or stripped install)
        return None
    if _unwrap_if_dead is None or not all(piece in src for piece in APPLY_SOURCE):
        return None
    return super(torch.autograd.Function, _FlashAttention).apply


_APPLY = _direct_apply()


def user_lse(lse_c, variant: Variant, scale: float):
    """The kernels' statistic -> the natural-log logsumexp (-inf for a row that sees no key)."""
    return lse_to_base2(lse_c, variant, scale) * LN2


# ---- the torch.library op: what torch.compile sees -------------------------------------------


def _op_variant(causal, bottom_right, window_left, window_right, softcap) -> Variant:
    return Variant(causal, bottom_right, (window_left, window_right), softcap)


@torch.library.custom_op("course_kernels::flash_attn_fwd", mutates_args=())
def flash_attn_fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool,
    scale: float,
    bottom_right: bool = False,
    window_left: int = -1,
    window_right: int = -1,
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(o, L) = the forward kernel on checked inputs; L is the row statistic in units of c."""
    variant = _op_variant(causal, bottom_right, window_left, window_right, softcap)
    return _forward_c(q, k, v, variant, scale, alibi_slopes)


@flash_attn_fwd.register_fake
def _flash_attn_fwd_fake(q, k, v, causal, scale, *_variant_args):
    B, Hq, Nq, _ = q.shape
    return q.new_empty(q.shape), q.new_empty((B, Hq, Nq), dtype=torch.float32)


@torch.library.custom_op("course_kernels::flash_attn_bwd", mutates_args=())
def flash_attn_bwd(
    do: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    o: torch.Tensor,
    lse: torch.Tensor,
    causal: bool,
    scale: float,
    bottom_right: bool = False,
    window_left: int = -1,
    window_right: int = -1,
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) = the backward kernels (``_backward_c``) on the forward op's (o, L)."""
    variant = _op_variant(causal, bottom_right, window_left, window_right, softcap)
    return _backward_c(do, q, k, v, o, lse, variant, scale, alibi_slopes)


@flash_attn_bwd.register_fake
def _flash_attn_bwd_fake(do, q, k, v, o, lse, causal, scale, *_variant_args):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _fwd_setup_context(ctx, inputs, output):
    q, k, v, *variant_args = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse)
    ctx.variant_args = variant_args
    ctx.mark_non_differentiable(lse)


def _fwd_backward(ctx, do, _dlse):
    q, k, v, o, lse = ctx.saved_tensors
    dq, dk, dv = torch.ops.course_kernels.flash_attn_bwd(do, q, k, v, o, lse, *ctx.variant_args)
    return dq, dk, dv, *([None] * len(ctx.variant_args))


def _bwd_setup_context(ctx, inputs, output):
    pass


def _bwd_backward(ctx, *_grads):
    raise RuntimeError(DOUBLE_BACKWARD_MESSAGE)


flash_attn_fwd.register_autograd(_fwd_backward, setup_context=_fwd_setup_context)
flash_attn_bwd.register_autograd(_bwd_backward, setup_context=_bwd_setup_context)
for _dev, _dt in (("cuda", torch.float16), ("cpu", torch.bfloat16)):
    # Direct callers of the op under torch.autocast get SDPA's behaviour: inputs cast to the
    # autocast dtype (flash_attention casts to the context's own dtype before calling it).
    torch.library.register_autocast("course_kernels::flash_attn_fwd", _dev, _dt)


_ANY_AUTOCAST = getattr(torch._C, "_is_any_autocast_enabled", None)  # any device type's


def _autocast(q, k, v):
    """Inside ``torch.autocast``: cast q, k, v to its dtype, as SDPA does; else unchanged."""
    if _ANY_AUTOCAST is not None and not _ANY_AUTOCAST():  # the usual call: ~1 us less
        return q, k, v
    dev = q.device.type
    if dev not in ("cuda", "cpu") or not torch.is_autocast_enabled(dev):
        return q, k, v
    dt = torch.get_autocast_dtype(dev)
    return tuple(x.to(dt) if x.is_floating_point() and x.dtype != dt else x for x in (q, k, v))


def flash_attention(
    q,
    k,
    v,
    causal: bool = False,
    scale: float | None = None,
    return_lse: bool = False,
    *,
    attn_mask=None,
    causal_alignment: str = "top_left",
    window_size=None,
    softcap=None,
    alibi_slopes=None,
    is_causal=None,
    dropout_p=0.0,
    enable_gqa=None,
):
    """Exact attention, O = softmax(scale * Q K^T [+ mask, soft cap, ALiBi]) V, in Triton.

    The same function as ``torch.nn.functional.scaled_dot_product_attention(q, k, v,
    is_causal=causal, scale=scale, enable_gqa=True)``, computed FlashAttention-2 style, plus
    flash-attn's variants.

    Args:
        q: (B, Hq, Nq, d) queries, layout (batch, heads, seq, head_dim).
        k: (B, kv_heads, Nk, d) keys. Hq must be a multiple of kv_heads (GQA; kv_heads = 1 is MQA);
            Nk may differ from Nq. Any N >= 1.
        v: (B, kv_heads, Nk, d) values.
        causal: query i sees keys j <= i (PyTorch ``is_causal``, top-left aligned, also when
            Nq != Nk). For Nq = 3, Nk = 4::

                1 0 0 0
                1 1 0 0
                1 1 1 0

            With ``causal_alignment="bottom_right"`` query i sees keys j <= i + Nk - Nq
            (flash-attn's causal; chunked prefill over a KV cache)::

                1 1 0 0
                1 1 1 0
                1 1 1 1

        scale: multiplies Q K^T; ``None`` means 1 / sqrt(d).
        return_lse: also return the logsumexp.
        attn_mask: ``None`` or one of SDPA's causal bias objects,
            ``torch.nn.attention.bias.causal_upper_left(Nq, Nk)`` (= ``causal=True``) or
            ``causal_lower_right(Nq, Nk)`` (= bottom-right causal), so code written for SDPA
            runs unchanged. Tensor masks are not supported (FlexAttention or SDPA take them).
        causal_alignment: ``"top_left"`` or ``"bottom_right"``: where the diagonal of ``causal``
            and of ``window_size`` sits.
        window_size: ``(left, right)``, flash-attn's sliding window: query i sees keys
            i + off - left <= j <= i + off + right (off = 0 top-left, Nk - Nq bottom-right);
            -1 is unbounded; with ``causal`` the right side is 0. Key blocks outside every
            row's window are skipped: the cost is O(window), not O(N).
        softcap: ``None``/0 (off) or > 0: scores become softcap * tanh(score / softcap)
            (Gemma 2's logit soft-capping), forward and backward.
        alibi_slopes: ``None`` or a (Hq,) or (B, Hq) tensor: adds -slope * |i + Nk - Nq - j| to
            the scores (flash-attn's ALiBi). No gradient flows to the slopes.
        is_causal, dropout_p, enable_gqa: SDPA's keywords, so its call sites run unchanged:
            ``is_causal`` is ``causal`` (one of the two); ``dropout_p`` must be 0 (no dropout);
            ``enable_gqa=False`` requires Hq = kv_heads as SDPA does (None, True: GQA).

    The variants are score and mask hooks inside the kernels (``course_kernels.triton.masks``),
    FlexAttention's idea in Triton functions. Dtypes: float16, bfloat16 (sm_80+), float32 (IEEE
    fp32 products, not TF32). Head dim: any multiple of 8 up to 256. Non-contiguous inputs are
    made contiguous. On CPU (Triton's interpreter) bf16 is computed in fp32 and rounded, because
    bf16 ``tl.dot`` is wrong there (triton-lang/triton#11584). Inside ``torch.autocast`` q, k, v
    are first cast to the autocast dtype (as SDPA's are). ``torch.compile`` traces it without a
    graph break (through the op ``torch.ops.course_kernels.flash_attn_fwd``). Double backward
    is not supported (raises). A row that sees no key (e.g. bottom-right with Nq > Nk) gives
    output 0, zero gradients and lse = -inf.

    Returns:
        out: (B, Hq, Nq, d), q's dtype. Differentiable with respect to q, k, v.
        lse: only if ``return_lse``: (B, Hq, Nq) float32, the natural-log logsumexp of each row
            of scaled, masked scores (not differentiable).
    """
    if isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor):
        q, k, v = _autocast(q, k, v)
    causal = sdpa_keywords(q, k, causal, is_causal, dropout_p, enable_gqa)
    scale = _check_inputs(q, k, v, causal, scale)
    if not isinstance(return_lse, bool):
        raise TypeError(f"return_lse must be a bool; got {type(return_lse).__name__}")
    variant = check_variant(
        causal, causal_alignment, window_size, softcap, attn_mask, q.shape[2], k.shape[2]
    )
    alibi = check_alibi(alibi_slopes, q)
    if torch.compiler.is_compiling():
        o, lse_c = torch.ops.course_kernels.flash_attn_fwd(
            q, k, v, *_op_args(variant, scale), alibi
        )
        return (o, user_lse(lse_c, variant, scale)) if return_lse else o
    return attention_c(q, k, v, variant, scale, return_lse, alibi)


def _op_args(variant: Variant, scale: float) -> tuple:
    return (variant.causal, scale, variant.bottom_right, *variant.window, variant.softcap)
