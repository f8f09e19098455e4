"""Where the Triton kernels run: a CUDA GPU, or Triton's CPU interpreter.

Chapter: "Flash Attention in Triton" (the forward kernel).

Import this module *before* any module that defines a ``@triton.jit`` kernel: Triton reads
``TRITON_INTERPRET`` when a kernel is defined, so the choice must be made first.
``launch.py`` imports it first, then the kernel modules.

- A CUDA GPU is present: kernels are compiled for it.
- No GPU: ``TRITON_INTERPRET=1`` is set (unless you set it yourself) and every kernel runs in
  Triton's NumPy interpreter. It is exact (fp32 dots are IEEE), slow, and needs CPU tensors.
  Interpreter caveats: bf16 ``tl.dot`` gives wrong results (triton-lang/triton#11584), so
  ``launch.py`` computes bf16 inputs in fp32 there; out-of-bounds accesses are not caught;
  ``triton.testing.do_bench`` needs a GPU.
- Neither Triton nor a GPU/interpreter can run: :func:`require_triton` raises ``RuntimeError``.

Below sm_80 (Colab's T4 is sm_75), Triton >= 3.3 runs ``tl.dot`` on FMA units instead of tensor
cores (triton-lang/triton#5066): the results are right but slow, and there is no bf16.
"""

from __future__ import annotations

import functools
import os
import sys

from .._probe import cuda_available


def _reinterpret_triton_library() -> None:
    """Turn Triton's own ``@jit`` helpers (``tl.max``, ``tl.sum``, ...) into interpreted ones.

    Triton decides at decoration time whether a ``@triton.jit`` function is compiled or
    interpreted. If ``triton`` was imported before TRITON_INTERPRET was set (``import triton``
    before ``import course_kernels`` in a notebook, or pytest's ``importorskip``), its library
    functions were built for a GPU, and calling them from an interpreted kernel fails with
    "Cannot call @triton.jit'd outside of the scope of a kernel". Rebuild those objects as the
    decorator would have with the variable set.
    """
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    rebuilt: dict[int, object] = {}
    for name, module in list(sys.modules.items()):
        if module is None or not name.startswith("triton.language"):
            continue
        for attr, value in list(vars(module).items()):
            if isinstance(value, JITFunction):
                if id(value) not in rebuilt:
                    rebuilt[id(value)] = InterpretedFunction(value.fn)
                setattr(module, attr, rebuilt[id(value)])


HAS_GPU: bool = cuda_available()
if not HAS_GPU and os.environ.get("TRITON_INTERPRET") is None:
    os.environ["TRITON_INTERPRET"] = "1"  # must happen before the first @triton.jit
    if "triton.language" in sys.modules:
        _reinterpret_triton_library()
INTERPRET: bool = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")

try:
    import triton  # noqa: F401

    TRITON_ERROR: Exception | None = None
except Exception as exc:  # ImportError, or a broken install
    TRITON_ERROR = exc


def require_triton() -> None:
    """Raise a clear ``RuntimeError`` when no kernel can run here."""
    if TRITON_ERROR is not None:
        raise RuntimeError(
            "flash_attention needs Triton (pip install 'course_kernels[kernel]'); importing it "
            f"failed: {TRITON_ERROR!r}"
        )
    if not HAS_GPU and not INTERPRET:
        raise RuntimeError(
            "flash_attention found no CUDA GPU and TRITON_INTERPRET=0, so Triton has nowhere to "
            "run ('0 active drivers'). Unset TRITON_INTERPRET (or set it to 1) to use the CPU "
            "interpreter, or run on a CUDA GPU."
        )


# COURSE_KERNELS_AUTOTUNE=0 keeps only the first (default) config of each kernel: no autotuning,
# so a test run or an ``ncu`` profile compiles each kernel once and times nothing extra.
AUTOTUNE: bool = os.environ.get("COURSE_KERNELS_AUTOTUNE", "1") != "0"


def autotune_kwargs() -> dict:
    """Cheaper timing for autotuning (5 ms warm-up, 25 ms of repeats) where Triton allows it."""
    import inspect

    import triton

    if INTERPRET or "do_bench" not in inspect.signature(triton.autotune).parameters:
        return {}

    def bench(fn, quantiles):
        return triton.testing.do_bench(fn, warmup=5, rep=25, quantiles=quantiles)

    return {"do_bench": bench}


