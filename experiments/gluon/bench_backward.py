"""Check and time the Gluon (FA3-schedule) attention BACKWARD on Hopper against cuDNN's backward
(SDPA with the cuDNN backend) and the course's `tl` backward. One GPU command:

    python experiments/gluon/bench_backward.py --out DIR       # < 150 s on an H200 (budgeted)
    python experiments/gluon/bench_backward.py --out DIR --Ns 8192 \
        --variants default,dq_vec4,dq_shared,dq_shared_vec4   # session 9's dQ switches, < 200 s
    python experiments/gluon/bench_backward.py --out DIR --Ns 8192 \
        --variants default,overlap_dq                         # session 9's lever (b), < 150 s
    python experiments/gluon/bench_backward.py --out DIR --Ns 8192 \
        --variants default,dq_tma,dq_tma_overlap              # session 12's TMA reduce-add
    (DQ_TMA is the default since session 12: its comparison today is --variants
    default,dq_atomics,dq_tma_overlap)
    python experiments/gluon/bench_backward.py --out DIR --Ns 8192 \
        --variants default,masked_last,dv_early,masked_last_dv_early,masked_last_overlap

The backward is a first version (notes/gluon_backward.md) that may fault. So every Gluon call
runs in a child process: first the correctness checks of each config (the configs' check children
run at once and then compile the timed shapes, all ended at 150 s; float64 autograd reference,
flash-attn's rule: each of dq, dk, dv within 2x SDPA's own error + 1e-5), then, one config at a
time and only
for configs whose checks all passed, its timings. An illegal memory access ends the child, not
the run: the parent records the child's exit status, its stderr tail and whatever rows it
finished (the child prints one JSON line per result). cuDNN and the `tl` backward are timed in
the parent. Shapes: B = 4, H * d = 2048, N = 4K/8K/16K, d = 64/128, causal and not, fp16.
FLOPs = 2.5 x 4 B H N^2 d (5 GEMMs of the backward), halved for causal; time = median of
triton.testing.do_bench; the timed call is the whole backward (Gluon: preprocess, zeroing dQ,
the kernel, the dq conversion; cuDNN: autograd.grad through its SDPA node; `tl`: the course's
backward op on its own forward's o and lse, with its first config only unless --tl-autotune,
so its row is a lower bound of the tuned `tl` backward's speed).

Caution (session 18, an H100): cuDNN is timed in the parent before any Gluon child runs, so the
two never meet the GPU in the same state; there the Gluon default ran ~12% slower in its child
(d = 64, N = 16K, no mask) than in rounds interleaved with cuDNN on the same inputs. For ratios
to cuDNN use ``bench_section.py --masks full causal --sections 0 cudnn`` (interleaved rounds);
this script stays the first check of a new variant (faults end a child, not the run).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

CHECKS = [  # (B, H, N, d, dtype, causal)
    *[(1, 2, n, d, "float16", c) for d in (64, 128) for c in (False, True) for n in (17, 1000)],
    (2, 3, 2053, 128, "bfloat16", True),
    (2, 3, 2053, 64, "bfloat16", False),
    (1, 2, 1, 64, "float16", False),
]
VARIANTS = {  # config name -> overrides of BACKWARD_CONFIG (the default first)
    "default": {},
    "d64 BM=128": dict(BM=128),
    "stages=3": dict(STAGES=3),
    # session 9, cheaper dQ (notes/gluon_backward.md): v4 reductions; one dQ partial per CTA step
    "dq_per_consumer": dict(DQ_SHARED=False),  # the first version (the default before session 9)
    "dq_vec4": dict(DQ_VEC=4),
    "dq_shared": dict(DQ_SHARED=True),
    "dq_shared_vec4": dict(DQ_SHARED=True, DQ_VEC=4),
    # session 9, lever (b): the dQ atomics overlapped with the dV/dK wgmmas
    "overlap_dq": dict(DQ_SHARED=True, OVERLAP_DQ=True),
    # session 12: dQ through shared memory and a TMA reduce-add (d = 64 keeps its OVERLAP_DQ)
    "dq_tma": dict(DQ_TMA=True),
    "dq_tma_overlap": dict(DQ_TMA=True, OVERLAP_DQ=True),
    # session 13: the unmasked query blocks first (the hot loop without spills at d = 128)
    "masked_last": dict(MASKED_LAST=True),  # the default since session 13, measured with:
    "masked_first": dict(MASKED_LAST=False),  # the order before session 13
    "rotate": dict(ROTATE=True),  # session 13: the unmasked run started at the block's own rows
    # session 13: dV issued before the wait for dP^T (FA3's order; turns d = 64's OVERLAP_DQ off)
    "dv_early": dict(DV_EARLY=True),
    "masked_last_dv_early": dict(MASKED_LAST=True, DV_EARLY=True),
    "masked_last_overlap": dict(MASKED_LAST=True, OVERLAP_DQ=True),  # d = 64's default + switch
    # the atomics of sessions 9-11 (the session-12 file's "default"), since DQ_TMA is the default
    "dq_atomics": dict(DQ_TMA=False),
}
VARIANT_DIMS = {"default": (64, 128), "d64 BM=128": (64,), "stages=3": (64, 128),
                "dq_vec4": (64, 128), "dq_shared": (64, 128), "dq_shared_vec4": (64, 128),
                "dq_per_consumer": (64, 128), "overlap_dq": (64, 128), "dq_tma": (64, 128),
                "dq_tma_overlap": (128,), "dq_atomics": (64, 128),
                "masked_last": (64, 128), "dv_early": (64, 128), "masked_first": (64, 128),
                "rotate": (64, 128),
                "masked_last_dv_early": (64, 128), "masked_last_overlap": (128,)}  # fmt: skip


def _emit(**row):
    print("ROW " + json.dumps(row), flush=True)


def _time_ms(fn):
    import triton

    return triton.testing.do_bench(fn, warmup=10, rep=60, return_mode="median")


def _flops(B, H, N, d, causal):
    return 2.5 * 4.0 * B * H * N * N * d * (0.5 if causal else 1.0)


def _inputs(B, H, N, d, dtype, seed=0):
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)
    dt = getattr(torch, dtype)
    return [torch.randn(B, H, N, d, device="cuda", dtype=dt, generator=g) for _ in range(4)]


# ------------------------------------------------------------------ the child (Gluon calls only)
def child(variant: str, do_time: bool, dims, Ns):
    import torch

    from course_kernels.gluon import launch as G
    from course_kernels.gluon.backward_launch import gluon_attention_backward
    from course_kernels.testing import attention_grads

    cfg = VARIANTS[variant]
    all_ok = True
    for B, H, N, d, dtype, causal in CHECKS:
        if d not in VARIANT_DIMS[variant]:
            continue
        row = dict(kind="check", variant=variant, B=B, H=H, N=N, d=d, dtype=dtype, causal=causal)
        try:
            q, k, v, do = _inputs(B, H, N, d, dtype, seed=N + d)
            scale = 1.0 / math.sqrt(d)
            ref = attention_grads(q, k, v, do, causal, scale, True)
            sdpa = attention_grads(q, k, v, do, causal, scale, False)
            o, lse = G.gluon_attention_forward(q, k, v, causal=causal, scale=scale)
            torch.empty(16 * q.numel(), device="cuda").fill_(float("nan"))  # poison
            got = gluon_attention_backward(do, q, k, v, o, lse, causal, scale, **cfg)
            torch.cuda.synchronize()
            errs = {}
            for name, g, r, s in zip(("dq", "dk", "dv"), got, ref, sdpa, strict=True):
                errs[name] = [
                    (g.double() - r).abs().max().item(),
                    (s.double() - r).abs().max().item(),
                ]
            ok = all(math.isfinite(e) and e <= 2 * es + 1e-5 for e, es in errs.values())
            _emit(**row, errors_kernel_sdpa=errs, ok=ok)
        except Exception as e:  # a Python-level failure: record it, go on
            ok = False
            _emit(**row, ok=False, error=f"{type(e).__name__}: {str(e)[:500]}")
        all_ok = all_ok and ok
    if not do_time:
        if all_ok:  # compile the timed shapes now, in parallel with the other variants' checks:
            _warm(G, gluon_attention_backward, cfg, variant, dims, Ns)  # (Triton's disk cache)
        return
    for d in dims:
        if d not in VARIANT_DIMS[variant]:
            continue
        for N in Ns:
            for causal in (False, True):
                B, H = 4, 2048 // d
                row = dict(kind="time", provider=f"gluon {variant}", B=B, H=H, N=N, d=d,
                           dtype="float16", causal=causal)  # fmt: skip
                try:
                    ms = _time_gluon(G, gluon_attention_backward, cfg, B, H, N, d, causal)
                    _emit(**row, ms=ms, tflops=_flops(B, H, N, d, causal) / ms / 1e9)
                except Exception as e:
                    _emit(**row, ms=None, error=f"{type(e).__name__}: {str(e)[:500]}")


def _warm(G, backward, cfg, variant, dims, Ns):
    """One untimed call per timed shape, so that the timing child finds its kernels compiled."""
    import torch

    for d in dims:
        for N in Ns:
            for causal in (False, True):
                if d not in VARIANT_DIMS[variant]:
                    continue
                try:
                    q, k, v, do = _inputs(4, 2048 // d, N, d, "float16")
                    o, lse = G.gluon_attention_forward(q, k, v, causal=causal)
                    backward(do, q, k, v, o, lse, causal, **cfg)
                    torch.cuda.synchronize()
                except Exception as e:  # the timing child records it
                    print(f"warm-up d={d} N={N} causal={causal}: {e!r}"[:300], file=sys.stderr)


def _time_gluon(G, backward, cfg, B, H, N, d, causal):
    q, k, v, do = _inputs(B, H, N, d, "float16")
    o, lse = G.gluon_attention_forward(q, k, v, causal=causal)
    return _time_ms(lambda: backward(do, q, k, v, o, lse, causal, **cfg))


def start_child(args_list):
    """Start this script as a child (its own process group, so a timeout ends all of it)."""
    cmd = [sys.executable, os.path.abspath(__file__), *args_list]
    return subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
        start_new_session=True,
    )  # fmt: skip


def finish_child(p, deadline):
    """Wait for a child until ``deadline`` (time.time()); returns (rows it printed, exit status,
    stderr tail). Past the deadline (a hang: an mbarrier deadlock) the child is killed."""
    try:
        out, err = p.communicate(timeout=max(1.0, deadline - time.time()))
        rc = p.returncode
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, 9)
        out, err = p.communicate()
        rc = "timeout"
    rows = [json.loads(ln[4:]) for ln in out.splitlines() if ln.startswith("ROW ")]
    return rows, rc, err[-3000:]


def run_child(args_list, timeout):
    """Run this script as a child; returns (rows it printed, exit status, stderr tail)."""
    return finish_child(start_child(args_list), time.time() + timeout)


# ------------------------------------------------------------------------- the parent
def time_reference(provider, d, N, causal):
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    B, H = 4, 2048 // d
    scale = 1.0 / math.sqrt(d)
    row = dict(kind="time", provider=provider, B=B, H=H, N=N, d=d, dtype="float16", causal=causal)
    try:
        q, k, v, do = _inputs(B, H, N, d, "float16")
        if provider == "cudnn":
            xs = [x.detach().requires_grad_() for x in (q, k, v)]
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                o = torch.nn.functional.scaled_dot_product_attention(
                    *xs, is_causal=causal, scale=scale
                )
            ms = _time_ms(lambda: torch.autograd.grad(o, xs, do, retain_graph=True))
        else:  # the course's tl backward (two kernels, deterministic dQ) on its own forward,
            # forced: the op's "auto" takes the Gluon backward at d = 64 and 128 on Hopper (until
            # session 14 this row was that auto path, i.e. the Gluon kernel, not tl)
            import course_kernels.triton.flash  # noqa: F401  (registers the ops)
            from course_kernels.triton.launch import BACKWARD_ENV

            os.environ[BACKWARD_ENV] = "triton"
            try:
                o, lse = torch.ops.course_kernels.flash_attn_fwd(q, k, v, causal, scale)
                bwd = torch.ops.course_kernels.flash_attn_bwd
                ms = _time_ms(lambda: bwd(do, q, k, v, o, lse, causal, scale))
            finally:
                os.environ.pop(BACKWARD_ENV)
        row.update(ms=ms, tflops=_flops(B, H, N, d, causal) / ms / 1e9)
    except Exception as e:
        row.update(ms=None, error=f"{type(e).__name__}: {str(e)[:500]}")
    print(row, flush=True)
    return row


def run_checks(variants, ns_of, dims, out, save, t0):
    """Every variant's checks at once (compiles dominate; 16 CPU cores), each in its own child,
    which then compiles the variant's timed shapes (one untimed call each); all ended at 150 s (a
    hang: an mbarrier deadlock). Returns {variant: all its checks passed}."""
    passed = {}
    kids = {v: start_child(["--child", v, "--Ns", ns_of(v), "--dims", dims]) for v in variants}
    deadline = time.time() + 150
    for variant in variants:
        rows, rc, err = finish_child(kids[variant], deadline)
        out["checks"] += rows
        out["children"].append(dict(variant=variant, part="check", rc=rc, stderr_tail=err))
        passed[variant] = rc == 0 and bool(rows) and all(r["ok"] for r in rows)
        print(f"[{variant}: {sum(r['ok'] for r in rows)}/{len(rows)} checks pass, rc={rc}, "
              f"{time.time() - t0:.0f}s]", flush=True)  # fmt: skip
        for r in rows:
            if not r["ok"]:
                print("CHECK FAIL", r, flush=True)
        save()
    return passed


def main():
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", default="results", help="directory for the JSON file")
    ap.add_argument("--tag", default="h200_gluon_backward", help="stem of the JSON file name")
    ap.add_argument("--Ns", default="4096,8192,16384")
    ap.add_argument("--dims", default="64,128")
    ap.add_argument("--variants", default="default", help="comma list of " + ", ".join(VARIANTS))
    ap.add_argument(
        "--variant-Ns",
        help="N values timed for the variants other than 'default' (default: --Ns); the "
        "references are timed at the union",
    )
    ap.add_argument(
        "--tl-autotune",
        action="store_true",
        help="let the tl backward autotune (minutes of compiles); default: its first config only",
    )
    ap.add_argument("--child", help=argparse.SUPPRESS)  # internal: variant name
    ap.add_argument("--child-time", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    Ns = [int(x) for x in args.Ns.split(",")]
    dims = [int(x) for x in args.dims.split(",")]
    if args.child:
        child(args.child, args.child_time, dims, Ns)
        return
    if not args.tl_autotune:  # read when course_kernels.triton is first imported (below)
        os.environ["COURSE_KERNELS_AUTOTUNE"] = "0"
    from course_kernels.bench import environment

    t0 = time.time()
    env = environment()
    env["command"] = " ".join(["python", "experiments/gluon/bench_backward.py", *sys.argv[1:]])
    out = dict(environment=env, checks=[], times=[], children=[], note=(
        "first version of the Gluon backward (notes/gluon_backward.md); FLOPs 2.5 x 4BHN^2d, "
        "halved for causal"))  # fmt: skip
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"{args.tag}.json")

    def save():
        with open(path, "w") as f:
            json.dump(out, f, indent=1)

    variants = args.variants.split(",")
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        ap.error(f"unknown variants {unknown}; known: {list(VARIANTS)}")
    var_Ns = args.variant_Ns or args.Ns

    def ns_of(variant):
        return args.Ns if variant == "default" else var_Ns

    passed = run_checks(variants, ns_of, args.dims, out, save, t0)
    all_Ns = sorted({int(n) for v in variants for n in ns_of(v).split(",")})
    for d in dims:
        for N in all_Ns:
            for causal in (False, True):
                for provider in ("cudnn", "tl"):
                    out["times"].append(time_reference(provider, d, N, causal))
    save()
    print(f"[references timed at {time.time() - t0:.0f}s]", flush=True)
    for variant, ok in passed.items():
        if not ok:
            out["children"].append(dict(variant=variant, part="time", skipped="checks failed"))
            continue
        base = ["--child", variant, "--child-time", "--Ns", ns_of(variant), "--dims", args.dims]
        rows, rc, err = run_child(base, timeout=90)
        out["times"] += [r for r in rows if r["kind"] == "time"]
        out["children"].append(dict(variant=variant, part="time", rc=rc, stderr_tail=err))
        save()
    cudnn = {(r["d"], r["N"], r["causal"]): r.get("tflops") for r in out["times"]
             if r["provider"] == "cudnn"}  # fmt: skip
    for r in out["times"]:
        c = cudnn.get((r["d"], r["N"], r["causal"]))
        r["ratio_vs_cudnn"] = r["tflops"] / c if r.get("tflops") and c else None
        print(f"{r['provider']:22s} d={r['d']:3d} N={r['N']:5d} causal={r['causal']!s:5s} "
              f"{r.get('tflops') or float('nan'):7.1f} TFLOP/s  x{r['ratio_vs_cudnn'] or 0:.3f} "
              "cuDNN", flush=True)  # fmt: skip
    save()
    print("wrote", path, f"[total {time.time() - t0:.0f}s]", flush=True)


if __name__ == "__main__":
    main()
