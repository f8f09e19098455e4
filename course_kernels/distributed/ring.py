"""Ring attention on ``torch.distributed``: the sequence split over GPUs, K/V passed round a ring.

Chapter: "Beyond one GPU" (book/part2/beyond_one_gpu.ipynb).

The only new idea is the merge of chapter 4: attention of a query block over two disjoint sets of
keys, each summarised by its output ``o`` and logsumexp ``lse``, combines exactly into attention
over the union (:func:`merge_attention`). Ring Attention (Liu, Zaharia & Abbeel 2023,
arXiv 2310.01889) uses it across devices: every rank keeps its shard of Q, and the K/V shards
travel round a ring of ``W`` ranks; after ``W`` steps every query has met every key.

    step s, rank r: holds the K/V shard of rank (r - s) mod W, computes one block with the
    course's Triton kernel (``flash._forward``, which also returns the logsumexp), merges it into
    its running (o, lse), while the next K/V shard is already on its way (P2P send/recv posted
    before the compute, so communication overlaps computation).

The backward runs round the same ring: each rank recomputes its blocks from the *global* o and
lse (``flash._backward`` takes them as arguments: exactly what a block of the ring needs), keeps
dQ, and sends dK/dV on with their K/V block; after the last step they arrive at their owner.

Layouts (``W`` ranks, ``world``): ``"contiguous"`` splits the sequence into W chunks in rank order
(this is DTensor's ``Shard(2)`` placement). With a causal mask rank W-1 then works every step and
rank 0 almost never: ``"zigzag"`` splits it into 2W chunks and gives rank r chunks r and 2W-1-r
(PyTorch context parallelism's head-tail load balancer), so every rank does the same work each
step. :func:`ring_schedule` is that plan, and both the implementation and the chapter's figure
read it.

Uneven N: chunks have ``c = ceil(N / n_chunks)`` tokens and the last chunk is shorter (the split
of ``torch.chunk`` and DTensor). Every chunk must be non-empty: N = 9 on 4 ranks would need an
empty last chunk (3, 3, 3, 0) and is refused with a clear error (pad the sequence, or use fewer
ranks). :func:`shard_sequence` / :func:`unshard_sequence` make and undo the split.

Precision: each block's output comes from the kernel in the inputs' dtype; merges, dQ and the
travelling dK/dV accumulate in float32 (dK/dV are sent in float32: twice the bytes of fp16 K/V,
but no rounding at every hop). Layout everywhere: (batch, heads, seq, head_dim).

Modules: :mod:`.ring_plan` (layouts, shards, the schedule), :mod:`.ring_cost` (cost models),
:mod:`.ring_stats` (timing), :mod:`.ring_setup` (validation and agreement across ranks); this
module runs the ring. All their public names are importable from here.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from ..numpy.reference import LN2
from .cost import ring_bytes, ring_memory_bytes, ring_min_shard, ring_step_times
from .plan import (
    LAYOUTS,
    BlockTask,
    RingStep,
    _local_calls as _local_calls,  # re-exported for tests/test_distributed.py
    chunk_bounds,
    gather_sequence,
    n_chunks,
    rank_chunks,
    ring_balance,
    ring_schedule,
    shard_lengths,
    shard_sequence,
    unshard_sequence,
)
from .setup import _Ring, _setup
from .stats import RingStats, _Clock

__all__ = [
    "LAYOUTS",
    "BlockTask",
    "RingStats",
    "RingStep",
    "chunk_bounds",
    "gather_sequence",
    "merge_attention",
    "n_chunks",
    "rank_chunks",
    "ring_attention",
    "ring_balance",
    "ring_bytes",
    "ring_memory_bytes",
    "ring_min_shard",
    "ring_step_times",
    "ring_schedule",
    "shard_lengths",
    "shard_sequence",
    "unshard_sequence",
]


# --------------------------------------------------------------------------- the merge


def merge_attention(o_a, lse_a, o_b, lse_b):
    """Attention over two disjoint key sets -> attention over their union (log-sum-exp form).

    o_*: (..., Nq, d) normalised outputs; lse_*: (..., Nq) natural-log logsumexp of each row's
    scores (-inf: the side saw no visible key). Returns ``(o, lse)`` in float32:

        lse = log(e^lse_a + e^lse_b),   o = e^(lse_a - lse) o_a + e^(lse_b - lse) o_b

    the same rescaling as ``online_softmax.merge`` (whose (m, l, acc) give o = acc / l and
    lse = m + log l). Rows with nothing visible on either side stay o = 0, lse = -inf.
    """
    o_a, o_b = o_a.float(), o_b.float()
    lse_a, lse_b = lse_a.float(), lse_b.float()
    lse = torch.logaddexp(lse_a, lse_b)  # (..., Nq)
    lse_safe = torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse)  # -inf guard
    wa = torch.exp(lse_a - lse_safe)  # (..., Nq); 0 for a side that saw nothing
    wb = torch.exp(lse_b - lse_safe)
    return wa[..., None] * o_a + wb[..., None] * o_b, lse


# --------------------------------------------------------------------------- the ring


def _exchange(ring: _Ring, send, recv, tag: int, stats, phase):
    """Post send(next) / recv(previous) together; returns the requests (wait on them later)."""
    ops = [
        dist.P2POp(dist.isend, send, ring.nxt, ring.group, tag),
        dist.P2POp(dist.irecv, recv, ring.prv, ring.group, tag),
    ]
    if stats is not None:
        stats.bytes_sent[phase] += send.numel() * send.element_size()
        stats.bytes_received[phase] += recv.numel() * recv.element_size()
    return dist.batch_isend_irecv(ops)


def _pairs(calls) -> int:
    """(query, key) pairs one step's calls compute (per batch and head)."""
    return sum(
        (q1 - q0) * (q1 - q0 + 1) // 2 if c else (q1 - q0) * (k1 - k0)
        for q0, q1, k0, k1, c in calls
    )


