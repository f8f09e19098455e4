"""The kernels' autotuning spaces: block sizes, warps and stages for the forward ``_attn_fwd``
(BLOCK_M query rows per program, BLOCK_N keys per step; with the arithmetic of its tiles: shared
memory, accumulator registers), and for the backward's ``_attn_bwd_dkdv`` (BLOCK_M1 query rows
per step, BLOCK_N1 keys per program) and ``_attn_bwd_dq`` (BLOCK_N2 keys per step, BLOCK_M2 query
rows per program), per GPU family, dtype and head dim.

Chapters: "Flash Attention in Triton" (forward, backward). The forward's names are re-exported
from :mod:`course_kernels.triton.forward`, the backward's from :mod:`course_kernels.triton.backward`.

The second half launches a chosen config with as little Python as possible (issue 22: at
N = 1K the Python path of a call is as long as its kernels). Three layers, each a cache:

1. :data:`_TUNED`: the config the autotuner chose per shape. ``Autotuner.run`` rebuilds its key
   from every argument on each call; after the first (tuning) launch :func:`_launch` calls the
   JIT function directly with the remembered config, exactly as ``Autotuner.run`` would.
2. :class:`KernelPlan`: everything of a launch but the tensors -- the integer and float
   arguments (strides, sizes, the variant's numbers), the constexprs, the grid -- computed once
   per shape, layout and variant by ``launch._forward_c`` / ``_backward_c`` (``_PLANS``).
3. The direct launch: ``JITFunction.run`` re-binds and re-specialises all ~40 arguments on each
   call (each int: == 1? divisible by 16? int32?, each pointer: 16-byte aligned?) to find the
   compiled kernel, then calls its launcher. A plan's scalars are fixed, so the only thing that
   can change Triton's choice between two calls of one plan is the alignment of each tensor
   (and the device and the debug knobs): the plan remembers the compiled kernel per
   (device, alignment bits, knobs) and calls its launcher with the same arguments
   ``JITFunction.run`` passes. Only on a GPU, only for the Triton versions whose internals
   ``tests/test_flash_launch_internals.py`` pins; anything else (the interpreter, launch hooks,
   ``COURSE_KERNELS_DIRECT_LAUNCH=0``) goes through ``JITFunction.run``.
"""

from __future__ import annotations

import contextlib
import os

from . import _env as _triton_env  # noqa: F401  (sets TRITON_INTERPRET before any @triton.jit)

import triton  # noqa: E402
from triton import knobs  # noqa: E402
from triton.runtime.driver import driver  # noqa: E402

from ._env import INTERPRET, pick_configs  # noqa: E402

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


# ---- launching a chosen config: _TUNED, KernelPlan, the direct launch -------------------------


# The Triton versions whose JITFunction.run / CompiledKernel internals the direct launch copies
# (tests/test_flash_launch_internals.py pins them; a GPU test compares results bit for bit).
DIRECT_VERSIONS = ("3.6.0", "3.9.0")
DIRECT_ENV = "COURSE_KERNELS_DIRECT_LAUNCH"
# DIRECT: on where supported unless $COURSE_KERNELS_DIRECT_LAUNCH=0 (then JITFunction.run).
DIRECT_SUPPORTED: bool = not INTERPRET and triton.__version__ in DIRECT_VERSIONS


def direct_wanted(environ=os.environ) -> bool:
    return environ.get(DIRECT_ENV, "1") != "0"


DIRECT: bool = DIRECT_SUPPORTED and direct_wanted()

# Per shape: the chosen config's kwargs (block sizes, warps, stages), filled by the first launch.
_TUNED: dict = {}


def _quiet():
    """NumPy floating-point warnings off while the interpreter runs a kernel.

    Under ``TRITON_INTERPRET`` each ``tl`` operation is a NumPy call, so NaN or inf inputs
    (which the GPU propagates silently, as SDPA does) would leak ``RuntimeWarning``s such as
    "invalid value encountered in subtract" into the caller's code.
    """
    if INTERPRET:
        import numpy as np

        return np.errstate(all="ignore")
    return contextlib.nullcontext()


def _launch(kernel, grid, args, key, **constexprs):
    """Launch an autotuned kernel; the first call per ``key`` tunes (``kernel[grid]``)."""
    tuned = _TUNED.get((id(kernel), *key))
    if tuned is None:
        with _quiet():
            kernel[grid](*args, **constexprs)
        _TUNED[(id(kernel), *key)] = kernel.best_config.all_kwargs()
        return
    with _quiet():
        kernel.fn.run(*args, grid=grid, warmup=False, **constexprs, **tuned)


# The options JITFunction.run reads from Triton's knobs on every call (``kwargs[name] = ...``):
# part of its compiled-kernel key, so part of the direct launch's key too (pinned by the tests).
OPTION_KWARGS = ("debug", "instrumentation_mode", "fpsan_homomorphic_casts")


