"""experiments/hopper/hopper_levers.py: the experimental forward behind the Hopper chapter's lever table
(checked in Triton's interpreter), the occupancy arithmetic on compiled-kernel metadata, and the
tutorial's config trimming."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")

from course_kernels.triton import _env as _triton_env  # noqa: E402

SCRIPT = Path(__file__).resolve().parents[1] / "experiments" / "hopper" / "hopper_levers.py"
spec = importlib.util.spec_from_file_location("hopper_levers", SCRIPT)
levers = importlib.util.module_from_spec(spec)
spec.loader.exec_module(levers)
DEVICE = _triton_env.device_kind()


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("variant", ["pointer", "pointer+fma", "tma"])
def test_lever_kernel_matches_sdpa(causal, variant):
    tma, ws, fma = levers.VARIANTS[variant]
    if tma and levers.TensorDescriptor is None:
        pytest.skip("this Triton has no host TensorDescriptor")
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 64, 16, generator=g).to(DEVICE) for _ in range(3))
    out, _ = levers.lever_attention(q, k, v, causal, 32, 16, 4, 1, tma, ws, fma)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    assert (out - ref).abs().max() < 1e-5


def test_meta_occupancy_arithmetic():
    kern = SimpleNamespace(
        n_regs=168, n_spills=0, metadata=SimpleNamespace(shared=114688, num_warps=4, num_stages=3)
    )
    m = levers._meta(kern)
    # registers: 65536 // (168 * 128) = 3; shared: 233472 // (114688 + 1024) = 2; threads: 16
    assert m["blocks_per_sm"] == 2 and m["limited_by"] == "shared memory"
    kern.n_regs = 255  # 65536 // (255 * 128) = 2: a tie with shared memory, reported as registers
    assert levers._meta(kern)["blocks_per_sm"] == 2
    kern.metadata.num_warps = 8  # 65536 // (255 * 256) = 1
    m = levers._meta(kern)
    assert (m["blocks_per_sm"], m["limited_by"]) == (1, "registers")


def test_trim_tutorial_keeps_listed_configs_and_prunes_wide_blocks():
    configs = [
        triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_stages=s, num_warps=w)
        for bm in (64, 128)
        for bn in (32, 64, 128)
        for s in (2, 3, 4)
        for w in (4, 8)
    ]
    mod = SimpleNamespace(
        _attn_fwd_tma=SimpleNamespace(configs=list(configs), early_config_prune=None)
    )
    kept = levers.trim_tutorial(mod)
    got = {
        (c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_stages, c.num_warps)
        for c in mod._attn_fwd_tma.configs
    }
    assert got == set(levers.TUTORIAL_CONFIGS) and kept == {"_attn_fwd_tma": len(got)}
    pruned = mod._attn_fwd_tma.early_config_prune(mod._attn_fwd_tma.configs, {}, HEAD_DIM=64)
    assert pruned and all(c.kwargs["BLOCK_N"] <= 64 for c in pruned)


@pytest.mark.parametrize("name", ["_attn_bwd_dkdv", "_attn_bwd_dq"])
def test_config_meta_compiles_the_backward_with_every_argument(name):
    """`meta` compiles each backward kernel with hand-built arguments: they must name every
    parameter of the kernel as it is now (a kernel that gains an argument must fail here, not
    leave error rows in h200_config_meta.json)."""
    import hopper_config_meta

    from course_kernels.triton import backward as triton_backward

    kernel = getattr(triton_backward, name)
    q = torch.zeros(1, 2, 256, 64)
    args, extra = hopper_config_meta.bwd_args(name, q, q, q[..., 0])
    config = kernel.configs[0]
    named = {*hopper_config_meta.constexprs(64, False), *config.kwargs, *extra}
    params = list(kernel.fn.arg_names)
    assert params[: len(args)] == [p for p in params if p not in named]
    assert len(args) + len(named) == len(params)