def _wait(reqs):
    for r in reqs:
        r.wait()


def _ring_forward(q, k, v, causal, scale, ring: _Ring, stats):
    """q (B, Hq, L, d), k/v (B, kv_heads, L, d) contiguous -> o (B, Hq, L, d) in q.dtype, lse2 base 2."""
    from ..triton import flash

    B, kv_heads, _, d = k.shape
    clock = _Clock(q.device, enabled=stats is not None)
    o = torch.zeros(q.shape, device=q.device, dtype=torch.float32)  # (B, Hq, L, d)
    lse = torch.full(q.shape[:3], -math.inf, device=q.device)  # (B, Hq, L) natural log
    kv = torch.stack([k, v])  # (2, B, kv_heads, L_src, d): K and V travel as one message
    for s in range(ring.world):
        t0 = clock.now()
        reqs, kv_next = [], None
        if s < ring.world - 1:  # post the next block's transfer before computing this one
            n_next = ring.lengths[(ring.rank - s - 1) % ring.world]
            kv_next = kv.new_empty((2, B, kv_heads, n_next, d))
            reqs = _exchange(ring, kv, kv_next, 0, stats, "fwd")
        for q0, q1, k0, k1, c in ring.calls[s]:
            o_blk, lse2_blk = flash._forward(
                q[:, :, q0:q1].contiguous(),
                kv[0, :, :, k0:k1].contiguous(),
                kv[1, :, :, k0:k1].contiguous(),
                c,
                scale,
            )
            o[:, :, q0:q1], lse[:, :, q0:q1] = merge_attention(
                o[:, :, q0:q1], lse[:, :, q0:q1], o_blk, lse2_blk * LN2
            )
        t1 = clock.now()
        _wait(reqs)
        if kv_next is not None:
            kv = kv_next
        if stats is not None:
            stats.marks.append(("fwd", s, _pairs(ring.calls[s]), clock, t0, t1, clock.now()))
    return o.to(q.dtype), lse / LN2


