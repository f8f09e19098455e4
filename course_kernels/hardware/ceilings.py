"""Measuring the roofline's two ceilings (copy bandwidth, fp16 matmul rate) and reading the
committed measurement: :func:`measure_ceilings` (run by ``scripts/measure_ceilings.py``),
:func:`ceilings_from_record`, :data:`H200_MEASURED`.

Chapter: "The GPU memory hierarchy" (book/chapters/01_memory_hierarchy.ipynb). Every public name is re-exported
from :mod:`course_kernels.hardware`.
"""

from __future__ import annotations


from .._validate import check_positive_int
from .specs import MeasuredCeilings


def _median_seconds(fn, repeats: int = 20, warmup: int = 3) -> float:
    """Median wall time of ``fn()`` in seconds (CPU fallback of ``triton.testing.do_bench``)."""
    import statistics
    import time

    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure_ceilings(
    device: str = "cuda", matmul_n: int = 8192, copy_bytes: int = 2**30, timer=None
) -> dict:
    """Measure the two roofline ceilings of one device, the way ``H200_MEASURED`` was measured.

    - copy bandwidth: ``b.copy_(a)`` of ``copy_bytes`` fp16 bytes, counted as bytes read plus
      bytes written (2 x copy_bytes) over the median time;
    - fp16 matmul: ``x @ y`` of two ``matmul_n`` x ``matmul_n`` fp16 matrices, 2 n^3 FLOPs over
      the median time.

    ``timer(fn) -> seconds``: by default ``triton.testing.do_bench`` (median, milliseconds
    converted) on CUDA and a median of wall times elsewhere (CPU: for testing the arithmetic
    only; a CPU has no fp16 tensor cores). Returns a dict with both ceilings in bytes/s and
    FLOP/s, the sizes, and the method, ready to be written to JSON next to the environment.
    """
    import torch

    matmul_n = check_positive_int(matmul_n, "matmul_n")
    copy_bytes = check_positive_int(copy_bytes, "copy_bytes")
    if copy_bytes % 2:
        raise ValueError(f"copy_bytes must be even (fp16 elements); got {copy_bytes}")
    if timer is None:
        if device.startswith("cuda"):
            import triton.testing

            def timer(fn):
                return triton.testing.do_bench(fn, return_mode="median") / 1e3
        else:
            timer = _median_seconds
    a = torch.ones(copy_bytes // 2, dtype=torch.float16, device=device)
    b = torch.empty_like(a)
    t_copy = timer(lambda: b.copy_(a))
    x = torch.randn(matmul_n, matmul_n, device=device).to(torch.float16)
    y = torch.randn(matmul_n, matmul_n, device=device).to(torch.float16)
    t_mm = timer(lambda: x @ y)
    if not (t_copy > 0 and t_mm > 0):
        raise RuntimeError(f"the timer returned non-positive times ({t_copy}, {t_mm}) s")
    return {
        "copy_bandwidth": 2 * copy_bytes / t_copy,
        "fp16_matmul_flops": 2 * matmul_n**3 / t_mm,
        "copy_bytes": copy_bytes,
        "matmul_n": matmul_n,
        "copy_seconds": t_copy,
        "matmul_seconds": t_mm,
        "method": "median time; copy counted as bytes read + written; matmul 2 n^3 FLOPs",
    }


def ceilings_from_record(record: dict, gpu: str | None = None) -> MeasuredCeilings:
    """A :class:`MeasuredCeilings` from a JSON record written by scripts/measure_ceilings.py.

    ``gpu``: the :data:`GPUS` key of the measured GPU (the record holds the driver's name).
    Two formats read: the first (one fp16 8192^3 product, median of ``do_bench``) and the
    extended one, whose ``ceilings["matmul_runs"]`` lists several shapes and dtypes with
    repeated timings; the matmul ceiling is then the **best** rate of any run (fp16 and bf16
    share one tensor-core peak), and ``matmul_method`` says how it was measured.
    """
    try:
        env, res = record["environment"], record["ceilings"]
        flops, matmul_n = float(res["fp16_matmul_flops"]), int(res["matmul_n"])
        method = f"one fp16 {matmul_n}^3 product, median time of triton.testing.do_bench, one run"
        runs = res.get("matmul_runs")
        if runs:
            best = max(runs, key=lambda r: r["best_flops"])
            flops, (m, n, k) = float(best["best_flops"]), best["shape"]
            matmul_n = n if m == n == k else max(m, n, k)
            shapes = sorted({tuple(r["shape"]) for r in runs})
            clock = res.get("clocks", {}).get("sm_mhz_during")
            method = (
                f"best of {len(runs)} runs ({len(shapes)} shapes x "
                f"{', '.join(sorted({r['dtype'] for r in runs}))}), each {best['repeats']} timed "
                f"repetitions; best run {best['dtype']} {m} x {n} x {k}: best "
                f"{best['best_flops'] / 1e12:.0f}, mean {best['mean_flops'] / 1e12:.0f} TFLOP/s"
                + (f"; SM clock {clock} MHz during the runs (nvidia-smi)" if clock else "")
            )
        return MeasuredCeilings(
            gpu=gpu or env["gpu"],
            copy_bandwidth=float(res["copy_bandwidth"]),
            fp16_matmul_flops=flops,
            date=env["date"],
            software=f"torch {env['torch']}, Triton {env['triton']}",
            source=f"measured with: {env['command']}",
            matmul_n=matmul_n,
            matmul_method=method,
        )
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(
            "a ceilings record needs 'environment' (gpu, date, torch, triton, command) and "
            f"'ceilings' (copy_bandwidth, fp16_matmul_flops, matmul_n; optionally matmul_runs "
            f"with shape, dtype, repeats, best_flops, mean_flops); missing {e}"
        ) from None


def _h200_measured() -> MeasuredCeilings:
    from ..datafiles import load_json

    return ceilings_from_record(load_json("hardware/h200_ceilings.json"), gpu="H200-SXM")


# The roofline's ceilings on the course's H200: scripts/measure_ceilings.py, committed as
# course_kernels/data/hardware/h200_ceilings.json (GPU, versions, date and command inside). A
# repeat on the same machine minutes later (h200_ceilings_run2.json) gave the same copy bandwidth
# and a 4% lower matmul rate: the matmul ceiling is good to a few percent.
H200_MEASURED = _h200_measured()
