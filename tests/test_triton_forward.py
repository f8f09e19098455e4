"""The Triton forward kernel (``triton_forward._attn_fwd``) against the float64 reference.

On a machine without a GPU these run in Triton's CPU interpreter (small sizes). The tolerance
is FlashAttention's rule (``course_kernels.testing``): error vs the float64 reference at most 2x
the error of naive attention computed in the inputs' dtype. One parametrize per axis; sizes are
odd so that every block is ragged (the CPU config uses BLOCK_M = 32, BLOCK_N = 16).
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from course_kernels import attention_naive, attention_reference, flash_attention  # noqa: E402
from course_kernels.triton._env import device_kind  # noqa: E402
from course_kernels.testing import assert_close_to_reference, max_abs_error  # noqa: E402

DEVICE = device_kind()


def make_qkv(B=1, Hq=2, kv_heads=2, Nq=33, Nk=33, d=64, dtype=torch.float32, seed=0, spread=1.0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hq, Nq, d, generator=g) * spread  # (B, Hq, Nq, d)
    k = torch.randn(B, kv_heads, Nk, d, generator=g)  # (B, kv_heads, Nk, d)
    v = torch.randn(B, kv_heads, Nk, d, generator=g)  # (B, kv_heads, Nk, d)
    return [x.to(dtype=dtype, device=DEVICE) for x in (q, k, v)]


def expand_kv(x, n_q_heads):
    """(B, kv_heads, N, d) -> (B, Hq, N, d) NumPy, repeating each K/V head for its query group."""
    x = x.detach().cpu()
    return x.repeat_interleave(n_q_heads // x.shape[1], dim=1).numpy()


def check_forward(q, k, v, causal, scale=None):
    """Run the kernel and assert O and the logsumexp against the float64 reference."""
    out, lse = flash_attention(q, k, v, causal=causal, scale=scale, return_lse=True)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert lse.shape == q.shape[:3] and lse.dtype == torch.float32
    qn, kn, vn = q.detach().cpu().numpy(), expand_kv(k, q.shape[1]), expand_kv(v, q.shape[1])
    ref, ref_lse = attention_reference(qn, kn, vn, causal=causal, scale=scale)
    naive = attention_naive(qn, kn, vn, causal=causal, scale=scale)
    assert_close_to_reference(out.float().cpu().numpy(), ref, naive, factor=2.0, what="O")
    # The lse comes from exact fp32 products of the inputs: fp32 rounding only, at any dtype.
    lse_err = max_abs_error(lse.cpu().numpy(), ref_lse)
    assert lse_err <= 1e-4 * max(1.0, float(np.abs(ref_lse).max())), f"lse error {lse_err:.3e}"
    return out, lse


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n", [1, 17, 33, 67])
def test_forward_seq_len(n, causal):
    check_forward(*make_qkv(Nq=n, Nk=n, dtype=torch.float16, seed=n), causal)


@pytest.mark.parametrize("d", [8, 16, 40, 64, 80, 96])
def test_forward_head_dim(d):
    check_forward(*make_qkv(Nq=37, Nk=37, d=d, seed=d), causal=True)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("heads", [(4, 4), (4, 2), (4, 1), (6, 3)])
def test_forward_gqa(heads, causal):
    hq, kv_heads = heads
    check_forward(
        *make_qkv(Hq=hq, kv_heads=kv_heads, Nq=35, Nk=35, seed=hq * 10 + kv_heads), causal
    )


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("lengths", [(17, 67), (67, 17), (1, 33), (33, 1), (49, 50)])
def test_forward_cross_lengths(lengths, causal):
    nq, nk = lengths
    check_forward(*make_qkv(Nq=nq, Nk=nk, dtype=torch.float16, seed=nq + nk), causal)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_forward_dtype(dtype):
    check_forward(*make_qkv(B=3, Hq=2, Nq=41, Nk=41, d=40, dtype=dtype, seed=3), causal=True)


@pytest.mark.parametrize("scale", [0.05, 1.0, -0.3])
def test_forward_scale(scale):
    check_forward(*make_qkv(Nq=33, Nk=47, seed=5), causal=True, scale=scale)


def test_forward_extreme_scores_no_nan():
    """Scores near +-1e4 (fp32): the online softmax must neither overflow nor give NaN."""
    q, k, v = make_qkv(Nq=67, Nk=67, seed=7, spread=800.0)
    out, _ = check_forward(q, k, v, causal=True)
    assert torch.isfinite(out).all()


def test_forward_causal_row_sees_exactly_its_prefix():
    """Changing key j must change only rows i >= j (catches a causal mask off by one)."""
    q, k, v = make_qkv(Nq=40, Nk=40, seed=11)
    out = flash_attention(q, k, v, causal=True)
    j = 21
    v2 = v.clone()
    v2[:, :, j] += 1.0
    out2 = flash_attention(q, k, v2, causal=True)
    changed = (out2 - out).abs().amax(dim=(0, 1, 3)) > 0  # (Nq,)
    assert changed.tolist() == [i >= j for i in range(40)]


def test_forward_bf16_in_interpreter_is_fp32_rounded():
    """Under the interpreter bf16 is computed in fp32 (triton-lang/triton#11584)."""
    if DEVICE != "cpu":
        pytest.skip("interpreter-only workaround")
    q, k, v = make_qkv(Nq=19, Nk=23, dtype=torch.bfloat16, seed=13)
    out = flash_attention(q, k, v, causal=True)
    expect = flash_attention(q.float(), k.float(), v.float(), causal=True).to(torch.bfloat16)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, expect)


def test_smem_estimate_and_accumulator_registers_by_hand():
    """Q tile once plus K and V per stage; one fp32 accumulator value per (row, column) per thread."""
    from course_kernels.triton.forward import accumulator_registers, smem_estimate

    # 2 bytes * (128 * 64 + 3 stages * 2 tiles * 64 * 64) = 65,536
    assert smem_estimate(128, 64, 3, 64) == 65_536
    assert smem_estimate(128, 64, 3, 64, dtype_bytes=4) == 131_072
    assert smem_estimate(64, 64, 1, 128) == 2 * (64 * 128 + 2 * 64 * 128)
    # one more stage adds exactly one K and one V tile
    assert smem_estimate(128, 128, 4, 128) - smem_estimate(128, 128, 3, 128) == 2 * 2 * 128 * 128
    assert accumulator_registers(128, 128, 8) == 64  # 16,384 values over 256 threads
    assert accumulator_registers(64, 64, 4) == 32
