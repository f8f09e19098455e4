"""The backward kernels' tail peeling (``PEEL``, session 9, notes/kernel.md) and
experiments/hopper/bwd_variants.py, in Triton's interpreter.

With ``PEEL`` (the package launches the dK/dV kernel with it, session 10) the dK/dV and dQ kernels put bounds
masks only on the block that can cross a sequence's end (the loops' tail step; with ``ONE_LOOP``
the dK/dV kernel's tail runs after its single loop as straight-line code); the reference is the
session-8 kernel, three loops, every load masked. Their gradients must agree bit for bit
on every shape: dense lengths that are and are not multiples of the blocks, causal or not, sliding
windows, soft cap, GQA, Nq != Nk in both alignments, packed documents of ragged lengths. A peel
that drops or repeats the tail step, or that leaves a crossing block unmasked, changes them (the
rows it forgets, or the neighbour document's rows it reads as its own). Session 8's
``EVEN_BLOCKS`` (the launch's promise, for dense lengths that are multiples of every block, that
there is no tail: the tail step is not compiled) is bitwise the same where the promise holds."""

from __future__ import annotations

import importlib.util
import inspect
import itertools
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")

from course_kernels.triton import _env as _triton_env  # noqa: E402
from course_kernels.triton import launch  # noqa: E402
from course_kernels.triton.masks import (  # noqa: E402
    BIG,
    CAUSAL,
    PLAIN,
    Variant,
    key_blocks,
    query_blocks,
    step_ranges,
)

SCRIPT = Path(__file__).resolve().parents[1] / "experiments" / "hopper" / "bwd_variants.py"
spec = importlib.util.spec_from_file_location("bwd_variants", SCRIPT)
bv = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bv)

MASKED = {}  # bwd_variants.OFF: three loops, every load masked (session 8)
PEELED = {"ONE_LOOP": True, "PEEL": True}  # the single dK/dV loop, its tail after it; dQ peeled


EVEN = {"EVEN_BLOCKS": True}


def _run(case, switches, lengths=None):
    tensors = bv.make_case(case, True, "cpu", torch.float32, seed=3)
    if lengths is not None:  # other document lengths (packed varlen)
        q, k, v, do, variant, _ = tensors
        cu = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32)
        n = sum(lengths)
        tensors = (q[:n], k[:n], v[:n], do[:n], variant, (cu, cu, max(lengths), max(lengths)))
    prep = bv.prepare(tensors)
    return tensors, prep, bv.backward(tensors, prep, bv.CPU_DKDV, bv.CPU_DQ, switches)


def _blocks(ranges, block):
    """(block start, step) in visiting order."""
    return [(s, i) for i, (a, b) in enumerate(ranges) for s in range(a, b, block)]


@pytest.mark.parametrize("kind", ["keys", "queries"])
def test_peeled_steps_visit_the_same_blocks_and_only_the_tail_crosses(kind):
    """masks.step_ranges (the arithmetic of _step_range): the same blocks in the same order as
    the three unpeeled steps; every block of steps 0-2 inside [0, n); step 3 at most one block,
    and only where n is not a multiple. Over all small shapes and windows."""
    split = key_blocks if kind == "keys" else query_blocks
    windows = [(-BIG, BIG), (-BIG, 0), (-5, 0), (-20, 3), (0, 7), (-3, 3), (2, 9), (-40, -17)]
    for (bm, bn), n, n_other, (wl, wh) in itertools.product(
        [(16, 32), (32, 16), (16, 16)], range(1, 70, 3), (1, 16, 37, 64), windows
    ):
        for diag in (0, n - n_other):
            for start in range(0, n_other, bm):
                lo, full_lo, full_hi, hi = split(start, n, diag + wl, diag + wh, bm, bn)
                old = step_ranges(lo, full_lo, full_hi, hi, n, bn, peel=False)
                new = step_ranges(lo, full_lo, full_hi, hi, n, bn)
                old_b, new_b = _blocks(old, bn), _blocks(new, bn)
                assert [s for s, _ in new_b] == [s for s, _ in old_b]
                assert all(s + bn <= n for s, i in new_b if i < 3)
                tail = [s for s, i in new_b if i == 3]
                assert len(tail) <= 1 and (not tail or (tail[0] + bn > n and n % bn))
                # step 3 revisits nothing the masked steps skipped, and loses no window mask:
                # its block was in a masked step or (dK/dV) in the middle, never elsewhere
                assert all(old_b[-1][0] == t for t in tail)


