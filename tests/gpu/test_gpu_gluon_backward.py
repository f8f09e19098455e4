"""GPU tests of the Gluon (FA3-schedule) Hopper BACKWARD (notes/gluon_backward.md; written
before the kernel first ran, session 8). Skipped unless `gluon_available()` (a capability-9.x
GPU with Triton 3.6.x and Gluon).

Reference: float64 autograd attention on the same low-precision inputs and the same dO;
flash-attn's Hopper rule for each of dq, dk, dv (`fa_rule.budget`): max error of the kernel <= 2x
the max error of PyTorch's SDPA backward in the same dtype, plus twice one rounding of the
reference in that dtype. Seeds come from the parameters (`fa_rule.seed`), the same in every run. o and lse come from the Gluon forward (the
backward's intended caller). Outputs are poisoned with NaN (the allocator's free blocks) before
every launch, so rows the kernel forgets to write fail the finiteness check.
"""

import math
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import fa_rule  # noqa: E402  (tests/gpu: flash-attn's Hopper rule, stable seeds)
from course_kernels.gluon import backward_launch as GB  # noqa: E402
from course_kernels.gluon import launch as G  # noqa: E402
from course_kernels.testing import attention_grads  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not G.gluon_available(), reason="needs Hopper + Triton 3.6 Gluon"),
]

if G.gluon_available():
    import torch


