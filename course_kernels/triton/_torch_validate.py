"""Input checks shared by every public torch function: ``flash_attention``, ``flash_decode`` and
``distributed.ring_attention`` (which checks its shards with ``flash_attention``'s rules).

The same bad value raises the same exception type everywhere: ``TypeError`` for a wrong kind
of object (not a tensor, a dtype the kernels do not take, ``causal`` not a bool, ``scale`` not a
real number), ``ValueError`` for a wrong value of the right kind (rank, empty, device, shapes,
``scale`` NaN or infinite). The private kernels' wrappers trust what these checks let through.
"""

from __future__ import annotations

from . import _env as _triton_env  # first: decides GPU vs interpreter before torch and Triton load
from .._validate import resolve_scale

import torch  # noqa: E402

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


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


def check_causal(causal) -> bool:
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool; got {type(causal).__name__}")
    return causal


def check_scale(scale, head_dim: int) -> float:
    """``None`` -> 1/sqrt(d); a real number must be finite (NaN, inf: ValueError)."""
    return resolve_scale(scale, head_dim)
