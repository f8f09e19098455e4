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