def _inputs(B, H, N, d, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return [
        torch.randn(B, H, N, d, device="cuda", dtype=dtype, generator=g) for _ in range(4)
    ]  # q, k, v, do


def _poison(nbytes):
    torch.empty(nbytes // 4 + 1024, device="cuda", dtype=torch.float32).fill_(float("nan"))


def _check(B, H, N, d, dtype, causal, seed, **cfg):
    q, k, v, do = _inputs(B, H, N, d, dtype, seed)
    scale = 1.0 / math.sqrt(d)
    ref = attention_grads(q, k, v, do, causal, scale, True)
    sdpa = attention_grads(q, k, v, do, causal, scale, False)
    o, lse = G.gluon_attention_forward(q, k, v, causal=causal, scale=scale)
    _poison(16 * q.numel() * q.element_size())
    got = GB.gluon_attention_backward(do, q, k, v, o, lse, causal=causal, scale=scale, **cfg)
    for name, g, r, s in zip(("dq", "dk", "dv"), got, ref, sdpa, strict=True):
        assert g.shape == r.shape and g.dtype == dtype, name
        assert torch.isfinite(g).all(), f"NaN/inf in {name} (unwritten rows?)"
        err, lim = (g.double() - r).abs().max().item(), fa_rule.budget(s, r, dtype)
        assert err <= lim, f"{name} error {err:.3e} > flash-attn's budget {lim:.3e}"


@pytest.mark.parametrize("N", [1, 17, 200, 1000, 2053])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_backward_matches_float64(N, causal, d, dtype):
    _check(1, 2, N, d, getattr(torch, dtype), causal, seed=fa_rule.seed(N, causal, d, dtype))


@pytest.mark.parametrize(
    "cfg",
    [
        {},
        dict(DQ_SHARED=True, DQ_VEC=4),
        dict(OVERLAP_DQ=True),
        dict(DQ_TMA=True),
        dict(DQ_TMA=True, OVERLAP_DQ=True),
        dict(MASKED_LAST=False),  # the order before session 13 (masked blocks first)
        dict(MASKED_LAST=True, DV_EARLY=True),  # and dV issued before the wait for dP^T
        dict(ROTATE=True),  # and the unmasked run started at the key block's own query block
        dict(SECTION=4),  # session 17: heads innermost in sections (6 heads: 4 + a partial 2)
        dict(SECTION=2),
        dict(TAIL=4),  # two heads one after the other, then four together
        dict(DQ_CONVERT=True),  # session 18: dq converted by each head's last CTA
        dict(DQ_CONVERT=True, SECTION=2),
        dict(PERSIST=True),  # session 21: persistent CTAs (here fewer tiles than SMs)
        dict(ZERO_ACC=True),  # session 22: dQ_acc zeroed by the preprocessing kernel
        dict(ZERO_ACC=True, DQ_CONVERT=True),  # and the counters too
        dict(ZERO_ACC=True, DQ_TMA=False),  # dQ_acc of N rows a head, not padded
        dict(PDL=True),  # session 26: kernels launched while the one before them runs
        dict(PDL=True, ZERO_ACC=True),  # the zeros written by the kernel the main one waits on
        dict(PDL=True, DQ_TMA=False),  # the flat dq conversion
        dict(PDL=True, DQ_CONVERT=True),  # no conversion kernel after the main one
        dict(KEEP_ACC=True, DQ_CONVERT=True),  # session 31: dQ_acc kept zero, no fill
        dict(DQ_CONVERT=2),  # session 31: each query block converted by the CTA completing it
        dict(DQ_CONVERT=2, KEEP_ACC=True),
        dict(DQ_CONVERT=2, SECTION=4, PDL=True),
    ],  # fmt: skip
    ids=str,
)
def test_backward_batch_and_heads_are_separate(cfg):
    """B = 2, H = 3 at a ragged N: a wrong head/batch offset (or the next head's rows leaking
    through a ragged tail: the TMA descriptors span all heads) shows up here."""
    _check(2, 3, 333, 64, torch.float16, True, seed=5, **cfg)
    _check(2, 3, 333, 128, torch.bfloat16, False, seed=6, **cfg)


@pytest.mark.parametrize("d", [64, 128])
def test_zero_acc_needs_no_zeroed_memory(d):
    """ZERO_ACC (session 22): dQ_acc and DQ_CONVERT's counters come from torch.empty and are
    zeroed by the preprocessing kernel, so the NaN that ``_check`` leaves in freed memory (which
    the caching allocator hands out again) must not reach dq, nor stop the last CTA's
    conversion (a NaN's bits as a counter never reach the count), call after call."""
    for seed in (40, 41):
        _check(2, 3, 333, d, torch.float16, False, seed=seed + d, ZERO_ACC=True, DQ_CONVERT=True)
        _check(1, 2, 1000, d, torch.bfloat16, True, seed=seed, ZERO_ACC=True)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [64, 128])
def test_persist_over_many_tiles_matches_float64(d, causal):
    """PERSIST with several tiles a CTA (B x H x key blocks > the SMs): flash-attn's rule
    against float64, at a ragged N (the last key block of each head partial)."""
    _check(2, 8, 2000, d, torch.float16, causal, seed=21 + d, PERSIST=True)


@pytest.mark.parametrize(
    "shape", [(4, 32, 4096, 64, 1), (4, 16, 3000, 128, 1), (2, 16, 4096, 128, 4)]
)
@pytest.mark.parametrize("causal", [False, True])
def test_persist_gives_the_one_cta_a_tile_gradients(shape, causal):
    """At issue 23's sizes (thousands of tiles, a dozen or more a CTA) PERSIST computes each
    tile as the plain grid does: dk and dv bit for bit, dq (fp32 sums in another order) within
    4 ulps of its largest entry; with GQA (the last shape: 4 query heads a K/V head) as well."""
    B, H, N, d, group = shape
    q, k, v, do = _inputs(B, H, N, d, torch.bfloat16, seed=N + d)
    k, v = k[:, : H // group].contiguous(), v[:, : H // group].contiguous()
    o, lse = G.gluon_attention_forward(q, k, v, causal=causal)
    want = GB.gluon_attention_backward(do, q, k, v, o, lse, causal=causal)
    _poison(16 * q.numel() * q.element_size())
    got = GB.gluon_attention_backward(do, q, k, v, o, lse, causal=causal, PERSIST=True)
    assert torch.equal(got[1], want[1]) and torch.equal(got[2], want[2])
    ulp = torch.finfo(torch.bfloat16).eps * want[0].abs().max().item()
    assert (got[0].float() - want[0].float()).abs().max().item() <= 4 * ulp


@pytest.mark.parametrize(
    "shape", [(4, 16, 4096, 128, 1, 1024), (4, 16, 4096, 128, 1, None), (2, 32, 3000, 64, 4, None)]
)
def test_pdl_changes_no_bit_of_dk_dv(shape):
    """PDL (session 26): the main kernel launched while the preprocessing runs and the dq
    conversion while the main kernel runs, each waiting (griddepcontrol.wait) before it reads
    what the kernel before it writes. At issue 22's sizes (the window, causal; GQA, whose host
    sum sits between the main kernel and the conversion), five calls in a row over memory
    filled with NaN: a read of L, D or dQ_acc before its writer finished would give NaN or a
    changed bit; dK, dV must be the default's bit for bit, dq within 4 ulps (fp32 sums)."""
    B, H, N, d, group, left = shape
    q, k, v, do = _inputs(B, H, N, d, torch.float16, seed=N + d + group)
    k, v = k[:, : H // group].contiguous(), v[:, : H // group].contiguous()
    o, lse = G.gluon_attention_forward(q, k, v, causal=True, window_left=left)
    want = GB.gluon_attention_backward(do, q, k, v, o, lse, True, window_left=left, KEEP_ACC=False)
    ulp = torch.finfo(torch.float16).eps * want[0].abs().max().item()
    for zero_acc in (False, True, False, True, False):
        _poison(16 * q.numel() * q.element_size())
        got = GB.gluon_attention_backward(
            do, q, k, v, o, lse, True, window_left=left, PDL=True, ZERO_ACC=zero_acc
        )  # fmt: skip
        assert torch.equal(got[1], want[1]) and torch.equal(got[2], want[2]), zero_acc
        assert (got[0].float() - want[0].float()).abs().max().item() <= 4 * ulp, zero_acc


@pytest.mark.parametrize(
    "shape", [(4, 16, 4096, 128, True, 1024), (2, 16, 3000, 128, False, None),
              (2, 32, 4096, 64, True, None), (1, 8, 16384, 128, True, 4000)],
)  # fmt: skip
def test_dq_convert_by_blocks_gives_the_default_gradients(shape):
    """DQ_CONVERT = 2 (session 31): each query block's dq converted by the CTA whose count-in
    completes it (counters set to minus ``_visits`` by the preprocessing). At issue 22's sizes
    (window, non-causal ragged N, causal; many CTAs a block, blocks finishing in any order),
    three calls over memory filled with NaN: a block converted before its last reduce-add, or
    never, gives NaN or a moved value; dK, dV the default's bit for bit, dq within 4 ulps."""
    B, H, N, d, causal, left = shape
    q, k, v, do = _inputs(B, H, N, d, torch.bfloat16, seed=N + d + 31)
    o, lse = G.gluon_attention_forward(q, k, v, causal=causal, window_left=left)
    want = GB.gluon_attention_backward(
        do, q, k, v, o, lse, causal, window_left=left, KEEP_ACC=False
    )
    ulp = torch.finfo(torch.bfloat16).eps * want[0].abs().max().item()
    for _ in range(3):
        _poison(16 * q.numel() * q.element_size())
        got = GB.gluon_attention_backward(
            do, q, k, v, o, lse, causal, window_left=left, DQ_CONVERT=2
        )  # fmt: skip
        assert torch.equal(got[1], want[1]) and torch.equal(got[2], want[2])
        assert (got[0].float() - want[0].float()).abs().max().item() <= 4 * ulp


def _kept_buffers_zero():
    assert GB._KEPT, "KEEP_ACC kept no buffer"
    for key, buf in GB._KEPT.items():
        assert torch.count_nonzero(buf).item() == 0, f"KEEP_ACC's buffer {key} left non-zero"


@pytest.mark.parametrize("convert", [True, 2])
@pytest.mark.parametrize("d", [64, 128])
def test_keep_acc_leaves_its_buffer_zero_call_after_call(d, convert):
    """KEEP_ACC (session 31): dQ_acc and the counters come from a buffer kept between calls, not
    a fill; each head's last CTA clears its rows, padding included, so the buffer is zero after
    every call and the next call (another shape: its heads' rows fall where other heads' and
    padding rows were) starts from zeros. Calls of growing and shrinking size, ragged N, the
    window and plain causal rows, GQA: flash-attn's rule against float64 and an all-zero buffer
    after each; at a large window row dK, dV equal the default's bit for bit, dq within 4 ulps.
    Both conversions: each head's last CTA (True) and each query block's (2: the counters set by
    the preprocessing must come back to 0 as well)."""
    GB._KEPT.clear()
    for B, H, N, causal in ((2, 3, 333, False), (1, 2, 1000, True), (2, 3, 70, False)):
        _check(B, H, N, d, torch.float16, causal, seed=N + d, KEEP_ACC=True, DQ_CONVERT=convert)
        _kept_buffers_zero()
    q, k, v, do = _inputs(4, 16, 4096, d, torch.bfloat16, seed=31 + d)
    k, v = k[:, :4].contiguous(), v[:, :4].contiguous()  # GQA: 4 query heads a K/V head
    o, lse = G.gluon_attention_forward(q, k, v, causal=True, window_left=1024)
    want = GB.gluon_attention_backward(do, q, k, v, o, lse, True, window_left=1024, KEEP_ACC=False)
    ulp = torch.finfo(torch.bfloat16).eps * want[0].abs().max().item()
    for _ in range(3):
        _poison(16 * q.numel() * q.element_size())
        got = GB.gluon_attention_backward(
            do, q, k, v, o, lse, True, window_left=1024, KEEP_ACC=True, DQ_CONVERT=convert
        )  # fmt: skip
        assert torch.equal(got[1], want[1]) and torch.equal(got[2], want[2])
        assert (got[0].float() - want[0].float()).abs().max().item() <= 4 * ulp
        _kept_buffers_zero()


def test_release_kept_buffers_then_keep_acc_starts_again():
    """After a KEEP_ACC call, release_kept_buffers frees the kept buffer (its bytes: at least the
    call's dQ_acc) and the next KEEP_ACC call allocates a zeroed one and is right again."""
    GB._KEPT.clear()
    _check(2, 3, 333, 128, torch.float16, True, seed=32, KEEP_ACC=True, DQ_CONVERT=2)
    assert GB.release_kept_buffers() >= 2 * 3 * 333 * 128 * 4 and not GB._KEPT
    _check(2, 3, 333, 128, torch.float16, True, seed=33, KEEP_ACC=True, DQ_CONVERT=2)
    _kept_buffers_zero()


@pytest.mark.parametrize("convert", [True, 2])
def test_keep_acc_calls_from_two_threads_on_one_stream(convert):
    """Two host threads on the same stream, each calling the KEEP_ACC backward on its own shape
    (window rows, 12 calls each): their launches interleave on the host (one thread's
    preprocessing may be enqueued between the other's preprocessing and main kernel), yet every
    call gives the default's dK, dV bit for bit and its dq within 4 ulps, and the kept buffer is
    zero after both. (DQ_CONVERT = 2's counters are set by the preprocessing, so they must not
    live in the shared buffer.)"""
    import threading

    GB._KEPT.clear()
    cases = []
    for B, H, N, seed in ((1, 4, 1500, 41), (2, 3, 700, 42)):
        q, k, v, do = _inputs(B, H, N, 128, torch.float16, seed)
        o, lse = G.gluon_attention_forward(q, k, v, causal=True, window_left=256)
        want = GB.gluon_attention_backward(
            do, q, k, v, o, lse, True, window_left=256, KEEP_ACC=False
        )
        cases.append(((do, q, k, v, o, lse), want))
    torch.cuda.synchronize()
    bad = []

    def run(args, want):  # an exception in a thread is recorded, not lost
        ulp = torch.finfo(torch.float16).eps * want[0].abs().max().item()
        try:
            for _ in range(12):
                got = GB.gluon_attention_backward(
                    *args, True, window_left=256, KEEP_ACC=True, DQ_CONVERT=convert
                )  # fmt: skip
                ok = torch.equal(got[1], want[1]) and torch.equal(got[2], want[2])
                if not ok or (got[0].float() - want[0].float()).abs().max().item() > 4 * ulp:
                    bad.append(tuple(args[1].shape))
        except Exception as exc:  # noqa: BLE001
            bad.append(repr(exc))

    threads = [threading.Thread(target=run, args=case) for case in cases]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    torch.cuda.synchronize()
    assert not bad, f"{len(bad)} wrong or failed calls: {sorted(set(map(str, bad)))}"
    _kept_buffers_zero()


def test_dq_tma_with_128_query_rows():
    """DQ_TMA's [128, 32] staging tiles (d = 64 only: at d = 128 they do not fit)."""
    for causal in (False, True):
        _check(1, 2, 1000, 64, torch.float16, causal, seed=13, DQ_TMA=True, BM=128)


@pytest.mark.parametrize(
    "cfg",
    [
        dict(NUM_CONSUMERS=1, DQ_SHARED=False),
        dict(DQ_SHARED=False),
        dict(STAGES=3),
        dict(STAGES=1),
        dict(BM=128),
        dict(DQ_SPLIT=1),
        dict(DQ_SPLIT=2),
        dict(DQ_SPLIT=4, DQ_SHARED=False),
        # session 9's dQ switches (notes/gluon_backward.md)
        dict(DQ_VEC=4),
        dict(DQ_SHARED=True),
        dict(DQ_SHARED=True, DQ_VEC=4),
        dict(DQ_SHARED=True, DQ_SPLIT=1),
        dict(BM=128, DQ_SHARED=True, DQ_VEC=4),
        # session 9, lever (b): OVERLAP_DQ (notes/gluon_backward.md)
        dict(OVERLAP_DQ=True),
        dict(OVERLAP_DQ=True, DQ_VEC=4),
        dict(OVERLAP_DQ=True, DQ_SPLIT=1),
        dict(OVERLAP_DQ=True, STAGES=1),
        # session 12: dQ through shared memory and a TMA reduce-add (DQ_TMA)
        dict(DQ_TMA=True),
        dict(DQ_TMA=True, OVERLAP_DQ=True),
        dict(DQ_TMA=True, OVERLAP_DQ=False),
        dict(DQ_TMA=False),  # the atomics of sessions 9-11 (DQ_TMA is the default since 12)
        dict(DQ_TMA=True, STAGES=1),
        # session 13: the unmasked query blocks first (ring order changed in both roles), now
        # the default; the order before it
        dict(MASKED_LAST=False),
        dict(MASKED_LAST=True, STAGES=1),
        dict(MASKED_LAST=True, DQ_TMA=False),
        dict(MASKED_LAST=True, DQ_SHARED=False),
        dict(DV_EARLY=True, MASKED_LAST=False),
        dict(DV_EARLY=True, MASKED_LAST=True),
        dict(DV_EARLY=True, DQ_TMA=False, STAGES=1),
        dict(MASKED_LAST=True, OVERLAP_DQ=True),
        dict(ROTATE=True),
        dict(ROTATE=True, STAGES=1),
        dict(ROTATE=True, DQ_TMA=False),
        # session 18: dq converted inside the kernel (DQ_CONVERT; on for non-causal d = 128)
        dict(DQ_CONVERT=True),
        dict(DQ_CONVERT=True, STAGES=1),
        # session 21: persistent CTAs (PERSIST; timed in session 22, off)
        dict(PERSIST=True),
        dict(PERSIST=True, STAGES=1),
        # session 22: dQ_acc zeroed by the preprocessing kernel (ZERO_ACC), not yet run on a GPU
        dict(ZERO_ACC=True),
        dict(ZERO_ACC=True, DQ_TMA=False),
        # session 24: masked steps chosen per consumer warpgroup (WG_MASK), not yet run on a GPU
        dict(WG_MASK=True),
        dict(WG_MASK=True, BM=64),
        dict(WG_MASK=True, STAGES=1),
        dict(WG_MASK=True, DQ_TMA=False),
        dict(WG_MASK=True, DQ_SHARED=False),
        # session 26: programmatic dependent launch (PDL), not yet run on a GPU
        dict(PDL=True),
        dict(PDL=True, ZERO_ACC=True, STAGES=1),
        # session 25: WG_MASK = 2, the masked runs cut per warpgroup, not yet run on a GPU
        dict(WG_MASK=2),
        dict(WG_MASK=2, BM=64),
        dict(WG_MASK=2, STAGES=1),
        dict(WG_MASK=2, DQ_TMA=False),
        dict(WG_MASK=2, PERSIST=True),
    ],
    ids=str,
)
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_backward_schedule_variants_are_correct(cfg, d, causal):
    _check(1, 2, 1000, d, torch.float16, causal, seed=11, **cfg)
    _check(1, 2, 17, d, torch.float16, causal, seed=12, **cfg)


# ------------------------------------------- session 10: flash_attention's auto backward
def _auto_backward(monkeypatch, q, k, v, do, causal):
    """dq, dk, dv of ``flash_attention`` with the backward choice on "auto", and how many times
    the Gluon backward ran."""
    from course_kernels.triton import launch
    from course_kernels.triton.flash import flash_attention

    monkeypatch.delenv(launch.BACKWARD_ENV, raising=False)
    calls = []
    real = launch.gluon_attention_backward
    monkeypatch.setattr(
        launch, "gluon_attention_backward", lambda *a, **kw: calls.append(1) or real(*a, **kw)
    )
    xs = [x.detach().requires_grad_() for x in (q, k, v)]
    out = flash_attention(*xs, causal=causal)
    return torch.autograd.grad(out, xs, do), len(calls)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [64, 128])
def test_auto_backward_takes_gluon_and_passes_the_rule(monkeypatch, causal, d):
    """At d = 64 and (since session 12's DQ_TMA) d = 128, with enough work (B * H * N^2 * d =
    2**36, GLUON_MIN_WORK) ``auto`` runs the Gluon backward (GLUON_BACKWARD_AUTO), and its
    gradients pass flash-attn's 2x rule; a head dim taken out of the tuple keeps tl."""
    B, H, N = 4 if d == 64 else 2, 16, 4096  # B * H * N^2 * d = 2**36; the float64 P: 8.6 GB
    q, k, v, do = _inputs(B, H, N, d, torch.float16, seed=21 + d)
    got, calls = _auto_backward(monkeypatch, q, k, v, do, causal)
    assert calls == 1
    scale = 1.0 / math.sqrt(d)
    ref = attention_grads(q, k, v, do, causal, scale, True)
    sdpa = attention_grads(q, k, v, do, causal, scale, False)
    for name, g, r, s in zip(("dq", "dk", "dv"), got, ref, sdpa, strict=True):
        err, lim = (g.double() - r).abs().max().item(), fa_rule.budget(s, r, torch.float16)
        assert err <= lim, f"{name} error {err:.3e} > flash-attn's budget {lim:.3e}"
    del ref, sdpa
    from course_kernels.triton import launch

    monkeypatch.setattr(launch, "GLUON_BACKWARD_AUTO", ())
    _, calls = _auto_backward(monkeypatch, q, k, v, do, causal)
    assert calls == 0


def test_deterministic_mode_keeps_the_bitwise_tl_backward(monkeypatch):
    """Under torch.use_deterministic_algorithms(True) ``auto`` never takes the Gluon backward
    (its dQ atomics are not bit-reproducible), and two backwards agree bit for bit."""
    q, k, v, do = _inputs(4, 16, 4096, 64, torch.float16, seed=23)
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        first, calls1 = _auto_backward(monkeypatch, q, k, v, do, True)
        second, calls2 = _auto_backward(monkeypatch, q, k, v, do, True)
    finally:
        torch.use_deterministic_algorithms(was)
    assert calls1 == calls2 == 0
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_dq_tma_matches_the_atomics_over_many_heads(d, causal):
    """DQ_TMA adds the same fp32 partials as the atomics, through TMA reductions into a dQ_acc
    padded per head (rows past N land in the head's own padding): over B * H = 12 heads of a
    ragged N, dq agrees with the atomic path's to fp32 summation order, and dk, dv are the same
    bits (DQ_TMA does not touch them)."""
    q, k, v, do = _inputs(2, 6, 1337, d, torch.float16, 21)
    o, lse = G.gluon_attention_forward(q, k, v, causal=causal)
    want = GB.gluon_attention_backward(do, q, k, v, o, lse, causal=causal, DQ_TMA=False)
    _poison(16 * q.numel() * q.element_size())
    got = GB.gluon_attention_backward(do, q, k, v, o, lse, causal=causal, DQ_TMA=True)
    assert torch.equal(got[1], want[1]) and torch.equal(got[2], want[2])
    tol = 2 * 2**-10 * want[0].abs().max().item()  # fp32 sums in another order, then one rounding
    assert (got[0].float() - want[0].float()).abs().max().item() <= tol


# ------------------------------------------- session 14: the causal sliding window (WINDOW)
def _window_grads(q, k, v, do, scale, left, f64):
    """dq, dk, dv with row i seeing keys [i - left, i]: float64 autograd with the boolean mask,
    or SDPA with it in the inputs' dtype (the naive side of flash-attn's 2x rule)."""
    n = q.shape[2]
    i = torch.arange(n, device=q.device)[:, None]
    j = torch.arange(n, device=q.device)[None, :]
    keep = (j <= i) & (j >= i - left)
    xs = [x.detach().to(torch.float64 if f64 else x.dtype).requires_grad_() for x in (q, k, v)]
    if f64:
        s = (xs[0] @ xs[1].transpose(-1, -2) * scale).masked_fill(~keep, float("-inf"))
        o = torch.softmax(s, -1) @ xs[2]
    else:
        o = torch.nn.functional.scaled_dot_product_attention(*xs, attn_mask=keep, scale=scale)
    return torch.autograd.grad(o, xs, do.to(o.dtype))


@pytest.mark.parametrize("masked_last", [True, False])
@pytest.mark.parametrize("left", [1, 37, 63, 64, 65, 127, 300, 1023])
@pytest.mark.parametrize("N", [17, 1000, 2053])
@pytest.mark.parametrize("d", [64, 128])
def test_window_backward_matches_float64(left, N, d, masked_last):
    """The Gluon backward with a causal sliding window (WINDOW): each key block visits only the
    query blocks that see one of its keys, the unmasked middle first (MASKED_LAST) or in block
    order, both window edges masked; flash-attn's 2x rule against float64, with the forward's
    own o and lse. The message carries every error (session 12's one failure was cut)."""
    q, k, v, do = _inputs(1, 2, N, d, torch.float16, seed=1000 * left + N + d)
    scale = 1.0 / math.sqrt(d)
    ref = _window_grads(q, k, v, do, scale, left, True)
    sdpa = _window_grads(q, k, v, do, scale, left, False)
    o, lse = G.gluon_attention_forward(q, k, v, causal=True, scale=scale, window_left=left)
    _poison(16 * q.numel() * q.element_size())
    got = GB.gluon_attention_backward(
        do, q, k, v, o, lse, True, scale, window_left=left, MASKED_LAST=masked_last
    )
    errs = {}
    for name, g, r, s in zip(("dq", "dk", "dv"), got, ref, sdpa, strict=True):
        assert torch.isfinite(g).all(), f"NaN/inf in {name} (unwritten rows?)"
        errs[name] = ((g.double() - r).abs().max().item(), fa_rule.budget(s, r, torch.float16))
    assert all(e <= lim for e, lim in errs.values()), errs


@pytest.mark.parametrize("persist", [False, True], ids=["grid", "persist"])
def test_window_backward_batch_heads_and_wide_windows(persist):
    """B = 2, H = 3 (head offsets), a ragged N, and windows that reach past the start (left >=
    N - 1: plain causal) or only just: each passes the 2x rule on every head; also with the
    CTAs persistent (PERSIST, session 21)."""
    for left in (200, 1332, 5000):
        q, k, v, do = _inputs(2, 3, 1333, 64, torch.bfloat16, seed=left)
        scale = 0.125
        ref = _window_grads(q, k, v, do, scale, left, True)
        sdpa = _window_grads(q, k, v, do, scale, left, False)
        o, lse = G.gluon_attention_forward(q, k, v, causal=True, scale=scale, window_left=left)
        got = GB.gluon_attention_backward(
            do, q, k, v, o, lse, True, scale, window_left=left, PERSIST=persist
        )  # fmt: skip
        for g, r, s in zip(got, ref, sdpa, strict=True):
            err, lim = (g.double() - r).abs().max().item(), fa_rule.budget(s, r, torch.bfloat16)
            assert err <= lim, (left, err, lim)


@pytest.mark.parametrize("d", [64, 128])
def test_flash_attention_runs_window_backwards_on_the_gluon_kernel(monkeypatch, d):
    """``window_size=(left, 0)``, left >= 1, takes the Gluon backward where
    GLUON_MASKED_BACKWARD["window"] lists d (set here), not under ``triton``, with gradients close to
    the tl backward's."""
    from course_kernels.triton import launch
    from course_kernels.triton.flash import flash_attention

    q, k, v, do = _inputs(2, 3, 1333, d, torch.float16, seed=31)
    monkeypatch.setattr(launch, "GLUON_MIN_WORK", 0)
    monkeypatch.setitem(launch.GLUON_MASKED_BACKWARD, "window", (d,))
    grads, calls = {}, []
    real = launch.gluon_attention_backward
    monkeypatch.setattr(
        launch, "gluon_attention_backward", lambda *a, **kw: calls.append(kw) or real(*a, **kw)
    )
    for choice in ("auto", "triton"):
        monkeypatch.setenv(launch.BACKWARD_ENV, choice)
        xs = [x.detach().requires_grad_() for x in (q, k, v)]
        out = flash_attention(*xs, causal=True, window_size=(200, 0))
        grads[choice] = torch.autograd.grad(out, xs, do)
        assert len(calls) == 1 and calls[0]["window_left"] == 200  # only "auto" took it
    for a, b in zip(grads["auto"], grads["triton"], strict=True):
        assert (a.double() - b.double()).abs().max().item() <= 4 * 2**-8 * b.abs().max().item()


# ------------------------------------------- session 14: packed causal documents (DOCS)
def _doc_mask(cu, n, device):
    end = torch.repeat_interleave(cu[1:], cu.diff(), output_size=n).to(device)
    i = torch.arange(n, device=device)[:, None]
    j = torch.arange(n, device=device)[None, :]
    return (j <= i) & (i < end[None, :])  # key j seen by query i: same document, j <= i


def _check_documents_backward(lengths, d, dtype, n_seed, **schedule):
    """gluon_varlen_backward (``schedule``: packed, BM, ...) on causal documents of ``lengths``,
    H = 2, on the tl varlen forward's o and lse: flash-attn's 2x rule against float64 with the
    block-diagonal causal mask for each of dq, dk, dv, every error in the message."""
    from course_kernels.triton.varlen import flash_attention_varlen

    n = sum(lengths)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], device="cuda").int()
    q, k, v, do = _inputs(1, 2, n, d, dtype, seed=n_seed)
    scale = 1.0 / math.sqrt(d)
    keep = _doc_mask(cu, n, "cuda")
    xs = [x.detach().double().requires_grad_() for x in (q, k, v)]
    s = (xs[0] @ xs[1].transpose(-1, -2) * scale).masked_fill(~keep, float("-inf"))
    ref = torch.autograd.grad(torch.softmax(s, -1) @ xs[2], xs, do.double())
    ys = [x.detach().requires_grad_() for x in (q, k, v)]
    o_sdpa = torch.nn.functional.scaled_dot_product_attention(*ys, attn_mask=keep, scale=scale)
    sdpa = torch.autograd.grad(o_sdpa, ys, do)
    qp, kp, vp, dop = (x[0].transpose(0, 1).contiguous() for x in (q, k, v, do))  # (n, H, d)
    m = max(lengths)
    o, lse = flash_attention_varlen(qp, kp, vp, cu, cu, m, m, True, scale, True)
    _poison(16 * q.numel() * q.element_size())
    got = GB.gluon_varlen_backward(dop, qp, kp, vp, o, lse, cu, scale, **schedule)
    errs = {}
    for name, g, r, s_ in zip(("dq", "dk", "dv"), got, ref, sdpa, strict=True):
        assert g.shape == qp.shape and torch.isfinite(g).all(), f"{name}: shape or NaN/inf"
        g = g.transpose(0, 1).unsqueeze(0)
        errs[name] = ((g.double() - r).abs().max().item(), fa_rule.budget(s_, r, dtype))
    assert all(e <= lim for e, lim in errs.values()), errs


