"""The ring's plan: how the sequence is cut over ranks (layouts, shards) and what each rank
computes at each step (:func:`ring_schedule`, :func:`ring_balance`).

Chapter: "Beyond one GPU" (book/part2/beyond_one_gpu.ipynb). Pure bookkeeping, no communication
except :func:`gather_sequence` (one all_gather); :mod:`course_kernels.distributed` runs the plan.
Public names are re-exported from :mod:`course_kernels.distributed`. Layout: (batch, heads, seq,
head_dim).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

LAYOUTS = ("contiguous", "zigzag")

__all__ = [
    "LAYOUTS",
    "BlockTask",
    "RingStep",
    "chunk_bounds",
    "gather_sequence",
    "n_chunks",
    "rank_chunks",
    "ring_balance",
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
    if isinstance(chunks, bool) or not isinstance(chunks, int) or chunks < 1:
        raise ValueError(f"chunks must be a positive int; got {chunks!r}")
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
