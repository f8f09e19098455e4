"""Cost models of the ring: bytes sent, the compute/transfer overlap of one step, the shard
length that hides the transfer, and what one rank holds in memory.

Chapter: "Beyond one GPU" (book/part2/beyond_one_gpu.ipynb). Formulas only (no torch); re-exported
from :mod:`course_kernels.distributed`.
"""

from __future__ import annotations

__all__ = ["ring_bytes", "ring_memory_bytes", "ring_min_shard", "ring_step_times"]


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