@pytest.mark.parametrize(
    "schedule",
    [
        dict(packed=True),
        dict(packed=False),
        dict(packed=True, MASKED_LAST=False),
        dict(packed=True, SECTION=2),  # session 17's CTA order (packed: the epilogue's rows)
        dict(packed=False, SECTION=4),  # a section wider than the two heads
        dict(packed=True, TAIL=2),
        dict(packed=True, DQ_CONVERT=True),  # session 18: PACKED dq rows from the converter
        dict(packed=True, PERSIST=True),  # session 21: persistent CTAs, packed rows
        dict(packed=True, ZERO_ACC=True, DQ_CONVERT=True),  # session 22
        dict(packed=True, WG_MASK=True),  # session 24: masked steps per consumer warpgroup
        dict(packed=False, WG_MASK=True, SECTION=8),
        dict(packed=True, WG_MASK=2),  # session 25: the masked runs cut per warpgroup
        dict(packed=False, WG_MASK=2, SECTION=4),
        dict(packed=True, PDL=True),  # session 26: programmatic dependent launch
        dict(packed=False, PDL=True, ZERO_ACC=True),
        dict(packed=True, KEEP_ACC=True, DQ_CONVERT=True),  # session 31
        dict(packed=True, DQ_CONVERT=2),
        dict(packed=False, DQ_CONVERT=2, KEEP_ACC=True),
    ],
    ids=str,
)
@pytest.mark.parametrize(
    "lengths", [[17], [1, 1, 1], [64, 64], [100, 1, 300, 77], [1000, 24, 1029], [5, 2048]]
)
@pytest.mark.parametrize("d", [64, 128])
def test_documents_backward_matches_float64(lengths, d, schedule):
    """The Gluon backward with packed causal documents (DOCS), through gluon_varlen_backward on
    flash-attn's (total, H, d) layout, read in place (PACKED) or copied: flash-attn's 2x rule
    against float64 with the block-diagonal causal mask, on the tl varlen forward's o and lse
    (what flash_attention_varlen hands it), every error in the message."""
    _check_documents_backward(lengths, d, torch.float16, n_seed=sum(lengths) + d, **schedule)