# ---- the kernels, peeled against all-masked -------------------------------------------------

if _triton_env.device_kind() != "cpu":  # the GPU run is the script itself
    pytest.skip("interpreter checks (CPU)", allow_module_level=True)

# (BLOCK_M1, BLOCK_N1, ...), (BLOCK_N2, BLOCK_M2, ...): "b" swaps the loop and program blocks
TILES = {"a": (bv.CPU_DKDV, bv.CPU_DQ), "b": ((32, 16, 4, 1), (32, 16, 4, 1))}
TILE_B = ("causal-50", "window2-45", "br-23x57", "docs-br", "docs-causal")
BR = Variant(causal=True, bottom_right=True)
# id: (Nq lengths, Nk lengths, Hq, Hkv, d, variant, varlen); several Nq lengths = documents
SHAPES = {
    "plain-50": ([50], [50], 2, 2, 16, PLAIN, False),
    "plain-64": ([64], [64], 2, 2, 16, PLAIN, False),
    "causal-50": ([50], [50], 2, 2, 16, CAUSAL, False),
    "causal-64": ([64], [64], 2, 2, 16, CAUSAL, False),
    "window-77": ([77], [77], 2, 2, 16, Variant(causal=True, window=(12, 0)), False),
    "window2-45": ([45], [45], 2, 2, 16, Variant(window=(7, 3)), False),
    "softcap-d24-40": ([40], [40], 2, 2, 24, Variant(causal=True, softcap=5.0), False),
    "gqa-41": ([41], [41], 4, 2, 16, CAUSAL, False),
    "br-23x57": ([23], [57], 2, 2, 16, BR, False),
    "br-57x23": ([57], [23], 2, 2, 16, BR, False),
    "brwin-30x70": ([30], [70], 2, 2, 16, Variant(window=(9, 4), bottom_right=True), False),
    "plain-70x30": ([70], [30], 2, 2, 16, PLAIN, False),
    "docs-causal": ([37, 64, 5, 32, 50], None, 2, 2, 16, CAUSAL, True),
    "docs-plain": ([37, 64, 5, 32, 50], None, 2, 2, 16, PLAIN, True),
    "docs-br": ([20, 33, 16], [45, 16, 29], 2, 2, 16, BR, True),
    "docs-gqa-window": ([37, 64, 50], None, 4, 2, 16, Variant(causal=True, window=(10, 0)), True),
}


def _tensors(shape_id, seed=5):
    nq, nk, hq, hkv, d, variant, varlen = SHAPES[shape_id]
    nk = nq if nk is None else nk
    g = torch.Generator().manual_seed(seed)
    if varlen:
        cu_q, cu_k = (
            torch.tensor([0, *itertools.accumulate(n)], dtype=torch.int32) for n in (nq, nk)
        )
        shapes = [(sum(nq), hq, d), (sum(nk), hkv, d), (sum(nk), hkv, d), (sum(nq), hq, d)]
        lay = (cu_q, cu_k, max(nq), max(nk))
    else:
        b = 2 if hq != hkv else 1  # (one batch of two: the GQA row)
        shapes = [(b, hq, nq[0], d), (b, hkv, nk[0], d), (b, hkv, nk[0], d), (b, hq, nq[0], d)]
        lay = None
    q, k, v, do = (torch.randn(s, generator=g) for s in shapes)
    return q, k, v, do, variant, lay


@pytest.mark.parametrize("tiles", list(TILES))
@pytest.mark.parametrize("shape_id", list(SHAPES))
def test_peeled_kernels_are_bitwise_the_masked_kernels(shape_id, tiles):
    if tiles == "b" and shape_id not in TILE_B:
        pytest.skip("the second tile on a few shapes (the interpreter is slow)")
    tensors = _tensors(shape_id)
    prep = bv.prepare(tensors)
    dkdv_tile, dq_tile = TILES[tiles]
    want = bv.backward(tensors, prep, dkdv_tile, dq_tile, MASKED)
    for peel in (PEELED, {"PEEL": True}) if tiles == "b" else (PEELED,):  # (b: four loops too)
        got = bv.backward(tensors, prep, dkdv_tile, dq_tile, peel)
        for name, a, b in zip(("dq", "dk", "dv"), got, want, strict=True):
            assert torch.equal(a, b), (name, peel)
    assert min(float(g.abs().max()) for g in got) > 0.05  # not trivially zero


