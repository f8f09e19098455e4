"""The kernels' autotuning spaces: block sizes, warps and stages for the forward ``_attn_fwd``
(BLOCK_M query rows per program, BLOCK_N keys per step; with the arithmetic of its tiles: shared
memory, accumulator registers), and for the backward's ``_attn_bwd_dkdv`` (BLOCK_M1 query rows
per step, BLOCK_N1 keys per program) and ``_attn_bwd_dq`` (BLOCK_N2 keys per step, BLOCK_M2 query
rows per program), per GPU family, dtype and head dim.

Chapters: "Flash Attention in Triton" (forward, backward). The forward's names are re-exported
from :mod:`course_kernels.triton.forward`, the backward's from :mod:`course_kernels.triton.backward`.
"""

from __future__ import annotations

from . import _env as _triton_env  # noqa: F401  (sets TRITON_INTERPRET before any @triton.jit)

import triton  # noqa: E402

from ._env import pick_configs  # noqa: E402

__all__ = [
    "DKDV_D128_CONFIGS",
    "DKDV_IEEE_CONFIG",
    "DKDV_SM75",
    "DKDV_SMALL_CONFIG",
    "DQ_D128_CONFIGS",
    "DQ_IEEE_CONFIG",
    "DQ_SM75",
    "DQ_SMALL_CONFIG",
    "FWD_CPU_CONFIG",
    "FWD_GPU_TILES",
    "FWD_IEEE_CONFIG",
    "FWD_SM75",
    "FWD_SMALL_CONFIG",
    "accumulator_registers",
    "dkdv_configs",
    "dq_configs",
    "fwd_configs",
    "fwd_gpu_configs",
    "smem_estimate",
]


def _configs(block_a: str, block_b: str, cpu: tuple[int, int], ieee, small, extra=()):
    gpu = [
        triton.Config({block_a: a, block_b: b}, num_warps=w, num_stages=s)
        for a, b, w, s in [
            (32, 128, 4, 3),  # the Triton tutorial's Hopper tile
            (64, 128, 8, 3),
            *extra,
        ]
    ] + [small]
    cpu_config = triton.Config({block_a: cpu[0], block_b: cpu[1]}, num_warps=4, num_stages=1)
    return pick_configs(gpu, cpu_config, ieee)


def _d128_configs(block_a: str, block_b: str, shapes):
    return [
        triton.Config({block_a: a, block_b: b}, num_warps=w, num_stages=s) for a, b, w, s in shapes
    ]


# Tried and not kept (notes/kernel.md, course_kernels/data/bench/h200_bwd_d128_ab.json): at d = 128 on the
# H200 the first configs above spill registers (compiled metadata, course_kernels/data/bench/
# h200_config_meta.json: dK/dV (32, 128, 4 warps) 192 spilled registers, dQ (128 rows, 32 keys,
# 4 warps) 54). These smaller tiles do not spill, but with them in the list the autotuner still
# chose (64, 128, 8 warps) for both kernels, at the same speed. experiments/hopper/hopper_levers.py bwd-ab
# re-measures them.
DKDV_D128_CONFIGS = _d128_configs(
    "BLOCK_M1", "BLOCK_N1", [(32, 64, 4, 3), (64, 64, 4, 3), (32, 128, 8, 3)]
)
DQ_D128_CONFIGS = _d128_configs(
    "BLOCK_N2", "BLOCK_M2", [(32, 64, 4, 3), (64, 64, 4, 3), (32, 128, 8, 3)]
)


# Deeper pipelines (the Triton tutorial's backward runs 4-warp tiles with 5 stages), measured with
# experiments/hopper/hopper_levers.py bwd-ab --extra deep (course_kernels/data/bench/h200_bwd_deep_ab.json):
# at d = 64 causal the autotuner chose dK/dV (64, 128, 4 warps, 4 stages), +5% to +9%; nothing
# else was chosen. That one is in dkdv_configs() (DKDV_DEEP_TILE); the rest were not kept.
DKDV_DEEP_TILE = (64, 128, 4, 4)
DKDV_DEEP_CONFIGS = _d128_configs("BLOCK_M1", "BLOCK_N1", [(32, 128, 4, 5), (64, 128, 4, 4)])
DQ_DEEP_CONFIGS = _d128_configs("BLOCK_N2", "BLOCK_M2", [(32, 128, 4, 5), (64, 128, 4, 4)])

