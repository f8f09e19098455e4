"""Input checks shared by every public torch function: ``flash_attention``, ``flash_decode`` and
``distributed.ring_attention`` (which checks its shards with ``flash_attention``'s rules).

The same bad value raises the same exception type everywhere: ``TypeError`` for a wrong kind
of object (not a tensor, a dtype the kernels do not take, ``causal`` not a bool, ``scale`` not a
real number), ``ValueError`` for a wrong value of the right kind (rank, empty, device, shapes,
``scale`` NaN or infinite). The private kernels' wrappers trust what these checks let through.
SDPA's keywords (``is_causal``, ``dropout_p``, ``enable_gqa``) and flash-attn's
(``softmax_scale``, ``dropout_p``, ``deterministic``, ``return_attn_probs``) are resolved here,
so a call written for either runs as written or is refused with the reason.
"""

from __future__ import annotations

from . import _env as _triton_env  # first: decides GPU vs interpreter before torch and Triton load
from ._env import INTERPRET, capability
from .._validate import resolve_scale

import torch  # noqa: E402

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_HEAD_DIM = 256


def check_tensors(q, k, v) -> None:
    """q, k, v: non-empty rank-4 tensors of one supported dtype, on the kernels' device."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(
                f"{name} must be a torch.Tensor of shape (B, H, N, d); got {type(x).__name__}"
            )
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.dim() != 4:
            raise ValueError(
                f"{name} must have rank 4, layout (batch, heads, seq, head_dim); got "
                f"shape {tuple(x.shape)}"
            )
        if x.numel() == 0:
            raise ValueError(f"{name} must not be empty; got shape {tuple(x.shape)}")
        if x.dtype not in SUPPORTED_DTYPES:
            raise TypeError(f"{name} must be float16, bfloat16 or float32; got {x.dtype}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k and v must share one dtype; got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(
            f"q, k and v must be on one device; got {q.device}, {k.device}, {v.device}"
        )
    want = _triton_env.device_kind()
    if q.device.type != want:
        where = (
            "no CUDA GPU was found, so kernels run in Triton's CPU interpreter"
            if want == "cpu"
            else "Triton compiles these kernels for the CUDA GPU"
        )
        raise ValueError(f"tensors must be on a {want} device here ({where}); got {q.device}")


def check_shapes(q, k, v) -> None:
    """k, v of one shape; batch and head dim shared with q; GQA head counts; supported d."""
    B, Hq, Nq, d = q.shape
    if k.shape != v.shape:
        raise ValueError(
            f"k and v must have the same shape (B, kv_heads, Nk, d); got "
            f"{tuple(k.shape)} and {tuple(v.shape)}"
        )
    if k.shape[0] != B:
        raise ValueError(f"q, k, v must share the batch size; got q {B} and k/v {k.shape[0]}")
    if k.shape[3] != d:
        raise ValueError(f"q, k, v must share the head dim; got q {d} and k/v {k.shape[3]}")
    kv_heads = k.shape[1]
    if Hq % kv_heads != 0:
        raise ValueError(
            f"the number of query heads must be a multiple of the number of key/value "
            f"heads (GQA/MQA); got Hq={Hq}, kv_heads={kv_heads}"
        )
    check_head_dim(d)
    if q.dtype == torch.bfloat16 and not INTERPRET:
        cap = capability()
        if cap is not None and cap < (8, 0):
            raise ValueError(
                f"bfloat16 needs a GPU of compute capability 8.0 or newer; this one "
                f"is sm_{cap[0]}{cap[1]}. Use float16."
            )


def check_head_dim(d: int) -> None:
    if d % 8 != 0 or d > MAX_HEAD_DIM:
        raise ValueError(f"head dim must be a multiple of 8 and at most {MAX_HEAD_DIM}; got {d}")


def check_bool(value, name: str) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool; got {type(value).__name__}")
    return value


def check_causal(causal) -> bool:
    return check_bool(causal, "causal")


def _check_dropout(dropout_p) -> None:
    """dropout_p (SDPA's and flash-attn's keyword): 0 only, the kernels have no dropout."""
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, (int, float)):
        raise TypeError(f"dropout_p must be a number (0.0); got {type(dropout_p).__name__}")
    if dropout_p != 0:
        raise ValueError(
            f"dropout_p must be 0.0: the course kernels have no attention dropout (pass "
            f"dropout_p=0.0, as at inference, or use SDPA where dropout is needed); got {dropout_p}"
        )


def sdpa_keywords(q, k, causal, is_causal, dropout_p, enable_gqa) -> bool:
    """SDPA's own keywords, so its call sites run unchanged; returns ``causal``.

    ``is_causal``: SDPA's name for ``causal`` (give one of them). ``dropout_p``: 0 only.
    ``enable_gqa``: None (the default here) or True, grouped heads when Hq is a multiple of
    kv_heads; False, as in SDPA, Hq must equal kv_heads. q, k: any rank, heads on dim 1
    ((B, H, N, d) or the packed (total, H, d)); checked for that only when ``enable_gqa=False``.
    """
    if not isinstance(causal, bool):
        raise TypeError(
            f"causal must be a bool; got {type(causal).__name__} (the fourth positional argument "
            f"here is causal, SDPA's is attn_mask: pass SDPA's arguments by keyword)"
        )
    _check_dropout(dropout_p)
    if is_causal is not None:
        check_bool(is_causal, "is_causal")
        if causal is not False:
            raise TypeError(
                f"pass causal or SDPA's name for it, is_causal, not both; got causal={causal!r} "
                f"and is_causal={is_causal!r}"
            )
        causal = is_causal
    if enable_gqa is not None:
        check_bool(enable_gqa, "enable_gqa")
        heads = [
            x.shape[1] if isinstance(x, torch.Tensor) and x.dim() > 2 else None for x in (q, k)
        ]
        if not enable_gqa and None not in heads and heads[0] != heads[1]:
            raise ValueError(
                f"enable_gqa=False (SDPA's default) needs as many key/value heads as query heads; "
                f"got Hq={heads[0]}, kv_heads={heads[1]}: pass enable_gqa=True (or leave it out) "
                f"for grouped-query attention"
            )
    return causal


def flash_attn_keywords(scale, softmax_scale, dropout_p, deterministic, return_attn_probs):
    """flash-attn's own keywords of ``flash_attn_varlen_func``; returns ``scale``.

    ``softmax_scale``: flash-attn's name for ``scale`` (give one of them). ``dropout_p``: 0
    only. ``deterministic``: False, or True where ``torch.use_deterministic_algorithms(True)``
    is on (the kernels follow that flag: the one backward that sums dQ in no fixed order, the
    Gluon one on Hopper, is then not used unless ``COURSE_KERNELS_BACKWARD=gluon`` forces it). ``return_attn_probs``: False (nothing N x N is kept;
    ``return_lse=True`` gives the logsumexp).
    """
    _check_dropout(dropout_p)
    if softmax_scale is not None:
        if scale is not None:
            raise TypeError(
                f"pass scale or flash-attn's name for it, softmax_scale, not both; got "
                f"scale={scale!r} and softmax_scale={softmax_scale!r}"
            )
        scale = softmax_scale
    if (
        check_bool(deterministic, "deterministic")
        and not torch.are_deterministic_algorithms_enabled()
    ):
        raise ValueError(
            "deterministic=True: call torch.use_deterministic_algorithms(True) instead (or as well); "
            "the kernels follow it, and their backward is deterministic then"
        )
    if check_bool(return_attn_probs, "return_attn_probs"):
        raise ValueError(
            "return_attn_probs=True: the kernels keep no attention probabilities (nothing N x N); "
            "return_lse=True returns the logsumexp, from which any row of P can be recomputed"
        )
    return scale


def check_scale(scale, head_dim: int) -> float:
    """``None`` -> 1/sqrt(d); a real number must be finite (NaN, inf: ValueError)."""
    return resolve_scale(scale, head_dim)


# Signatures of q, k, v that passed check_tensors and flash._check_shapes (metadata only: they
# read no values): a call with a recorded one skips them, ~3 of the ~45 us of a forward call's
# Python on CPU (notes/kernel.md item 17). Only valid ones are recorded, so bad input raises the
# same error on every call. Plain tensors only: a subclass may answer dim(), dtype... its own way.
VALID: dict = {}
MAX_VALID = 256  # then start over


def tensor_signature(q, k, v):
    """What the checks read (the shape gives dim() and numel()), or None: not memoised."""
    T = torch.Tensor
    if type(q) is not T or type(k) is not T or type(v) is not T:
        return None
    if torch.compiler.is_compiling():  # traced: a guard on the dict would recompile as it grows
        return None
    dt = q.dtype
    # bf16 on a GPU: _check_shapes reads the current GPU's compute capability
    bf16_gpu = dt == torch.bfloat16 and _triton_env.HAS_GPU and not _triton_env.INTERPRET
    gpu = torch.cuda.current_device() if bf16_gpu else None
    return (q.shape, k.shape, v.shape, dt, k.dtype, v.dtype, q.device, k.device, v.device, gpu)


def remember_valid(sig) -> None:
    if sig is not None:
        if len(VALID) >= MAX_VALID:
            VALID.clear()
        VALID[sig] = True
