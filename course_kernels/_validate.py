"""Input checks shared by every NumPy entry point.

Each check raises ``ValueError`` (or ``TypeError`` for a wrong kind of object) whose message
names the argument, says what was given and what is accepted. Kernels never see bad input.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

FLOAT_DTYPES = (np.float16, np.float32, np.float64)


def as_float_array(x, name: str) -> np.ndarray:
    """Return ``x`` as a NumPy floating array of rank >= 2, or raise a clear error."""
    if isinstance(x, np.ndarray):
        arr = x
    elif hasattr(x, "__array__") or isinstance(x, (list, tuple)):
        arr = np.asarray(x)
    else:
        raise TypeError(f"{name} must be an array of shape (..., N, d); got {type(x).__name__}")
    if arr.dtype.type not in FLOAT_DTYPES:
        raise TypeError(
            f"{name} must have a floating dtype (float16, float32 or float64); got {arr.dtype}"
        )
    if arr.ndim < 2:
        raise ValueError(
            f"{name} must have rank >= 2 with layout (..., N, d) such as (batch, heads, seq, dim); "
            f"got shape {arr.shape}"
        )
    if 0 in arr.shape:
        raise ValueError(f"{name} must not be empty; got shape {arr.shape}")
    return arr


def check_qkv(q, k, v):
    """Validate q (..., Nq, d), k (..., Nk, d), v (..., Nk, dv); return them as arrays."""
    q = as_float_array(q, "q")
    k = as_float_array(k, "k")
    v = as_float_array(v, "v")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(
            f"q, k and v must share one dtype; got q {q.dtype}, k {k.dtype}, v {v.dtype}"
        )
    if not (q.ndim == k.ndim == v.ndim):
        raise ValueError(
            f"q, k and v must have the same rank; got shapes {q.shape}, {k.shape}, {v.shape}"
        )
    if q.shape[:-2] != k.shape[:-2] or k.shape[:-2] != v.shape[:-2]:
        raise ValueError(
            "q, k and v must share their leading (batch, heads) dims; "
            f"got {q.shape[:-2]}, {k.shape[:-2]}, {v.shape[:-2]}"
        )
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"q and k must have the same head dim d (last axis); got {q.shape[-1]} and {k.shape[-1]}"
        )
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(
            "k and v must have the same sequence length Nk (axis -2); "
            f"got {k.shape[-2]} and {v.shape[-2]}"
        )
    return q, k, v


def resolve_scale(scale, head_dim: int) -> float:
    """``None`` -> 1/sqrt(d); otherwise a finite real number."""
    if scale is None:
        return 1.0 / math.sqrt(head_dim)
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise TypeError(f"scale must be a finite real number or None; got {scale!r}")
    scale = float(scale)
    if not math.isfinite(scale):
        raise ValueError(f"scale must be finite (or None for 1/sqrt(d)); got {scale}")
    return scale


def check_positive_int(value, name: str, accepted: str = ">= 1") -> int:
    """An integer >= 1 (bools refused)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer {accepted}; got {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be an integer {accepted}; got {value}")
    return int(value)


def check_bool(value, name: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False; got {value!r}")
    return bool(value)


def accumulator_dtype(dtype) -> np.dtype:
    """Working precision of the tiled algorithms: fp16 in -> fp32 accumulate; else the input's."""
    return np.dtype(np.float32) if np.dtype(dtype) == np.float16 else np.dtype(dtype)
