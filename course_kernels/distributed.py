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
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from .reference import LN2

LAYOUTS = ("contiguous", "zigzag")

__all__ = [
    "LAYOUTS",
    "BlockTask",
    "RingStats",
    "RingStep",
    "chunk_bounds",
    "gather_sequence",
    "merge_attention",
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


# --------------------------------------------------------------------------- the split


def _check_layout(layout) -> str:
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}; got {layout!r}")
    return layout


def _check_world(world) -> int:
    if isinstance(world, bool) or not isinstance(world, int) or world < 1:
        raise ValueError(f"world (the number of ranks) must be a positive int; got {world!r}")
    return world


def n_chunks(world: int, layout: str = "contiguous") -> int:
    """How many chunks the sequence is cut into: W (contiguous) or 2W (zigzag)."""
    return _check_world(world) * (2 if _check_layout(layout) == "zigzag" else 1)


def chunk_bounds(n: int, chunks: int) -> list[tuple[int, int]]:
    """[start, end) of each chunk: ``c = ceil(n / chunks)`` tokens each, the last one shorter.

    Raises ValueError when that leaves a chunk empty (e.g. n = 9, chunks = 4: 3, 3, 3, 0).
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"sequence length must be a positive int; got {n!r}")
    c = -(-n // chunks)
    if (chunks - 1) * c >= n:
        ok = [m for m in range(n, n + 2 * chunks) if (chunks - 1) * -(-m // chunks) < m]
        raise ValueError(
            f"a sequence of {n} tokens cannot be cut into {chunks} non-empty chunks of "
            f"ceil({n}/{chunks}) = {c} tokens with only the last one shorter; accepted: any n with "
            f"(chunks - 1) * ceil(n / chunks) < n (for example n = {ok[0]}, or any multiple of "
            f"{chunks}). Pad the sequence or use fewer ranks."
        )
    return [(i * c, min((i + 1) * c, n)) for i in range(chunks)]


def rank_chunks(rank: int, world: int, layout: str = "contiguous") -> tuple[int, ...]:
    """The chunk indices rank ``rank`` holds, in sequence order: (r,) or (r, 2W-1-r)."""
    _check_world(world)
    if not 0 <= rank < world:
        raise ValueError(f"rank must be in [0, {world}); got {rank!r}")
    return (rank,) if _check_layout(layout) == "contiguous" else (rank, 2 * world - 1 - rank)


def shard_lengths(n: int, world: int, layout: str = "contiguous") -> list[int]:
    """Tokens each rank holds for a sequence of length ``n``."""
    b = chunk_bounds(n, n_chunks(world, layout))
    return [sum(b[i][1] - b[i][0] for i in rank_chunks(r, world, layout)) for r in range(world)]


def shard_sequence(
    x: torch.Tensor, world: int, rank: int, layout: str = "contiguous", dim: int = 2
) -> torch.Tensor:
    """Rank ``rank``'s shard of the full tensor ``x`` (sequence along ``dim``, default 2 of
    (B, H, N, d)): its chunk(s) concatenated in sequence order. A new contiguous tensor."""
    b = chunk_bounds(x.shape[dim], n_chunks(world, layout))
    parts = [x.narrow(dim, b[i][0], b[i][1] - b[i][0]) for i in rank_chunks(rank, world, layout)]
    return torch.cat(parts, dim=dim).contiguous()


def unshard_sequence(shards, layout: str = "contiguous", dim: int = 2) -> torch.Tensor:
    """Inverse of :func:`shard_sequence`: the full tensor from the list of all W shards."""
    world = len(shards)
    n = sum(s.shape[dim] for s in shards)
    b = chunk_bounds(n, n_chunks(world, layout))
    if [s.shape[dim] for s in shards] != shard_lengths(n, world, layout):
        raise ValueError(
            f"shard lengths {[s.shape[dim] for s in shards]} are not the "
            f"{layout} split of {n} tokens over {world} ranks "
            f"({shard_lengths(n, world, layout)})"
        )
    pieces = {}
    for r, s in enumerate(shards):
        off = 0
        for i in rank_chunks(r, world, layout):
            pieces[i] = s.narrow(dim, off, b[i][1] - b[i][0])
            off += b[i][1] - b[i][0]
    return torch.cat([pieces[i] for i in range(len(b))], dim=dim)


def gather_sequence(
    x_local: torch.Tensor, layout: str = "contiguous", group=None, dim: int = 2
) -> torch.Tensor:
    """All-gather every rank's shard and unshard: the full tensor, on every rank (a collective)."""
    world = dist.get_world_size(group)
    lens = torch.tensor([x_local.shape[dim]], device=x_local.device)
    all_lens = [torch.empty_like(lens) for _ in range(world)]
    dist.all_gather(all_lens, lens, group=group)
    lens = [int(t.item()) for t in all_lens]
    pad = max(lens) - x_local.shape[dim]
    x = x_local.contiguous()
    if pad:
        shape = list(x.shape)
        shape[dim] = pad
        x = torch.cat([x, x.new_zeros(shape)], dim=dim)
    bufs = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(bufs, x, group=group)
    return unshard_sequence(
        [t.narrow(dim, 0, n) for t, n in zip(bufs, lens, strict=True)], layout, dim
    )


