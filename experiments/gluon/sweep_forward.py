"""Session 22: the Gluon forward's schedule switches timed beside its default and cuDNN on the
same inputs, the forward's counterpart of bench_section.py (whose sweep found the backward's
128-row query blocks at d = 64: +7 to +15%, a config that had been compiled but never timed).

    PYTHONPATH=. python experiments/gluon/sweep_forward.py --out DIR \\
        --variants 0 cudnn NUM_CONSUMERS=2 STAGES=2 QSTAGES=1 [--dims 64 128] [--ns 4096]

Rows: causal and no mask (``--masks``), B = 4, H * d = 2048, N in --ns, d in --dims, fp16 (or
--dtype bfloat16). A variant is ``KEY=V[+KEY=V...]`` (integers; 0 / 1 for the switches) added to
the row's default schedule (``launch.schedule_config`` at the row's N: DEFAULT_CONFIG and
CAUSAL_CONFIG or NONCAUSAL_CONFIG of its head dim, DEFER only where a head has at most
DEFER_MAX_TILES tiles), ``0`` the default itself (the baseline, first), ``cudnn`` SDPA's cuDNN forward. A variant
that does not apply to a row (a key the head dim's schedule cannot take) or fails to compile is
left out of that row with its error. Each variant is checked against the default on the same
inputs (O within 4 ulps of the largest |O|, the logsumexp within 1e-3: another BN or tile order
changes the order of the fp32 sums, not the result) and timed (triton.testing.do_bench, median) in
--rounds rounds, variants interleaved; the row's time is the median round. ``speedup``: the
default's time over the variant's (> 1: the variant is faster). Kernels are compiled first by
child processes in parallel (they fill Triton's cache).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [ROOT, HERE]

from bench_section import (  # noqa: E402
    base_parser,
    compile_in_children,
    interleaved,
    new_record,
    time_rows,
)


def parse(variant: str) -> dict:
    """'0' -> {} (the default); 'KEY=V+KEY=V' -> {KEY: int(V), ...}."""
    if variant == "0":
        return {}
    return {k: int(v) for k, v in (kv.split("=") for kv in variant.split("+"))}


def overrides(row, variant):
    """The schedule the variant runs for the row: the row's default switches plus its own."""
    from course_kernels.gluon import launch as G

    base = G.schedule_config(row["d"], row["mask"] == "causal", row["n"])  # at the row's N
    return {**base, **parse(variant)}


def make_call(row, variant, small=False):
    """A function computing the row's forward (O, lse) with ``variant``."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from course_kernels.gluon import launch as G

    d, n = row["d"], 1024 if small else row["n"]
    g = torch.Generator(device="cuda").manual_seed(23)
    dt = getattr(torch, row["dtype"])
    q, k, v = (torch.randn(4, 2048 // d, n, d, device="cuda", dtype=dt, generator=g)
               for _ in range(3))  # fmt: skip
    causal, scale = row["mask"] == "causal", 1.0 / math.sqrt(d)
    if variant == "cudnn":

        def cudnn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale), None

        return cudnn
    cfg = overrides(row, variant)
    return lambda: G.gluon_attention_forward(q, k, v, causal=causal, scale=scale, **cfg)


def rows(args):
    return [dict(mask=m, d=d, n=n, dtype=args.dtype)
            for m in args.masks for d in args.dims for n in args.ns]  # fmt: skip


def prewarm(args):
    """One child per (mask, d, variant, dtype) compiles its kernels: {job: error} of failures."""
    jobs = sorted({(r["mask"], r["d"], s, args.dtype) for r in rows(args)
                   for s in args.variants if s != "cudnn"})  # fmt: skip
    return compile_in_children(__file__, jobs, args.compile_timeout)


def check(base, got, dtype):
    """O within 4 ulps of the default's largest |O|, lse within 1e-3 (None: cuDNN, O only)."""
    ulp = 2**-7 if dtype == "bfloat16" else 2**-10
    o_diff = (got[0].float() - base[0].float()).abs().max().item()
    tol = 4 * ulp * base[0].abs().max().item()
    out = dict(o_max_diff=o_diff, o_tolerance=tol, ok=o_diff <= tol)
    if got[1] is not None:
        out["lse_max_diff"] = (got[1].float() - base[1].float()).abs().max().item()
        out["ok"] = out["ok"] and out["lse_max_diff"] <= 1e-3
    return out


def main(argv=None):
    ap = base_parser(__doc__, "sweep_forward")
    ap.add_argument("--variants", nargs="+", default=["0", "cudnn"],
                    help="0 (the default, first), cudnn, KEY=V[+KEY=V] schedule overrides")  # fmt: skip
    ap.add_argument("--masks", nargs="+", default=["causal", "full"], help="causal full")
    ap.add_argument("--dims", type=int, nargs="+", default=[64, 128], help="head dims")
    ap.add_argument("--ns", type=int, nargs="+", default=[4096], help="sequence lengths")
    ap.add_argument("--dtype", default="float16", choices=("float16", "bfloat16"))
    ap.add_argument("--rounds", type=int, default=5, help="timing rounds (variants interleaved)")
    ap.add_argument("--budget-s", type=float, default=300.0, help="stop starting rows after this")
    ap.add_argument("--compile-timeout", type=float, default=240.0, help="per compile child")
    ap.add_argument("--child", help=argparse.SUPPRESS)  # internal: mask,d,variant,dtype
    args = ap.parse_args(argv)
    if args.child:
        mask, d, s, dt = args.child.split(",")
        make_call(dict(mask=mask, d=int(d), n=0, dtype=dt), s, small=True)()
        return
    if args.variants[0] != "0":
        ap.error("--variants: the first must be 0 (the default, the baseline of every ratio)")

    t0 = time.time()
    record = new_record(__file__, argv)
    bad = prewarm(args)
    record["compile_failures"] = [dict(job=",".join(map(str, j)), error=e) for j, e in bad.items()]
    record["compile_s"] = round(time.time() - t0, 1)
    print(f"compiled in {record['compile_s']} s; failures: {len(bad)}")
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"{args.tag}.json")
    time_rows(record, path, rows(args), args.variants, args, t0,
              lambda row, v: (row["mask"], row["d"], v, args.dtype) not in bad, make_call,
              lambda base, got, row: check(base, got, row["dtype"]), interleaved)  # fmt: skip


if __name__ == "__main__":
    main()
