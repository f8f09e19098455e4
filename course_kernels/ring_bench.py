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
- ``python -m course_kernels.ring_bench`` (run it under ``torchrun``) does all of this and writes
  JSON files; ``scripts/gpu_ring.sh`` is the two-GPU command.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import sys
import tempfile
import time
import traceback

import torch
import torch.distributed as dist

from ._compat import renamed_kwargs
from .distributed import (
    RingStats,
    gather_sequence,
    ring_attention,
    ring_balance,
    ring_bytes,
    shard_sequence,
)

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
# Error rule (FlashAttention's own tests): error vs the reference at most FACTOR x that of
# single-device flash_attention in the same dtype, plus a floor for when both are at rounding.
FWD_FACTOR, BWD_FACTOR = 2.0, 3.0
FLOOR = {torch.float32: 2e-6, torch.float16: 2e-4, torch.bfloat16: 1e-3}


# --------------------------------------------------------------------------- processes


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


# --------------------------------------------------------------------------- correctness


def _inputs(B, Hq, kv_heads, n, d, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hq, n, d, generator=g)
    k = torch.randn(B, kv_heads, n, d, generator=g)
    v = torch.randn(B, kv_heads, n, d, generator=g)
    do = torch.randn(B, Hq, n, d, generator=g)
    return q, k, v, do


def _reference(q, k, v, do, causal, device):
    """Float64 on CPU (explicit softmax), float32 SDPA on a GPU; returns o, dq, dk, dv."""
    dt = torch.float64 if device.type == "cpu" else torch.float32
    q, k, v = (x.to(device, dt).requires_grad_() for x in (q, k, v))
    rep = q.shape[1] // k.shape[1]
    if device.type == "cpu":
        kk, vv = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        s = (q @ kk.transpose(-1, -2)) / math.sqrt(q.shape[-1])  # (B, H, N, N)
        if causal:
            n = q.shape[2]
            s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), -math.inf)
        o = torch.softmax(s, -1) @ vv
    else:  # K/V heads repeated by hand: SDPA's fused kernels take no GQA in every version
        o = torch.nn.functional.scaled_dot_product_attention(
            q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1), is_causal=causal
        )
    o.backward(do.to(device, dt))
    return [x.detach().cpu().double() for x in (o, q.grad, k.grad, v.grad)]


def _err(a, b) -> float:
    return (a.double().cpu() - b).abs().max().item()


@renamed_kwargs(Hkv="kv_heads")
def check_case(
    B=1,
    Hq=2,
    kv_heads=1,
    n=24,
    d=16,
    causal=True,
    layout="zigzag",
    dtype="float32",
    seed=0,
    backward=True,
) -> dict | None:
    """Inside a process group: ring_attention (gathered) vs a reference and vs flash_attention.

    Every rank computes the same full inputs from ``seed`` and its shard of them. Returns, on
    rank 0, a dict of max errors (ring and single-device flash vs the reference) and ``ok``;
    None on the other ranks.
    """
    from .flash import flash_attention

    rank, world = dist.get_rank(), dist.get_world_size()
    device, dt = device_here(), DTYPES[dtype]
    q, k, v, do = _inputs(B, Hq, kv_heads, n, d, seed)
    shard = [
        shard_sequence(x, world, rank, layout).to(device, dt).requires_grad_() for x in (q, k, v)
    ]
    out = ring_attention(*shard, causal=causal, layout=layout)
    got = [out.detach()]
    if backward:
        out.backward(shard_sequence(do, world, rank, layout).to(device, dt))
        got += [x.grad for x in shard]
    got = [gather_sequence(x, layout) for x in got]
    if rank != 0:
        return None
    ref = _reference(q, k, v, do, causal, device)
    fl = [x.to(device, dt).requires_grad_() for x in (q, k, v)]
    fo = flash_attention(*fl, causal=causal)
    mine = [fo.detach()]
    if backward:
        fo.backward(do.to(device, dt))
        mine += [x.grad for x in fl]
    names = ["o", "dq", "dk", "dv"]
    row = {
        "B": B,
        "Hq": Hq,
        "kv_heads": kv_heads,
        "n": n,
        "d": d,
        "causal": causal,
        "layout": layout,
        "dtype": dtype,
        "world": world,
        "ok": True,
    }
    for i, (a, b) in enumerate(zip(got, mine, strict=True)):
        e_ring, e_flash = _err(a, ref[i]), _err(b, ref[i])
        factor = FWD_FACTOR if i == 0 else BWD_FACTOR
        row[f"{names[i]}_err"], row[f"{names[i]}_flash_err"] = e_ring, e_flash
        row[f"{names[i]}_vs_flash"] = _err(a, b.double().cpu())
        row["ok"] &= bool(e_ring <= factor * e_flash + FLOOR[dt])
    return row