# --------------------------------------------------------------------------- the schedule


@dataclass(frozen=True)
class BlockTask:
    """Queries of chunk ``q_chunk`` against keys of chunk ``k_chunk``: all keys, or causal (the
    diagonal: a query sees keys at or before it). Pairs with k_chunk > q_chunk under a causal
    mask are not tasks at all: nothing there is visible."""

    q_chunk: int
    k_chunk: int
    causal: bool

    @property
    def work(self) -> float:
        """Work in units of one full chunk x chunk block (a causal diagonal block is half)."""
        return 0.5 if self.causal else 1.0


@dataclass(frozen=True)
class RingStep:
    """What rank ``rank`` does at step ``step``: it holds the K/V of rank ``kv_rank``."""

    step: int
    rank: int
    kv_rank: int
    tasks: tuple

    @property
    def work(self) -> float:
        return sum(t.work for t in self.tasks)


def ring_schedule(world: int, layout: str = "contiguous", causal: bool = False):
    """The ring's plan: ``schedule[s][r]`` is the :class:`RingStep` of rank r at step s.

    At step s rank r holds the K/V shard of rank (r - s) mod W (shards move to the next rank,
    r -> r + 1, after every step). Its tasks are the (query chunk, key chunk) pairs it computes.
    """
    _check_world(world)
    _check_layout(layout)
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool; got {type(causal).__name__}")
    plan = []
    for s in range(world):
        row = []
        for r in range(world):
            src = (r - s) % world
            tasks = tuple(
                BlockTask(i, j, causal and i == j)
                for i in rank_chunks(r, world, layout)
                for j in rank_chunks(src, world, layout)
                if not causal or i >= j
            )
            row.append(RingStep(s, r, src, tasks))
        plan.append(row)
    return plan


def ring_balance(world: int, layout: str = "contiguous", causal: bool = False) -> dict:
    """Work per rank and step from :func:`ring_schedule`, in full-block units of one chunk.

    Every step ends when the slowest rank is done (the next K/V cannot be used before), so the
    ring takes ``sum over steps of max over ranks``; a perfect split would take total / W.
    Returns ``work`` (steps x ranks), ``critical_path``, ``ideal`` and ``imbalance`` (their
    ratio, 1.0 = perfectly balanced). Block units: a zigzag chunk is half a contiguous one.
    """
    plan = ring_schedule(world, layout, causal)
    work = [[st.work for st in row] for row in plan]
    critical = sum(max(row) for row in work)
    ideal = sum(map(sum, work)) / world
    return {"work": work, "critical_path": critical, "ideal": ideal, "imbalance": critical / ideal}


