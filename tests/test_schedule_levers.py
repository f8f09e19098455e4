"""experiments/hopper/schedule_levers.py: the persistent forward and the atomic-dQ backward behind the
Hopper chapter's schedule levers, checked against the package in Triton's interpreter (on a GPU,
the same checks run on the device). The timing subcommands refuse without a GPU."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")

from course_kernels.triton import _env as _triton_env  # noqa: E402
from course_kernels.triton import flash  # noqa: E402

SCRIPT = Path(__file__).resolve().parents[1] / "experiments" / "hopper" / "schedule_levers.py"
spec = importlib.util.spec_from_file_location("schedule_levers", SCRIPT)
levers = importlib.util.module_from_spec(spec)
spec.loader.exec_module(levers)
DEVICE = _triton_env.device_kind()
DTYPE = torch.float16 if DEVICE == "cuda" else torch.float32
TOL = 2e-2 if DEVICE == "cuda" else 1e-5


def _qkv(n, d=16, heads=2, kv_heads=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, heads, n, d, generator=g).to(DEVICE, DTYPE)
    k, v = (torch.randn(1, kv_heads, n, d, generator=g).to(DEVICE, DTYPE) for _ in range(2))
    return q, k, v, torch.randn_like(q)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("programs", [1, 3])
def test_persistent_forward_matches_the_package(causal, programs):
    """Every tile is claimed exactly once, whatever the number of programs (a tile done twice or
    never would leave O or the LSE wrong for those rows)."""
    q, k, v, _ = _qkv(75)
    o, lse2 = flash._forward(q, k, v, causal, 0.25)
    cfg = levers._tuned(levers._attn_fwd)
    o2, lse2b = levers.forward_persistent(q, k, v, causal, 0.25, cfg, programs)
    assert (o2 - o).abs().max() <= TOL
    assert (lse2b - lse2).abs().max() <= TOL


@pytest.mark.parametrize("causal", [False, True])
def test_atomic_dq_backward_matches_the_package(causal):
    """GQA (2 query heads per K/V head) and a ragged N: dQ summed by atomics from every key block
    and query head equals the dQ kernel's sum; dK and dV are the same kernel's."""
    q, k, v, do = _qkv(50, heads=4, kv_heads=2, seed=1)
    o, lse2 = flash._forward(q, k, v, causal, 0.25)
    want = flash._backward(do, q, k, v, o, lse2, causal, 0.25)
    levers.backward_atomic_dq(do, q, k, v, o, lse2, causal, 0.25)  # tuning runs add into dQ
    got = levers.backward_atomic_dq(do, q, k, v, o, lse2, causal, 0.25)
    for name, a, b in zip(("dq", "dk", "dv"), got, want, strict=True):
        assert (a.float() - b.float()).abs().max() <= TOL, name
    assert got[0].abs().max() > 0.1  # not trivially zero


@pytest.mark.skipif(DEVICE == "cuda", reason="on a GPU the timing subcommands run")
@pytest.mark.parametrize("what", ["persistent", "atomic", "graphs"])
def test_timing_subcommands_refuse_without_a_gpu(what, capsys):
    with pytest.raises(SystemExit) as exc:
        levers.main([what])
    assert exc.value.code == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


@pytest.mark.skipif(DEVICE == "cuda", reason="on a GPU it runs")
@pytest.mark.parametrize("what", ["n1k", "n1k-one"])
def test_n1k_runs_refuse_without_a_gpu(what, capsys):
    """experiments/hopper/n1k_runs.py (the N = 1K fresh processes, moved out of this script)."""
    path = SCRIPT.parent / "n1k_runs.py"
    spec = importlib.util.spec_from_file_location("n1k_runs", path)
    n1k = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(n1k)
    with pytest.raises(SystemExit) as exc:
        n1k.main([what])
    assert exc.value.code == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
