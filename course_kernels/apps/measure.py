"""What the Applications chapter's GPU runs (:mod:`.runs`, :mod:`.paged_runs`) share: the CUDA
check, the least HBM bytes of a decode step, host time per call, and one call captured in a CUDA
graph."""

from __future__ import annotations

import time


def _require_cuda(what: str) -> None:
    from .._probe import cuda_available

    if not cuda_available():
        raise RuntimeError(f"{what} needs a CUDA GPU (it times kernels on one); torch sees none")


def decode_bytes(
    batch: int,
    kv_heads: int,
    n_keys: int,
    head_dim: int,
    q_heads: int,
    n_q: int = 1,
    elem_bytes: int = 2,
) -> int:
    """The least HBM traffic of one decode step: K and V read once, q read, out written."""
    cache = 2 * batch * kv_heads * n_keys * head_dim  # K and V
    return elem_bytes * (cache + 2 * batch * q_heads * n_q * head_dim)  # + q read, out written


def _host_us(fn, calls=50):
    """Host time per call: launches are queued without waiting for the GPU, so the loop's wall
    time over ``calls`` calls is the Python + launch cost (the queue does not fill)."""
    import torch

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / calls * 1e6


def _graphed(fn):
    """Capture one call in a CUDA graph; replaying it launches every kernel of the step with one
    host call, which is how serving engines run decode steps. The capture fails if ``fn``
    synchronizes with the host."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay
