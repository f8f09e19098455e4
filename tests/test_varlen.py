"""Chunked prefill, causal alignment and variable-length batches in NumPy (serving/varlen.py)."""

import numpy as np
import pytest

from course_kernels import attention_reference, causal_mask
from course_kernels.serving import varlen


def test_chunked_prefill_rejects_an_unknown_alignment(rng):
    q = rng.standard_normal((1, 4, 8))
    with pytest.raises(ValueError, match="alignment must be 'top_left'"):
        varlen.chunked_prefill(q, q, q, 2, alignment="bottom-left")


@pytest.mark.parametrize("n,chunk", [(37, 8), (16, 16), (9, 1), (20, 64)])
def test_chunked_prefill_needs_bottom_right(rng, n, chunk):
    q, k, v = (rng.standard_normal((2, n, 8)) for _ in range(3))
    full, _ = attention_reference(q, k, v, causal=True)
    good = varlen.chunked_prefill(q, k, v, chunk)
    np.testing.assert_allclose(good, full, atol=1e-13)
    bad = varlen.chunked_prefill(q, k, v, chunk, alignment="top_left")
    if chunk < n:
        assert np.abs(bad - full).max() > 1e-2
        np.testing.assert_allclose(bad[:, :chunk], full[:, :chunk], atol=1e-13)  # chunk 0 is fine


def test_varlen_programs():
    assert varlen.varlen_programs([0, 5, 5, 21], 4) == [
        (0, 0),
        (0, 1),
        (2, 0),
        (2, 1),
        (2, 2),
        (2, 3),
    ]
    assert varlen.varlen_programs([0, 0], 16) == []
    assert varlen.padded_programs([0, 5, 5, 21], 4) == 12
    with pytest.raises(ValueError, match="start at 0"):
        varlen.varlen_programs([1, 5], 4)
    with pytest.raises(ValueError, match="never decrease"):
        varlen.varlen_programs([0, 5, 3], 4)
    with pytest.raises(ValueError, match="B \\+ 1 integers"):
        varlen.varlen_programs([0], 4)


def test_varlen_attention_equals_per_sequence_reference(rng):
    lq, lk = [3, 1, 6], [7, 1, 6]  # decode-like, one token, prefill
    cu_q, cu_k = np.cumsum([0] + lq), np.cumsum([0] + lk)
    q = rng.standard_normal((sum(lq), 4, 8))
    k, v = (rng.standard_normal((sum(lk), 2, 8)) for _ in range(2))
    out, lse = varlen.varlen_attention_numpy(q, k, v, cu_q, cu_k, causal=True)
    for b in range(3):
        qs = q[cu_q[b] : cu_q[b + 1]].transpose(1, 0, 2)
        ks, vs = (np.repeat(x[cu_k[b] : cu_k[b + 1]].transpose(1, 0, 2), 2, 0) for x in (k, v))
        want, want_lse = varlen.masked_attention(
            qs, ks, vs, causal_mask(lq[b], lk[b], "bottom_right")
        )
        np.testing.assert_allclose(out[cu_q[b] : cu_q[b + 1]], want.transpose(1, 0, 2), atol=1e-13)
        np.testing.assert_allclose(lse[cu_q[b] : cu_q[b + 1]], want_lse.T, atol=1e-13)
    with pytest.raises(ValueError, match="packed lengths"):
        varlen.varlen_attention_numpy(q, k, v, cu_q, cu_k[:-1])


# -- mutation audit: scale, defaults, and the checks of cu_seqlens and the packed lengths ---------


def test_masked_attention_and_chunked_prefill_apply_the_scale(rng):
    q, k, v = (rng.standard_normal((2, 11, 8)) for _ in range(3))
    want, want_lse = attention_reference(q, k, v, causal=True, scale=0.3)
    out, lse = varlen.masked_attention(q, k, v, causal_mask(11, 11), scale=0.3)
    np.testing.assert_allclose(out, want, atol=1e-13)
    np.testing.assert_allclose(lse, want_lse, atol=1e-13)
    np.testing.assert_allclose(varlen.chunked_prefill(q, k, v, 4, scale=0.3), want, atol=1e-13)


def test_chunked_prefill_checks_the_chunk(rng):
    q = rng.standard_normal((1, 4, 8))
    with pytest.raises(TypeError, match="chunk must be an integer"):
        varlen.chunked_prefill(q, q, q, True)
    with pytest.raises(ValueError, match="chunk must be an integer"):
        varlen.chunked_prefill(q, q, q, 0)


def test_cu_seqlens_must_be_a_1d_integer_array():
    with pytest.raises(ValueError, match=r"B \+ 1 integers"):
        varlen.check_cu_seqlens([0.0, 4.0])
    with pytest.raises(ValueError, match=r"B \+ 1 integers"):
        varlen.check_cu_seqlens([[0, 4], [4, 8]])
    got = varlen.check_cu_seqlens(np.array([0, 3, 3], dtype=np.int32))
    assert got.dtype == np.int64 and got.tolist() == [0, 3, 3]


def test_program_counts_check_block_m():
    for fn in (varlen.varlen_programs, varlen.padded_programs):
        with pytest.raises(ValueError, match="block_m"):
            fn([0, 5], 0)
        with pytest.raises(TypeError, match="block_m"):
            fn([0, 5], 2.0)


def _packed(rng, lq, lk, hq=2, hk=1, d=4):
    q = rng.standard_normal((sum(lq), hq, d))
    k, v = (rng.standard_normal((sum(lk), hk, d)) for _ in range(2))
    return q, k, v, np.cumsum([0] + lq), np.cumsum([0] + lk)


def test_varlen_attention_defaults_to_full_attention_and_applies_the_scale(rng):
    """One sequence, MHA: the packed result is attention_reference on (heads, N, d)."""
    q, k, v, cu_q, cu_k = _packed(rng, [5], [9], hq=2, hk=2)
    qh, kh, vh = (x.transpose(1, 0, 2) for x in (q, k, v))
    out, lse = varlen.varlen_attention_numpy(q, k, v, cu_q, cu_k)
    want, want_lse = attention_reference(qh, kh, vh)
    np.testing.assert_allclose(out, want.transpose(1, 0, 2), atol=1e-13)
    np.testing.assert_allclose(lse, want_lse.T, atol=1e-13)
    out, _ = varlen.varlen_attention_numpy(q, k, v, cu_q, cu_k, scale=2.5)
    want, _ = attention_reference(qh, kh, vh, scale=2.5)
    np.testing.assert_allclose(out, want.transpose(1, 0, 2), atol=1e-13)


def test_varlen_attention_checks_that_the_offsets_describe_the_packing(rng):
    q, k, v, cu_q, cu_k = _packed(rng, [3, 2], [4, 4])
    with pytest.raises(ValueError, match="packed lengths"):  # 2 vs 3 sequences, same totals
        varlen.varlen_attention_numpy(q, k, v, cu_q, [0, 2, 6, 8])
    with pytest.raises(ValueError, match="packed lengths"):  # q has a row past cu_q[-1]
        varlen.varlen_attention_numpy(np.concatenate([q, q[:1]]), k, v, cu_q, cu_k)
    with pytest.raises(ValueError, match="packed lengths"):  # k has a row past cu_k[-1]
        varlen.varlen_attention_numpy(q, k, v, cu_q, [0, 4, 7])
