"""Session 27: what one CTA of the Gluon backward costs beyond its query steps.

    PYTHONPATH=. python experiments/gluon/cta_cost.py --out DIR [--variants 0 PERSIST=1]

The rows have exactly one CTA an SM a wave: B = 1 and as many heads as the GPU has SMs, no mask,
N = 1K ... 8K, so a call runs N / 128 waves of equal CTAs (BN = 128 keys), each of N / BM query
steps, and no wave is partly empty. The main kernel's CUDA time (torch.profiler, the fill,
preprocessing and dq conversion left out; DQ_CONVERT off so that the conversion is not in it)
divided by the waves is then F + s x steps: a least-squares line over the N gives s, the time of
a query step, and F, what a CTA costs besides (launch, K/V load, ring fill and drain, dK/dV
epilogue). With PERSIST (one CTA an SM, tiles pid, pid + grid, ...: here every CTA gets N / 128
equal tiles) F is what a tile costs when the next tile's K/V load overlaps this one's epilogue.
Each variant is profiled in --rounds rounds, interleaved, the median round kept. d = 128 (and 64
with --dims). notes/gluon_backward.md, "Session 27", says what the numbers were for.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [ROOT, HERE]

from bench_section import base_parser, new_record, save  # noqa: E402


def _config(name):
    """'0' -> the default schedule; 'KEY=V[+KEY=V]' -> those overrides (bench_section's form)."""
    if name == "0":
        return {}
    return {k: int(v) for k, v in (kv.split("=") for kv in name.split("+"))}


def make_call(d, n, heads, variant, dtype):
    import torch

    from course_kernels.gluon import backward_launch as GB
    from course_kernels.gluon import launch as G

    g = torch.Generator(device="cuda").manual_seed(27)
    dt = getattr(torch, dtype)
    q, k, v, do = (
        torch.randn(1, heads, n, d, device="cuda", dtype=dt, generator=g) for _ in "qkvd"
    )
    scale = 1.0 / math.sqrt(d)
    o, lse = G.gluon_attention_forward(q, k, v, causal=False, scale=scale)
    cfg = dict(DQ_CONVERT=False, **_config(variant))
    return lambda: GB.gluon_attention_backward(do, q, k, v, o, lse, False, scale, **cfg)


def main_kernel_us(fn, calls):
    """The main backward kernel's CUDA time a call (microseconds), from torch.profiler."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    total = 0.0
    for ev in prof.key_averages():
        if "_attn_bwd_kernel" in ev.key:
            total += getattr(ev, "device_time_total", None) or ev.cuda_time_total
    return total / calls


def fit(points):
    """Least squares y = F + s x over (x, y) points: (F, s)."""
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    s = sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x in xs)
    return my - s * mx, s


def main(argv=None):
    ap = base_parser(__doc__, "cta_cost")
    ap.add_argument("--variants", nargs="+", default=["0", "PERSIST=1"],
                    help="schedules: 0 (the default) or KEY=V[+KEY=V]")  # fmt: skip
    ap.add_argument("--dims", type=int, nargs="+", default=[128], help="head dims")
    ap.add_argument("--ns", type=int, nargs="+", default=[1024, 2048, 4096, 8192], help="N")
    ap.add_argument("--rounds", type=int, default=3, help="profiling rounds (variants interleaved)")
    ap.add_argument("--calls", type=int, default=5, help="calls profiled a round")
    ap.add_argument("--dtype", default="float16", choices=("float16", "bfloat16"))
    args = ap.parse_args(argv)
    import torch

    from course_kernels.gluon.backward_launch import BACKWARD_BM

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    record = dict(new_record(__file__, argv), heads=sms, fits=[])
    path = os.path.join(args.out, args.tag + ".json")
    os.makedirs(args.out, exist_ok=True)
    for d in args.dims:
        bm = BACKWARD_BM.get(d, 64)
        for n in args.ns:
            calls = {v: make_call(d, n, sms, v, args.dtype) for v in args.variants}
            for fn in calls.values():
                fn(), fn()
            rounds = {v: [] for v in args.variants}
            for _ in range(args.rounds):
                for v, fn in calls.items():
                    rounds[v].append(main_kernel_us(fn, args.calls))
            waves, steps = n // 128, -(-n // bm)
            for v in args.variants:
                us = statistics.median(rounds[v])
                row = dict(d=d, n=n, variant=v, waves=waves, steps_a_cta=steps,
                           main_us=round(us, 1), us_a_wave=round(us / waves, 3),
                           rounds_us=[round(x, 1) for x in rounds[v]])  # fmt: skip
                record["rows"].append(row)
                print(json.dumps(row), flush=True)
            del calls
            torch.cuda.empty_cache()
        for v in args.variants:
            pts = [(r["steps_a_cta"], r["us_a_wave"]) for r in record["rows"]
                   if r["d"] == d and r["variant"] == v]  # fmt: skip
            if len(pts) >= 2:
                f, s = fit(pts)
                out = dict(d=d, variant=v, F_us=round(f, 3), step_us=round(s, 4))
                record["fits"].append(out)
                print(json.dumps(out), flush=True)
        save(record, path)
    save(record, path)


if __name__ == "__main__":
    main()