def _option_knobs() -> tuple:
    """The values of :data:`OPTION_KWARGS` now (``fpsan_homomorphic_casts``: Triton 3.9 only)."""
    c = knobs.compilation
    return (knobs.runtime.debug, c.instrumentation_mode, getattr(c, "fpsan_homomorphic_casts", 0))


def _hook_in_use(hook) -> bool:
    """A launch hook slot in use. Since Triton 3.6 the slots hold a ``HookChain`` (``.calls``, a
    list of functions) even when nothing is registered, and a HookChain is always truthy: read
    its list. (``bool(hook)`` here kept the direct launch from ever running: notes/kernel.md 14.)"""
    if hook is None:
        return False
    calls = getattr(hook, "calls", None)
    return True if calls is None else bool(calls)


def _hooks_set(fn) -> bool:
    """Hooks ``JITFunction.run`` calls or keys on, which the direct launch does not handle."""
    rt = knobs.runtime
    stages = getattr(rt, "add_stages_inspection_hook", None)  # Triton 3.9: part of its key
    hooks = (rt.launch_enter_hook, rt.launch_exit_hook)
    return any(map(_hook_in_use, hooks)) or bool(stages) or bool(fn.pre_run_hooks)


def alignment_bits(tensors) -> int:
    """Bit i (from the last tensor) set when tensor i is 16-byte aligned: the only property of
    a pointer Triton specialises on besides its dtype (which a plan fixes)."""
    bits = 0
    for t in tensors:
        bits = 2 * bits + (t.data_ptr() % 16 == 0)
    return bits


def constexpr_tail(fn, n_args: int, kwargs: dict) -> tuple:
    """The values of ``fn``'s parameters after the first ``n_args``, in signature order: what
    ``JITFunction.run``'s binder appends (the launcher takes every parameter, constexprs too)."""
    tail = []
    for p in fn.params[n_args:]:
        if p.name in kwargs:
            tail.append(kwargs[p.name])
        elif p.has_default:
            tail.append(p.default)
        else:
            raise TypeError(f"{fn.fn.__name__}: no value for parameter {p.name!r}")
    return tuple(tail)


class KernelPlan:
    """One kernel's launch for one shape, layout and variant: all but the tensors.

    ``tune_key``: the :data:`_TUNED` key; ``scalars``: the arguments after the tensors;
    ``grid_fn(meta)``: the grid for a config. :meth:`launch` takes the tensors (a prefix of the
    kernel's parameters). The plan's caches follow the tuned config: when :data:`_TUNED` is
    cleared or refilled (a sweep forcing configs), the next launch sees a new config object and
    starts over.
    """

    __slots__ = (
        "kernel",
        "tune_key",
        "scalars",
        "constexprs",
        "grid_fn",
        "tuned",
        "grid",
        "compiled",
    )

    def __init__(self, kernel, tune_key: tuple, scalars: tuple, constexprs: dict, grid_fn):
        self.kernel, self.tune_key, self.scalars = kernel, tune_key, scalars
        self.constexprs, self.grid_fn = constexprs, grid_fn
        self.tuned = self.grid = None
        self.compiled: dict = {}  # (device, alignment bits, knobs) -> the launcher's arguments

    def launch(self, tensors: tuple) -> None:
        tuned = _TUNED.get(self.tune_key)
        if tuned is None:  # first launch of this shape: autotune
            _launch(
                self.kernel,
                self.grid_fn,
                (*tensors, *self.scalars),
                self.tune_key[1:],
                **self.constexprs,
            )
            return
        if tuned is not self.tuned:
            grid = tuple(self.grid_fn(tuned))  # (x, y) -> (x, y, 1): the same launch
            self.tuned, self.grid, self.compiled = tuned, grid + (1,) * (3 - len(grid)), {}
        fn = self.kernel.fn
        if not DIRECT or _hooks_set(fn):
            with _quiet():
                fn.run(
                    *tensors,
                    *self.scalars,
                    grid=self.grid,
                    warmup=False,
                    **self.constexprs,
                    **tuned,
                )
            return
        device = driver.active.get_current_device()
        key = (device, alignment_bits(tensors), _option_knobs())
        entry = self.compiled.get(key)
        if entry is None:  # JITFunction.run specialises, compiles or finds, launches
            ck = fn.run(
                *tensors, *self.scalars, grid=self.grid, warmup=False, **self.constexprs, **tuned
            )
            if ck is not None and not hasattr(ck, "result"):  # not an async compile's future
                tail = constexpr_tail(
                    fn, len(tensors) + len(self.scalars), {**self.constexprs, **tuned}
                )
                self.compiled[key] = (ck.run, ck.function, ck.packed_metadata, tail)
            return
        run, function, metadata, tail = entry
        stream = driver.active.get_current_stream(device)
        g0, g1, g2 = self.grid
        # The call JITFunction.run makes (launch_metadata is None without a launch_enter_hook).
        run(
            g0, g1, g2, stream, function, metadata, None, None, None, *tensors, *self.scalars, *tail
        )
