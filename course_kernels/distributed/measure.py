"""Measuring ``ring_attention``: time per step and per call, bytes sent per rank, peak memory
per rank, against N; and the link bandwidth between two ranks.

Chapter: "Beyond one GPU" (book/part2/beyond_one_gpu.ipynb). Re-exported from
:mod:`course_kernels.distributed.bench`.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from .._compat import renamed_kwargs
from .ring import (
    RingStats,
    ring_attention,
    ring_balance,
    ring_bytes,
    shard_sequence,
)
from .check import DTYPES, _inputs
from .spawn import device_here


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
    from ..triton.flash import flash_attention

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
