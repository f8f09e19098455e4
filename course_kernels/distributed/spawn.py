"""Simulated ranks: run a function on W local processes joined by a gloo (CPU) or NCCL (GPU)
process group, with a time limit, and collect what each rank returned.

Chapter: "Beyond one GPU" (book/part2/beyond_one_gpu.ipynb). Re-exported from
:mod:`course_kernels.distributed.bench`.
"""

from __future__ import annotations

import datetime as _dt
import os
import tempfile
import time
import traceback

import torch
import torch.distributed as dist


def _child(rank, world, init_file, backend, fn, args, queue, timeout_s):
    try:
        if backend == "nccl":
            torch.cuda.set_device(rank)
        dist.init_process_group(
            backend,
            init_method=f"file://{init_file}",
            rank=rank,
            world_size=world,
            timeout=_dt.timedelta(seconds=timeout_s),
        )
        torch.set_num_threads(1)
        queue.put((rank, "ok", fn(*args)))
    except BaseException:  # noqa: BLE001 - report any failure to the parent, then exit
        queue.put((rank, "error", traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def spawn(fn, world: int, args=(), backend: str = "gloo", timeout_s: float = 300.0):
    """Run ``fn(*args)`` on ``world`` new processes in one process group; return their results.

    ``fn`` must be importable (a module-level function). The group is initialised through a
    temporary file (no port to pick). If a rank fails, raises RuntimeError with its traceback;
    if they are not all done after ``timeout_s`` seconds, the processes are terminated and
    TimeoutError is raised (a hang fails instead of blocking).
    """
    import multiprocessing as mp

    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend must be 'gloo' or 'nccl'; got {backend!r}")
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        init_file = os.path.join(tmp, "rendezvous")
        procs = [
            ctx.Process(
                target=_child,
                args=(r, world, init_file, backend, fn, args, queue, timeout_s),
                daemon=True,
            )
            for r in range(world)
        ]
        for p in procs:
            p.start()
        results, deadline = {}, time.monotonic() + timeout_s
        try:
            while len(results) < world:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(
                        f"{world} ranks running {fn.__name__} did not finish in "
                        f"{timeout_s:.0f} s (ranks done: {sorted(results)})"
                    )
                try:
                    rank, status, value = queue.get(timeout=min(left, 1.0))
                except Exception:  # queue.Empty: check that nobody died silently
                    dead = [
                        r
                        for r, p in enumerate(procs)
                        if p.exitcode not in (None, 0) and r not in results
                    ]
                    if dead:
                        raise RuntimeError(
                            f"rank(s) {dead} of {fn.__name__} died (exit codes "
                            f"{[procs[r].exitcode for r in dead]})"
                        ) from None
                    continue
                if status == "error":
                    raise RuntimeError(f"rank {rank} of {fn.__name__} failed:\n{value}")
                results[rank] = value
        finally:
            for p in procs:
                p.join(timeout=5)
                if p.is_alive():
                    p.terminate()
                    p.join(timeout=5)
    return [results[r] for r in range(world)]


def device_here():
    """The device this rank computes on: its GPU under NCCL, the CPU under gloo."""
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
