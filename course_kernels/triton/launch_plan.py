"""The kernels' host-side launch: autotune once per shape, then launch with as little Python as
possible (issue 22: at N = 1K the Python path of a call is as long as its kernels).

Chapter: "Flash Attention in Triton" (the autograd wrapper). Three layers, each a cache:

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

from ._env import INTERPRET

import triton  # noqa: E402
from triton import knobs  # noqa: E402
from triton.runtime.driver import driver  # noqa: E402

# The Triton versions whose JITFunction.run / CompiledKernel internals the direct launch copies
# (tests/test_flash_launch_internals.py pins them; a GPU test compares results bit for bit).
DIRECT_VERSIONS = ("3.6.0", "3.9.0")
DIRECT_ENV = "COURSE_KERNELS_DIRECT_LAUNCH"
# Module switch (experiments/hopper/host_path.py times both paths in one process).
DIRECT: bool = (
    not INTERPRET
    and triton.__version__ in DIRECT_VERSIONS
    and os.environ.get(DIRECT_ENV, "1") != "0"
)

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


def _hooks_set(fn) -> bool:
    """Hooks ``JITFunction.run`` calls or keys on, which the direct launch does not handle."""
    rt = knobs.runtime
    stages = getattr(rt, "add_stages_inspection_hook", None)  # Triton 3.9: part of its key
    return bool(rt.launch_enter_hook or rt.launch_exit_hook or stages or fn.pre_run_hooks)


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