@pytest.mark.parametrize("d", [64, 128])
def test_flash_attention_varlen_runs_documents_on_the_gluon_backward(gluon_documents, d):
    """flash_attention_varlen with one cu_seqlens for queries and keys, causal, takes the Gluon
    backward where GLUON_MASKED_BACKWARD["documents"] lists d (set here), with gradients close
    to the tl backward's (``triton``)."""
    lengths = [700, 3, 1500, 1]
    n = sum(lengths)
    cu = torch.tensor(
        [0, *torch.tensor(lengths).cumsum(0).tolist()], device="cuda", dtype=torch.int32
    )
    g = torch.Generator(device="cuda").manual_seed(d)
    q, k, v, do = (torch.randn(n, 4, d, device="cuda", dtype=torch.bfloat16, generator=g)
                   for _ in range(4))  # fmt: skip
    res = gluon_documents("backward", d, q, k, v, cu, max(lengths), do)
    for a, b in zip(res["auto"][1:], res["triton"][1:], strict=True):
        assert a.shape == b.shape
        assert (a.double() - b.double()).abs().max().item() <= 4 * 2**-7 * b.abs().max().item()


@pytest.mark.parametrize("left", [1, 63, 64, 65, 127, 128, 129, 300, 1023])
@pytest.mark.parametrize("N", [17, 129, 1000, 2053])
def test_window_backward_with_128_row_query_blocks(left, N):
    """Session 23: BM = 128 at d = 64 under a causal window, the schedule measured +0.8 to +5.9%
    before it becomes the default for windows: window edges one row either side of a block
    boundary of 64 and 128, N below, at and past a 128-row block; flash-attn's 2x rule."""
    q, k, v, do = _inputs(1, 2, N, 64, torch.float16, seed=7 * left + N)
    scale = 0.125
    ref = _window_grads(q, k, v, do, scale, left, True)
    sdpa = _window_grads(q, k, v, do, scale, left, False)
    o, lse = G.gluon_attention_forward(q, k, v, causal=True, scale=scale, window_left=left)
    _poison(16 * q.numel() * q.element_size())
    got = GB.gluon_attention_backward(do, q, k, v, o, lse, True, scale, window_left=left, BM=128)
    errs = {}
    for name, g, r, s in zip(("dq", "dk", "dv"), got, ref, sdpa, strict=True):
        assert torch.isfinite(g).all(), f"NaN/inf in {name} (unwritten rows?)"
        errs[name] = ((g.double() - r).abs().max().item(), fa_rule.budget(s, r, torch.float16))
    assert all(e <= lim for e, lim in errs.values()), errs