def pick_configs(gpu_configs: list, cpu_config, ieee_config) -> list:
    """The configs an autotuned kernel may use; :func:`prune_configs` chooses among them.

    Under the interpreter: ``cpu_config`` alone. On a GPU: ``gpu_configs`` for fp16/bf16 (the
    last one small enough for head dim 256 and for a T4's 64 KB of shared memory), plus
    ``ieee_config`` for fp32 inputs, whose IEEE products Triton computes on FMA units with
    fully unrolled code: big tiles there compile for minutes and spill.
    """
    if INTERPRET:
        return [cpu_config]
    return list(gpu_configs) + [ieee_config]


def gpu_capability() -> tuple[int, int] | None:
    """(major, minor) compute capability of the current CUDA device; None without a GPU."""
    if not HAS_GPU:
        return None
    import torch

    return _capability(torch.cuda.current_device())


@functools.cache
def _capability(device_index: int) -> tuple[int, int]:
    import torch

    return tuple(torch.cuda.get_device_capability(device_index))


# Below sm_80 (Colab's T4, sm_75) a block may ask for at most 64 KiB of shared memory, and tl.dot
# runs on FMA units with its operands staged in shared memory, so tiles cost more than on Ampere
# or Hopper. Measured by compiling for sm_75 without a T4 (tests/test_sm75_compile.py,
# notes/t4_sm75.md): the largest tiles that fit, per head dim (padded) and product precision.
# A kernel has one entry per (max head dim, ieee); None: nothing fits (a clear error instead).
SM75_SHARED_BYTES = 64 * 1024


def sm75_config(table: dict, head_dim_padded: int, ieee: bool):
    """The config a pre-Ampere GPU (a T4) uses for this head dim and precision, or None."""
    for max_d, cfg in sorted((k[0], v) for k, v in table.items() if k[1] == ieee):
        if head_dim_padded <= max_d:
            return cfg
    return None


def prune_configs(ieee_config, small_config, sm75_table: dict | None = None):
    """An ``early_config_prune``: a pre-Ampere GPU (T4) -> its table's config; fp32 ->
    ``ieee_config``; head dim 256 -> ``small_config``; otherwise the fp16/bf16 configs (only the
    first with COURSE_KERNELS_AUTOTUNE=0)."""

    def prune(configs, named_args, **kwargs):
        args = {**named_args, **kwargs}
        ieee = args.get("DOT_PRECISION") == "ieee"
        cap = gpu_capability()
        if sm75_table is not None and cap is not None and cap < (8, 0):
            cfg = sm75_config(sm75_table, args.get("HEAD_DIM_PADDED", 0), ieee)
            if cfg is None:
                raise ValueError(
                    f"no kernel config fits this GPU's 64 KiB of shared memory (sm_{cap[0]}{cap[1]}) "
                    f"at head dim {args.get('HEAD_DIM')} with "
                    f"{'fp32' if ieee else 'fp16'} inputs; use fp16 inputs or a head dim <= 128 "
                    "(notes/t4_sm75.md)"
                )
            return [cfg]
        if ieee:
            return [ieee_config]
        if args.get("HEAD_DIM_PADDED", 0) >= 256:
            return [small_config]
        fast = [c for c in configs if c is not ieee_config]
        return fast if AUTOTUNE else fast[:1]

    return prune


def next_power_of_2(n: int) -> int:
    """Smallest power of two >= n, in plain Python.

    ``triton.next_power_of_2`` (like ``triton.cdiv``) is a Triton constexpr function in recent
    versions and costs tens of microseconds per host-side call: launch overhead that showed at
    N = 1024 (notes/kernel.md).
    """
    return 1 << (int(n) - 1).bit_length()


def device_kind() -> str:
    """'cuda' where kernels compile for a GPU, 'cpu' under the interpreter."""
    return "cpu" if INTERPRET else "cuda"


def capability() -> tuple[int, int] | None:
    """The GPU's compute capability, or None under the interpreter."""
    if INTERPRET or not HAS_GPU:
        return None
    import torch

    return torch.cuda.get_device_capability()


def environ_get(name: str, default: str) -> str:
    """``os.environ.get`` without its per-call key encoding (~1 us a forward call): read at every
    call, so a change of the variable (``monkeypatch.setenv``, a sweep) takes effect at once."""
    data, encodekey = getattr(os.environ, "_data", None), getattr(os.environ, "encodekey", None)
    if data is None or encodekey is None:  # pragma: no cover (another Python's os.environ)
        return os.environ.get(name, default)
    value = data.get(_ENV_KEYS.get(name) or _ENV_KEYS.setdefault(name, encodekey(name)))
    return default if value is None else os.environ.decodevalue(value)


_ENV_KEYS: dict = {}
