"""Measure the roofline ceilings (device copy bandwidth, 16-bit matmul FLOP/s) and write them as JSON.

    python scripts/measure_ceilings.py --out course_kernels/data/hardware/h200_ceilings.json   # on the GPU

This is how ``course_kernels.hardware.H200_MEASURED`` is (re)measured: the JSON records the GPU,
software versions, date and this command next to the numbers, and
``hardware.ceilings_from_record`` reads it back. ``--device cpu --small`` runs the same code on a
CPU at tiny sizes (for testing the script; the numbers mean nothing).

The matmul ceiling is measured on several shapes (default 4096^3, 8192^3, 16384 x 16384 x 8192)
in fp16 and bf16, each ``--repeats`` times: a repetition times ``--iters`` back-to-back products
between two CUDA events (after a warm-up), so one repetition is one rate. Each run records the
best, mean, median and worst rate of its repetitions; the record's ceiling is the best rate of
any run (``ceilings_from_record``), and the GPU's clocks, power and throttle reasons are read
with nvidia-smi before, during (right after the last repetition of each run) and after. The
first format's fields (copy bandwidth, one fp16 n^3 product, median of ``do_bench``) are kept.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

DEFAULT_SHAPES = "4096x4096x4096,8192x8192x8192,16384x16384x8192"
SMI_FIELDS = (
    "clocks.sm,clocks.max.sm,clocks.mem,power.draw,power.limit,temperature.gpu,"
    "clocks_throttle_reasons.active"
)


def nvidia_smi() -> str | None:
    """One nvidia-smi reading of the clocks, power and throttle reasons (None without a driver)."""
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={SMI_FIELDS}", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip().splitlines()[0] if out.stdout.strip() else None


def _sm_mhz(reading: str | None) -> int | None:
    try:
        return int(reading.split(",")[0].split()[0])
    except (AttributeError, IndexError, ValueError):
        return None


def time_matmul(shape, dtype, device, repeats, iters, warmup=3):
    """Rates (FLOP/s) of ``repeats`` repetitions of ``iters`` products of ``shape`` = (m, n, k)."""
    import time

    import torch

    m, n, k = shape
    x = torch.randn(m, k, device=device).to(dtype)
    y = torch.randn(k, n, device=device).to(dtype)
    flops = 2 * m * n * k * iters
    cuda = device.startswith("cuda")
    for _ in range(warmup):
        x @ y
    rates = []
    for _ in range(repeats):
        if cuda:
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                x @ y
            end.record()
            torch.cuda.synchronize()
            seconds = start.elapsed_time(end) / 1e3
        else:
            t0 = time.perf_counter()
            for _ in range(iters):
                x @ y
            seconds = time.perf_counter() - t0
        rates.append(flops / seconds)
    return rates


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", required=True, help="JSON file to write")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--matmul-n", type=int, default=8192, help="the first format's one product")
    ap.add_argument("--copy-mib", type=int, default=1024)
    ap.add_argument("--shapes", default=DEFAULT_SHAPES, help="m x n x k, comma separated")
    ap.add_argument("--dtypes", default="float16,bfloat16")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--iters", type=int, default=20, help="products per timed repetition")
    ap.add_argument("--small", action="store_true", help="tiny sizes (testing on a CPU)")
    args = ap.parse_args(argv)
    import torch

    from course_kernels import hardware
    from course_kernels.bench import environment

    n, copy_bytes = (64, 2**16) if args.small else (args.matmul_n, args.copy_mib * 2**20)
    shapes = [tuple(int(v) for v in s.lower().split("x")) for s in args.shapes.split(",")]
    if args.small:
        shapes, args.repeats, args.iters = [(64, 64, 64), (64, 32, 64)], 3, 2
    clocks = {"before": nvidia_smi()}
    ceilings = hardware.measure_ceilings(args.device, matmul_n=n, copy_bytes=copy_bytes)
    runs, during = [], []
    for dtype_name in args.dtypes.split(","):
        dtype = getattr(torch, dtype_name)
        for shape in shapes:
            rates = time_matmul(shape, dtype, args.device, args.repeats, args.iters)
            reading = nvidia_smi()
            during.append(reading)
            runs.append(
                {
                    "shape": list(shape),
                    "dtype": dtype_name,
                    "repeats": args.repeats,
                    "iters": args.iters,
                    "best_flops": max(rates),
                    "mean_flops": statistics.mean(rates),
                    "median_flops": statistics.median(rates),
                    "worst_flops": min(rates),
                    "flops": rates,
                    "nvidia_smi_after": reading,
                }
            )
            print(
                f"{dtype_name} {shape}: best {max(rates) / 1e12:.1f}, mean "
                f"{statistics.mean(rates) / 1e12:.1f} TFLOP/s  [{reading}]"
            )
    clocks["after"] = nvidia_smi()
    mhz = [v for v in map(_sm_mhz, during) if v]
    clocks["sm_mhz_during"] = f"{min(mhz)}-{max(mhz)}" if mhz else None
    clocks["fields"] = SMI_FIELDS
    best = max(runs, key=lambda r: r["best_flops"])
    ceilings.update(
        {
            "fp16_matmul_flops_do_bench_median": ceilings["fp16_matmul_flops"],
            "fp16_matmul_flops": best["best_flops"],  # the ceiling: the best rate of any run
            "matmul_n": max(best["shape"]),
            "matmul_runs": runs,
            "clocks": clocks,
            "method": (
                "copy: median of do_bench, bytes read + written. matmul: for each shape and dtype, "
                f"{args.repeats} repetitions of {args.iters} back-to-back products timed with CUDA "
                "events after a warm-up (2 m n k FLOPs each); ceiling = best repetition of any run; "
                "fp16_matmul_flops_do_bench_median = the first format's one product"
            ),
        }
    )
    env = environment()
    env["command"] = " ".join(
        ["python", "scripts/measure_ceilings.py", *(argv if argv is not None else sys.argv[1:])]
    )
    record = {"environment": env, "ceilings": ceilings}
    hardware.ceilings_from_record(record)  # the file must read back
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(
        f"copy {ceilings['copy_bandwidth'] / 1e12:.3f} TB/s, matmul ceiling "
        f"{ceilings['fp16_matmul_flops'] / 1e12:.1f} TFLOP/s ({best['dtype']} {best['shape']}; "
        f"{env['gpu']}) -> {out}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