@pytest.mark.parametrize("packed", [True, False])
@pytest.mark.parametrize(
    "lengths", [[17], [1, 1, 1], [128, 128], [100, 1, 300, 129], [1000, 24, 1029]]
)
def test_documents_backward_with_128_row_query_blocks(lengths, packed):
    """Session 23: BM = 128 at d = 64 on packed causal documents (lengths below, at and past a
    128-row block, one-token documents), read in place or copied: flash-attn's 2x rule against
    float64 with the block-diagonal causal mask."""
    _check_documents_backward(
        lengths, 64, torch.bfloat16, n_seed=sum(lengths), packed=packed, BM=128
    )


@pytest.mark.parametrize("d", [64, 128])
def test_documents_cta_order_changes_only_the_dq_summation_order(d):
    """Session 17: the documents backward's default CTA order (BACKWARD_SECTION: sections of 8
    heads at d = 64, of 4 at d = 128 since session 24; here 12 heads: full sections and, at
    d = 64, a partial one) against the plain grid on the
    same inputs: dk and dv bit for bit (a CTA's own sums do not depend on when it runs), dq
    within a few fp16 ulps (only its fp32 adds change order). A CTA given the wrong head or key
    block changes dk or dv."""
    from course_kernels.triton.varlen import flash_attention_varlen

    assert GB.BACKWARD_SECTION["documents"] == {64: 8, 128: 4}
    lengths = [700, 1, 300, 1100, 77]
    n, cu = sum(lengths), torch.tensor([0, 700, 701, 1001, 2101, 2178], device="cuda").int()
    q, k, v, do = (
        x[0].transpose(0, 1).contiguous() for x in _inputs(1, 12, n, d, torch.float16, 7)
    )
    o, lse = flash_attention_varlen(q, k, v, cu, cu, 1100, 1100, True, None, True)
    plain = GB.gluon_varlen_backward(do, q, k, v, o, lse, cu, None, SECTION=0)
    default = GB.gluon_varlen_backward(do, q, k, v, o, lse, cu, None)
    assert torch.equal(plain[1], default[1]) and torch.equal(plain[2], default[2])
    tol = 4 * 2**-10 * plain[0].abs().max().item()
    assert (plain[0].float() - default[0].float()).abs().max().item() <= tol