@pytest.mark.parametrize("case", ["doc128", "causal128"])
def test_direct_launch_is_the_package_backward(case):
    """The script's launch (forced interpreter tiles, all masked) is what ``_backward_c`` computes
    (one peeled dK/dV loop; EVEN_BLOCKS on the dense divisible row: bitwise the same)."""
    tensors = bv.make_case(case, True, "cpu", torch.float32, seed=3)
    prep = bv.prepare(tensors)
    got = bv.backward(tensors, prep, bv.CPU_DKDV, bv.CPU_DQ, {})
    q, k, v, do, variant, varlen = tensors
    o, lse_c, dq_plan, dkdv_plan = prep
    assert "PEEL" not in dq_plan.constexprs and dkdv_plan.constexprs["PEEL"] is True
    assert dkdv_plan.constexprs["EVEN_BLOCKS"] == (varlen is None)
    want = launch._backward_c(do, q, k, v, o, lse_c, variant, q.shape[-1] ** -0.5, None, varlen)
    for name, a, b in zip(("dq", "dk", "dv"), got, want, strict=True):
        assert torch.equal(a, b), name


def test_cpu_smoke_writes_rows(tmp_path):
    out = tmp_path / "v.json"
    record = bv.main(["--cpu-smoke", "--cases", "docr128", "--out", str(out)])
    rows = [
        r for r in record["rows"] if r.get("variant") in ("masked", "one_loop", "one_loop_peel")
    ]
    assert len(rows) == 3 and all(r["bitwise_equal"] for r in rows)
    assert not rows[0]["divisible"]  # the ragged documents: tail steps run
    assert out.exists() and "environment" in record and "summary" in record


# ---- EVEN_BLOCKS (session 8): no tail step compiled, for dense lengths multiple of every block


@pytest.mark.parametrize("case", ["doc128", "window128", "causal128"])
def test_even_blocks_is_bitwise_the_masked_kernel(case):
    tensors = bv.make_case(case, True, "cpu", torch.float32, seed=3)
    prep = bv.prepare(tensors)
    assert bv.divisible(tensors, [bv.CPU_DKDV, bv.CPU_DQ])
    want = bv.backward(tensors, prep, bv.CPU_DKDV, bv.CPU_DQ, MASKED)
    got = bv.backward(tensors, prep, bv.CPU_DKDV, bv.CPU_DQ, {"EVEN_BLOCKS": True})
    for name, a, b in zip(("dq", "dk", "dv"), got, want, strict=True):
        assert torch.equal(a, b), name


def test_even_blocks_changes_results_on_ragged_lengths():
    """Documents of 37, 5 and 50 tokens: without the tail step the kernels read the next
    document's rows and keys as their own, so the gradients differ (the script runs "even" on
    divisible lengths only; the launch sets it for dense divisible lengths only)."""
    tensors = _tensors("docs-plain")
    prep = bv.prepare(tensors)
    want = bv.backward(tensors, prep, bv.CPU_DKDV, bv.CPU_DQ, MASKED)
    got = bv.backward(tensors, prep, bv.CPU_DKDV, bv.CPU_DQ, {"EVEN_BLOCKS": True})
    assert any(not torch.equal(a, b) for a, b in zip(got, want, strict=True))


