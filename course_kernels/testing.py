"""The accuracy rule used by every test, exercise check and grader in the course.

FlashAttention's own test rule (flash-attention ``tests/test_flash_attn.py``): compared with a
float64/fp32 reference, a fast kernel's error may be at most ``factor`` times the error of a naive
implementation computed in the same dtype (2x for outputs, 3x for gradients). It avoids magic
per-case tolerances: the budget scales with what the dtype can do.
"""

from __future__ import annotations

import numpy as np


def max_abs_error(x, ref) -> float:
    """max |x - ref| in float64; NaN anywhere gives +inf (NaN never passes)."""
    x = np.asarray(x, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if x.shape != ref.shape:
        raise ValueError(f"shape mismatch: got {x.shape}, expected {ref.shape}")
    if not np.all(np.isfinite(x) | (np.isneginf(x) & np.isneginf(ref))):
        return float("inf")
    diff = np.where(np.isneginf(x) & np.isneginf(ref), 0.0, np.abs(x - ref))
    return float(diff.max(initial=0.0))


def error_budget(naive, ref, factor: float = 2.0, floor: float | None = None) -> float:
    """``factor`` x the naive implementation's error, never below a few ulps of ``ref``."""
    naive_err = max_abs_error(naive, ref)
    if floor is None:
        floor = 8 * np.finfo(np.asarray(naive).dtype).eps * max(1.0, float(np.abs(ref).max()))
    return float(max(factor * naive_err, floor))  # a Python float: it goes into JSON records


def assert_close_to_reference(x, ref, naive, factor: float = 2.0, what: str = "output") -> None:
    """Raise AssertionError unless ``x`` is within ``factor`` x the naive error of ``ref``."""
    err = max_abs_error(x, ref)
    budget = error_budget(naive, ref, factor)
    if not err <= budget:
        raise AssertionError(
            f"{what}: max abs error {err:.3e} exceeds {factor}x the naive same-dtype error "
            f"(budget {budget:.3e})"
        )


def attention_grads(q, k, v, do, causal: bool, scale: float, f64: bool = True):
    """dq, dk, dv of attention by torch autograd: float64 math (an explicit top-left causal mask
    and softmax) when ``f64``, else PyTorch's SDPA in the inputs' own dtype (the "naive" side of
    the rule above on a GPU). q: (B, H, N, d), k and v with the same heads."""
    import torch
    import torch.nn.functional as F

    if f64 and q.dim() == 4 and q.shape[0] > 1:
        # Heads are independent: one batch element at a time keeps the float64 score matrices
        # of a large case (B = 4, H = 16, N = 4K: three of 8.6 GB each) a quarter as big.
        parts = [
            attention_grads(*(x[b : b + 1] for x in (q, k, v, do)), causal, scale)
            for b in range(q.shape[0])
        ]
        return tuple(torch.cat(g, 0) for g in zip(*parts, strict=True))
    xs = [x.detach().to(torch.float64 if f64 else x.dtype).requires_grad_() for x in (q, k, v)]
    if f64:
        s = xs[0] @ xs[1].transpose(-1, -2) * scale
        if causal:
            n_q, n_k = s.shape[-2:]
            keep = torch.ones(n_q, n_k, dtype=torch.bool, device=q.device).tril()
            s = s.masked_fill(~keep, float("-inf"))
        o = torch.softmax(s, -1) @ xs[2]
    else:
        o = F.scaled_dot_product_attention(*xs, is_causal=causal, scale=scale)
    return torch.autograd.grad(o, xs, do.to(o.dtype))