def ring_bytes(
    batch: int,
    kv_heads: int,
    n: int,
    head_dim: int,
    world: int,
    element_bytes: int = 2,
    backward: bool = False,
) -> int:
    """Bytes one rank sends (N divisible by W). Forward: W-1 K/V shards. ``backward=True``:
    the backward pass alone, W-1 K/V shards plus W dK/dV shards in float32 (4 bytes each)."""
    shard = 2 * batch * kv_heads * (n // world) * head_dim  # K and V elements
    if not backward:
        return (world - 1) * shard * element_bytes
    return (world - 1) * shard * element_bytes + world * shard * 4


def ring_step_times(
    shard_len: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    flops: float,
    link_bandwidth: float,
    element_bytes: int = 2,
    batch: int = 1,
) -> dict:
    """The overlap model of one forward ring step with a full (non-causal) block.

    compute = 4 B H L^2 d / flops (two matmuls of an L x L block), transfer = 2 B kv_heads L d bytes
    / link_bandwidth (the next K and V shards). With the transfer posted before the compute, the
    step takes max(compute, transfer): the transfer is hidden when compute >= transfer, that is
    when the shard holds at least :func:`ring_min_shard` tokens. Returns seconds and ``hidden``.
    """
    compute = 4.0 * batch * heads * shard_len**2 * head_dim / flops
    transfer = 2.0 * batch * kv_heads * shard_len * head_dim * element_bytes / link_bandwidth
    return {
        "compute_s": compute,
        "transfer_s": transfer,
        "step_s": max(compute, transfer),
        "hidden": compute >= transfer,
    }


def ring_min_shard(
    heads: int, kv_heads: int, flops: float, link_bandwidth: float, element_bytes: int = 2
) -> float:
    """Shard length L above which a step's compute hides its transfer:
    4 H L^2 d / F >= 2 kv_heads L d e / bw  <=>  L >= (kv_heads / H) e F / (2 bw). Independent of d and B;
    GQA (fewer K/V heads) lowers it."""
    return kv_heads / heads * element_bytes * flops / (2.0 * link_bandwidth)


def ring_memory_bytes(
    n: int, world: int, batch: int, heads: int, kv_heads: int, head_dim: int, element_bytes: int = 2
) -> dict:
    """What one rank holds during forward + backward, term by term (N divisible by W, L = N/W).

    Every term is O(L) = O(N / W): the inputs and dO, the saved O and logsumexp, the K/V shard
    being used and the one arriving, and the float32 dQ and travelling dK/dV (this one and the
    one arriving). ``world = 1`` gives the same tensors for the whole sequence on one GPU (plain
    ``flash_attention`` holds a little less: no buffer in flight, no float32 accumulators).
    """
    L = n // world
    q = batch * heads * L * head_dim  # elements of one (B, H, L, d) shard
    kv = batch * kv_heads * L * head_dim
    return {
        "q, k, v, dO shards": (2 * q + 2 * kv) * element_bytes,
        "saved O and logsumexp": q * element_bytes + batch * heads * L * 4,
        "K/V in use and arriving": 2 * 2 * kv * element_bytes,
        "fp32 dQ, dK/dV in use and arriving": q * 4 + 2 * 2 * kv * 4,
    }


def _local_calls(tasks, q_chunks, kv_chunks, bounds):
    """Turn one step's tasks into kernel calls on local slices: (q0, q1, k0, k1, causal).

    A rank's shard is its chunks concatenated in sequence order, so the diagonal step (K/V of
    the same chunks as Q) under a causal mask is one causal call over the whole shard (a query
    sees the earlier chunk entirely and its own chunk causally), and a full rectangle of
    off-diagonal pairs is one call. Anything else: one call per task.
    """
    if not tasks:
        return []

    def offsets(chunks):
        off, out = 0, {}
        for i in chunks:
            out[i] = (off, off + bounds[i][1] - bounds[i][0])
            off = out[i][1]
        return out, off

    qo, qn = offsets(q_chunks)
    ko, kn = offsets(kv_chunks)
    pairs = {(t.q_chunk, t.k_chunk): t.causal for t in tasks}
    if tuple(q_chunks) == tuple(kv_chunks):
        lower = {(i, j): i == j for i in q_chunks for j in q_chunks if i >= j}
        if pairs == lower:
            return [(0, qn, 0, kn, True)]
    qs = sorted({t.q_chunk for t in tasks}, key=q_chunks.index)
    ks = sorted({t.k_chunk for t in tasks}, key=kv_chunks.index)
    if not any(pairs.values()) and len(pairs) == len(qs) * len(ks):
        q_span = (qo[qs[0]][0], qo[qs[-1]][1])
        k_span = (ko[ks[0]][0], ko[ks[-1]][1])
        if q_span[1] - q_span[0] == sum(qo[i][1] - qo[i][0] for i in qs) and k_span[1] - k_span[
            0
        ] == sum(ko[j][1] - ko[j][0] for j in ks):
            return [(*q_span, *k_span, False)]
    return [(*qo[t.q_chunk], *ko[t.k_chunk], t.causal) for t in tasks]


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


# --------------------------------------------------------------------------- measurement


class _Clock:
    """Timestamps: CUDA events on a GPU (no host sync inside the ring), perf_counter on CPU.
    Disabled (``now()`` is None) when nobody asked for statistics."""

    def __init__(self, device, enabled=True):
        self.cuda = device.type == "cuda"
        self.enabled = enabled

    def now(self):
        if not self.enabled:
            return None
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def ms(self, a, b) -> float:
        if self.cuda:
            b.synchronize()
            return a.elapsed_time(b)
        return (b - a) * 1e3


@dataclass
class RingStats:
    """Filled by ``ring_attention(..., stats=RingStats())``: per step, the compute time, the
    whole step (compute, then waiting for the next K/V), and the bytes this rank sent/received.

    ``rows()`` resolves the timestamps (on a GPU it synchronises once, at the end).
    """

    marks: list = field(default_factory=list)  # (phase, step, pairs, clock, t0, t_compute, t_end)
    bytes_sent: dict = field(default_factory=lambda: {"fwd": 0, "bwd": 0})
    bytes_received: dict = field(default_factory=lambda: {"fwd": 0, "bwd": 0})

    def rows(self) -> list[dict]:
        return [
            {"phase": p, "step": s, "pairs": w, "compute_ms": c.ms(t0, t1), "step_ms": c.ms(t0, t2)}
            for p, s, w, c, t0, t1, t2 in self.marks
        ]


# --------------------------------------------------------------------------- the ring


_DTYPES = {torch.float16: 0, torch.bfloat16: 1, torch.float32: 2}
_FIELDS = (
    "q length",
    "k/v length",
    "batch",
    "query heads",
    "key/value heads",
    "head dim",
    "dtype",
    "causal",
    "layout",
    "scale",
    "inputs valid",
)


@dataclass
class _Ring:
    group: object
    rank: int
    world: int
    nxt: int  # global rank of the next rank in the ring
    prv: int
    lengths: list
    layout: str
    calls: list  # calls[s]: this rank's kernel calls at step s


def _setup(q, k, v, causal, scale, layout, group) -> tuple[_Ring, float]:
    """Validate locally, agree globally (one small all_gather), and build this rank's plan.

    A rank whose inputs are invalid still joins the all_gather, so every rank raises (no hang).
    """
    from . import flash

    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(
            "ring_attention needs an initialised torch.distributed process group "
            "(dist.init_process_group('nccl' on GPUs, 'gloo' on CPU))"
        )
    _check_layout(layout)
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    local_error = None
    try:
        scale = flash._check_inputs(q, k, v, causal, scale)
    except (TypeError, ValueError) as exc:
        local_error = exc
    # the device of the small agreement message: NCCL talks between GPUs, gloo on the CPU
    device = (
        torch.device("cuda", torch.cuda.current_device())
        if dist.get_backend(group) == "nccl"
        else torch.device("cpu")
    )
    if local_error is None:
        meta = [
            q.shape[2],
            k.shape[2],
            q.shape[0],
            q.shape[1],
            k.shape[1],
            q.shape[3],
            _DTYPES[q.dtype],
            float(causal),
            LAYOUTS.index(layout),
            scale,
            1.0,
        ]
    else:
        meta = [0.0] * (len(_FIELDS) - 1) + [0.0]
    mine = torch.tensor(meta, dtype=torch.float64, device=device)
    everyone = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(everyone, mine, group=group)
    table = torch.stack(everyone).cpu().tolist()  # (world, fields)
    if local_error is not None:
        raise local_error
    bad = [r for r in range(world) if table[r][-1] != 1.0]
    if bad:
        raise ValueError(
            f"ring_attention: the inputs of rank(s) {bad} are invalid (their error "
            "says why); every rank stops"
        )
    for f in range(2, len(_FIELDS) - 1):
        vals = [row[f] for row in table]
        if len(set(vals)) > 1:
            raise ValueError(
                f"ring_attention: every rank must pass the same {_FIELDS[f]}; got {vals} (by rank)"
            )
    lengths = [int(row[0]) for row in table]
    if any(int(row[1]) != int(row[0]) for row in table):
        raise ValueError(
            "ring_attention is self-attention over one sequence: each rank's q, k "
            f"and v shards must have the same length; got q {lengths}, k/v "
            f"{[int(row[1]) for row in table]}"
        )
    n = sum(lengths)
    expected = shard_lengths(n, world, layout)  # raises if the split leaves an empty chunk
    if lengths != expected:
        raise ValueError(
            f"ring_attention: shard lengths by rank {lengths} are not the {layout} "
            f"split of N = {n} over {world} ranks, which is {expected} (chunks of "
            f"ceil(N / {n_chunks(world, layout)}) tokens, the last one shorter); "
            "make shards with shard_sequence"
        )
    bounds = chunk_bounds(n, n_chunks(world, layout))
    plan = ring_schedule(world, layout, causal)
    mine_chunks = list(rank_chunks(rank, world, layout))
    calls = [
        _local_calls(
            plan[s][rank].tasks,
            mine_chunks,
            list(rank_chunks(plan[s][rank].kv_rank, world, layout)),
            bounds,
        )
        for s in range(world)
    ]
    ranks = dist.get_process_group_ranks(group) if group is not None else list(range(world))
    ring = _Ring(
        group,
        rank,
        world,
        ranks[(rank + 1) % world],
        ranks[(rank - 1) % world],
        lengths,
        layout,
        calls,
    )
    return ring, scale


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
    from . import flash

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
    from . import flash

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
    from ._triton_env import INTERPRET

    ring, scale = _setup(q, k, v, causal, scale, layout, group)
    if INTERPRET and q.dtype == torch.bfloat16:
        out = _RingAttention.apply(q.float(), k.float(), v.float(), causal, scale, ring, stats)
        return out.to(torch.bfloat16)
    return _RingAttention.apply(q, k, v, causal, scale, ring, stats)