def test_the_package_sets_even_blocks_only_for_divisible_dense_lengths(monkeypatch):
    """launch._even: lengths that are multiples of the largest block of both autotuning lists
    (dense only); the package's backward then equals the peeled kernels' bit for bit."""
    blocks = [v for kern in (launch._attn_bwd_dq, launch._attn_bwd_dkdv)
              for cfg in kern.configs for v in cfg.kwargs.values()]  # fmt: skip
    b = max(blocks)
    assert launch._even(b, 2 * b) and not launch._even(b, b + 16) and not launch._even(b // 2, b)
    g = torch.Generator().manual_seed(11)
    q, k, v, do = (torch.randn(1, 2, 2 * b, 16, generator=g) for _ in range(4))
    o, lse = launch._forward_c(q, k, v, CAUSAL, 0.3)
    seen = []
    real = launch._bwd_plans
    monkeypatch.setattr(launch, "_bwd_plans", lambda *a: seen.append(r := real(*a)) or r)
    launch._PLANS.clear()
    got = launch._backward_c(do, q, k, v, o, lse, CAUSAL, 0.3)
    assert seen and all(p.constexprs["EVEN_BLOCKS"] for p in seen[0][1:])
    monkeypatch.setattr(launch, "_even", lambda n_q, n_k: False)
    launch._PLANS.clear()
    want = launch._backward_c(do, q, k, v, o, lse, CAUSAL, 0.3)
    launch._PLANS.clear()
    for a, w in zip(got, want, strict=True):
        assert torch.equal(a, w)


@pytest.mark.parametrize("case", ["doc128", "window128", "causal128"])
def test_one_loop_is_bitwise_the_three_loops(case):
    """``ONE_LOOP`` (session 9): the dK/dV kernel's single loop, masking the edge blocks by a
    run-time test, gives the three-loop kernel's gradients bit for bit (with and without
    ``EVEN_BLOCKS``), on ragged documents too."""
    for lengths in (None, [56, 40, 96]) if case == "doc128" else (None,):
        _t, _p, want = _run(case, {}, lengths)
        _t, _p, got = _run(case, {"ONE_LOOP": True}, lengths)
        for name, a, b in zip(("dq", "dk", "dv"), got, want, strict=True):
            assert torch.equal(a, b), (name, lengths)
    _t, _p, want = _run(case, EVEN)
    _t, _p, got = _run(case, {**EVEN, "ONE_LOOP": True})
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


@pytest.mark.parametrize("causal, window", [(True, (80, 0)), (False, (70, 90)), (False, (-1, 60))])
def test_one_loop_masks_both_edges_of_a_wide_window(causal, window):
    """Windows wider than the interpreter's blocks (16 query rows, 32 keys), so that a key block
    has masked query blocks before and after its unmasked ones. Both kernels' forms share the
    masking step, so each is checked against float64 autograd (not only against the other)."""
    from course_kernels.triton.masks import Variant

    g = torch.Generator().manual_seed(7)
    n = 150  # (not a multiple of the blocks: PEELED runs its tail step)
    q, k, v, do = (torch.randn(1, 2, n, 16, generator=g) for _ in range(4))
    tensors = (q, k, v, do, Variant(causal=causal, window=window), None)
    x = [t.double().requires_grad_() for t in (q, k, v)]
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    left, right = window
    keep = (j >= i - left if left >= 0 else True) & (j <= i + (0 if causal else right))
    s = (x[0] @ x[1].transpose(-1, -2) * 16**-0.5).masked_fill(~keep, float("-inf"))
    (torch.softmax(s, -1) @ x[2]).backward(do.double())
    prep = bv.prepare(tensors)
    for switches in ({}, {"ONE_LOOP": True}, PEELED):
        got = bv.backward(tensors, prep, bv.CPU_DKDV, bv.CPU_DQ, switches)
        for name, a, ref in zip(("dq", "dk", "dv"), got, x, strict=True):
            err = float((a.double() - ref.grad).abs().max())
            assert err < 1e-4, (switches, name, err)


def test_the_package_runs_the_one_loop_dkdv_kernel():
    from course_kernels.triton.masks import CAUSAL

    q = torch.randn(1, 2, 40, 16)
    _c, dq_plan, dkdv_plan = launch._bwd_plans(q, q, torch.zeros(1, 2, 40), CAUSAL, 0.3, None, None)
    assert dkdv_plan.constexprs["ONE_LOOP"] is True and "ONE_LOOP" not in dq_plan.constexprs
    # PEEL (tail peeling in the single loop): dK/dV 0.76-0.97x the unpeeled loop on the H200
    # (session 10); the dQ kernel peeled ran 1-5% slower, so it keeps its masks
    assert dkdv_plan.constexprs["PEEL"] is True and "PEEL" not in dq_plan.constexprs
    for plan in (dq_plan, dkdv_plan):  # the kernels' own default, too
        assert inspect.signature(plan.kernel.fn.fn).parameters["PEEL"].default is False
