"""Colab's T4 without a T4: the Triton kernels compiled ahead of time for sm_75.

Triton compiles for a GPU it is not running on: ``triton.compile(ASTSource(fn, signature,
constexprs, attrs), target=GPUTarget("cuda", 75, 32))`` lowers a kernel to PTX and assembles it
with the ptxas shipped in the Triton wheel; no GPU and no driver are involved (Triton 3.6, on the
course's GPU machine, and 3.9, pinned here, have this API). The compiled kernel's metadata says
how much shared memory a launch asks for, and that decides whether it can run on a T4: 64 KiB per
block with the opt-in Triton requests (``hw.GPUS["T4"]``); above that, loading the kernel raises
``OutOfResources``.

What a T4 runs: on a GPU below sm_80 each kernel's pruner (``_triton_env.prune_configs``) keeps
one config from the kernel's sm_75 table (``FWD_SM75``, ``DKDV_SM75``, ``DQ_SM75``), chosen by
head dim and product precision (``_triton_env.sm75_config``); a table entry of None (fp32 dK/dV at
head dim 256: nothing fits) makes the launch raise a clear error. This file compiles every entry
for sm_75 and checks it asks for at most 64 KiB. Before those tables (measured with this file,
notes/t4_sm75.md) the backward did not fit at head dim 128 and nothing fit at head dim 256.

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
HEAD_DIMS = (64, 128, 256)

# Pointer arguments of the three autotuned kernels; LSE and Delta are float32 whatever the input.
POINTERS = {"Q", "K", "V", "DO", "Out", "DK", "DV", "DQ"}
FP32_POINTERS = {"LSE", "Delta", "ALIBI_R"}
I32_POINTERS = {"CU_Q", "CU_K"}  # cu_seqlens (read only with VARLEN)


def _kernels():
    from course_kernels.triton import backward as triton_backward
    from course_kernels.triton import forward as triton_forward

    return {
        "fwd": triton_forward._attn_fwd,
        "dkdv": triton_backward._attn_bwd_dkdv,
        "dq": triton_backward._attn_bwd_dq,
    }


def _source(autotuner, dtype: str, d: int, config, backend):
    """The ASTSource a launch from ``course_kernels.triton.flash`` would compile: batch 1, 2 heads, N = 1024.

    Arguments are specialized the way Triton specializes a launch: tensors (16-byte aligned by
    torch) are pointers divisible by 16, integers equal to 1 become constexprs, other integers
    that are multiples of 16 carry the divisibility hint.
    """
    from aot_source import launch_source

    fn = autotuner.fn
    H, N = 2, 1024  # the batch size changes the launch grid, not the compiled kernel
    values = {
        "scale": d**-0.5,
        "H_Q": H,
        "KV_HEADS": H,
        "GROUP_SIZE": 1,
        "N_CTX_Q": N,
        "N_CTX_K": N,
        "qk_mul": 1.0,  # the plain variant: r = q.k, c = scale (masks.py)
        "c2": d**-0.5 * 1.4426950408889634,
        "win_lo": -(1 << 30),
        "win_hi": 1 << 30,
    }
    for name in fn.arg_names:  # contiguous (B, H, N, d) tensors
        if name.startswith("stride_"):
            values[name] = {"z": H * N * d, "h": N * d, "m": d, "n": d, "k": 1}[name[-1]]
    values.update(stride_lz=H * N, stride_lh=N, stride_az=0)  # LSE (B, H, N); no ALiBi
    variant_flags = ("WINDOWED", "BOTTOM_RIGHT", "SOFTCAP", "ALIBI", "VARLEN")
    constexprs = dict(
        HEAD_DIM=d,
        HEAD_DIM_PADDED=max(16, 1 << (d - 1).bit_length()),
        **{flag: False for flag in variant_flags if flag in fn.arg_names},
        DOT_PRECISION="ieee" if dtype == "fp32" else "tf32",
        **config.kwargs,
    )

    def pointer_type(name):
        if name in FP32_POINTERS or name in I32_POINTERS:
            return "*fp32" if name in FP32_POINTERS else "*i32"
        return f"*{dtype}" if name in POINTERS else None

    return launch_source(fn, constexprs, values, pointer_type, backend)


def _tables():
    from course_kernels.triton import backward as triton_backward
    from course_kernels.triton import forward as triton_forward

    return {
        "fwd": triton_forward.FWD_SM75,
        "dkdv": triton_backward.DKDV_SM75,
        "dq": triton_backward.DQ_SM75,
    }


def _t4_config(kernel: str, dtype: str, d: int):
    """The config a T4 runs for this kernel, dtype and head dim (None: nothing fits)."""
    from course_kernels.triton._env import sm75_config

    return sm75_config(_tables()[kernel], max(16, 1 << (d - 1).bit_length()), dtype == "fp32")


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
        config = _t4_config(case["kernel"], case["dtype"], case["d"])
        start = time.perf_counter()
        compiled = triton.compile(
            _source(kernel, case["dtype"], case["d"], config, backend),
            target=target,
            options=dict(num_warps=config.num_warps, num_stages=config.num_stages),
        )
        ptx = compiled.asm["ptx"]
        print(
            json.dumps(
                {
                    **case,
                    "config": str(config),
                    "shared": compiled.metadata.shared,
                    "ptx_target": re.search(r"^\.target (\S+)", ptx, re.M).group(1),
                    "cubin_bytes": len(compiled.asm["cubin"]),
                    "mma": len(re.findall(r"\bmma\.sync\b", ptx)),
                    "fma_f32": len(re.findall(r"\bfma\.rn\.f32\b", ptx)),
                    "triton": triton.__version__,
                    "seconds": round(time.perf_counter() - start, 1),
                }
            ),
            flush=True,
        )


def _compile(cases: list[dict], tmp_path) -> list[dict]:
    env = {
        **os.environ,
        "TRITON_INTERPRET": "0",
        "TRITON_CACHE_DIR": str(tmp_path / "cache"),
        "TRITON_DEFAULT_FP_FUSION": "1",
        "PYTHONPATH": str(ROOT),
    }
    proc = subprocess.run(
        [sys.executable, __file__, json.dumps(cases)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, f"compiling for sm_75 failed:\n{proc.stderr[-4000:]}"
    results = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(results) == len(cases), proc.stdout
    return results


# fp32 dK/dV at head dim 256: even 16 x 16 tiles ask for 66,560 bytes (notes/t4_sm75.md).
NOTHING_FITS = {("dkdv", "fp32", 256)}


@pytest.mark.parametrize("kernel", ["fwd", "dkdv", "dq"])
def test_sm75_the_t4_path_fits_64_kib(kernel, tmp_path):
    """fp16 and fp32, head dims 64, 128 and 256: the config of the T4 path compiles for sm_75
    (PTX assembled to a cubin) and asks for at most 64 KiB of shared memory."""
    cases = [
        dict(kernel=kernel, dtype=t, d=d, arch=75)
        for t in ("fp16", "fp32")
        for d in HEAD_DIMS
        if (kernel, t, d) not in NOTHING_FITS
    ]
    results = _compile(cases, tmp_path)
    for r in results:
        assert r["ptx_target"] == "sm_75" and r["cubin_bytes"] > 0, r
        assert r["shared"] > 0, r  # a tl.dot on sm_75 stages its operands in shared memory
    too_big = [r for r in results if r["shared"] > T4_SHARED_BYTES]
    assert not too_big, (
        "these would fail to launch on a T4 (more than 64 KiB of shared "
        "memory):\n"
        + "\n".join(
            f"{r['kernel']} {r['dtype']} d={r['d']} {r['config']}: {r['shared']} bytes"
            for r in too_big
        )
    )


def test_sm75_pruner_uses_the_table_below_sm80(monkeypatch):
    """On a GPU below sm_80 each kernel's pruner keeps exactly its sm_75 table's config, and a
    shape that fits nowhere is a clear error (not a launch failure deep in Triton)."""
    from course_kernels.triton import _env as _triton_env
    from course_kernels.triton import backward as triton_backward
    from course_kernels.triton import forward as triton_forward

    kernels = {
        "fwd": triton_forward._attn_fwd,
        "dkdv": triton_backward._attn_bwd_dkdv,
        "dq": triton_backward._attn_bwd_dq,
    }
    monkeypatch.setattr(_triton_env, "gpu_capability", lambda: (7, 5))
    for name, autotuner in kernels.items():
        for dtype in ("fp16", "fp32"):
            for d in HEAD_DIMS:
                named = dict(
                    HEAD_DIM=d,
                    HEAD_DIM_PADDED=d,
                    DOT_PRECISION="ieee" if dtype == "fp32" else "tf32",
                )
                if (name, dtype, d) in NOTHING_FITS:
                    with pytest.raises(ValueError, match="64 KiB"):
                        autotuner.early_config_prune(autotuner.configs, named)
                    continue
                kept = autotuner.early_config_prune(autotuner.configs, named)
                assert kept == [_t4_config(name, dtype, d)], (name, dtype, d)
    monkeypatch.setattr(_triton_env, "gpu_capability", lambda: (9, 0))  # Hopper: unchanged
    named = dict(HEAD_DIM=64, HEAD_DIM_PADDED=64, DOT_PRECISION="tf32")
    configs = triton_forward._attn_fwd.configs
    kept = triton_forward._attn_fwd.early_config_prune(configs, named)
    fast = [c for c in configs if c is not triton_forward.FWD_IEEE_CONFIG]
    assert kept == (fast if _triton_env.AUTOTUNE else fast[:1])


def test_sm75_dot_runs_on_fma_units_not_tensor_cores(tmp_path):
    """What the book tells a T4 user: Triton >= 3.3 compiles tl.dot for sm_75 to FMA
    instructions (triton-lang/triton#5066), and to tensor-core mma for sm_80."""
    t4, a100 = _compile(
        [
            dict(kernel="fwd", dtype="fp16", d=64, arch=75),
            dict(kernel="fwd", dtype="fp16", d=64, arch=80),
        ],
        tmp_path,
    )
    assert t4["mma"] == 0 and t4["fma_f32"] > 1000, t4
    assert a100["mma"] > 0, a100


if __name__ == "__main__":
    compile_cases(json.loads(sys.argv[1]))
