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
