"""Measurements on a GPU: speed (TFLOP/s), peak memory and DRAM traffic of attention kernels.

Chapter: "Fast on a real GPU" (and the IO chapter for :func:`dram_cases`). Run through the CLI:

    python -m course_kernels bench  --out course_kernels/data/bench     # TFLOP/s, memory, correctness
    python -m course_kernels memory --out course_kernels/data/memory    # extra memory vs N
    python -m course_kernels dram run                    # under ncu; then `dram parse`

Providers: ``flash`` (this package's Triton kernel), ``sdpa-flash`` (FlashAttention-2 inside
PyTorch), ``sdpa-cudnn`` (cuDNN fused attention), ``sdpa-efficient`` (memory-efficient
attention), ``naive`` (matmul + softmax + matmul) and ``tutorial`` (Triton's fused-attention
tutorial, ``python/tutorials/06-fused-attention.py``, from a file named by the environment
variable ``COURSE_KERNELS_TUTORIAL``: see :func:`load_tutorial`); they live in
``bench_providers``. FLOPs = 4 B H N^2 d, halved for causal,
x2.5 for the backward (the Triton tutorial's and FlashAttention papers' convention); the
backward is timed alone (``torch.autograd.grad`` on a retained graph). Times are the median of
``triton.testing.do_bench``.

One module per job: speed here (:func:`run_bench`, :func:`gpu_check`); the providers in
``bench_providers``; reports (ratio table, figure) in ``bench_report``; memory in
``bench_memory``; DRAM traffic in ``bench_dram``; the config sweep in ``bench_sweep``. Their
names stay reachable as ``bench.<name>``.
"""

from __future__ import annotations

import csv
import datetime as _dt
import json
import os
import platform
import sys

import numpy as np

from .providers import (  # re-exported: the book, the tests and the other benchmarks
    PROVIDER_LABELS as PROVIDER_LABELS,
    PROVIDERS,
    TUTORIAL_ENV as TUTORIAL_ENV,
    _TUTORIALS as _TUTORIALS,
    _tutorial_provenance,
    load_tutorial as load_tutorial,
    naive_attention,
    provider_fn,
)
from ..testing import error_budget, max_abs_error

NAIVE_LIMIT_BYTES = 40 * 2**30  # skip naive where its N x N tensors would pass this


def environment() -> dict:
    """GPU, software versions, date and command: stored with every result."""
    import torch
    import triton

    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "none"
    cap = torch.cuda.get_device_capability() if torch.cuda.is_available() else None
    return {
        "gpu": gpu,
        "capability": list(cap) if cap else None,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.cuda.is_available() else None,
        "python": platform.python_version(),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(
            [os.path.basename(sys.executable), "-m", "course_kernels"] + sys.argv[1:]
        ),
        "autotune": os.environ.get("COURSE_KERNELS_AUTOTUNE", "1") != "0",
        "course_kernels_env": {
            k: v for k, v in os.environ.items() if k.startswith("COURSE_KERNELS_")
        },
        "tutorial": _tutorial_provenance(),
    }


def attention_flops(batch, heads, n, d, causal, mode) -> float:
    flops = 4.0 * batch * heads * n * n * d
    if causal:
        flops *= 0.5
    return flops * (2.5 if mode == "bwd" else 1.0)


def _peak_extra_mib(fn) -> float:
    """Peak memory allocated by ``fn()`` beyond what was live before, in MiB."""
    import torch

    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del out
    return peak / 2**20


def check_correctness(q, k, v, do, causal, out, grads, heads=2) -> dict:
    """FlashAttention's rule on a slice (batch 0, the first ``heads`` heads) of one shape.

    Reference: fp32 math on the GPU; bar: naive attention in the inputs' dtype. O may err at
    most 2x the naive error, gradients 3x (``course_kernels.testing``).
    """
    import torch

    sl = (slice(0, 1), slice(0, heads))
    result = {}
    ref_in = [x[sl].detach().float().requires_grad_() for x in (q, k, v)]
    nai_in = [x[sl].detach().clone().requires_grad_() for x in (q, k, v)]
    ref = naive_attention(*ref_in, causal)
    nai = naive_attention(*nai_in, causal)
    dref = torch.autograd.grad(ref, ref_in, do[sl].float())
    dnai = torch.autograd.grad(nai, nai_in, do[sl])
    pairs = {"O": (out, ref, nai, 2.0)}
    if grads is not None:
        for name, g, r, n in zip(("dQ", "dK", "dV"), grads, dref, dnai, strict=True):
            pairs[name] = (g, r, n, 3.0)
    ok = True
    for name, (x, r, n, factor) in pairs.items():
        x = x[sl].detach().float().cpu().numpy()
        r = r.detach().double().cpu().numpy()
        n = n.detach().float().cpu().numpy()
        err, budget = max_abs_error(x, r), error_budget(n, r, factor)
        result[name] = {"err": err, "budget": budget, "ok": bool(err <= budget)}
        ok &= err <= budget
    result["ok"] = bool(ok)
    del ref, nai, dref, dnai
    return result


