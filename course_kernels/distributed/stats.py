"""Timing of the ring: per-step compute and step times, bytes sent and received.

Chapter: "Beyond one GPU" (book/part2/beyond_one_gpu.ipynb). :class:`RingStats` is re-exported
from :mod:`course_kernels.distributed`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

__all__ = ["RingStats"]


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