# The backward's configs forced one at a time on issue 22's masks (experiments/hopper/
# bwd_configs.py, experiments/data/bench/h200_bwd_configs.json, H200, fp16): the dK/dV tile with
# two stages at d = 128: -7% on 6 causal documents, -3% on a 1K window, +3% dense causal (the
# autotuner keeps it only where it wins); the dQ tile (32 keys, 64 rows, 4 warps): -7% on the
# documents at d = 64, -3% on the window at d = 128. No other candidate won anywhere.
DKDV_TWO_STAGE_TILE = (64, 128, 8, 2)
DQ_NARROW_TILE = (32, 64, 4, 3)

# fp32 inputs (IEEE products on FMA units): small tiles, see _triton_env.pick_configs.
DKDV_IEEE_CONFIG = triton.Config({"BLOCK_M1": 32, "BLOCK_N1": 32}, num_warps=4, num_stages=1)
DQ_IEEE_CONFIG = triton.Config({"BLOCK_N2": 32, "BLOCK_M2": 32}, num_warps=4, num_stages=1)
# Head dim 256, and a T4's 64 KB of shared memory.
DKDV_SMALL_CONFIG = triton.Config({"BLOCK_M1": 16, "BLOCK_N1": 64}, num_warps=4, num_stages=2)
DQ_SMALL_CONFIG = triton.Config({"BLOCK_N2": 16, "BLOCK_M2": 64}, num_warps=4, num_stages=2)


def _cfg(a_name, b_name, a, b, stages):
    return triton.Config({a_name: a, b_name: b}, num_warps=4, num_stages=stages)


# A T4 (sm_75): the largest tiles that fit 64 KiB, measured for sm_75 (notes/t4_sm75.md). fp32
# dK/dV at head dim 256 fits nowhere (16 x 16 tiles already ask for 66,560 bytes): None.
DKDV_SM75 = {
    (64, False): DKDV_SMALL_CONFIG,
    (128, False): _cfg("BLOCK_M1", "BLOCK_N1", 16, 32, 2),  # 40,960 bytes
    (256, False): _cfg("BLOCK_M1", "BLOCK_N1", 16, 16, 1),  # 49,152
    (64, True): DKDV_IEEE_CONFIG,
    (128, True): _cfg("BLOCK_M1", "BLOCK_N1", 16, 32, 1),  # 51,200
    (256, True): None,
}
DQ_SM75 = {
    (64, False): DQ_SMALL_CONFIG,
    (128, False): _cfg("BLOCK_N2", "BLOCK_M2", 16, 32, 2),  # 40,960
    (256, False): _cfg("BLOCK_N2", "BLOCK_M2", 16, 16, 1),  # 49,152
    (128, True): DQ_IEEE_CONFIG,
    (256, True): _cfg("BLOCK_N2", "BLOCK_M2", 16, 16, 1),  # 65,536: exactly the limit
}


def dkdv_configs() -> list[triton.Config]:
    """(BLOCK_M1 query rows per step, BLOCK_N1 keys per program)."""
    extra = (DKDV_DEEP_TILE, DKDV_TWO_STAGE_TILE)
    return _configs("BLOCK_M1", "BLOCK_N1", (16, 32), DKDV_IEEE_CONFIG, DKDV_SMALL_CONFIG, extra)


def dq_configs() -> list[triton.Config]:
    """(BLOCK_N2 keys per step, BLOCK_M2 query rows per program)."""
    extra = (DQ_NARROW_TILE,)
    return _configs("BLOCK_N2", "BLOCK_M2", (16, 32), DQ_IEEE_CONFIG, DQ_SMALL_CONFIG, extra)


# ---- the forward kernel ------------------------------------------------------------------

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


# What a tuned config is remembered by: the sizes and the variant switches (the dK/dV kernel adds
# its own GROUP_SIZE and ATOMIC_DQ).
TUNE_KEY = (
    "N_CTX_Q",
    "N_CTX_K",
    "HEAD_DIM",
    "WINDOWED",
    "BOTTOM_RIGHT",
    "SOFTCAP",
    "ALIBI",
    "VARLEN",
    "DOT_PRECISION",
)


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