def run_bench(
    out_dir,
    dtypes=("float16", "bfloat16"),
    ds=(64, 128),
    ns=(1024, 2048, 4096, 8192, 16384),
    causals=(False, True),
    modes=("fwd", "bwd"),
    providers=PROVIDERS,
    batch=4,
    hidden=2048,
    check=True,
    log=print,
):
    """Time every provider at every shape; write bench.json, bench.csv, ratios.csv, bench.png."""
    import torch
    from tqdm import tqdm

    os.makedirs(out_dir, exist_ok=True)
    env = environment()
    rows = []
    shapes = [(dt, d, n, c) for dt in dtypes for d in ds for c in causals for n in ns]
    fns = {p: provider_fn(p) for p in providers}
    for dt, d, n, causal in tqdm(shapes, desc="bench", file=sys.stdout, mininterval=5):
        heads = hidden // d
        dtype = getattr(torch, dt)
        torch.manual_seed(n + d)
        q, k, v, do = (
            torch.randn(batch, heads, n, d, device="cuda", dtype=dtype) for _ in range(4)
        )
        for x in (q, k, v):
            x.requires_grad_(True)
        naive_bytes = batch * heads * n * n * q.element_size() * 3
        for p in providers:
            if p == "naive" and naive_bytes > NAIVE_LIMIT_BYTES:
                continue
            fn = fns[p]
            row = {
                "provider": p,
                "dtype": dt,
                "d": d,
                "heads": heads,
                "batch": batch,
                "N": n,
                "causal": causal,
            }
            try:
                out = fn(q, k, v, causal)
                grads = bwd_error = None
                if "bwd" in modes or (check and p == "flash"):
                    try:  # a provider without this backward still gets its forward timed
                        grads = torch.autograd.grad(out, (q, k, v), do, retain_graph=True)
                    except Exception as exc:
                        bwd_error = exc
                if check and p == "flash":
                    row["check"] = check_correctness(q, k, v, do, causal, out, grads)
                    if not row["check"]["ok"]:
                        log(f"CORRECTNESS FAIL {row}")
                for mode in modes:
                    if mode == "bwd" and grads is None:
                        rows.append({**row, "mode": "error", "error": f"bwd: {bwd_error!r}"[:300]})
                        log(f"{p} {dt} d={d} N={n} causal={causal} bwd: {bwd_error!r}"[:300])
                        continue
                    ms, mem = _time_one(fn, q, k, v, do, causal, out, mode)
                    flops = attention_flops(batch, heads, n, d, causal, mode)
                    rows.append(
                        {
                            **row,
                            "mode": mode,
                            "ms": ms,
                            "tflops": flops / ms * 1e-9,
                            "peak_extra_mib": mem,
                        }
                    )
                out = grads = None
            except Exception as exc:  # a backend that refuses a shape is recorded, not fatal
                rows.append({**row, "mode": "error", "error": repr(exc)[:300]})
                log(f"{p} {dt} d={d} N={n} causal={causal}: {exc!r}"[:300])
            torch.cuda.empty_cache()
        q = k = v = do = None  # free before the next shape allocates
        _write_bench(out_dir, env, rows)
    _write_bench(out_dir, env, rows)
    try:
        from .report import plot_bench

        plot_bench(rows, os.path.join(out_dir, "bench.png"), env)
    except Exception as exc:  # matplotlib missing: the data still stands
        log(f"plot failed: {exc!r}")
    return rows


def _time_one(fn, q, k, v, do, causal, out, mode):
    """Median ms (``do_bench``) and peak extra MiB of one forward, or one backward alone."""
    import torch
    import triton

    if mode == "fwd":

        def call():
            return fn(q, k, v, causal)
    else:

        def call():
            return torch.autograd.grad(out, (q, k, v), do, retain_graph=True)

    ms = triton.testing.do_bench(call, warmup=10, rep=50, return_mode="median")
    return ms, _peak_extra_mib(call)


def _write_bench(out_dir, env, rows):
    from .report import write_ratios

    with open(os.path.join(out_dir, "bench.json"), "w") as f:
        json.dump({"environment": env, "results": rows}, f, indent=1)
    fields = [
        "provider",
        "dtype",
        "d",
        "heads",
        "batch",
        "N",
        "causal",
        "mode",
        "ms",
        "tflops",
        "peak_extra_mib",
        "check_ok",
    ]
    with open(os.path.join(out_dir, "bench.csv"), "w", newline="") as f:
        f.write(
            f"# {env['gpu']}; torch {env['torch']}; triton {env['triton']}; {env['date']}; "
            f"{env['command']}\n"
        )
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            if r.get("mode") in ("fwd", "bwd"):
                w.writerow({**r, "check_ok": r.get("check", {}).get("ok", "")})
    write_ratios(os.path.join(out_dir, "ratios.csv"), env, rows)


def gpu_check(log=print) -> bool:
    """Quick sanity check on the GPU: one shape per dtype against fp32 math."""
    import torch

    from ..triton.flash import flash_attention

    env = environment()
    log(json.dumps(env))
    ok = True
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        q, k, v, do = (torch.randn(2, 4, 1000, 80, device="cuda", dtype=dtype) for _ in range(4))
        k, v = k[:, :2], v[:, :2]
        ref = naive_attention(
            q.float(), k.float().repeat_interleave(2, 1), v.float().repeat_interleave(2, 1), True
        )
        out = flash_attention(q, k, v, causal=True)
        err = (out.float() - ref).abs().max().item()
        log(f"{dtype}: max abs error vs fp32 math {err:.2e}")
        ok &= bool(np.isfinite(err) and err < 5e-2)
    return ok
