"""What each compiled kernel config uses: registers, spills, shared memory and the programs per
SM they allow (experiments/hopper/hopper_levers.py ``meta``, and the ``levers`` rows; re-exported there).
"""

from __future__ import annotations

import contextlib
import json
import os

import torch

from hopper_env import _env


def _meta(kernel) -> dict:
    """Registers, spills, shared memory of a compiled kernel (Triton's CompiledKernel)."""
    out = {}
    with contextlib.suppress(Exception):
        kernel._init_handles()
    for name in ("n_regs", "n_spills", "n_max_threads"):
        val = getattr(kernel, name, None)
        if isinstance(val, int):
            out[name] = val
    md = getattr(kernel, "metadata", None)
    for name in ("shared", "num_warps", "num_stages", "num_ctas"):
        val = getattr(md, name, None)
        if isinstance(val, int):
            out[name] = val
    if "n_regs" in out and "shared" in out and "num_warps" in out:
        threads = 32 * out["num_warps"]
        by_regs = 65536 // max(1, out["n_regs"] * threads)
        by_smem = 233472 // (out["shared"] + 1024) if out["shared"] else 32
        by_threads = 2048 // threads
        out["blocks_per_sm"] = int(min(by_regs, by_smem, by_threads, 32))
        out["limited_by"] = min(
            (by_regs, "registers"), (by_smem, "shared memory"), (by_threads, "threads")
        )[1]
    return out


def _meta_worker(job):
    """Compile (no launch) every package config for one (head dim, causal); return the rows."""
    d, causal = job
    from course_kernels.triton import backward as triton_backward
    from course_kernels.triton import forward as triton_forward
    from course_kernels.bench import SWEEP_CONFIGS

    rows = []
    q = torch.randn(1, 2, 256, d, device="cuda", dtype=torch.float16)
    o = torch.empty_like(q)
    lse = torch.empty(1, 2, 256, device="cuda")
    base = {"dtype": "float16", "d": d, "causal": causal}
    common = constexprs(d, causal)
    fwd_cfgs = sorted(set(SWEEP_CONFIGS) | {(64, 128, 8, 3), (128, 128, 8, 4), (64, 64, 4, 4)})
    for bm, bn, w, s in fwd_cfgs:
        row = {
            **base,
            "kernel": "_attn_fwd",
            "block_m": bm,
            "block_n": bn,
            "num_warps": w,
            "num_stages": s,
        }
        try:
            kern = triton_forward._attn_fwd.fn.warmup(
                *(q, q, q, lse, o, lse, lse, lse),  # Q K V LSE O, cu_seqlens and ALiBi unused
                *q.stride(),
                *q.stride(),
                *q.stride(),
                *o.stride(),
                *variant_args(causal),
                2,
                1,
                256,
                256,
                grid=(1,),
                BLOCK_M=bm,
                BLOCK_N=bn,
                num_warps=w,
                num_stages=s,
                **common,
            )
            row.update(_meta(kern))
        except Exception as exc:
            row["error"] = repr(exc)[:300]
        rows.append(row)
    for name, kernel, which in (
        ("_attn_bwd_dkdv", triton_backward._attn_bwd_dkdv, "dkdv"),
        ("_attn_bwd_dq", triton_backward._attn_bwd_dq, "dq"),
    ):
        for c in kernel_configs(which):
            row = {
                **base,
                "kernel": name,
                **{k.lower(): v for k, v in c.kwargs.items()},
                "num_warps": c.num_warps,
                "num_stages": c.num_stages,
            }
            try:
                args_, extra = bwd_args(name, q, o, lse, causal)
                kern = kernel.fn.warmup(
                    *args_,
                    grid=(1,),
                    num_warps=c.num_warps,
                    num_stages=c.num_stages,
                    **c.kwargs,
                    **common,
                    **extra,
                )
                row.update(_meta(kern))
            except Exception as exc:
                row["error"] = repr(exc)[:300]
            rows.append(row)
    return rows


def cmd_meta(args):
    """Registers / spills / shared memory / blocks per SM of each package kernel config
    (compiled, not launched), one worker process per (head dim, causal)."""
    import multiprocessing as mp

    env, rows = _env(), []
    path = os.path.join(args.out, "config_meta.json")
    jobs = [(d, c) for d in (128, 64) for c in (False, True)]
    with mp.get_context("spawn").Pool(len(jobs)) as pool:
        for part in pool.imap_unordered(_meta_worker, jobs):
            rows.extend(part)
            with open(path, "w") as f:
                json.dump({"environment": env, "results": rows}, f, indent=1)
    for r in rows:
        print(json.dumps(r))
    return 0


def constexprs(d, causal):
    """The constexprs every kernel takes: head dim, the variant (causal: top-left), precision."""
    flags = dict(WINDOWED=causal, BOTTOM_RIGHT=False, SOFTCAP=False, ALIBI=False, VARLEN=False)
    return dict(HEAD_DIM=d, HEAD_DIM_PADDED=d, **flags, DOT_PRECISION="tf32")


def variant_args(causal):
    """LSE strides, ALiBi stride, qk_mul, c log2 e, window offsets (course_kernels.triton.masks)."""
    from course_kernels.triton.masks import BIG

    return (512, 256, 0, 1.0, 0.18, -BIG, 0 if causal else BIG)


def bwd_args(name, q, o, lse, causal=False):
    """Positional arguments and extra constexprs of a backward kernel compiled (not launched) for
    (1, 2, 256, d) inputs: every pointer is q, o or lse (only dtypes and alignment matter)."""
    pointers = {
        "_attn_bwd_dkdv": (q, q, q, q, lse, lse, o, o, o),  # Q K V dO LSE D dK dV dQ
        "_attn_bwd_dq": (q, q, q, q, o, lse, lse, o),  # Q K V dO O LSE D dQ
    }[name]
    extra = (
        {"ATOMIC_DQ": False, "ONE_LOOP": True} if name == "_attn_bwd_dkdv" else {}
    )  # as launched
    extra["EVEN_BLOCKS"] = False  # the masked loads (the package sets it for divisible lengths)
    extra["PEEL"] = name == "_attn_bwd_dkdv"  # as launched: dK/dV's tail peeled, dQ masked
    tail = (0.1, *q.stride(), *q.stride(), *variant_args(causal), 2, 1, 256, 256)
    return (*pointers, lse, lse, lse, *tail), extra  # cu_seqlens and ALiBi: unused pointers


def kernel_configs(which):
    from course_kernels.triton import backward as triton_backward

    cfgs = triton_backward.dkdv_configs() if which == "dkdv" else triton_backward.dq_configs()
    return [
        c
        for c in cfgs
        if c not in (triton_backward.DKDV_IEEE_CONFIG, triton_backward.DQ_IEEE_CONFIG)
    ]
