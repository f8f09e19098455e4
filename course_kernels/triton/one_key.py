"""The backward when there is one key (Nk = 1): a closed form in PyTorch ops instead of the kernels.

Chapter: "Flash Attention in Triton" (backward). Used by ``launch._backward_c``; importable from
:mod:`course_kernels.triton.flash` as ``_backward_one_key``.
"""

from __future__ import annotations

import torch

from .masks import PLAIN, Variant


def _one_key_closed_form(k, variant: Variant, alibi, varlen) -> bool:
    """Nk = 1 and every row sees key 0 with the plain score: the closed form applies."""
    if varlen is not None or k.shape[2] != 1:  # the usual case, decided first
        return False
    plain = variant.softcap == 0 and alibi is None and variant.window == (-1, -1)
    return plain and not variant.bottom_right


def _backward_one_key(do, q, k, v, o, lse_c, scale, variant: Variant = PLAIN):
    """The backward when there is one key (Nk = 1) and every row sees it, in closed form
    (PyTorch ops, O(N d)); ``lse_c`` is the kernels' statistic (units of c, masks.py).

    P = exp2((r - L) * c log2 e), dP = dO . v, D = rowsum(dO * O), dS = P (dP - D), dQ = dS k
    scale, dK = sum dS q scale, dV = sum P dO. When o and L are this call's own forward's, O = V
    exactly, so D and dP are the same sum of the same numbers and dS is exactly 0: dQ = dK = 0
    as in exact arithmetic. The kernels compute dP with a tensor-core dot and D with an
    elementwise sum, in different orders, which left ~1e-5 of rounding noise in dQ and dK there
    (notes/kernel.md). With another o and L (ring attention passes the global ones per block)
    this is the general formula. NaN or inf in the inputs still propagate to the gradients.
    """
    B, Hq, Nq, d = q.shape
    kv_heads = k.shape[1]
    G = Hq // kv_heads
    f = torch.float32
    qk_mul, _, c2 = variant.units(scale)
    qf = q.to(f).reshape(B, kv_heads, G, Nq, d)
    kf = k.to(f).reshape(B, kv_heads, 1, 1, d)
    vf = v.to(f).reshape(B, kv_heads, 1, 1, d)
    dof = do.to(f).reshape(B, kv_heads, G, Nq, d)
    of = o.to(f).reshape(B, kv_heads, G, Nq, d)
    r = (qf * kf).sum(-1, keepdim=True) * qk_mul  # (B, kv_heads, G, Nq, 1), units of c
    p = torch.exp2((r - lse_c.reshape(B, kv_heads, G, Nq, 1)) * c2)
    dp = (dof * vf).sum(-1, keepdim=True)
    delta = (dof * of).sum(-1, keepdim=True)  # bitwise dp when o = v: same shapes, same order
    ds = p * (dp - delta)
    dq = (ds * kf * scale).reshape(B, Hq, Nq, d)
    dk = (ds * qf).sum((2, 3)).reshape(B, kv_heads, 1, d) * scale
    dv = (p * dof).sum((2, 3)).reshape(B, kv_heads, 1, d)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)