def check_cases(cases) -> list | None:
    """:func:`check_case` for each dict of keyword arguments in ``cases``; rank 0 gets the rows."""
    rows = [check_case(**c) for c in cases]
    return rows if dist.get_rank() == 0 else None


def demo(cases, n=24, heads=2, kv_heads=1, head_dim=16) -> dict:
    """For the chapter, on simulated ranks: :func:`check_cases` (rows on rank 0) and one causal
    zigzag forward+backward of N tokens with :class:`RingStats` (this rank's bytes and steps)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    q, k, v, do = _inputs(1, heads, kv_heads, n, head_dim, seed=1)
    sh = [shard_sequence(x, world, rank, "zigzag").requires_grad_() for x in (q, k, v)]
    stats = RingStats()
    out = ring_attention(*sh, causal=True, layout="zigzag", stats=stats)
    out.backward(shard_sequence(do, world, rank, "zigzag"))
    return {
        "rows": check_cases(cases),
        "rank": rank,
        "tokens": sh[0].shape[2],
        "bytes_sent": dict(stats.bytes_sent),
        "bytes_received": dict(stats.bytes_received),
        "steps": stats.rows(),
    }


# --------------------------------------------------------------------------- measurement


def _time_ms(fn, device, repeats):
    """Mean ms per call of ``fn`` on this rank, started together on all ranks (a barrier)."""
    dist.barrier()
    if device.type == "cuda":
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(repeats):
            fn()
        b.record()
        b.synchronize()
        return a.elapsed_time(b) / repeats
    t = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - t) * 1e3 / repeats


def _peak_bytes(fn, device):
    """Peak bytes allocated during ``fn`` beyond what was allocated before (CUDA only)."""
    if device.type != "cuda":
        return None
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


def _all(x):
    """Every rank's value of the float ``x`` (None allowed), by rank."""
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, x)
    return out