# ------------------------------------- session 19: GQA (GROUP query heads share a K/V head)
def _gqa_grads(q, k, v, do, scale, keep, f64):
    """dq, dk, dv when query head h reads K/V head h // (H // H_kv) (SDPA's ``enable_gqa``),
    ``keep`` a boolean (N, N) mask or None: float64 autograd through K/V repeated per query head
    (so their gradients sum over the group), or SDPA in the inputs' dtype."""
    g = q.shape[1] // k.shape[1]
    xs = [x.detach().to(torch.float64 if f64 else x.dtype).requires_grad_() for x in (q, k, v)]
    if f64:
        kr, vr = (x.repeat_interleave(g, dim=1) for x in xs[1:])
        s = xs[0] @ kr.transpose(-1, -2) * scale
        o = torch.softmax(s if keep is None else s.masked_fill(~keep, float("-inf")), -1) @ vr
    else:
        o = torch.nn.functional.scaled_dot_product_attention(
            *xs, attn_mask=keep, scale=scale, enable_gqa=True
        )
    return torch.autograd.grad(o, xs, do.to(o.dtype))


def _gqa_inputs(B, H, H_kv, N, d, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q, do = (torch.randn(B, H, N, d, device="cuda", dtype=dtype, generator=g) for _ in range(2))
    k, v = (torch.randn(B, H_kv, N, d, device="cuda", dtype=dtype, generator=g) for _ in range(2))
    return q, k, v, do


def _assert_rule(got, ref, sdpa, dtype, shapes):
    errs = {}
    for name, g, r, s, shape in zip(("dq", "dk", "dv"), got, ref, sdpa, shapes, strict=True):
        assert g.shape == shape and g.dtype == dtype, (name, g.shape, g.dtype)
        assert torch.isfinite(g).all(), f"NaN/inf in {name} (unwritten rows?)"
        errs[name] = ((g.double() - r).abs().max().item(), fa_rule.budget(s, r, dtype))
    assert all(e <= lim for e, lim in errs.values()), errs


@pytest.mark.parametrize("mask", ["full", "causal", "window"])
@pytest.mark.parametrize("heads", [(4, 2), (8, 1), (6, 3)], ids=lambda h: "H{}Hkv{}".format(*h))
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_gqa_backward_matches_float64(mask, heads, d, dtype):
    """GQA and MQA in the Gluon backward (GROUP): K/V read from head hz // GROUP, dK and dV
    written per query head and summed over each group on the host; flash-attn's 2x rule against
    float64 for every gradient, dk and dv in k's shape; two batch entries (hz = b H + h)."""
    H, H_kv = heads
    dt, N, left = getattr(torch, dtype), 1000, 300 if mask == "window" else None
    q, k, v, do = _gqa_inputs(2, H, H_kv, N, d, dt, seed=fa_rule.seed(mask, heads, d, dtype))
    scale = 1.0 / math.sqrt(d)
    i = torch.arange(N, device="cuda")[:, None]
    j = torch.arange(N, device="cuda")[None, :]
    keep = {"full": None, "causal": j <= i, "window": (j <= i) & (j >= i - 300)}[mask]
    ref = _gqa_grads(q, k, v, do, scale, keep, True)
    sdpa = _gqa_grads(q, k, v, do, scale, keep, False)
    causal = mask != "full"
    o, lse = G.gluon_attention_forward(q, k, v, causal=causal, scale=scale, window_left=left)
    _poison(16 * q.numel() * q.element_size())
    got = GB.gluon_attention_backward(do, q, k, v, o, lse, causal, scale, window_left=left)
    _assert_rule(got, ref, sdpa, dt, (q.shape, k.shape, v.shape))


@pytest.mark.parametrize("packed", [True, False])
@pytest.mark.parametrize("lengths", [[100, 1, 300, 77], [1000, 24, 1029]])
@pytest.mark.parametrize("d", [64, 128])
def test_gqa_documents_backward_matches_float64(lengths, d, packed):
    """GQA with packed causal documents (gluon_varlen_backward, flash-attn's (total, heads, d)
    layout with fewer K/V heads, in place or copied): flash-attn's 2x rule against float64."""
    from course_kernels.triton.varlen import flash_attention_varlen

    n = sum(lengths)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], device="cuda").int()
    q, k, v, do = _gqa_inputs(1, 4, 2, n, d, torch.float16, seed=fa_rule.seed(lengths, d))
    scale = 1.0 / math.sqrt(d)
    keep = _doc_mask(cu, n, "cuda")
    ref = _gqa_grads(q, k, v, do, scale, keep, True)
    sdpa = _gqa_grads(q, k, v, do, scale, keep, False)
    qp, kp, vp, dop = (x[0].transpose(0, 1).contiguous() for x in (q, k, v, do))  # (n, H, d)
    m = max(lengths)
    o, lse = flash_attention_varlen(qp, kp, vp, cu, cu, m, m, True, scale, True)
    _poison(16 * q.numel() * q.element_size())
    got = GB.gluon_varlen_backward(dop, qp, kp, vp, o, lse, cu, scale, packed=packed)
    got = [g.transpose(0, 1).unsqueeze(0) for g in got]  # back to (1, heads, n, d)
    _assert_rule(got, ref, sdpa, torch.float16, (q.shape, k.shape, v.shape))


