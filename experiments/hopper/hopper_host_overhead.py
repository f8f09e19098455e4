"""Host time per call of each layer of the launch path (experiments/hopper/hopper_levers.py ``overhead`` and
``overhead-bwd``; re-exported there): where the microseconds of a small attention call go.
"""

from __future__ import annotations

import json
import os
import statistics
import time

import torch

from hopper_env import _env


def _host_us(fn, n):
    """Host microseconds per call: n calls back to back, no synchronisation inside."""
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    dt = (time.perf_counter() - t0) / n * 1e6
    torch.cuda.synchronize()
    return dt


def cmd_overhead(args):
    """Host time per call of each layer of the launch path (tiny shape: the GPU waits on the
    host), 3 repeats; then a torch.profiler table of forward + backward at N = 1024."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from course_kernels.triton import flash
    from course_kernels.triton import forward as triton_forward
    from course_kernels.triton.flash import flash_attention

    env = _env()
    dev = "cuda"
    q, k, v, do = (torch.randn(1, 1, 128, 64, device=dev, dtype=torch.float16) for _ in range(4))
    qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
    out = flash_attention(qg, kg, vg, causal=True)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        out_s = F.scaled_dot_product_attention(qg, kg, vg, is_causal=True)
    o, lse2 = flash._forward(q, k, v, True, 0.125)
    lse_t = torch.empty(1, 1, 128, device=dev)

    def sdpa_fwd():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(qg, kg, vg, is_causal=True)

    def fwd_args():
        return (
            q,
            k,
            v,
            0.125,
            lse_t,
            o,
            *q.stride(),
            *k.stride(),
            *v.stride(),
            *o.stride(),
            1,
            1,
            128,
            128,
        )

    tuned = flash._TUNED[(id(triton_forward._attn_fwd), q.device, q.dtype, 128, 128, 64, True)]
    consts = dict(HEAD_DIM=64, HEAD_DIM_PADDED=64, CAUSAL=True, DOT_PRECISION="tf32")

    def grid(meta):
        return (flash._cdiv(128, meta["BLOCK_M"]), 1)

    items = {
        "sdpa-flash forward (autograd recording)": sdpa_fwd,
        "sdpa-flash backward (autograd.grad)": lambda: torch.autograd.grad(
            out_s, (qg, kg, vg), do, retain_graph=True
        ),
        "flash_attention forward (autograd recording)": lambda: flash_attention(
            qg, kg, vg, causal=True
        ),
        "flash_attention forward (no_grad)": lambda: _nograd(flash_attention, q, k, v),
        "flash_attention backward (autograd.grad)": lambda: torch.autograd.grad(
            out, (qg, kg, vg), do, retain_graph=True
        ),
        "_check_inputs": lambda: flash._check_inputs(q, k, v, True, None),
        "_FlashAttention.apply (forward)": lambda: flash._FlashAttention.apply(
            qg, kg, vg, True, 0.125, False
        ),
        "_forward (allocations + launch)": lambda: flash._forward(q, k, v, True, 0.125),
        "_backward (allocations + 2 launches)": lambda: flash._backward(
            do, q, k, v, o, lse2, True, 0.125
        ),
        "Triton launch, JITFunction.run (the package's cache-hit path)": lambda: (
            triton_forward._attn_fwd.fn.run(*fwd_args(), grid=grid, warmup=False, **consts, **tuned)
        ),
        "Triton launch through Autotuner.run": lambda: triton_forward._attn_fwd[grid](
            *fwd_args(), **consts
        ),
        "torch.empty_like x2": lambda: (torch.empty_like(q), torch.empty_like(lse_t)),
        "torch.ops op forward (custom_op dispatch)": lambda: (
            torch.ops.course_kernels.flash_attn_fwd(q, k, v, True, 0.125)
        ),
    }
    rows = []
    for name, fn in items.items():
        reps = [_host_us(fn, args.calls) for _ in range(3)]
        rows.append(
            {
                "what": name,
                "us_median": statistics.median(reps),
                "us_min": min(reps),
                "us_runs": reps,
            }
        )
        print(
            f"{name:64s} median {statistics.median(reps):7.1f} us  min {min(reps):7.1f}", flush=True
        )
    # torch.profiler at a real N = 1K shape: host (CPU) time vs GPU time per op
    from torch.profiler import ProfilerActivity, profile

    qb, kb, vb, dob = (
        torch.randn(4, 32, 1024, 64, device=dev, dtype=torch.float16) for _ in range(4)
    )
    qb.requires_grad_()
    kb.requires_grad_()
    vb.requires_grad_()
    for _ in range(3):
        torch.autograd.grad(flash_attention(qb, kb, vb, causal=True), (qb, kb, vb), dob)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            torch.autograd.grad(flash_attention(qb, kb, vb, causal=True), (qb, kb, vb), dob)
        torch.cuda.synchronize()
    table = []
    for e in prof.key_averages():
        table.append(
            {
                "name": e.key,
                "count": e.count,
                "cpu_total_us": e.cpu_time_total,
                "self_cpu_us": e.self_cpu_time_total,
                "device_total_us": getattr(
                    e, "device_time_total", getattr(e, "cuda_time_total", 0)
                ),
            }
        )
    table.sort(key=lambda r: -r["cpu_total_us"])
    with open(os.path.join(args.out, "host_overhead.json"), "w") as f:
        json.dump(
            {
                "environment": env,
                "calls_per_repeat": args.calls,
                "shape_host": [1, 1, 128, 64],
                "results": rows,
                "profile_fwd_bwd_x10_B4_H32_N1024_d64_causal": table[:25],
            },
            f,
            indent=1,
        )
    print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=15))
    return 0


def cmd_overhead_bwd(args):
    """Where the backward's host time goes: the autograd engine with an empty Python Function,
    the package's backward with and without the engine's worker thread, and a cProfile of the
    package backward run on the calling thread."""
    import cProfile
    import io
    import pstats

    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from course_kernels.triton import flash
    from course_kernels.triton.flash import flash_attention

    class Empty(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v):
            ctx.save_for_backward(q, k, v)
            return torch.empty_like(q)

        @staticmethod
        def backward(ctx, do):
            q, k, v = ctx.saved_tensors
            return do, do, do

    env = _env()
    q, k, v, do = (torch.randn(1, 1, 128, 64, device="cuda", dtype=torch.float16) for _ in range(4))
    qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
    out = flash_attention(qg, kg, vg, causal=True)
    out_e = Empty.apply(qg, kg, vg)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        out_s = F.scaled_dot_product_attention(qg, kg, vg, is_causal=True)
    o, lse2 = flash._forward(q, k, v, True, 0.125)
    items = {
        "sdpa-flash backward": lambda: torch.autograd.grad(
            out_s, (qg, kg, vg), do, retain_graph=True
        ),
        "empty Python Function backward (engine + Function overhead)": lambda: torch.autograd.grad(
            out_e, (qg, kg, vg), do, retain_graph=True
        ),
        "flash_attention backward": lambda: torch.autograd.grad(
            out, (qg, kg, vg), do, retain_graph=True
        ),
        "_backward alone": lambda: flash._backward(do, q, k, v, o, lse2, True, 0.125),
    }
    rows = []
    for threaded in (True, False):
        torch.autograd.set_multithreading_enabled(threaded)
        for name, fn in items.items():
            reps = [_host_us(fn, args.calls) for _ in range(3)]
            label = f"{name} [autograd worker thread {'on' if threaded else 'off'}]"
            rows.append(
                {
                    "what": label,
                    "us_median": statistics.median(reps),
                    "us_min": min(reps),
                    "us_runs": reps,
                }
            )
            print(f"{label:90s} median {statistics.median(reps):7.1f} us", flush=True)
    # cProfile the package backward on this thread (worker thread off)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(200):
        torch.autograd.grad(out, (qg, kg, vg), do, retain_graph=True)
    prof.disable()
    torch.autograd.set_multithreading_enabled(True)
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(30)
    text = buf.getvalue()
    print(text)
    with open(os.path.join(args.out, "host_overhead_bwd.json"), "w") as f:
        json.dump(
            {
                "environment": env,
                "calls_per_repeat": args.calls,
                "shape_host": [1, 1, 128, 64],
                "results": rows,
                "cprofile_200_backward_calls_thread_off": text,
            },
            f,
            indent=1,
        )
    return 0


def _nograd(fn, q, k, v):
    with torch.no_grad():
        return fn(q, k, v, causal=True)
