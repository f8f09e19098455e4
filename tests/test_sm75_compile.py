"""Colab's T4 without a T4: the Triton kernels compiled ahead of time for sm_75.

Triton compiles for a GPU it is not running on: ``triton.compile(ASTSource(fn, signature,
constexprs, attrs), target=GPUTarget("cuda", 75, 32))`` lowers a kernel to PTX and assembles it
with the ptxas shipped in the Triton wheel; no GPU and no driver are involved (Triton 3.6, on the
course's GPU machine, and 3.9, pinned here, have this API). The compiled kernel's metadata says
how much shared memory a launch asks for, and that decides whether it can run on a T4: 64 KiB per
block with the opt-in Triton requests (``hw.GPUS["T4"]``); above that, loading the kernel raises
``OutOfResources``.

What a T4 runs (``course_kernels._triton_env.pick_configs`` / ``prune_configs``; nothing is
special-cased for sm_75): fp16 inputs use the autotuner's list, whose configs that do not fit
fail to load and are dropped by the autotuner (``OutOfResources`` -> infinite time), so the list
must hold one that fits: the small config at its end. fp32 inputs use the IEEE config alone, so
it must fit. Shared memory grows with the head dim, so head dim 128 (the largest below 256) is the
worst case tested here. Measured with this file (notes/t4_sm75.md): the forward fits; the
backward does not at head dim 128 (marked xfail, strict); nothing fits at head dim 256, nor the
first config alone (``COURSE_KERNELS_AUTOTUNE=0``) at head dim 128.

The compilation runs in a subprocess with a fresh ``TRITON_CACHE_DIR`` (nothing is cached across
runs): this pytest session runs the kernels in Triton's CPU interpreter (``TRITON_INTERPRET=1`` is
fixed when a kernel is defined), and compiling needs the real JIT functions.

Run as a script, this file compiles the cases given as JSON and prints one JSON line per case.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

if importlib.util.find_spec("triton") is None:  # like the other kernel tests (importorskip),
    pytest.skip("Triton is not installed", allow_module_level=True)  # without importing it here

ROOT = Path(__file__).resolve().parents[1]
T4_SHARED_BYTES = 64 * 1024
HEAD_DIMS = (64, 128)  # 128: the worst case below 256 (smaller head dims need less)

# Pointer arguments of the three autotuned kernels; LSE and Delta are float32 whatever the input.
POINTERS = {"Q", "K", "V", "DO", "Out", "DK", "DV", "DQ"}
FP32_POINTERS = {"LSE", "Delta"}


def _kernels():
    from course_kernels import triton_backward, triton_forward

    return {"fwd": triton_forward._attn_fwd, "dkdv": triton_backward._attn_bwd_dkdv,
            "dq": triton_backward._attn_bwd_dq}


def _source(autotuner, dtype: str, d: int, config, backend):
    """The ASTSource a launch from ``course_kernels.flash`` would compile: batch 1, 2 heads, N = 1024.

    Arguments are specialized the way Triton specializes a launch: tensors (16-byte aligned by
    torch) are pointers divisible by 16, integers equal to 1 become constexprs, other integers
    that are multiples of 16 carry the divisibility hint.
    """
    from triton.compiler import ASTSource

    fn = autotuner.fn
    H, N = 2, 1024  # the batch size changes the launch grid, not the compiled kernel
    values = {"sm_scale": d ** -0.5, "H_Q": H, "H_KV": H, "GROUP_SIZE": 1, "N_CTX_Q": N,
              "N_CTX_K": N}
    for name in fn.arg_names:  # contiguous (B, H, N, d) tensors
        if name.startswith("stride_"):
            values[name] = {"z": H * N * d, "h": N * d, "m": d, "n": d, "k": 1}[name[-1]]
    constexprs = dict(HEAD_DIM=d, HEAD_DIM_PADDED=max(16, 1 << (d - 1).bit_length()),
                      CAUSAL=False, DOT_PRECISION="ieee" if dtype == "fp32" else "tf32",
                      **config.kwargs)
    signature, attrs = {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in constexprs:
            signature[name] = "constexpr"
        elif name in POINTERS or name in FP32_POINTERS:
            signature[name] = "*fp32" if name in FP32_POINTERS else f"*{dtype}"
            attrs[(i,)] = backend.parse_attr("D")
        elif isinstance(values[name], float):
            signature[name] = "fp32"
        elif values[name] == 1:
            signature[name] = "constexpr"
            constexprs[name] = 1
        else:
            signature[name] = "i32"
            if values[name] % 16 == 0:
                attrs[(i,)] = backend.parse_attr("D")
    return ASTSource(fn, signature, constexprs, attrs)


def _t4_config(autotuner, dtype: str, d: int):
    """The config of the T4 path that must fit: the last one the kernel's own pruner keeps
    (the small config for fp16, the only one for fp32)."""
    named = dict(HEAD_DIM=d, HEAD_DIM_PADDED=max(16, 1 << (d - 1).bit_length()),
                 DOT_PRECISION="ieee" if dtype == "fp32" else "tf32")
    return autotuner.early_config_prune(autotuner.configs, named)[-1]


def compile_cases(cases: list[dict]) -> None:
    """Compile each case ({kernel, dtype, d, arch}) and print what the compiler reports."""
    import re
    import time

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend

    kernels = _kernels()
    for case in cases:
        target = GPUTarget("cuda", case["arch"], 32)
        backend = make_backend(target)
        kernel = kernels[case["kernel"]]
        config = _t4_config(kernel, case["dtype"], case["d"])
        start = time.perf_counter()
        compiled = triton.compile(_source(kernel, case["dtype"], case["d"], config, backend),
                                  target=target, options=dict(num_warps=config.num_warps,
                                                              num_stages=config.num_stages))
        ptx = compiled.asm["ptx"]
        print(json.dumps({**case, "config": str(config), "shared": compiled.metadata.shared,
                          "ptx_target": re.search(r"^\.target (\S+)", ptx, re.M).group(1),
                          "cubin_bytes": len(compiled.asm["cubin"]),
                          "mma": len(re.findall(r"\bmma\.sync\b", ptx)),
                          "fma_f32": len(re.findall(r"\bfma\.rn\.f32\b", ptx)),
                          "triton": triton.__version__,
                          "seconds": round(time.perf_counter() - start, 1)}), flush=True)


def _compile(cases: list[dict], tmp_path) -> list[dict]:
    env = {**os.environ, "TRITON_INTERPRET": "0", "TRITON_CACHE_DIR": str(tmp_path / "cache"),
           "TRITON_DEFAULT_FP_FUSION": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, __file__, json.dumps(cases)], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"compiling for sm_75 failed:\n{proc.stderr[-4000:]}"
    results = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(results) == len(cases), proc.stdout
    return results


# The backward's configs do not fit a T4 at head dim 128 (measured with this test: dK/dV 72 KiB
# in fp16 and 68 KiB in fp32, dQ 72 KiB in fp16; notes/t4_sm75.md lists configs that do fit).
# strict: once the kernels get configs that fit, this marker must go and the test guards them.
BACKWARD_TOO_BIG = pytest.mark.xfail(
    strict=True, reason="the backward needs more than a T4's 64 KiB of shared memory at head "
    "dim 128 with the current configs (notes/t4_sm75.md)")


@pytest.mark.parametrize("kernel", ["fwd", pytest.param("dkdv", marks=BACKWARD_TOO_BIG),
                                    pytest.param("dq", marks=BACKWARD_TOO_BIG)])
def test_sm75_the_t4_path_fits_64_kib(kernel, tmp_path):
    """fp16 and fp32, head dims 64 and 128: the config of the T4 path compiles for sm_75 (PTX
    assembled to a cubin) and asks for at most 64 KiB of shared memory."""
    cases = [dict(kernel=kernel, dtype=t, d=d, arch=75) for t in ("fp16", "fp32") for d in HEAD_DIMS]
    results = _compile(cases, tmp_path)
    for r in results:
        assert r["ptx_target"] == "sm_75" and r["cubin_bytes"] > 0, r
        assert r["shared"] > 0, r  # a tl.dot on sm_75 stages its operands in shared memory
    too_big = [r for r in results if r["shared"] > T4_SHARED_BYTES]
    assert not too_big, "these would fail to launch on a T4 (more than 64 KiB of shared " \
        "memory):\n" + "\n".join(f"{r['kernel']} {r['dtype']} d={r['d']} {r['config']}: "
                                 f"{r['shared']} bytes" for r in too_big)


def test_sm75_dot_runs_on_fma_units_not_tensor_cores(tmp_path):
    """What the book tells a T4 user: Triton >= 3.3 compiles tl.dot for sm_75 to FMA
    instructions (triton-lang/triton#5066), and to tensor-core mma for sm_80."""
    t4, a100 = _compile([dict(kernel="fwd", dtype="fp16", d=64, arch=75),
                         dict(kernel="fwd", dtype="fp16", d=64, arch=80)], tmp_path)
    assert t4["mma"] == 0 and t4["fma_f32"] > 1000, t4
    assert a100["mma"] > 0, a100


if __name__ == "__main__":
    compile_cases(json.loads(sys.argv[1]))
