"""experiments/hopper/bwd_variants.py and the backward kernels' ``EVEN_BLOCKS`` switch (session 8,
notes/kernel.md), in Triton's interpreter: with every sequence length a multiple of the blocks,
the switch (no bounds masks on the loads, FlexAttention's ``IS_DIVISIBLE``) gives the default
kernels' gradients bit for bit, on the three masks the GPU run measures; the script's direct
launch is the package's backward; and where lengths are not multiples the switch does change the
result (so the comparison can fail), which is why the script only uses it on divisible shapes."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")

from course_kernels.triton import _env as _triton_env  # noqa: E402
from course_kernels.triton import launch  # noqa: E402

SCRIPT = Path(__file__).resolve().parents[1] / "experiments" / "hopper" / "bwd_variants.py"
spec = importlib.util.spec_from_file_location("bwd_variants", SCRIPT)
bv = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bv)

if _triton_env.device_kind() != "cpu":  # the GPU run is the script itself
    pytest.skip("interpreter checks (CPU)", allow_module_level=True)

EVEN = {"EVEN_BLOCKS": True}


def _run(case, switches, lengths=None):
    tensors = bv.make_case(case, True, "cpu", torch.float32, seed=3)
    if lengths is not None:  # other document lengths (packed varlen)
        q, k, v, do, variant, _ = tensors
        cu = torch.tensor([0, *__import__("itertools").accumulate(lengths)], dtype=torch.int32)
        n = sum(lengths)
        tensors = (q[:n], k[:n], v[:n], do[:n], variant, (cu, cu, max(lengths), max(lengths)))
    prep = bv.prepare(tensors)
    return tensors, prep, bv.backward(tensors, prep, bv.CPU_DKDV, bv.CPU_DQ, switches)


@pytest.mark.parametrize("case", ["doc128", "window128", "causal128"])
def test_even_blocks_is_bitwise_the_default(case):
    tensors, _prep, want = _run(case, {})
    assert bv.divisible(tensors, [bv.CPU_DKDV, bv.CPU_DQ])
    _t, _p, got = _run(case, EVEN)
    for name, a, b in zip(("dq", "dk", "dv"), got, want, strict=True):
        assert torch.equal(a, b), name
    assert min(float(g.abs().max()) for g in got) > 0.05  # not trivially zero


@pytest.mark.parametrize("case", ["doc128", "causal128"])
def test_direct_launch_is_the_package_backward(case):
    """The script's launch (forced interpreter tiles) is what ``_backward_c`` computes."""
    tensors, (o, lse_c, *_plans), got = _run(case, {})
    q, k, v, do, variant, varlen = tensors
    want = launch._backward_c(do, q, k, v, o, lse_c, variant, q.shape[-1] ** -0.5, None, varlen)
    for name, a, b in zip(("dq", "dk", "dv"), got, want, strict=True):
        assert torch.equal(a, b), name


def test_even_blocks_changes_results_on_ragged_lengths():
    """Documents of 56 and 40 tokens (not multiples of 16 or 32): without their bounds masks
    the kernels read the next document's rows and keys as their own (inside the tensors: the
    last document, 96 tokens, is a multiple), so those gradients differ. The equality test above
    can fail; the script skips such shapes."""
    lengths = [56, 40, 96]
    tensors, _prep, want = _run("doc128", {}, lengths)
    assert not bv.divisible(tensors, [bv.CPU_DKDV, bv.CPU_DQ])
    _t, _p, got = _run("doc128", EVEN, lengths)
    assert any(not torch.equal(a, b) for a, b in zip(got, want, strict=True))


def test_cpu_smoke_writes_rows(tmp_path):
    out = tmp_path / "v.json"
    record = bv.main(["--cpu-smoke", "--cases", "window128", "--out", str(out)])
    rows = [r for r in record["rows"] if r.get("variant") in ("default", "even")]
    assert len(rows) == 2 and all(r["bitwise_equal"] for r in rows)
    assert out.exists() and "environment" in record


def test_the_package_turns_even_blocks_on_only_for_divisible_dense_lengths(monkeypatch):
    """launch._even: lengths that are multiples of the largest block of both autotuning lists
    (dense only); the package's backward then equals the masked kernels' bit for bit."""
    blocks = [v for kern in (launch._attn_bwd_dq, launch._attn_bwd_dkdv)
              for cfg in kern.configs for v in cfg.kwargs.values()]  # fmt: skip
    b = max(blocks)
    assert launch._even(b, 2 * b) and not launch._even(b, b + 16) and not launch._even(b // 2, b)
    from course_kernels.triton.masks import CAUSAL

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
    n = 160
    q, k, v, do = (torch.randn(1, 2, n, 16, generator=g) for _ in range(4))
    tensors = (q, k, v, do, Variant(causal=causal, window=window), None)
    x = [t.double().requires_grad_() for t in (q, k, v)]
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    left, right = window
    keep = (j >= i - left if left >= 0 else True) & (j <= i + (0 if causal else right))
    s = (x[0] @ x[1].transpose(-1, -2) * 16**-0.5).masked_fill(~keep, float("-inf"))
    (torch.softmax(s, -1) @ x[2]).backward(do.double())
    prep = bv.prepare(tensors)
    for switches in ({}, {"ONE_LOOP": True}):
        got = bv.backward(tensors, prep, bv.CPU_DKDV, bv.CPU_DQ, switches)
        for name, a, ref in zip(("dq", "dk", "dv"), got, x, strict=True):
            err = float((a.double() - ref.grad).abs().max())
            assert err < 1e-4, (switches, name, err)


def test_the_package_runs_the_one_loop_dkdv_kernel():
    from course_kernels.triton.masks import CAUSAL

    q = torch.randn(1, 2, 40, 16)
    _c, dq_plan, dkdv_plan = launch._bwd_plans(q, q, torch.zeros(1, 2, 40), CAUSAL, 0.3, None, None)
    assert dkdv_plan.constexprs["ONE_LOOP"] is True and "ONE_LOOP" not in dq_plan.constexprs
