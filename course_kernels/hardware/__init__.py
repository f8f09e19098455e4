"""GPU numbers the book computes with, each with its source, and the helpers that use them.

Chapter: "The GPU memory hierarchy" (book/chapters/01_memory_hierarchy.ipynb).

Two kinds of numbers live here and are never mixed up:

- :data:`GPUS`: datasheet and programming-guide values (leads, not promises). Dense tensor
  rates (no 2:4 sparsity). Shared memory is in KiB as NVIDIA writes "KB" in the CUDA C++
  Programming Guide's compute capability table (164 KB = 164 * 1024 bytes).
- :data:`H200_MEASURED`: ceilings measured on one H200 by ``scripts/measure_ceilings.py`` (a
  device-to-device copy and an fp16 8192^3 matmul), read from the committed record. Rooflines use these, because a datasheet peak is rarely reached.

Helpers: the transfer time T = D / B, the SRAM budget M in elements, the article's traffic
ratio M / (2 d^2), a roofline, and the time standard attention spends moving S and P.

Modules: :mod:`.specs` (the data tables), :mod:`.ceilings` (measuring the ceilings); this
module holds the helpers, and every public name of those is importable from here.
"""

from __future__ import annotations

from .._validate import check_positive_int
from .ceilings import H200_MEASURED, ceilings_from_record, measure_ceilings
from .specs import (
    CUDA_GUIDE,
    FA_PAPER_FIG2,
    GPU,
    GPUS,
    KIB,
    LINKS,
    Link,
    MAX_REGISTERS_PER_THREAD,
    MeasuredCeilings,
    PaperMeasurement,
    REGISTERS_PER_SM,
    SMEM_BANKS,
    SMEM_BANK_BYTES,
    WARP_SIZE,
)

__all__ = [
    "CUDA_GUIDE",
    "FA_PAPER_FIG2",
    "GPU",
    "GPUS",
    "H200_MEASURED",
    "KIB",
    "LINKS",
    "Link",
    "MAX_REGISTERS_PER_THREAD",
    "MeasuredCeilings",
    "PaperMeasurement",
    "REGISTERS_PER_SM",
    "SMEM_BANKS",
    "SMEM_BANK_BYTES",
    "WARP_SIZE",
    "attention_flops",
    "bank_conflict_degree",
    "ceilings_from_record",
    "load_measurements",
    "measure_ceilings",
    "ridge_point",
    "roofline",
    "standard_attention_bytes",
    "traffic_ratio",
    "transfer_time",
]


# -- helpers ---------------------------------------------------------------------------------
def transfer_time(data_bytes: float, bandwidth: float) -> float:
    """T = D / B: seconds to move ``data_bytes`` at ``bandwidth`` bytes/s."""
    if not data_bytes >= 0:
        raise ValueError(f"data_bytes must be >= 0; got {data_bytes}")
    if not bandwidth > 0:
        raise ValueError(f"bandwidth must be > 0 bytes/s; got {bandwidth}")
    return data_bytes / bandwidth


def traffic_ratio(sram_elements: int, head_dim: int) -> float:
    """The article's M / (2 d^2): standard attention's ~4N^2 over FA2's ~8N^2 d^2 / M.

    A ratio of HBM traffic in the two-level model, not a speedup.
    """
    m = check_positive_int(sram_elements, "sram_elements")
    d = check_positive_int(head_dim, "head_dim")
    return m / (2 * d * d)


def roofline(intensity, peak_flops: float, bandwidth: float):
    """Attainable FLOP/s at arithmetic ``intensity`` (FLOP per byte): min(peak, I * B)."""
    import numpy as np

    return np.minimum(peak_flops, np.asarray(intensity, dtype=float) * bandwidth)


def ridge_point(peak_flops: float, bandwidth: float) -> float:
    """The intensity (FLOP/byte) where a kernel stops being memory-bound: peak / bandwidth."""
    return peak_flops / bandwidth


def attention_flops(N: int, d: int, causal: bool = False, backward: bool = False) -> float:
    """FLOPs of one head's attention: 4 N^2 d (two matmuls), halved if causal, x2.5 backward.

    The convention of the FlashAttention papers and Triton's fused-attention tutorial.
    """
    flops = 4.0 * N * N * d
    if causal:
        flops /= 2
    if backward:
        flops *= 2.5
    return flops


def standard_attention_bytes(N: int, d: int, bytes_per_element: int = 2, scale_pass: bool = False):
    """HBM bytes of textbook standard attention for one head: (4N^2 + 4Nd) elements.

    ``scale_pass=True`` adds PyTorch's separate read+write of S for the 1/sqrt(d) scale (6N^2).
    """
    n_sq = (6 if scale_pass else 4) * N * N
    return (n_sq + 4 * N * d) * bytes_per_element


def load_measurements(name: str) -> list[dict]:
    """Rows of a committed measurement CSV (``#`` lines are provenance comments) as dicts.

    ``name`` is the file inside the package's measured data (:mod:`course_kernels.datafiles`),
    e.g. ``"anchors/h200_sdpa_2026-11-29.csv"``; the older spelling with a leading ``"data/"``
    is accepted too. Numbers become floats, empty cells None. The files travel with the package
    (a wheel, Colab), so this never needs the repository or the network.
    """
    import csv
    import io

    from ..datafiles import data_path

    if isinstance(name, str) and name.startswith("data/"):
        name = name[len("data/") :]
    text = data_path(name).read_text(encoding="utf-8")
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    rows = []
    for row in csv.DictReader(io.StringIO("\n".join(lines))):
        parsed = {}
        for key, value in row.items():
            try:
                parsed[key] = float(value) if value != "" else None
            except ValueError:
                parsed[key] = value
        rows.append(parsed)
    return rows


def bank_conflict_degree(
    byte_addresses, banks: int = SMEM_BANKS, bank_bytes: int = SMEM_BANK_BYTES
) -> int:
    """How many serialised shared-memory transactions one warp-wide access needs (1 = no conflict).

    Shared memory is split into ``banks`` banks of ``bank_bytes``-byte words; word ``w`` lives in
    bank ``w % banks`` (CUDA C++ Programming Guide, "Shared Memory", compute capability 5.x and
    later: 32 banks of 4 bytes). Threads that read the *same* word are served by one broadcast;
    distinct words in the same bank are served one after another. Returns the largest number of
    distinct words any bank must deliver. A simplified model: 8- and 16-byte accesses are split
    into phases by the hardware, which this function does not model.
    """
    banks = check_positive_int(banks, "banks")
    bank_bytes = check_positive_int(bank_bytes, "bank_bytes")
    words_per_bank: dict[int, set] = {}
    count = 0
    for a in byte_addresses:
        if isinstance(a, bool) or int(a) != a or a < 0:
            raise ValueError(f"byte addresses must be integers >= 0; got {a!r}")
        word = int(a) // bank_bytes
        words_per_bank.setdefault(word % banks, set()).add(word)
        count += 1
    if count == 0:
        raise ValueError("byte_addresses is empty: give the address each thread of the warp reads")
    return max(len(w) for w in words_per_bank.values())
