"""Correctness of ``ring_attention``: forward and backward, gathered from all ranks, against a
float64 (CPU) or float32 (GPU) reference and single-device ``flash_attention`` in the same dtype.

Chapter: "Beyond one GPU" (book/part2/beyond_one_gpu.ipynb). Re-exported from
:mod:`course_kernels.distributed.bench`.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from .._compat import renamed_kwargs
from .ring import (
    RingStats,
    gather_sequence,
    ring_attention,
    shard_sequence,
)
from .spawn import device_here


DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
# Error rule (FlashAttention's own tests): error vs the reference at most FACTOR x that of
# single-device flash_attention in the same dtype, plus a floor for when both are at rounding.
FWD_FACTOR, BWD_FACTOR = 2.0, 3.0
FLOOR = {torch.float32: 2e-6, torch.float16: 2e-4, torch.bfloat16: 1e-3}


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
    from ..triton.flash import flash_attention

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