@renamed_kwargs(Hkv="kv_heads")
def benchmark(
    ns=(4096, 16384),
    B=1,
    Hq=16,
    kv_heads=16,
    d=128,
    dtype="bfloat16",
    layouts=("contiguous", "zigzag"),
    causals=(False, True),
    repeats=5,
    single=True,
    log=print,
) -> list[dict]:
    """Times, bytes and memory per rank of ring_attention vs N (call on every rank).

    Each row (the same on every rank): N, layout, causal; ``fwd_ms`` / ``fwd_bwd_ms`` (slowest
    rank, mean of ``repeats``); ``steps``: per step the slowest rank's step time and every
    rank's compute time; ``busy_ms_by_rank`` (compute, fwd); ``bytes_sent_by_rank`` (one
    forward+backward) and the model's ``bytes_model``; ``peak_bytes_by_rank`` (fwd+bwd, beyond
    the inputs); and single-device flash_attention at the full N for comparison.
    """
    from .flash import flash_attention

    rank, world = dist.get_rank(), dist.get_world_size()
    device, dt = device_here(), DTYPES[dtype]
    rows = []
    for n in ns:
        q, k, v, do = _inputs(B, Hq, kv_heads, n, d, seed=n)  # the same full inputs on every rank
        for causal in causals:
            for layout in layouts:
                sh = [
                    shard_sequence(x, world, rank, layout).to(device, dt).requires_grad_()
                    for x in (q, k, v)
                ]
                dsh = shard_sequence(do, world, rank, layout).to(device, dt)

                def fwd(sh=sh, causal=causal, layout=layout):
                    with torch.no_grad():
                        ring_attention(*sh, causal=causal, layout=layout)

                def fwd_bwd(stats=None, sh=sh, causal=causal, layout=layout, dsh=dsh):
                    ring_attention(*sh, causal=causal, layout=layout, stats=stats).backward(dsh)

                fwd_bwd()  # warm-up: compiles / autotunes every block shape
                fwd_ms = _time_ms(fwd, device, repeats)
                fb_ms = _time_ms(fwd_bwd, device, repeats)
                stats = RingStats()
                dist.barrier()
                fwd_bwd(stats)
                steps = stats.rows()
                peak = _peak_bytes(fwd_bwd, device)
                fwd_steps = [s for s in steps if s["phase"] == "fwd"]
                bwd_steps = [s for s in steps if s["phase"] == "bwd"]
                row = {
                    "n": n,
                    "B": B,
                    "Hq": Hq,
                    "kv_heads": kv_heads,
                    "d": d,
                    "dtype": dtype,
                    "world": world,
                    "layout": layout,
                    "causal": causal,
                    "repeats": repeats,
                    "fwd_ms": max(_all(fwd_ms)),
                    "fwd_bwd_ms": max(_all(fb_ms)),
                    "fwd_ms_by_rank": _all(fwd_ms),
                    "fwd_bwd_ms_by_rank": _all(fb_ms),
                    "fwd_step_ms_by_rank": _all([s["step_ms"] for s in fwd_steps]),
                    "fwd_compute_ms_by_rank": _all([s["compute_ms"] for s in fwd_steps]),
                    "bwd_step_ms_by_rank": _all([s["step_ms"] for s in bwd_steps]),
                    "bwd_compute_ms_by_rank": _all([s["compute_ms"] for s in bwd_steps]),
                    "pairs_by_rank": _all([s["pairs"] for s in fwd_steps]),
                    "bytes_sent_by_rank": _all(dict(stats.bytes_sent)),
                    "bytes_model": {
                        "fwd": ring_bytes(B, kv_heads, n, d, world, dt.itemsize),
                        "bwd": ring_bytes(B, kv_heads, n, d, world, dt.itemsize, True),
                    },
                    "peak_bytes_by_rank": _all(peak),
                    "schedule_imbalance": ring_balance(world, layout, causal)["imbalance"],
                }
                row["busy_ms_by_rank"] = [sum(x) for x in row["fwd_compute_ms_by_rank"]]
                if single and layout == layouts[0]:
                    fq, fk, fv = (x.to(device, dt).requires_grad_() for x in (q, k, v))
                    fdo = do.to(device, dt)

                    def f_fwd(fq=fq, fk=fk, fv=fv, causal=causal):
                        with torch.no_grad():
                            flash_attention(fq, fk, fv, causal=causal)

                    def f_fb(fq=fq, fk=fk, fv=fv, causal=causal, fdo=fdo):
                        flash_attention(fq, fk, fv, causal=causal).backward(fdo)

                    f_fb()
                    row["single_fwd_ms"] = max(_all(_time_ms(f_fwd, device, repeats)))
                    row["single_fwd_bwd_ms"] = max(_all(_time_ms(f_fb, device, repeats)))
                    peaks = _all(_peak_bytes(f_fb, device))
                    row["single_peak_bytes"] = None if peaks[0] is None else max(peaks)
                    del fq, fk, fv, fdo
                rows.append(row)
                if device.type == "cuda":
                    torch.cuda.empty_cache()
                if rank == 0:
                    log(format_row(row))
    return rows


