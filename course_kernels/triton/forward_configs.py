"""The forward kernel's autotuning space and the arithmetic of its tiles (shared memory,
accumulator registers). Chapter: "Flash Attention in Triton: the forward kernel"; every name is
re-exported from :mod:`course_kernels.triton.forward`.
"""

from __future__ import annotations

from . import _env as _triton_env  # noqa: F401  (sets TRITON_INTERPRET before any @triton.jit)

import triton  # noqa: E402

from ._env import pick_configs  # noqa: E402


# fp32 inputs (IEEE products on FMA units): small tiles, see _triton_env.pick_configs.
FWD_IEEE_CONFIG = triton.Config({"BLOCK_M": 32, "BLOCK_N": 32}, num_warps=4, num_stages=1)
# Head dim 256, and a T4's 64 KB of shared memory.
FWD_SMALL_CONFIG = triton.Config({"BLOCK_M": 64, "BLOCK_N": 32}, num_warps=4, num_stages=2)


# A T4 (sm_75): the largest tiles that fit 64 KiB, measured for sm_75 (notes/t4_sm75.md).
FWD_SM75 = {
    (128, False): FWD_SMALL_CONFIG,  # 49,152 bytes at d = 128
    (256, False): triton.Config({"BLOCK_M": 32, "BLOCK_N": 16}, num_warps=4, num_stages=1),
    (128, True): FWD_IEEE_CONFIG,
    (256, True): triton.Config({"BLOCK_M": 16, "BLOCK_N": 16}, num_warps=4, num_stages=1),
}


# The GPU autotuning space for fp16/bf16 as data: (BLOCK_M, BLOCK_N, num_warps, num_stages).
# The last is the best forward config of the H200 sweep (course_kernels/data/bench/sweep.json).
FWD_GPU_TILES = ((128, 64, 4, 3), (128, 128, 8, 3), (128, 64, 8, 4), (64, 64, 4, 3))
# Under the interpreter, one config: BLOCK_M = 2 * BLOCK_N crosses several diagonal blocks.
FWD_CPU_CONFIG = triton.Config({"BLOCK_M": 32, "BLOCK_N": 16}, num_warps=4, num_stages=1)


def fwd_configs() -> list[triton.Config]:
    """The autotuning space: a few configs known to do well on Hopper/Ampere, and a small one.

    Under the interpreter one config (several would each run): BLOCK_M = 2 * BLOCK_N, so that
    small CPU tests cross several diagonal blocks.
    """
    return pick_configs(fwd_gpu_configs(), FWD_CPU_CONFIG, FWD_IEEE_CONFIG)


def fwd_gpu_configs() -> list[triton.Config]:
    """The GPU's fp16/bf16 autotuning list (:data:`FWD_GPU_TILES` and the small config), the same
    whether or not this process has a GPU: what the chapters tabulate."""
    return [
        triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s)
        for bm, bn, w, s in FWD_GPU_TILES
    ] + [FWD_SMALL_CONFIG]


def smem_estimate(
    block_q: int, block_k: int, num_stages: int, head_dim: int, dtype_bytes: int = 2
) -> int:
    """Shared memory of one forward program, estimated in bytes: the Q tile (block_q x d) once,
    a K and a V tile (block_k x d each) per pipeline stage. Triton's compiled kernel reports
    the exact figure (``metadata.shared``); this is the arithmetic that says what can fit."""
    return dtype_bytes * (block_q * head_dim + num_stages * 2 * block_k * head_dim)


def accumulator_registers(block_q: int, head_dim: int, num_warps: int) -> int:
    """fp32 values of the (block_q x d) output accumulator each thread holds (32 threads a warp)."""
    return block_q * head_dim // (32 * num_warps)
