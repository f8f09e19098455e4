"""DRAM traffic under Nsight Compute (``python -m course_kernels dram run|parse``).

Split from :mod:`course_kernels.bench` (which re-exports these names).
"""

from __future__ import annotations

import csv
import json

from .speed import environment
from .providers import provider_fn


DRAM_NS = (1024, 2048, 4096, 8192, 16384, 32768)


def dram_cases(ns=DRAM_NS, batch=1, heads=4, d=64):
    """Run one forward per (provider, N) between cudaProfilerStart/Stop, each on its own
    stream, so that ``ncu --profile-from-start off`` sees exactly these kernels, grouped by
    stream in this order. Prints the run's environment as JSON, then the case list as JSON on
    the last line (``dram parse`` reads both)."""
    import torch

    print(json.dumps({"environment": environment()}))
    cases = []
    for n in ns:
        q, k, v = (
            torch.randn(batch, heads, n, d, device="cuda", dtype=torch.float16) for _ in range(3)
        )
        for p in ("naive", "sdpa-flash", "flash"):
            fn = provider_fn(p)
            fn(q, k, v, False)  # warm-up: compile, cuBLAS handles, allocator
            torch.cuda.synchronize()
            stream = torch.cuda.Stream()
            torch.cuda.profiler.start()
            with torch.cuda.stream(stream):
                fn(q, k, v, False)  # the output is freed in stream order, after the kernel
            stream.synchronize()
            torch.cuda.profiler.stop()
            cases.append({"provider": p, "N": n, "batch": batch, "heads": heads, "d": d})
        q = k = v = None
        torch.cuda.empty_cache()
    print(json.dumps(cases))
    return cases


def parse_ncu_csv(ncu_csv, cases, out_csv, command="", env=None):
    """Sum ncu's dram__bytes_{read,write}.sum per case (kernels grouped by stream, in order).

    ``env``: the measuring run's :func:`environment` (``dram run`` prints it), written into the
    CSV's header with the command so the file names its GPU, versions and date.
    """
    with open(ncu_csv) as f:
        lines = [ln for ln in f if ln.startswith('"')]
    reader = csv.DictReader(lines)
    streams: dict[str, dict] = {}
    order = []
    for r in reader:
        try:
            read = float(r["dram__bytes_read.sum"].replace(",", ""))
            write = float(r["dram__bytes_write.sum"].replace(",", ""))
        except (KeyError, ValueError):
            continue  # the units row
        s = r.get("Stream", "?")
        if s not in streams:
            streams[s] = {"read": 0.0, "write": 0.0, "kernels": []}
            order.append(s)
        streams[s]["read"] += read
        streams[s]["write"] += write
        streams[s]["kernels"].append(r.get("Kernel Name", "?")[:40])
    if len(order) != len(cases):
        raise RuntimeError(f"ncu reported {len(order)} streams for {len(cases)} cases")
    with open(out_csv, "w", newline="") as f:
        where = (
            ""
            if not env
            else f"{env.get('gpu')}; torch {env.get('torch')}; "
            f"triton {env.get('triton')}; {env.get('date')}; "
        )
        f.write(f"# DRAM bytes per forward, Nsight Compute; {where}{command}\n")
        w = csv.writer(f)
        w.writerow(
            [
                "provider",
                "N",
                "batch",
                "heads",
                "d",
                "dtype",
                "dram_read_bytes",
                "dram_write_bytes",
                "n_kernels",
                "kernels",
            ]
        )
        for case, s in zip(cases, order, strict=True):
            st = streams[s]
            w.writerow(
                [
                    case["provider"],
                    case["N"],
                    case["batch"],
                    case["heads"],
                    case["d"],
                    "float16",
                    int(st["read"]),
                    int(st["write"]),
                    len(st["kernels"]),
                    ";".join(st["kernels"]),
                ]
            )
    return out_csv
