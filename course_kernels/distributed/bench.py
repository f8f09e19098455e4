"""Running, checking and measuring ``ring_attention``: simulated ranks on a laptop, GPUs for real.

Chapter: "Beyond one GPU" (book/part2/beyond_one_gpu.ipynb).

- :func:`spawn` runs a function on W local processes joined by a gloo (CPU) or NCCL (GPU)
  process group, with a time limit, and returns what each rank returned: the tests and the
  chapter use it for "simulated ranks" on one CPU.
- :func:`check_case` (inside a process group) compares ``ring_attention``'s forward and backward,
  gathered from all ranks, with a float64 (CPU) or float32 (GPU) reference and with single-device
  ``flash_attention`` in the same dtype.
- :func:`benchmark` times forward and forward+backward per step and per call, counts the bytes
  each rank sends, and the peak memory per rank, against N.
- :func:`compare_torch_cp` runs PyTorch's own context parallelism
  (``torch.distributed.tensor.experimental.context_parallel``) on the same inputs.
- ``python -m course_kernels.distributed.bench`` (run it under ``torchrun``) does all of this and writes
  JSON files; ``scripts/gpu_ring.sh`` is the two-GPU command.

Modules: :mod:`.ring_spawn`, :mod:`.ring_check`, :mod:`.ring_measure`, :mod:`.ring_torch_cp`; this
module is the command line, and every public name of those is importable from here.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import sys

import torch
import torch.distributed as dist

from .check import (
    BWD_FACTOR,
    DTYPES,
    FLOOR,
    FWD_FACTOR,
    check_case,
    check_cases,
    demo,
)
from .measure import benchmark, format_row, link_bandwidth
from .spawn import device_here, spawn
from .torch_cp import compare_torch_cp

__all__ = [
    "BWD_FACTOR",
    "DTYPES",
    "FLOOR",
    "FWD_FACTOR",
    "benchmark",
    "check_case",
    "check_cases",
    "compare_torch_cp",
    "demo",
    "device_here",
    "environment",
    "format_row",
    "link_bandwidth",
    "main",
    "spawn",
]


# --------------------------------------------------------------------------- command line


def environment(command: str) -> dict:
    import platform

    import triton

    cuda = torch.cuda.is_available()
    return {
        "gpu": torch.cuda.get_device_name() if cuda else "none (CPU, gloo)",
        "gpus": torch.cuda.device_count() if cuda else 0,
        "backend": dist.get_backend() if dist.is_initialized() else None,
        "world": dist.get_world_size() if dist.is_initialized() else 1,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "nccl": _nccl_version() if cuda else None,
        "python": platform.python_version(),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": command,
        "autotune": os.environ.get("COURSE_KERNELS_AUTOTUNE", "1") != "0",
        "env": {
            k: os.environ.get(k) for k in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST")
        },
    }


def _nccl_version():
    v = torch.cuda.nccl.version()
    return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)


def _ints(text):
    return tuple(int(x) for x in text.split(","))


def main(argv=None) -> int:
    """Run under torchrun (``python -m torch.distributed.run --nproc_per_node W -m
    course_kernels.distributed.bench ...``): each process joins the group from the environment."""
    ap = argparse.ArgumentParser(
        prog="python -m course_kernels.distributed.bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("step", choices=["check", "bench", "cp"])
    ap.add_argument("--out", default="course_kernels/data/ring")
    ap.add_argument(
        "--backend",
        choices=["nccl", "gloo"],
        default=None,
        help="default: nccl when CUDA GPUs are visible, else gloo",
    )
    ap.add_argument("--ns", type=_ints, default=None, help="sequence lengths, comma-separated")
    ap.add_argument("--dtype", choices=list(DTYPES), default=None)
    ap.add_argument("--heads", type=int, default=None)
    ap.add_argument("--kv-heads", type=int, default=None)
    ap.add_argument("--head-dim", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds for one collective")
    args = ap.parse_args(argv)
    if "RANK" not in os.environ:
        ap.error(
            "run it under torchrun: python -m torch.distributed.run --nproc_per_node 2 "
            "-m course_kernels.distributed.bench " + " ".join(argv or sys.argv[1:])
        )
    cuda = torch.cuda.is_available()
    backend = args.backend or ("nccl" if cuda else "gloo")
    if backend == "nccl":
        if not cuda or torch.cuda.device_count() < int(os.environ["LOCAL_WORLD_SIZE"]):
            ap.error(
                f"nccl needs one GPU per process; {torch.cuda.device_count()} visible for "
                f"{os.environ['LOCAL_WORLD_SIZE']} processes"
            )
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group(backend, timeout=_dt.timedelta(seconds=args.timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    gpu = backend == "nccl"
    command = (
        "python -m torch.distributed.run --standalone --nproc_per_node "
        f"{world} -m course_kernels.distributed.bench " + " ".join(argv or sys.argv[1:])
    )
    env = environment(command)
    os.makedirs(args.out, exist_ok=True)
    extra = {}
    try:
        if args.step == "check":
            dtype = args.dtype or ("bfloat16" if gpu else "float32")
            ns = args.ns or ((16384, 17001) if gpu else (24, 21))  # 17001: uneven shards
            H, kv_heads = args.heads or (16 if gpu else 2), args.kv_heads or (4 if gpu else 1)
            d = args.head_dim or (128 if gpu else 16)
            cases = [
                dict(B=1, Hq=H, kv_heads=kv_heads, n=n, d=d, causal=c, layout=lay, dtype=dt)
                for n in ns
                for c in (False, True)
                for lay in ("contiguous", "zigzag")
                for dt in sorted({dtype, "float16"} if gpu else {dtype})
            ]
            rows = []
            for c in cases:
                row = check_case(**c)
                if rank == 0:
                    rows.append(row)
                    print(
                        f"check N={row['n']} {row['dtype']} causal={row['causal']} "
                        f"{row['layout']}: max err vs reference o {row['o_err']:.2e} (flash "
                        f"{row['o_flash_err']:.2e}) dq {row['dq_err']:.2e} dk "
                        f"{row['dk_err']:.2e} dv {row['dv_err']:.2e} -> "
                        f"{'ok' if row['ok'] else 'FAIL'}",
                        flush=True,
                    )
            name, payload = "ring_check.json", rows
            failed = rank == 0 and not all(r["ok"] for r in rows)
        elif args.step == "bench":
            link = link_bandwidth((1, 16, 256, 1024) if gpu else (1,))
            if rank == 0:
                for row in link:
                    print(
                        f"link: {row['mib']:5d} MiB per exchange, {row['ms']:.3f} ms, "
                        f"{row['gb_per_s']:.1f} GB/s per direction per rank",
                        flush=True,
                    )
            extra["link"] = link
            rows = benchmark(
                ns=args.ns or ((4096, 16384, 65536) if gpu else (32, 64)),
                Hq=args.heads or (16 if gpu else 2),
                kv_heads=args.kv_heads or (16 if gpu else 2),
                d=args.head_dim or (128 if gpu else 16),
                dtype=args.dtype or ("bfloat16" if gpu else "float32"),
                repeats=args.repeats or (5 if gpu else 1),
                log=lambda s: print(s, flush=True),
            )
            name, payload, failed = "ring_bench.json", rows, False
        else:
            rows = compare_torch_cp(
                ns=args.ns or ((8192, 32768) if gpu else (32,)),
                Hq=args.heads or (16 if gpu else 2),
                d=args.head_dim or (128 if gpu else 16),
                dtype=args.dtype or ("bfloat16" if gpu else "float32"),
                repeats=args.repeats or (5 if gpu else 1),
                log=lambda s: print(s, flush=True),
            )
            name, payload, failed = "ring_torch_cp.json", rows, False
        if rank == 0:
            path = os.path.join(args.out, name)
            with open(path, "w") as f:
                json.dump({**env, **extra, "rows": payload}, f, indent=1)
            print(f"wrote {path} ({len(payload)} rows)", flush=True)
    finally:
        dist.destroy_process_group()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
