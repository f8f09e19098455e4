"""Checks for the attention variants of ``flash_attention`` and ``flash_attention_varlen``:
causal alignment, SDPA's causal bias objects, sliding window, soft cap, ALiBi slopes.

Chapter: "Flash Attention in Triton" (masks and variants). The same bad value raises the same
error type as in the NumPy reference (:mod:`course_kernels.numpy.reference`), whose checks these
reuse: ``TypeError`` for a wrong kind of object, ``ValueError`` for a wrong value.
"""

from __future__ import annotations

from . import _env as _triton_env  # noqa: F401  (first: GPU or interpreter)

import torch  # noqa: E402

from ..numpy.reference import check_alignment, check_softcap, check_window  # noqa: E402
from .launch import Variant  # noqa: E402


def _causal_bias_types():
    """SDPA's causal bias class and its variant enum (torch >= 2.2), or (None, None)."""
    try:
        from torch.nn.attention.bias import CausalBias, CausalVariant
    except ImportError:  # pragma: no cover (older torch)
        return None, None
    return CausalBias, CausalVariant


def bias_alignment(attn_mask, n_q: int, n_k: int) -> str:
    """The alignment of SDPA's ``causal_upper_left`` / ``causal_lower_right`` bias object."""
    CausalBias, CausalVariant = _causal_bias_types()
    if CausalBias is None or not isinstance(attn_mask, CausalBias):
        raise TypeError(
            "attn_mask must be None or one of SDPA's causal bias objects "
            "(torch.nn.attention.bias.causal_upper_left(Nq, Nk) or causal_lower_right(Nq, Nk)); "
            f"got {type(attn_mask).__name__}. Tensor masks are not supported: use "
            "window_size / causal here, or FlexAttention / SDPA for arbitrary masks."
        )
    if (attn_mask.seq_len_q, attn_mask.seq_len_kv) != (n_q, n_k):
        raise ValueError(
            f"attn_mask was built for (Nq, Nk) = ({attn_mask.seq_len_q}, "
            f"{attn_mask.seq_len_kv}) but q, k have Nq = {n_q}, Nk = {n_k}"
        )
    return "top_left" if attn_mask.variant == CausalVariant.UPPER_LEFT else "bottom_right"


def check_variant(
    causal, causal_alignment, window_size, softcap, attn_mask, n_q: int, n_k: int
) -> Variant:
    """Validate the variant arguments of ``flash_attention``; return the :class:`Variant`."""
    alignment = check_alignment(causal_alignment)
    if attn_mask is not None:
        if causal:
            raise ValueError(
                "pass either causal=True or attn_mask (a causal bias object), not both "
                "(as in scaled_dot_product_attention)"
            )
        bias_align = bias_alignment(attn_mask, n_q, n_k)
        if alignment == "bottom_right" and bias_align == "top_left":
            raise ValueError(
                "causal_alignment='bottom_right' contradicts attn_mask=causal_upper_left(...); "
                "pass one of them"
            )
        causal, alignment = True, bias_align
    return Variant(
        causal=causal,
        bottom_right=alignment == "bottom_right",
        window=check_window(window_size),
        softcap=check_softcap(softcap),
    )


def check_alibi(alibi_slopes, q: torch.Tensor, batch: int | None = None, heads: int | None = None):
    """``None``, or slopes (H,) or (B, H) -> a float32 (1 or B, H) tensor on q's device.

    Dense q is (B, H, Nq, d); for packed varlen q pass ``batch`` (sequences) and ``heads``.
    """
    if alibi_slopes is None:
        return None
    B = q.shape[0] if batch is None else batch
    H = q.shape[1] if heads is None else heads
    if not isinstance(alibi_slopes, torch.Tensor):
        raise TypeError(
            f"alibi_slopes must be None or a tensor of shape ({H},) or ({B}, {H}); got "
            f"{type(alibi_slopes).__name__}"
        )
    if not alibi_slopes.is_floating_point():
        raise TypeError(f"alibi_slopes must be a floating tensor; got {alibi_slopes.dtype}")
    if tuple(alibi_slopes.shape) not in ((H,), (B, H)):
        raise ValueError(
            f"alibi_slopes must have shape (H,) = ({H},) or (B, H) = ({B}, {H}) (one slope per "
            f"query head, optionally per batch entry); got {tuple(alibi_slopes.shape)}"
        )
    if alibi_slopes.device != q.device:
        raise ValueError(
            f"alibi_slopes must be on q's device {q.device}; got {alibi_slopes.device}"
        )
    # (a data-dependent check: skipped under torch.compile, where it would break the graph)
    if not torch.compiler.is_compiling() and not torch.isfinite(alibi_slopes).all():
        raise ValueError("alibi_slopes must be finite")
    return alibi_slopes.detach().to(torch.float32).reshape(-1, H)
