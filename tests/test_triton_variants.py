"""The kernels' variants against the float64 NumPy truth (Triton's CPU interpreter without a GPU):
bottom-right causal and SDPA's causal bias objects, sliding windows (with block skipping), soft
capping, ALiBi, forward and backward, GQA, odd sizes (the CPU configs use 32 x 16 and 16 x 32
tiles, so windows and diagonals cut through blocks). Issue 22.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from variant_cases import DEVICE, check, make  # noqa: E402

from course_kernels import flash_attention  # noqa: E402
from course_kernels.numpy.reference import attention_mask  # noqa: E402
from course_kernels.triton.masks import BIG, key_blocks, query_blocks  # noqa: E402

BR = {"causal": True, "causal_alignment": "bottom_right"}


@pytest.mark.parametrize("lengths", [(17, 67), (67, 17), (1, 33), (35, 35)])
@pytest.mark.parametrize("heads", [(2, 2), (4, 1)])
def test_bottom_right_causal(lengths, heads):
    nq, nk = lengths
    check(*make(Hq=heads[0], kv_heads=heads[1], Nq=nq, Nk=nk, seed=nq + nk), BR, flash_attention)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_bottom_right_causal_half(dtype):
    check(*make(Nq=23, Nk=50, dtype=dtype, seed=3), BR, flash_attention)


def test_sdpa_causal_bias_objects_are_accepted_and_match_sdpa():
    from torch.nn.attention.bias import causal_lower_right, causal_upper_left

    q, k, v, _ = make(Nq=21, Nk=45, seed=1)
    lower = flash_attention(q, k, v, attn_mask=causal_lower_right(21, 45))
    assert torch.equal(lower, flash_attention(q, k, v, **BR))
    upper = flash_attention(q, k, v, attn_mask=causal_upper_left(21, 45))
    assert torch.equal(upper, flash_attention(q, k, v, causal=True))
    for bias, got in ((causal_lower_right(21, 45), lower), (causal_upper_left(21, 45), upper)):
        want = torch.nn.functional.scaled_dot_product_attention(
            q.cpu().double(), k.cpu().double(), v.cpu().double(), attn_mask=bias
        )
        assert (got.cpu().double() - want).abs().max() < 1e-5


def test_bottom_right_is_not_top_left():
    """A kernel that ignored the alignment would pass Nq = Nk; with Nq < Nk it must differ."""
    q, k, v, _ = make(Nq=9, Nk=40, seed=2)
    tl_ = flash_attention(q, k, v, causal=True)
    br = flash_attention(q, k, v, **BR)
    assert (tl_ - br).abs().max() > 0.1


@pytest.mark.parametrize("align", ["top_left", "bottom_right"])
@pytest.mark.parametrize("window", [(0, 0), (5, 3), (8, -1), (-1, 4)])
@pytest.mark.parametrize("causal", [False, True])
def test_sliding_window(window, causal, align):
    kw = {"window_size": window, "causal": causal, "causal_alignment": align}
    # (0, 0): every row sees one key, where the exact dQ is 0 and NumPy's matmul (the
    # interpreter's dot) sums some rows of dP in another order than D: fp16's floor, not fp32's.
    dtype = torch.float16 if window == (0, 0) else torch.float32
    qkvo = make(Hq=4, kv_heads=2, Nq=37, Nk=53, dtype=dtype, seed=sum(window) + 9)
    check(*qkvo, kw, flash_attention)


@pytest.mark.parametrize("align", ["top_left", "bottom_right"])
def test_window_changes_exactly_the_rows_that_see_the_key(align):
    """Changing V at key j changes exactly the rows whose window holds j (catches an
    off-by-one on either edge and a wrong alignment)."""
    q, k, v, _ = make(Nq=30, Nk=45, seed=4)
    kw = {"window_size": (6, 2), "causal_alignment": align}
    out = flash_attention(q, k, v, **kw)
    keep = attention_mask(30, 45, False, align, (6, 2))
    for j in (0, 7, 20, 44):
        v2 = v.clone()
        v2[:, :, j] += 1.0
        changed = (flash_attention(q, k, v2, **kw) - out).abs().amax(dim=(0, 1, 3)) > 0
        assert changed.tolist() == keep[:, j].tolist(), j


def test_window_blocks_outside_are_never_read():
    """NaN in V (and K) outside every window of a query block leaves that block's output finite:
    its program never loads them (block skipping), it does not merely mask them."""
    q, k, v, do = make(Nq=128, Nk=128, seed=5)
    k, v = k.clone(), v.clone()
    k[:, :, :48] = float("nan")  # rows 64..95 with window (8, 0) see keys 56..95 only
    v[:, :, :48] = float("nan")
    out = flash_attention(q, k, v, causal=True, window_size=(8, 0))
    assert torch.isfinite(out[:, :, 64:]).all() and torch.isnan(out[:, :, :48]).any()
    # dK/dV: key block 0..15 is seen by rows 0..23 only; NaN queries from row 64 on
    q2, do2 = q.clone(), do.clone()
    q2[:, :, 64:] = float("nan")
    do2[:, :, 64:] = float("nan")
    k3, v3 = (x.clone().requires_grad_() for x in make(Nq=128, Nk=128, seed=6)[1:3])
    flash_attention(q2, k3, v3, causal=True, window_size=(8, 0)).backward(do2)
    assert torch.isfinite(k3.grad[:, :, :16]).all() and torch.isfinite(v3.grad[:, :, :16]).all()


def test_block_ranges_visit_only_window_blocks():
    """With a 256-key window at N = 4096 a query block visits ~ (256 + BLOCK_M) / BLOCK_N key
    blocks, not N / BLOCK_N; every visible key is inside the visited ranges (brute force)."""
    lo, flo, fhi, hi = key_blocks(2048, 4096, -256, 0, 128, 64)
    assert (lo, hi) == (1792, 2048 + 128) and hi - lo <= 256 + 128 + 64
    assert (flo, fhi) == (1920, 2048)  # unmasked middle: keys every row of the block sees
    keep = attention_mask(200, 260, True, "bottom_right", (20, -1))
    diag = 60
    for sm in range(0, 200, 32):
        lo, flo, fhi, hi = key_blocks(sm, 260, diag - 20, diag, 32, 16)
        cols = keep[sm : sm + 32].any(0).nonzero()[0]
        assert cols.size == 0 or (lo <= cols.min() and cols.max() < max(hi, fhi))
        assert keep[sm : sm + 32, flo:fhi].all()
    for sn in range(0, 260, 16):
        lo, flo, fhi, hi = query_blocks(sn, 200, diag - 20, diag, 16, 32)
        rows = keep[:, sn : sn + 16].any(1).nonzero()[0]
        assert rows.size == 0 or (lo <= rows.min() and rows.max() < max(hi, fhi))
        assert keep[flo:fhi, sn : sn + 16].all()
    assert key_blocks(0, 100, -BIG, BIG, 32, 16) == (0, 0, 96, 100)


@pytest.mark.parametrize("softcap", [1.0, 5.0])
@pytest.mark.parametrize("causal", [False, True])
def test_softcap(softcap, causal):
    kw = {"softcap": softcap, "causal": causal}
    check(*make(Nq=33, Nk=41, seed=int(softcap) + causal, d=40), kw, flash_attention)


def test_softcap_scale_matters():
    """softcap * tanh(scale qk / softcap): large scores are capped, so the output differs from
    the uncapped one, and softcap -> infinity gives it back."""
    q, k, v, _ = make(Nq=20, Nk=20, seed=7)
    plain = flash_attention(q * 4, k, v)
    assert (flash_attention(q * 4, k, v, softcap=1.0) - plain).abs().max() > 0.05
    assert (flash_attention(q * 4, k, v, softcap=1e4) - plain).abs().max() < 1e-4


@pytest.mark.parametrize("per_batch", [False, True])
@pytest.mark.parametrize("causal", [False, True])
def test_alibi(per_batch, causal):
    q, k, v, do = make(B=2, Hq=4, kv_heads=2, Nq=29, Nk=43, seed=8 + per_batch)
    slopes = torch.rand((2, 4) if per_batch else (4,), generator=torch.Generator().manual_seed(1))
    kw = {"alibi_slopes": slopes.to(DEVICE), "causal": causal, "causal_alignment": "bottom_right"}
    check(q, k, v, do, kw, flash_attention)


def test_everything_together_fp16():
    kw = {
        "causal": True,
        "causal_alignment": "bottom_right",
        "window_size": (11, -1),
        "softcap": 3.0,
        "alibi_slopes": torch.tensor([0.3, 0.1, 0.05, 0.2], device=DEVICE),
        "scale": 0.2,
    }
    check(*make(Hq=4, kv_heads=1, Nq=45, Nk=70, dtype=torch.float16, seed=10), kw, flash_attention)


def test_rows_that_see_nothing_give_zero_and_no_nan():
    """Bottom-right with Nq > Nk: the first Nq - Nk rows see no key: O = 0, lse = -inf, and
    gradients are finite (the kernel stores +inf internally so that P = 0 in the backward)."""
    q, k, v, do = make(Nq=40, Nk=11, seed=11)
    out, *grads = check(q, k, v, do, BR, flash_attention)
    assert torch.count_nonzero(out[:, :, :29]) == 0
    assert all(torch.isfinite(g).all() for g in grads)


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        ({"window_size": (1, 2, 3)}, ValueError, "window_size"),
        ({"window_size": (-2, 0)}, ValueError, "window_size"),
        ({"window_size": (1.5, 0)}, ValueError, "window_size"),
        ({"softcap": -1.0}, ValueError, "softcap"),
        ({"softcap": float("inf")}, ValueError, "softcap"),
        ({"softcap": "big"}, TypeError, "softcap"),
        ({"causal_alignment": "bottom-right"}, ValueError, "alignment"),
        ({"attn_mask": "causal"}, TypeError, "causal bias"),
        ({"alibi_slopes": [0.1, 0.2]}, TypeError, "alibi_slopes"),
        ({"alibi_slopes": "shape"}, ValueError, r"\(H,\)"),
        ({"alibi_slopes": "int"}, TypeError, "floating"),
    ],
)
def test_bad_variant_arguments_raise_clearly(kwargs, error, match):
    q, k, v, _ = make(Nq=8, Nk=8)
    if kwargs.get("alibi_slopes") == "shape":
        kwargs = {"alibi_slopes": torch.ones(3, device=DEVICE)}
    elif kwargs.get("alibi_slopes") == "int":
        kwargs = {"alibi_slopes": torch.ones(2, dtype=torch.int32, device=DEVICE)}
    with pytest.raises(error, match=match):
        flash_attention(q, k, v, **kwargs)


def test_causal_bias_object_misuse_raises_clearly():
    from torch.nn.attention.bias import causal_lower_right, causal_upper_left

    q, k, v, _ = make(Nq=8, Nk=12)
    with pytest.raises(ValueError, match="built for"):
        flash_attention(q, k, v, attn_mask=causal_lower_right(8, 13))
    with pytest.raises(ValueError, match="not both"):
        flash_attention(q, k, v, causal=True, attn_mask=causal_lower_right(8, 12))
    with pytest.raises(ValueError, match="contradicts"):
        flash_attention(
            q, k, v, attn_mask=causal_upper_left(8, 12), causal_alignment="bottom_right"
        )
    with pytest.raises(TypeError, match="Tensor masks"):
        flash_attention(q, k, v, attn_mask=torch.ones(8, 12, dtype=torch.bool))


def test_block_ranges_are_ordered_and_inside_the_sequence():
    """lo <= full_lo <= full_hi <= hi, all within [0, N]: a negative or past-the-end stage would
    read garbage (found: Nq > Nk bottom-right once visited key -18)."""
    for nq, nk in [(67, 17), (17, 67), (1, 50), (50, 1), (64, 64)]:
        for diag_lo, diag_hi in [(-BIG, BIG), (-BIG, nk - nq), (nk - nq - 5, nk - nq), (-3, 4)]:
            for sm in range(0, nq, 32):
                lo, flo, fhi, hi = key_blocks(sm, nk, diag_lo, diag_hi, 32, 16)
                assert 0 <= lo <= flo <= fhi <= hi <= max(nk, lo), (nq, nk, sm, lo, flo, fhi, hi)
            for sn in range(0, nk, 16):
                lo, flo, fhi, hi = query_blocks(sn, nq, diag_lo, diag_hi, 16, 32)
                assert 0 <= lo <= flo <= fhi <= hi <= max(nq, lo), (nq, nk, sn, lo, flo, fhi, hi)


def test_alibi_slopes_are_checked_once_per_unchanged_tensor_and_in_inference_mode():
    """The finiteness check reads the slopes (a sync on a GPU): once per unchanged tensor; an
    in-place write makes it read (and refuse) again; inference tensors, which have no version
    counter, are checked on every call rather than crashing."""
    q = torch.randn(1, 2, 8, 16, device=DEVICE)
    slopes = torch.tensor([0.5, 0.25], device=DEVICE)
    flash_attention(q, q, q, alibi_slopes=slopes)
    slopes[0] = float("nan")  # bumps the version counter: checked again
    with pytest.raises(ValueError, match="alibi_slopes must be finite"):
        flash_attention(q, q, q, alibi_slopes=slopes)
    with torch.inference_mode():
        bad = torch.tensor([0.5, float("inf")], device=DEVICE)
        qi = torch.randn(1, 2, 8, 16, device=DEVICE)
        good = torch.tensor([0.5, 0.25], device=DEVICE)
        out = flash_attention(qi, qi, qi, alibi_slopes=good)
        assert torch.isfinite(out).all()
        with pytest.raises(ValueError, match="alibi_slopes must be finite"):
            flash_attention(qi, qi, qi, alibi_slopes=bad)


def test_alibi_slopes_are_read_once(monkeypatch):
    from course_kernels.triton import masks

    reads = []
    real = masks._check_finite_slopes
    monkeypatch.setattr(masks, "_check_finite_slopes", lambda s: (reads.append(1), real(s)))
    q = torch.randn(1, 2, 8, 16, device=DEVICE)
    slopes = torch.tensor([0.5, 0.25], device=DEVICE)
    for _ in range(3):
        flash_attention(q, q, q, alibi_slopes=slopes)
    assert len(reads) == 1, f"the slopes were read {len(reads)} times for one unchanged tensor"
    slopes.mul_(2.0)
    flash_attention(q, q, q, alibi_slopes=slopes)
    assert len(reads) == 2


# ---- mutation audit: the block ranges by brute force, and the host-side Variant arithmetic ------


def _sees(i, j, diag_lo, diag_hi):
    return i + diag_lo <= j <= i + diag_hi


def _check_blocks(got, tile, n, step, sees, whole_inside, case):
    """A tile (its indices ``tile``) against the other side's [0, n) in blocks of ``step``:
    ``got`` = (lo, flo, fhi, hi). The visited blocks hold every visible pair (one spare block at
    most, where nothing in the tile sees anything); the unmasked middle is exactly the blocks
    every pair of which is visible, counted within [0, n) if ``whole_inside`` else whole."""
    lo, flo, fhi, hi = got
    assert lo <= flo <= fhi <= hi, case
    starts = range(0, n, step)
    seen = [b for b in starts if any(sees(t, o) for t in tile for o in range(b, min(b + step, n)))]
    full = [
        b
        for b in starts
        if (b + step <= n or not whole_inside)
        and all(sees(t, o) for t in tile for o in range(b, b + step))
    ]
    visited = list(range(lo, hi, step))
    extra = [b for b in visited if b not in seen]
    assert all(b % step == 0 for b in visited) and set(seen) <= set(visited), case
    assert not extra or (not seen and len(extra) == 1), case
    assert list(range(flo, fhi, step)) == full, case


def _check_key_blocks(sm, nk, dlo, dhi, bm, bn):
    """Query rows [sm, sm + bm) against keys [0, nk) in blocks of bn: a middle block lies whole
    inside [0, nk)."""
    got = key_blocks(sm, nk, dlo, dhi, bm, bn)
    sees = lambda i, j: _sees(i, j, dlo, dhi)  # noqa: E731
    _check_blocks(got, range(sm, sm + bm), nk, bn, sees, True, (sm, nk, dlo, dhi, bm, bn, got))


def _check_query_blocks(sn, nq, dlo, dhi, bn, bm):
    """Keys [sn, sn + bn) against query rows [0, nq) in blocks of bm: a middle block's bm rows are
    counted whole (the kernel masks rows past nq)."""
    got = query_blocks(sn, nq, dlo, dhi, bn, bm)
    sees = lambda j, i: _sees(i, j, dlo, dhi)  # noqa: E731
    _check_blocks(got, range(sn, sn + bn), nq, bm, sees, False, (sn, nq, dlo, dhi, bn, bm, got))


def test_block_ranges_against_brute_force():
    """key_blocks / query_blocks over small shapes, both alignments and windows that leave whole
    unmasked blocks (an off-by-one on the middle's edges only shows there)."""
    import itertools

    windows = [(-BIG, BIG), (-BIG, 0), (-BIG, 3), (-7, BIG), (-5, 0), (-6, 3), (-12, 3)]
    windows += [(-13, 2), (-11, 20), (0, 7), (2, 9), (-11, -7)]
    for (bm, bn), (nq, nk), (wl, wh) in itertools.product(
        [(8, 4), (4, 8), (4, 4)], [(13, 29), (29, 13), (16, 16), (1, 9)], windows
    ):
        for diag in (0, nk - nq):
            for sm in range(0, nq, bm):
                _check_key_blocks(sm, nk, diag + wl, diag + wh, bm, bn)
            for sn in range(0, nk, bn):
                _check_query_blocks(sn, nq, diag + wl, diag + wh, bn, bm)


def test_variant_window_offsets_and_units_by_hand():
    import math

    from course_kernels.triton.masks import CAUSAL, PLAIN, Variant

    assert PLAIN.window_offsets() == (-BIG, BIG) and not PLAIN.windowed
    assert CAUSAL.window_offsets() == (-BIG, 0) and CAUSAL.windowed
    assert Variant(window=(5, 3)).window_offsets() == (-5, 3)
    assert Variant(window=(-1, 4)).window_offsets() == (-BIG, 4)
    assert Variant(window=(0, 0)).window_offsets() == (0, 0)
    assert Variant(causal=True, window=(8, -1)).window_offsets() == (-8, 0)  # causal: right = 0
    assert Variant(window=(8, -1)).windowed
    log2e = 1 / math.log(2)
    # s = c * r: r = sign(scale) q.k, c = |scale|; soft cap: r = tanh(scale q.k / cap), c = cap
    qk_mul, c, c2 = PLAIN.units(-0.5)
    assert (qk_mul, c) == (-1.0, 0.5) and c2 == pytest.approx(0.5 * log2e, rel=1e-15)
    qk_mul, c, c2 = Variant(softcap=2.0).units(0.5)
    assert (qk_mul, c) == (0.25, 2.0) and c2 == pytest.approx(2.0 * log2e, rel=1e-15)
    qk_mul, c, c2 = PLAIN.units(0.0)  # every r = 0: any finite c > 0 gives the same P
    assert qk_mul == 0.0 and 0 < c < math.inf and c2 == pytest.approx(c * log2e, rel=1e-15)


def test_as_variant_keeps_a_variant():
    from course_kernels.triton.masks import CAUSAL, PLAIN, Variant, as_variant

    v = Variant(causal=True, bottom_right=True, window=(3, -1), softcap=2.0)
    assert as_variant(v) is v
    assert as_variant(True) is CAUSAL and as_variant(False) is PLAIN


def test_lse_base2_conversions_against_logsumexp():
    """The kernels' statistic is the natural logsumexp divided by c; lse_to_base2 gives it in
    bits (natural / ln 2), an empty row's +inf becomes -inf, and lse_from_base2 undoes it."""
    import math

    from course_kernels.triton.masks import PLAIN, Variant, lse_from_base2, lse_to_base2

    g = torch.Generator().manual_seed(12)
    scores = torch.randn(3, 7, generator=g, dtype=torch.float64)
    for variant, scale, c in ((PLAIN, -0.3, 0.3), (Variant(softcap=2.5), 0.3, 2.5)):
        lse_nat = torch.logsumexp(scores, dim=-1)  # any natural-log scores
        lse_c = torch.cat([lse_nat / c, torch.tensor([math.inf], dtype=torch.float64)])
        got = lse_to_base2(lse_c, variant, scale)
        assert torch.allclose(got[:3], lse_nat / math.log(2), rtol=1e-14, atol=0)
        assert torch.isneginf(got[3])
        back = lse_from_base2(got, variant, scale)
        assert torch.allclose(back[:3], lse_c[:3], rtol=1e-14, atol=0) and torch.isposinf(back[3])


def test_check_once_rechecks_on_new_facts_or_writes():
    from course_kernels.triton.masks import check_once

    t, calls = torch.zeros(3), []
    for facts in ((1,), (1,), (2,), (2,)):
        check_once(t, "_course_kernels_test_stamp", facts, lambda: calls.append(1))
    assert len(calls) == 2  # facts (1,) then (2,): each checked once
    t.add_(1.0)
    check_once(t, "_course_kernels_test_stamp", (2,), lambda: calls.append(1))
    assert len(calls) == 3


def test_check_alibi_gives_float32_rows_of_slopes():
    from course_kernels.triton.masks import check_alibi

    q = torch.zeros(2, 4, 8, 16)
    one = check_alibi(torch.tensor([0.5, 0.25, 0.125, 1.0], dtype=torch.float64), q)
    assert one.dtype == torch.float32 and one.shape == (1, 4)
    assert one.tolist() == [[0.5, 0.25, 0.125, 1.0]]
    assert check_alibi(torch.ones(2, 4), q).shape == (2, 4)
    packed = torch.zeros(20, 4, 16)  # varlen: (total tokens, heads, d), 3 sequences
    assert check_alibi(torch.ones(3, 4), packed, batch=3, heads=4).shape == (3, 4)
    with pytest.raises(ValueError, match=r"\(B, H\) = \(3, 4\)"):
        check_alibi(torch.ones(20, 4), packed, batch=3, heads=4)
    assert check_alibi(None, q) is None


def test_negative_scale():
    """scale < 0 flips every score: r = sign(scale) q.k with c = |scale| (masks.Variant.units)."""
    check(*make(Nq=9, Nk=13, seed=13), {"scale": -0.3, "causal": True}, flash_attention)


def test_scale_zero_is_uniform_attention():
    """scale = 0: every visible key weighs 1 / Nk, so O = mean(V), lse = ln Nk, dV = sum(dO) / Nk
    and dQ = dK = 0 (worked by hand, no reference needed)."""
    import math

    q, k, v, do = (x.detach().clone().requires_grad_() for x in make(Nq=9, Nk=13, seed=14))
    out, lse = flash_attention(q, k, v, scale=0.0, return_lse=True)
    out.backward(do)
    assert torch.allclose(out, v.mean(dim=2, keepdim=True).expand_as(out), atol=1e-6)
    assert torch.allclose(lse, torch.full_like(lse, math.log(13)), atol=1e-6)
    assert torch.allclose(v.grad, do.sum(dim=2, keepdim=True).expand_as(v) / 13, atol=1e-6)
    assert q.grad.abs().max() == 0 and k.grad.abs().max() == 0