def link_bandwidth(sizes_mib=(1, 16, 256, 1024), repeats=10) -> list[dict]:
    """GB/s of one ring exchange (each rank sends ``size`` to the next and receives as much from
    the previous, as the ring does), per size; the slowest rank's time (call on every rank)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    device = device_here()
    ring = list(range(world))
    rows = []
    for mib in sizes_mib:
        send = torch.ones(int(mib * 2**20), dtype=torch.uint8, device=device)
        recv = torch.empty_like(send)

        def exchange(send=send, recv=recv):
            ops = [
                dist.P2POp(dist.isend, send, ring[(rank + 1) % world]),
                dist.P2POp(dist.irecv, recv, ring[(rank - 1) % world]),
            ]
            for r in dist.batch_isend_irecv(ops):
                r.wait()

        exchange()
        ms = max(_all(_time_ms(exchange, device, repeats)))
        rows.append({"mib": mib, "ms": ms, "gb_per_s": send.numel() / (ms * 1e-3) / 1e9})
    return rows


def format_row(r) -> str:
    mib = [None if b is None else b / 2**20 for b in r["peak_bytes_by_rank"]]
    peak = "-" if mib[0] is None else "/".join(f"{m:.0f}" for m in mib) + " MiB"
    busy = "/".join(f"{b:.2f}" for b in r["busy_ms_by_rank"])
    single = ""
    if "single_fwd_ms" in r:
        single = f" | 1 device: fwd {r['single_fwd_ms']:.2f} fwd+bwd {r['single_fwd_bwd_ms']:.2f}"
    sent = r["bytes_sent_by_rank"][0]
    return (
        f"N={r['n']:6d} {'causal' if r['causal'] else 'full  '} {r['layout']:10s} "
        f"fwd {r['fwd_ms']:8.2f} ms fwd+bwd {r['fwd_bwd_ms']:8.2f} ms | busy/rank {busy} ms"
        f" | sent/rank fwd {sent['fwd'] / 2**20:.3g} bwd {sent['bwd'] / 2**20:.3g} MiB"
        f" | peak/rank {peak}{single}"
    )


# --------------------------------------------------------------------------- PyTorch's CP


def compare_torch_cp(
    ns=(4096,), B=1, Hq=16, d=128, dtype="bfloat16", causals=(False, True), repeats=5, log=print
) -> list[dict]:
    """PyTorch's context parallelism vs ring_attention (zigzag) on the same inputs.

    Runs ``F.scaled_dot_product_attention`` inside
    ``torch.distributed.tensor.experimental.context_parallel`` (it shards the buffers with its
    head-tail load balancer when N is a multiple of 2W: our zigzag layout), forward and
    backward, unshards with ``context_parallel_unshard`` and compares output and gradients
    with ours gathered; times both. A row records ``error`` when this torch cannot run it
    (for example on CPU/gloo, where CP has no SDPA kernel to dispatch to).
    """
    import torch.nn.functional as F

    rank, world = dist.get_rank(), dist.get_world_size()
    device, dt = device_here(), DTYPES[dtype]
    rows, mesh = [], None
    for n in ns:
        for causal in causals:
            row = {
                "n": n,
                "B": B,
                "Hq": Hq,
                "kv_heads": Hq,
                "d": d,
                "dtype": dtype,
                "causal": causal,
                "world": world,
                "torch": torch.__version__,
            }
            q, k, v, do = _inputs(B, Hq, Hq, n, d, seed=n)
            try:
                from torch.distributed.device_mesh import init_device_mesh
                from torch.distributed.tensor.experimental import context_parallel
                from torch.distributed.tensor.experimental._attention import (
                    context_parallel_unshard,
                )

                try:  # a ring of K/V rotations, like ours (the default all-gathers K/V)
                    from torch.distributed.tensor.experimental._attention import (
                        set_rotate_method,
                    )

                    set_rotate_method("alltoall")
                    row["cp_rotate_method"] = "alltoall"
                except ImportError:
                    row["cp_rotate_method"] = "default (this torch has no set_rotate_method)"
                if mesh is None:  # one mesh (one process group) for every case
                    mesh = init_device_mesh(device.type, (world,))

                bufs = [x.to(device, dt) for x in (q, k, v, do)]
                with context_parallel(mesh, buffers=bufs, buffer_seq_dims=[2, 2, 2, 2]):
                    # inside: bufs are this rank's shards and SDPA is PyTorch's ring
                    try:  # the buffers are resized back on exit: only without grad
                        for b in bufs[:3]:
                            b.requires_grad_(True)
                        out = F.scaled_dot_product_attention(*bufs[:3], is_causal=causal)
                        out.backward(bufs[3])
                        res = [out.detach()] + [b.grad.clone() for b in bufs[:3]]

                        def cp_fwd(bufs=bufs, causal=causal):
                            with torch.no_grad():
                                F.scaled_dot_product_attention(*bufs[:3], is_causal=causal)

                        def cp_fwd_bwd(bufs=bufs, causal=causal):
                            F.scaled_dot_product_attention(*bufs[:3], is_causal=causal).backward(
                                bufs[3]
                            )

                        cp_ms = (
                            _time_ms(cp_fwd, device, repeats),
                            _time_ms(cp_fwd_bwd, device, repeats),
                        )
                    finally:
                        for b in bufs[:3]:
                            b.requires_grad_(False)
                theirs = context_parallel_unshard(mesh, res, [2] * len(res))
                row["cp_fwd_ms"] = max(_all(cp_ms[0]))
                row["cp_fwd_bwd_ms"] = max(_all(cp_ms[1]))
                res = None  # free the shards before our run
            except Exception as exc:  # noqa: BLE001 - record what this torch cannot do
                row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
                rows.append(row)
                if rank == 0:
                    log(f"torch CP N={n} causal={causal}: {row['error']}")
                continue
            sh = [
                shard_sequence(x, world, rank, "zigzag").to(device, dt).requires_grad_()
                for x in (q, k, v)
            ]
            dsh = shard_sequence(do, world, rank, "zigzag").to(device, dt)

            def ours_fwd(sh=sh, causal=causal):
                with torch.no_grad():
                    ring_attention(*sh, causal=causal, layout="zigzag")

            def ours_fwd_bwd(sh=sh, causal=causal, dsh=dsh):
                ring_attention(*sh, causal=causal, layout="zigzag").backward(dsh)

            out = ring_attention(*sh, causal=causal, layout="zigzag")
            out.backward(dsh)
            mine = [gather_sequence(x, "zigzag") for x in [out.detach()] + [s.grad for s in sh]]
            for name, a, b in zip(("o", "dq", "dk", "dv"), mine, theirs, strict=True):
                row[f"{name}_max_diff"] = (a.float() - b.float()).abs().max().item()
            row["ours_fwd_ms"] = max(_all(_time_ms(ours_fwd, device, repeats)))
            row["ours_fwd_bwd_ms"] = max(_all(_time_ms(ours_fwd_bwd, device, repeats)))
            rows.append(row)
            if rank == 0:
                log(
                    f"torch CP vs ring (zigzag) N={n} causal={causal}: max |diff| o "
                    f"{row['o_max_diff']:.2e} dq {row['dq_max_diff']:.2e} dk "
                    f"{row['dk_max_diff']:.2e} dv {row['dv_max_diff']:.2e}; fwd+bwd ms: CP "
                    f"{row['cp_fwd_bwd_ms']:.2f}, ours {row['ours_fwd_bwd_ms']:.2f}"
                )
    return rows


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
    course_kernels.ring_bench ...``): each process joins the group from the environment."""
    ap = argparse.ArgumentParser(
        prog="python -m course_kernels.ring_bench",
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
            "-m course_kernels.ring_bench " + " ".join(argv or sys.argv[1:])
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
        f"{world} -m course_kernels.ring_bench " + " ".join(argv or sys.argv[1:])
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