@pytest.mark.parametrize("causal", [False, True])
def test_flash_attention_runs_gqa_backwards_on_gluon_only_when_asked(monkeypatch, causal):
    """``auto`` takes the Gluon backward for GQA exactly when GLUON_BACKWARD_GQA is on (since
    session 20's timing); ``$COURSE_KERNELS_BACKWARD=gluon`` takes it either way; the gradients
    pass flash-attn's rule against float64 on every path."""
    from course_kernels.triton import launch
    from course_kernels.triton.flash import flash_attention

    q, k, v, do = _gqa_inputs(1, 8, 2, 2048, 128, torch.float16, seed=191 + causal)
    scale = 1.0 / math.sqrt(128)
    keep = torch.ones(2048, 2048, dtype=torch.bool, device="cuda").tril() if causal else None
    ref = _gqa_grads(q, k, v, do, scale, keep, True)
    sdpa = _gqa_grads(q, k, v, do, scale, keep, False)
    calls = []
    real = launch.gluon_attention_backward
    monkeypatch.setattr(
        launch, "gluon_attention_backward", lambda *a, **kw: calls.append(1) or real(*a, **kw)
    )
    monkeypatch.setattr(launch, "_gluon_pays", lambda q, k: True)
    for env, switch, want in (("auto", False, 0), ("gluon", False, 1), ("auto", True, 1)):
        monkeypatch.setenv(launch.BACKWARD_ENV, env)
        monkeypatch.setattr(launch, "GLUON_BACKWARD_GQA", switch)
        calls.clear()
        xs = [x.detach().requires_grad_() for x in (q, k, v)]
        got = torch.autograd.grad(flash_attention(*xs, causal=causal, scale=scale), xs, do)
        assert len(calls) == want, (env, switch, calls)
        _assert_rule(got, ref, sdpa, torch.float16, (q.shape, k.shape, v.shape))


