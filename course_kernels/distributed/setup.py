"""Setting up the ring: validate this rank's inputs, agree with every rank on the shapes and
options (one small all_gather, so a bad input raises everywhere instead of hanging), and build
this rank's plan of kernel calls (:class:`_Ring`).

Chapter: "Beyond one GPU" (book/part2/beyond_one_gpu.ipynb). Private to
:mod:`course_kernels.distributed`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from .plan import (
    LAYOUTS,
    _check_layout,
    _local_calls,
    chunk_bounds,
    n_chunks,
    rank_chunks,
    ring_schedule,
    shard_lengths,
)


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
    from ..triton import flash

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
