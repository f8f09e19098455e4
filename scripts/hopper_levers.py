"""Hopper measurements for notes/kernel.md and the book's "What each Hopper lever did" chapter.

    python scripts/hopper_levers.py overhead --out DIR   # host time per call, N = 1K profile
    python scripts/hopper_levers.py meta --out DIR       # registers / shared memory per config
    python scripts/hopper_levers.py levers --out DIR     # TMA, warp specialization, FMA A/B
    python scripts/hopper_levers.py check                # the lever kernel vs SDPA (CPU or GPU)
    python scripts/hopper_levers.py bench --out DIR      # `python -m course_kernels bench` with
                                                         # the tutorial (fewer configs to tune)
    python scripts/hopper_levers.py n1k --out DIR        # N = 1024 again, --repeats times

Each writes one JSON (``host_overhead.json``, ``config_meta.json``, ``levers.json``) holding
the environment (GPU, versions, date, command) next to its rows. ``levers`` times an
*experimental* forward kernel defined here (not the package's): the package's forward loop with
switches for tensor-descriptor (TMA) loads of K and V, Triton's automatic warp specialization of
the key loop, and the tutorial's FMA form of the softmax rescaling, so that each lever is
measured against the same kernel with the switch off, in the same process.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from functools import partial

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from course_kernels import _triton_env  # noqa: E402,F401  (TRITON_INTERPRET before @jit)

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from course_kernels.triton_forward import LOG2E  # noqa: E402

try:
    from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: E402
except ImportError:  # older Triton
    TensorDescriptor = None


def _env():
    from course_kernels.bench import environment

    env = environment()
    env["command"] = "python3 " + " ".join(sys.argv)
    return env


# --------------------------------------------------------------------------------------------
# The experimental forward: the package's loop with lever switches (N a multiple of BLOCK_M,
# head dim a power of two, Hq = kv_heads: enough for the benchmark shapes).


@triton.jit
def _lever_step(
    acc,
    l_i,
    m_i,
    q,
    desc_k,
    desc_v,
    K,
    V,
    row0,
    offs_m,
    start_n,
    qk_scale,
    BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    MASKED: tl.constexpr,
    USE_TMA: tl.constexpr,
    FMA: tl.constexpr,
):
    """One key block through the online softmax (the package's loop body, with switches)."""
    offs_d = tl.arange(0, HEAD_DIM)
    offs_n = start_n + tl.arange(0, BLOCK_N)
    if USE_TMA:
        k = desc_k.load([(row0 + start_n).to(tl.int32), 0])  # (BLOCK_N, D) by the TMA engine
    else:
        k = tl.load(K + (row0 + offs_n)[:, None] * HEAD_DIM + offs_d[None, :])
    qk = tl.dot(q, tl.trans(k))
    if MASKED:
        qk = qk * qk_scale
        qk = tl.where(offs_n[None, :] <= offs_m[:, None], qk, float("-inf"))
        m_ij = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.math.exp2(qk - m_ij[:, None])
    elif FMA:  # scale folded into the subtraction: one fused multiply-add per score
        m_ij = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        p = tl.math.exp2(qk * qk_scale - m_ij[:, None])
    else:  # the package's form: scale, then subtract
        qk = qk * qk_scale
        m_ij = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.math.exp2(qk - m_ij[:, None])
    alpha = tl.math.exp2(m_i - m_ij)
    l_i = l_i * alpha + tl.sum(p, 1)
    if USE_TMA:
        v = desc_v.load([(row0 + start_n).to(tl.int32), 0])
    else:
        v = tl.load(V + (row0 + offs_n)[:, None] * HEAD_DIM + offs_d[None, :])
    acc = acc * alpha[:, None]
    acc = tl.dot(p.to(v.dtype), v, acc)
    return acc, l_i, m_ij


@triton.jit
def _lever_inner(
    acc,
    l_i,
    m_i,
    q,
    desc_k,
    desc_v,
    K,
    V,
    row0,
    offs_m,
    lo,
    hi,
    qk_scale,
    BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    MASKED: tl.constexpr,
    USE_TMA: tl.constexpr,
    WS: tl.constexpr,
    FMA: tl.constexpr,
):
    if WS:  # Triton's automatic warp specialization of the loop (producer / consumer warps)
        for start_n in tl.range(lo, hi, BLOCK_N, warp_specialize=True):
            start_n = tl.multiple_of(start_n, BLOCK_N)
            acc, l_i, m_i = _lever_step(
                acc,
                l_i,
                m_i,
                q,
                desc_k,
                desc_v,
                K,
                V,
                row0,
                offs_m,
                start_n,
                qk_scale,
                BLOCK_N,
                HEAD_DIM,
                MASKED,
                USE_TMA,
                FMA,
            )
    else:
        for start_n in range(lo, hi, BLOCK_N):
            start_n = tl.multiple_of(start_n, BLOCK_N)
            acc, l_i, m_i = _lever_step(
                acc,
                l_i,
                m_i,
                q,
                desc_k,
                desc_v,
                K,
                V,
                row0,
                offs_m,
                start_n,
                qk_scale,
                BLOCK_N,
                HEAD_DIM,
                MASKED,
                USE_TMA,
                FMA,
            )
    return acc, l_i, m_i


@triton.jit
def _lever_fwd(
    Q,
    K,
    V,
    Out,
    desc_k,
    desc_v,
    scale,
    N_CTX,
    HEAD_DIM: tl.constexpr,
    CAUSAL: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    USE_TMA: tl.constexpr,
    WS: tl.constexpr,
    FMA: tl.constexpr,
):
    start_m = tl.program_id(0) * BLOCK_M
    row0 = tl.program_id(1).to(tl.int64) * N_CTX  # first row of this (batch, head)
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + (row0 + offs_m)[:, None] * HEAD_DIM + offs_d[None, :])
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    qk_scale = scale * LOG2E
    if CAUSAL:
        acc, l_i, m_i = _lever_inner(
            acc,
            l_i,
            m_i,
            q,
            desc_k,
            desc_v,
            K,
            V,
            row0,
            offs_m,
            0,
            start_m,
            qk_scale,
            BLOCK_N,
            HEAD_DIM,
            False,
            USE_TMA,
            WS,
            FMA,
        )
        acc, l_i, m_i = _lever_inner(
            acc,
            l_i,
            m_i,
            q,
            desc_k,
            desc_v,
            K,
            V,
            row0,
            offs_m,
            start_m,
            start_m + BLOCK_M,
            qk_scale,
            BLOCK_N,
            HEAD_DIM,
            True,
            USE_TMA,
            False,
            FMA,
        )
    else:
        acc, l_i, m_i = _lever_inner(
            acc,
            l_i,
            m_i,
            q,
            desc_k,
            desc_v,
            K,
            V,
            row0,
            offs_m,
            0,
            N_CTX,
            qk_scale,
            BLOCK_N,
            HEAD_DIM,
            False,
            USE_TMA,
            WS,
            FMA,
        )
    acc = acc / l_i[:, None]
    tl.store(
        Out + (row0 + offs_m)[:, None] * HEAD_DIM + offs_d[None, :], acc.to(Out.dtype.element_ty)
    )