# ------------------------------------- session 24: WG_MASK, masked steps per consumer warpgroup
@pytest.mark.parametrize("left", [None, 1, 63, 64, 65, 127, 300, 1023])
@pytest.mark.parametrize("N", [17, 129, 1000, 2053])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("wg", [True, 2])  # session 25: 2, the masked runs cut per warpgroup
def test_wg_mask_changes_no_bit_of_dk_dv(left, N, d, wg):
    """WG_MASK against the default on the same inputs, causal (left None) or under a window: a
    warpgroup whose keys no row of the block sees skips its wgmmas (its P and dS would be exactly
    0) and one whose keys every row sees skips the mask (it would keep every pair), so dK and dV
    must be bit for bit the default's and dQ within a few ulps (the dS exchange adds the same
    terms); both against float64 by flash-attn's rule. A wrong dead/full test (an edge off by
    one row or key) changes dK or dV."""
    q, k, v, do = _inputs(1, 3, N, d, torch.float16, seed=3 * N + d + (left or 0))
    scale = 1.0 / math.sqrt(d)
    o, lse = G.gluon_attention_forward(q, k, v, causal=True, scale=scale, window_left=left)
    base = GB.gluon_attention_backward(do, q, k, v, o, lse, True, scale, window_left=left)
    for bm in (64, 128) if d == 64 else (64,):
        got = GB.gluon_attention_backward(
            do, q, k, v, o, lse, True, scale, window_left=left, WG_MASK=wg, BM=bm
        )  # fmt: skip
        if bm == GB.BACKWARD_BM.get(d, 64):
            assert torch.equal(got[1], base[1]) and torch.equal(got[2], base[2]), (bm, "dk/dv bits")
            tol = 4 * 2**-10 * base[0].abs().max().item()
            assert (got[0].float() - base[0].float()).abs().max().item() <= tol
        reach = N if left is None else left  # a window of N keys is plain causal
        ref = _window_grads(q, k, v, do, scale, reach, True)
        sdpa = _window_grads(q, k, v, do, scale, reach, False)
        errs = {}
        for name, g, r, s_ in zip(("dq", "dk", "dv"), got, ref, sdpa, strict=True):
            assert torch.isfinite(g).all(), f"NaN/inf in {name}"
            errs[name] = ((g.double() - r).abs().max().item(), fa_rule.budget(s_, r, torch.float16))
        assert all(e <= lim for e, lim in errs.values()), (bm, errs)
