"""Exact where the reference is exact (issue 22): a row that sees one key has P = 1, so O = V,
dV = dO and dQ = dK = 0 exactly, in every dtype and with every variant.

The cause of the old ulp errors: P was recomputed in the backward as exp2(q.k * scale log2 e -
lse2). A GPU compiler fuses that multiply and subtraction into one FMA (the product is not
rounded) while the forward rounded q.k * scale log2 e before taking the max, so for the one
visible key the exponent was the product's rounding error, not 0. The kernels now work in
"units of c" (course_kernels/triton/masks.py): P = exp2((r - L) * c log2 e), the subtraction
first, which no FMA can change: r - L = 0 exactly. And D = rowsum(dO * O) is the diagonal of a
dot dO O^T, the same tensor-core sum as dP = dO V^T, so dP - D = 0 exactly.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from variant_cases import DEVICE, make  # noqa: E402

from course_kernels import flash_attention  # noqa: E402
from course_kernels.numpy.reference import LOG2E  # noqa: E402


def _fma32(a, b, c):
    """float32 fma(a, b, c): the exact product (a float32 product fits a float64) plus c, rounded
    once (the float64 sum's own rounding is far below float32's)."""
    return np.float32(np.float64(a) * np.float64(b) + np.float64(c))


def test_the_cause_old_recompute_under_fma_is_not_one_new_one_is():
    """A model of the GPU's arithmetic in NumPy: with the old formula the fused backward gives
    P = 1 +- one fp32 ulp for about a fifth of one-key rows (fp32 inputs carry it into dV; fp16
    and bf16 round it away); with the new one P == 1 for every row."""
    rng = np.random.default_rng(0)
    qk = rng.standard_normal(2000).astype(np.float32) * np.float32(8)  # raw dots q.k
    scale = np.float32(1 / np.sqrt(40))
    qk_scale = np.float32(scale * np.float32(LOG2E))
    # old: the forward rounds s2 = qk * qk_scale, m = s2 (one key), l = 1, lse2 = m
    lse2 = qk * qk_scale
    old = np.exp2(np.array([_fma32(x, qk_scale, -m) for x, m in zip(qk, lse2, strict=True)]))
    assert (old != 1).mean() > 0.1  # the exponent is the product's rounding error
    # new: r = qk * sign(scale) (exact), L = m = r, P = exp2((r - L) * c2): the subtraction first
    c2 = np.float32(abs(scale) * np.float32(LOG2E))
    r = qk * np.float32(1.0)
    new = np.exp2(np.array([_fma32(x - L, c2, 0) for x, L in zip(r, r, strict=True)]))
    assert (new == 1).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("heads,d", [((2, 2), 64), ((4, 2), 40)])
@pytest.mark.parametrize("nk", [2, 67])
def test_seqlen_q_1_causal_is_exact(dtype, heads, d, nk):
    """flash-attn's seqlen_q = 1 cases with top-left causal: the query sees key 0 only."""
    hq, kvh = heads
    q, k, v, do = make(B=2, Hq=hq, kv_heads=kvh, Nq=1, Nk=nk, d=d, dtype=dtype, seed=nk + d)
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    out = flash_attention(q, k, v, causal=True)
    out.backward(do)
    g = hq // kvh
    assert torch.equal(out, v[:, :, :1].detach().repeat_interleave(g, 1))
    assert torch.count_nonzero(q.grad) == 0 and torch.count_nonzero(k.grad) == 0
    expect = do.float().view(2, kvh, g, 1, d).sum(2).to(dtype)  # a sum of <= 2: one rounding
    assert torch.equal(v.grad[:, :, :1], expect) and torch.count_nonzero(v.grad[:, :, 1:]) == 0


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize(
    "kw",
    [
        {"window_size": (0, 0)},
        {"window_size": (0, 0), "causal_alignment": "bottom_right", "scale": -0.7},
        {"window_size": (0, 0), "softcap": 2.0, "alibi_slopes": "slopes"},
        {"causal": True, "causal_alignment": "bottom_right", "window_size": (0, -1)},
    ],
)
def test_every_row_sees_one_key_p_is_one(dtype, kw):
    """O = V and dV = dO exactly for rows that see one key (P = 1 recomputed exactly), with
    either alignment, a negative scale, the soft cap and ALiBi in the score hook."""
    kw = dict(kw)
    if kw.get("alibi_slopes") == "slopes":
        kw["alibi_slopes"] = torch.tensor([0.5, 0.125], device=DEVICE)
    q, k, v, do = make(Nq=37, Nk=37, d=48, dtype=dtype, seed=3)
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    out = flash_attention(q, k, v, **kw)
    out.backward(do)
    assert torch.equal(out, v.detach())
    assert torch.equal(v.grad, do)


def test_one_key_row_among_many_keys_in_a_block():
    """Causal row 0 sees one key while its block's other rows see more: O[0] = V[0] exactly."""
    q, k, v, _ = make(Nq=40, Nk=40, dtype=torch.float32, seed=5)
    out = flash_attention(q, k, v, causal=True, scale=0.37)
    assert torch.equal(out[:, :, 0], v[:, :, 0])