def lever_attention(
    q,
    k,
    v,
    causal,
    block_q,
    block_k,
    num_warps,
    num_stages,
    tma=False,
    ws=False,
    fma=False,
    scale=None,
):
    """Run the experimental forward; q, k, v (B, H, N, d) contiguous, N % block_q == 0."""
    B, H, N, d = q.shape
    assert N % block_q == 0 and block_q % block_k == 0 and q.is_contiguous()
    o = torch.empty_like(q)
    scale = d**-0.5 if scale is None else scale
    if tma:
        flat_k, flat_v = k.view(B * H * N, d), v.view(B * H * N, d)
        desc_k = TensorDescriptor(flat_k, list(flat_k.shape), list(flat_k.stride()), [block_k, d])
        desc_v = TensorDescriptor(flat_v, list(flat_v.shape), list(flat_v.stride()), [block_k, d])
    else:
        desc_k = desc_v = k  # unused (a pointer placeholder)
    kernel = _lever_fwd[(N // block_q, B * H)](
        q,
        k,
        v,
        o,
        desc_k,
        desc_v,
        scale,
        N,
        HEAD_DIM=d,
        CAUSAL=causal,
        BLOCK_M=block_q,
        BLOCK_N=block_k,
        USE_TMA=tma,
        WS=ws,
        FMA=fma,
        num_warps=num_warps,
        num_stages=num_stages,
    )
    return o, kernel


VARIANTS = {  # name -> (tma, ws, fma)
    "pointer": (False, False, False),
    "pointer+fma": (False, False, True),
    "tma": (True, False, False),
    "tma+fma": (True, False, True),
    "tma+fma+ws": (True, True, True),
}
LEVER_CONFIGS = ((64, 64, 4, 3), (128, 128, 8, 3))


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


def cmd_check(args):
    """The experimental kernel against SDPA at small sizes (interpreter on CPU, or the GPU)."""
    dev = _triton_env.device_kind()
    dtype = torch.float16 if dev == "cuda" else torch.float32
    torch.manual_seed(0)
    bad = 0
    for causal in (False, True):
        q, k, v = (torch.randn(1, 2, 128, 32, device=dev, dtype=dtype) for _ in range(3))
        ref = torch.nn.functional.scaled_dot_product_attention(
            q.float(), k.float(), v.float(), is_causal=causal
        )
        for name, (tma, ws, fma) in VARIANTS.items():
            if (tma and TensorDescriptor is None) or (ws and dev == "cpu"):
                continue
            o, _ = lever_attention(
                q, k, v, causal, 64, 32, 4, 1 if dev == "cpu" else 3, tma, ws, fma
            )
            err = float((o.float() - ref).abs().max())
            ok = err < (2e-3 if dtype == torch.float16 else 1e-5)
            bad += not ok
            print(f"causal={causal} {name}: max abs error {err:.2e} {'ok' if ok else 'FAIL'}")
    return 1 if bad else 0


def cmd_levers(args):
    from triton.testing import do_bench

    from course_kernels.bench import attention_flops
    from course_kernels.flash import flash_attention

    env, rows = _env(), []
    n, batch, hidden = args.n, 4, 2048
    path = os.path.join(args.out, args.levers_file)
    variants = {k: VARIANTS[k] for k in args.variants.split(",")}
    configs = (
        LEVER_CONFIGS
        if not args.configs
        else tuple(tuple(int(x) for x in c.split("/")) for c in args.configs.split(","))
    )
    for dt, rep in ((dt, rep) for rep in range(args.repeats) for dt in args.dtypes.split(",")):
        dtype = getattr(torch, dt)
        for d in (int(x) for x in args.ds.split(",")):
            for causal in (False, True):
                heads = hidden // d
                torch.manual_seed(d)
                q, k, v = (
                    torch.randn(batch, heads, n, d, device="cuda", dtype=dtype) for _ in range(3)
                )
                ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
                flops = attention_flops(batch, heads, n, d, causal, "fwd")
                base = {
                    "dtype": dt,
                    "d": d,
                    "N": n,
                    "causal": causal,
                    "batch": batch,
                    "heads": heads,
                    "repeat": rep,
                }
                ms = do_bench(
                    lambda q=q, k=k, v=v, causal=causal: flash_attention(q, k, v, causal=causal),
                    warmup=10,
                    rep=40,
                    return_mode="median",
                )
                rows.append(
                    {
                        **base,
                        "variant": "package (autotuned)",
                        "ms": ms,
                        "tflops": flops / ms * 1e-9,
                    }
                )
                for name, (tma, ws, fma) in variants.items():
                    for cfg in configs:
                        row = {
                            **base,
                            "variant": name,
                            "block_m": cfg[0],
                            "block_n": cfg[1],
                            "num_warps": cfg[2],
                            "num_stages": cfg[3],
                        }
                        try:
                            o, kern = lever_attention(q, k, v, causal, *cfg, tma, ws, fma)
                            row["max_abs_error_vs_sdpa"] = float(
                                (o.float() - ref.float()).abs().max()
                            )
                            row.update(_meta(kern))
                            ms = do_bench(
                                partial(lever_attention, q, k, v, causal, *cfg, tma, ws, fma),
                                warmup=10,
                                rep=40,
                                return_mode="median",
                            )
                            row.update(ms=ms, tflops=flops / ms * 1e-9)
                        except Exception as exc:  # a variant that does not compile: recorded
                            row["error"] = repr(exc)[:300]
                        rows.append(row)
                        print(
                            json.dumps(
                                {
                                    k: row.get(k)
                                    for k in (
                                        "dtype",
                                        "d",
                                        "causal",
                                        "variant",
                                        "block_m",
                                        "block_n",
                                        "num_warps",
                                        "tflops",
                                        "n_regs",
                                        "shared",
                                        "error",
                                    )
                                }
                            ),
                            flush=True,
                        )
                        with open(path, "w") as f:
                            json.dump({"environment": env, "results": rows}, f, indent=1)
                q = k = v = ref = None
    return 0


def _meta_worker(job):
    """Compile (no launch) every package config for one (head dim, causal); return the rows."""
    d, causal = job
    from course_kernels import triton_backward, triton_forward
    from course_kernels.bench import SWEEP_CONFIGS

    rows = []
    q = torch.randn(1, 2, 256, d, device="cuda", dtype=torch.float16)
    o = torch.empty_like(q)
    lse = torch.empty(1, 2, 256, device="cuda")
    base = {"dtype": "float16", "d": d, "causal": causal}
    common = dict(HEAD_DIM=d, HEAD_DIM_PADDED=d, CAUSAL=causal, DOT_PRECISION="tf32")
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
                q,
                q,
                q,
                0.1,
                lse,
                o,
                *q.stride(),
                *q.stride(),
                *q.stride(),
                *o.stride(),
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
                if name == "_attn_bwd_dkdv":
                    args_ = (
                        q,
                        q,
                        q,
                        q,
                        lse,
                        lse,
                        o,
                        o,
                        0.1,
                        *q.stride(),
                        *q.stride(),
                        2,
                        1,
                        256,
                        256,
                    )
                else:
                    args_ = (
                        q,
                        q,
                        q,
                        q,
                        o,
                        lse,
                        lse,
                        o,
                        0.1,
                        *q.stride(),
                        *q.stride(),
                        2,
                        1,
                        256,
                        256,
                    )
                kern = kernel.fn.warmup(
                    *args_,
                    grid=(1,),
                    num_warps=c.num_warps,
                    num_stages=c.num_stages,
                    **c.kwargs,
                    **common,
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


def kernel_configs(which):
    from course_kernels import triton_backward

    cfgs = triton_backward.dkdv_configs() if which == "dkdv" else triton_backward.dq_configs()
    return [
        c
        for c in cfgs
        if c not in (triton_backward.DKDV_IEEE_CONFIG, triton_backward.DQ_IEEE_CONFIG)
    ]


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

    from course_kernels import flash, triton_forward
    from course_kernels.flash import flash_attention

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

    from course_kernels import flash
    from course_kernels.flash import flash_attention

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


def cmd_bwd_ab(args):
    """Backward at d = 128: the autotuner's old config lists vs the lists with the head-dim-128
    configs that do not spill (same process, A then B at each shape); records the chosen
    configs."""
    from triton.testing import do_bench

    from course_kernels import flash, triton_backward
    from course_kernels.bench import attention_flops
    from course_kernels.flash import flash_attention

    env, rows = _env(), []
    kernels = {"dkdv": triton_backward._attn_bwd_dkdv, "dq": triton_backward._attn_bwd_dq}
    extra = {"dkdv": triton_backward.DKDV_D128_CONFIGS, "dq": triton_backward.DQ_D128_CONFIGS}
    old = {name: list(k.configs) for name, k in kernels.items()}
    full = {name: old[name] + list(extra[name]) for name in kernels}
    names = {id(k): name for name, k in kernels.items()}
    d, batch, heads = 128, 4, 16
    for n in (int(x) for x in args.ns.split(",")):
        for causal in (False, True):
            torch.manual_seed(n)
            q, k, v, do = (
                torch.randn(batch, heads, n, d, device="cuda", dtype=torch.float16)
                for _ in range(4)
            )
            for x in (q, k, v):
                x.requires_grad_()
            out = flash_attention(q, k, v, causal=causal)
            for variant, lists in (("old configs", old), ("with d=128 configs", full)):
                for name, kern in kernels.items():
                    kern.configs = lists[name]
                    kern.cache.clear()
                flash._TUNED.clear()
                torch.autograd.grad(out, (q, k, v), do, retain_graph=True)  # tunes
                chosen = {
                    names[key[0]]: cfg for key, cfg in flash._TUNED.items() if key[0] in names
                }
                ms = do_bench(
                    lambda out=out, q=q, k=k, v=v, do=do: torch.autograd.grad(
                        out,
                        (q, k, v),
                        do,
                        retain_graph=True,
                    ),
                    warmup=10,
                    rep=50,
                    return_mode="median",
                )
                row = {
                    "d": d,
                    "N": n,
                    "causal": causal,
                    "dtype": "float16",
                    "batch": batch,
                    "heads": heads,
                    "variant": variant,
                    "ms": ms,
                    "tflops": attention_flops(batch, heads, n, d, causal, "bwd") / ms * 1e-9,
                    "chosen": {k_: {kk: vv for kk, vv in v_.items()} for k_, v_ in chosen.items()},
                }
                rows.append(row)
                print(json.dumps(row), flush=True)
                with open(os.path.join(args.out, "bwd_d128_ab.json"), "w") as f:
                    json.dump({"environment": env, "results": rows}, f, indent=1)
            q = k = v = do = out = None
    for name, kern in kernels.items():
        kern.configs = old[name]
        kern.cache.clear()
    flash._TUNED.clear()
    return 0


def _nograd(fn, q, k, v):
    with torch.no_grad():
        return fn(q, k, v, causal=True)


# The tutorial autotunes its forward over ~28 configs per (N, head dim); the benchmark keeps its
# Hopper-sized ones (BLOCK_M, BLOCK_N, num_stages, num_warps) to bound tuning time, as the
# anchor measurement did ("autotuned over a reduced config set").
TUTORIAL_CONFIGS = (
    (128, 64, 3, 4),
    (128, 128, 3, 8),
    (64, 64, 3, 4),
    (128, 64, 4, 4),
    (128, 128, 2, 8),
)


def trim_tutorial(module):
    """Keep TUTORIAL_CONFIGS in the tutorial's forward autotuners; drop BLOCK_N > HEAD_DIM."""
    kept = {}
    for name in ("_attn_fwd_tma", "_attn_fwd"):
        kern = getattr(module, name, None)
        if kern is None or not hasattr(kern, "configs"):
            continue
        cs = [
            c
            for c in kern.configs
            if (c.kwargs.get("BLOCK_M"), c.kwargs.get("BLOCK_N"), c.num_stages, c.num_warps)
            in TUTORIAL_CONFIGS
        ]
        if cs:
            kern.configs = cs
        previous = getattr(kern, "early_config_prune", None)

        def prune(configs, named_args, _previous=previous, **kwargs):
            if _previous is not None:
                configs = _previous(configs, named_args, **kwargs)
            hd = kwargs.get("HEAD_DIM", named_args.get("HEAD_DIM"))
            ok = [c for c in configs if hd is None or c.kwargs.get("BLOCK_N", 0) <= hd]
            return ok or configs

        kern.early_config_prune = prune
        kept[name] = len(kern.configs)
    return kept


def cmd_bench(args):
    from course_kernels import bench

    providers = args.providers.split(",")
    note = {"command": "python3 " + " ".join(sys.argv)}
    if "tutorial" in providers:
        mod = bench.load_tutorial()
        note["tutorial_configs_kept"] = trim_tutorial(mod)
    rows = bench.run_bench(
        args.out,
        dtypes=tuple(args.dtypes.split(",")),
        ds=tuple(int(x) for x in args.ds.split(",")),
        ns=tuple(int(x) for x in args.ns.split(",")),
        modes=tuple(args.modes.split(",")),
        providers=tuple(providers),
        check=not args.no_check,
    )
    for r in rows:  # this tutorial version's backward always applies the causal mask
        if r["provider"] == "tutorial" and r.get("mode") == "bwd" and not r["causal"]:
            r.update(
                mode="error",
                error="not comparable: this tutorial version's backward "
                "is causal-only (it masks as if causal=True)",
                bwd_ms_causal_only=r["ms"],
            )
    with open(os.path.join(args.out, "bench.json")) as f:
        env = json.load(f)["environment"]
    note["tuned_configs"] = _tuned_configs()
    bench._write_bench(args.out, {**env, **note}, rows)
    print(bench.format_ratio_table(rows))
    return 0


def _tuned_configs():
    """The config autotuning chose per kernel and shape key (flash._TUNED), JSON-friendly."""
    from course_kernels import flash, triton_backward, triton_forward

    names = {
        id(triton_forward._attn_fwd): "_attn_fwd",
        id(triton_backward._attn_bwd_dkdv): "_attn_bwd_dkdv",
        id(triton_backward._attn_bwd_dq): "_attn_bwd_dq",
    }
    return [
        {
            "kernel": names.get(key[0], "?"),
            "key": [str(x) for x in key[2:]],
            "config": {
                k: (v if isinstance(v, (int, float, str, bool)) or v is None else str(v))
                for k, v in cfg.items()
            },
        }
        for key, cfg in flash._TUNED.items()
    ]


def cmd_n1k(args):
    """N = 1024 only, ``--repeats`` separate runs of run_bench (flash, sdpa-flash, sdpa-cudnn)."""
    from course_kernels import bench

    runs, tuned = [], []
    for i in range(args.repeats):
        sub = os.path.join(args.out, f"n1k_run{i}")
        rows = bench.run_bench(
            sub,
            dtypes=tuple(args.dtypes.split(",")),
            ns=(1024,),
            providers=("flash", "sdpa-flash", "sdpa-cudnn"),
            check=False,
        )
        runs.append(rows)
        tuned.append(_tuned_configs())
    with open(os.path.join(args.out, "n1024_repeats.json"), "w") as f:
        json.dump({"environment": _env(), "runs": runs, "tuned_configs": tuned}, f, indent=1)
    return 0


def main():
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "cmd",
        choices=["overhead", "overhead-bwd", "meta", "levers", "check", "bench", "n1k", "bwd-ab"],
    )
    ap.add_argument("--out", default=".")
    ap.add_argument("--n", type=int, default=8192)
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--dtypes", default="float16")
    ap.add_argument("--ns", default="1024,2048,4096,8192,16384")
    ap.add_argument("--providers", default="flash,sdpa-flash,sdpa-cudnn,tutorial")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--no-check", action="store_true")
    ap.add_argument("--ds", default="128,64")
    ap.add_argument("--modes", default="fwd,bwd")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--configs", default="", help="levers: BM/BN/warps/stages,... ")
    ap.add_argument("--levers-file", default="levers.json")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    return {
        "overhead": cmd_overhead,
        "meta": cmd_meta,
        "levers": cmd_levers,
        "check": cmd_check,
        "bench": cmd_bench,
        "n1k": cmd_n1k,
        "overhead-bwd": cmd_overhead_bwd,
        "bwd-ab": cmd_bwd_ab,
    }[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