def _ring_backward(do, q, k, v, o, lse2, causal, scale, ring: _Ring, stats):
    """dq, dk, dv of the local shards. K/V go round once more; each dK/dV accumulator travels
    with its block and, one hop after the last step, reaches the block's owner."""
    from ..triton import flash

    B, kv_heads, _, d = k.shape
    clock = _Clock(q.device, enabled=stats is not None)
    do = do.contiguous()
    dq = torch.zeros(q.shape, device=q.device, dtype=torch.float32)  # (B, Hq, L, d)
    kv = torch.stack([k, v])  # (2, B, kv_heads, L_src, d)
    dkv_reqs, dkv_in = [], None
    for s in range(ring.world):
        t0 = clock.now()
        kv_reqs, kv_next = [], None
        if s < ring.world - 1:
            n_next = ring.lengths[(ring.rank - s - 1) % ring.world]
            kv_next = kv.new_empty((2, B, kv_heads, n_next, d))
            kv_reqs = _exchange(ring, kv, kv_next, 0, stats, "bwd")
        dkv = torch.zeros(kv.shape, device=q.device, dtype=torch.float32)  # this block's dK, dV
        for q0, q1, k0, k1, c in ring.calls[s]:
            dq_b, dk_b, dv_b = flash._backward(
                do[:, :, q0:q1].contiguous(),
                q[:, :, q0:q1].contiguous(),
                kv[0, :, :, k0:k1].contiguous(),
                kv[1, :, :, k0:k1].contiguous(),
                o[:, :, q0:q1].contiguous(),
                lse2[:, :, q0:q1].contiguous(),
                c,
                scale,
            )
            dq[:, :, q0:q1] += dq_b.float()
            dkv[0, :, :, k0:k1] += dk_b.float()
            dkv[1, :, :, k0:k1] += dv_b.float()
        t1 = clock.now()
        if s > 0:  # what the previous ranks accumulated for this block arrives meanwhile
            _wait(dkv_reqs)
            dkv += dkv_in
        if ring.world > 1:  # pass the accumulator on with the block; the last hop goes home
            n_in = ring.lengths[(ring.rank - s - 1) % ring.world]
            dkv_in = dkv.new_empty((2, B, kv_heads, n_in, d))
            dkv_reqs = _exchange(ring, dkv, dkv_in, 1, stats, "bwd")
        else:
            dkv_in = dkv
        _wait(kv_reqs)
        if kv_next is not None:
            kv = kv_next
        if stats is not None:
            stats.marks.append(("bwd", s, _pairs(ring.calls[s]), clock, t0, t1, clock.now()))
    _wait(dkv_reqs)
    return dq.to(q.dtype), dkv_in[0].to(k.dtype), dkv_in[1].to(v.dtype)


class _RingAttention(torch.autograd.Function):
    """Saves the local q, k, v, o and base-2 lse: O(N / W) per rank, nothing N x N."""

    @staticmethod
    def forward(ctx, q, k, v, causal, scale, ring, stats):
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        o, lse2 = _ring_forward(q, k, v, causal, scale, ring, stats)
        ctx.save_for_backward(q, k, v, o, lse2)
        ctx.causal, ctx.scale, ctx.ring, ctx.stats = causal, scale, ring, stats
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse2 = ctx.saved_tensors
        dq, dk, dv = _ring_backward(
            do, q, k, v, o, lse2, ctx.causal, ctx.scale, ctx.ring, ctx.stats
        )
        return dq, dk, dv, None, None, None, None


def ring_attention(
    q,
    k,
    v,
    causal: bool = False,
    scale: float | None = None,
    group=None,
    layout: str = "contiguous",
    stats: RingStats | None = None,
):
    """Exact attention over a sequence sharded across the ranks of ``group``; differentiable.

    Call it on every rank of the group (it is a collective), each with its own shard.

    Args:
        q: (B, Hq, L_r, d) this rank's query shard, layout (batch, heads, seq, head_dim).
        k, v: (B, kv_heads, L_r, d) this rank's key/value shards (Hq a multiple of kv_heads: GQA/MQA).
            The shards are the ``layout`` split of one sequence of N = sum of L_r tokens, as
            :func:`shard_sequence` makes it: ``"contiguous"``, rank r holds chunk r of W;
            ``"zigzag"``, chunks r and 2W-1-r of 2W. Chunks have ceil(N / chunks) tokens, the
            last one shorter; an empty chunk is refused.
        causal: token i sees tokens j <= i of the whole sequence.
        scale: multiplies Q K^T; None means 1 / sqrt(d).
        group: the process group (None: the default group); its ranks form the ring in order.
        layout: ``"contiguous"`` or ``"zigzag"``.
        stats: a :class:`RingStats` to fill with step times and bytes moved (forward and, when
            it runs, backward).

    Returns:
        (B, Hq, L_r, d) in q's dtype: this rank's shard of ``flash_attention`` on the full
        sequence. Dtypes float16, bfloat16, float32; on CPU (Triton's interpreter) bfloat16 is
        computed in float32 and rounded, as ``flash_attention`` does (triton-lang/triton#11584).
    """
    from ..triton._env import INTERPRET

    ring, scale = _setup(q, k, v, causal, scale, layout, group)
    if INTERPRET and q.dtype == torch.bfloat16:
        out = _RingAttention.apply(q.float(), k.float(), v.float(), causal, scale, ring, stats)
        return out.to(torch.bfloat16)
    return _RingAttention.apply(q, k, v, causal, scale, ring, stats)
