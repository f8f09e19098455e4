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
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ._validate import check_positive_int

KIB = 1024
# Architecture constants of every GPU in the table (CUDA C++ Programming Guide, compute capability
# table and "Shared Memory" section, cc 5.0 to 9.0).
WARP_SIZE = 32  # threads per warp
SMEM_BANKS = 32  # shared-memory banks
SMEM_BANK_BYTES = 4  # bytes per bank word
REGISTERS_PER_SM = 65536  # 32-bit registers per SM
MAX_REGISTERS_PER_THREAD = 255
CUDA_GUIDE = (
    "NVIDIA CUDA C++ Programming Guide, 'Features and Technical Specifications' "
    "(compute capability table): https://docs.nvidia.com/cuda/cuda-c-programming-guide/"
)


@dataclass(frozen=True)
class GPU:
    """One GPU's memory hierarchy and tensor rates. Units are in the field names."""

    name: str
    compute_capability: str
    sms: int
    smem_per_sm_kib: int  # shared memory per SM (the configurable L1/shared carve-out maximum)
    smem_per_block_kib: int  # most shared memory one thread block can get (opt-in)
    smem_per_block_default_kib: int  # without the opt-in attribute
    l2_mb: float  # as the datasheet or whitepaper states it
    memory_gb: float
    memory_type: str
    bandwidth_gbs: float  # HBM / GDDR bandwidth, 10^9 bytes per second
    fp16_tensor_tflops: float  # dense
    bf16_tensor_tflops: float | None  # None: no bf16 tensor cores
    boost_clock_mhz: float
    sources: dict = field(default_factory=dict)
    fp32_tflops: float | None = None  # non-tensor (CUDA core) FP32, dense: the non-matmul rate

    def matmul_to_nonmatmul(self) -> float:
        """How many fp16 tensor-core FLOPs one non-matmul FP32 FLOP costs (FA2 paper Sec. 3.1)."""
        if self.fp32_tflops is None:
            raise ValueError(f"no FP32 (non-tensor) rate recorded for {self.name}")
        return self.fp16_tensor_tflops / self.fp32_tflops

    @property
    def bandwidth(self) -> float:
        """Bytes per second."""
        return self.bandwidth_gbs * 1e9

    @property
    def fp16_flops(self) -> float:
        """Dense fp16 tensor-core FLOP/s."""
        return self.fp16_tensor_tflops * 1e12

    def sram_elements(self, bytes_per_element: int = 2, per: str = "block") -> int:
        """M: how many elements fit in the shared memory of one block (or one SM)."""
        kib = {"block": self.smem_per_block_kib, "sm": self.smem_per_sm_kib}.get(per)
        if kib is None:
            raise ValueError(f"per must be 'block' or 'sm'; got {per!r}")
        return kib * KIB // check_positive_int(bytes_per_element, "bytes_per_element")

    def shared_memory_bandwidth(self, bytes_per_clock_per_sm: int = 128) -> float:
        """Aggregate shared-memory bandwidth of the whole chip, bytes/s: SMs x 128 B/clk x clock.

        This is the estimate behind the "~19 TB/s SRAM" figure quoted for the A100: it is for
        all SMs together, not per SM.
        """
        return self.sms * bytes_per_clock_per_sm * self.boost_clock_mhz * 1e6


GPUS: dict[str, GPU] = {
    "T4": GPU(
        name="NVIDIA T4 (Colab free tier)",
        compute_capability="7.5",
        sms=40,
        smem_per_sm_kib=64,
        smem_per_block_kib=64,
        smem_per_block_default_kib=48,
        l2_mb=4,
        memory_gb=16,
        memory_type="GDDR6",
        bandwidth_gbs=320,
        fp16_tensor_tflops=65,
        bf16_tensor_tflops=None,
        boost_clock_mhz=1590,
        fp32_tflops=8.1,
        sources={
            "datasheet": "NVIDIA T4 Tensor Core GPU datasheet: 320 GB/s, 16 GB GDDR6, "
            "65 TFLOPS mixed precision (FP16/FP32), 40 Turing SMs",
            "shared memory": CUDA_GUIDE + " (cc 7.5: 64 KB per SM, 64 KB per block opt-in)",
            "L2": "NVIDIA Turing architecture whitepaper (TU104: 4 MB L2)",
        },
    ),
    "A100-40GB": GPU(
        name="NVIDIA A100 SXM 40 GB",
        compute_capability="8.0",
        sms=108,
        smem_per_sm_kib=164,
        smem_per_block_kib=163,
        smem_per_block_default_kib=48,
        l2_mb=40,
        memory_gb=40,
        memory_type="HBM2",
        bandwidth_gbs=1555,
        fp16_tensor_tflops=312,
        bf16_tensor_tflops=312,
        boost_clock_mhz=1410,
        fp32_tflops=19.5,
        sources={
            "datasheet": "NVIDIA A100 Tensor Core GPU datasheet: 1,555 GB/s (40 GB), "
            "312 TFLOPS FP16/BF16 dense",
            "shared memory": CUDA_GUIDE + " (cc 8.0: 164 KB per SM, 163 KB per block)",
            "L2 and clock": "NVIDIA A100 Tensor Core GPU architecture whitepaper "
            "(40 MB L2, 108 SMs, 1410 MHz boost)",
        },
    ),
    "A100-80GB": GPU(
        name="NVIDIA A100 SXM 80 GB",
        compute_capability="8.0",
        sms=108,
        smem_per_sm_kib=164,
        smem_per_block_kib=163,
        smem_per_block_default_kib=48,
        l2_mb=40,
        memory_gb=80,
        memory_type="HBM2e",
        bandwidth_gbs=2039,
        fp16_tensor_tflops=312,
        bf16_tensor_tflops=312,
        boost_clock_mhz=1410,
        fp32_tflops=19.5,
        sources={
            "datasheet": "NVIDIA A100 Tensor Core GPU datasheet: 2,039 GB/s (80 GB SXM; "
            "1,935 GB/s PCIe), 312 TFLOPS FP16/BF16 dense",
            "shared memory": CUDA_GUIDE + " (cc 8.0: 164 KB per SM, 163 KB per block)",
            "L2 and clock": "NVIDIA A100 Tensor Core GPU architecture whitepaper",
        },
    ),
    "H100-SXM": GPU(
        name="NVIDIA H100 SXM 80 GB",
        compute_capability="9.0",
        sms=132,
        smem_per_sm_kib=228,
        smem_per_block_kib=227,
        smem_per_block_default_kib=48,
        l2_mb=50,
        memory_gb=80,
        memory_type="HBM3",
        bandwidth_gbs=3350,
        fp16_tensor_tflops=989,
        bf16_tensor_tflops=989,
        boost_clock_mhz=1980,
        fp32_tflops=67,
        sources={
            "datasheet": "NVIDIA H100 Tensor Core GPU datasheet (SXM): 3.35 TB/s, "
            "1,979 TFLOPS FP16/BF16 with sparsity = ~989 dense",
            "shared memory": CUDA_GUIDE + " (cc 9.0: 228 KB per SM, 227 KB per block)",
            "L2": "NVIDIA H100 Tensor Core GPU architecture whitepaper (50 MB L2, 132 SMs on SXM5)",
        },
    ),
    "H200-SXM": GPU(
        name="NVIDIA H200 SXM 141 GB",
        compute_capability="9.0",
        sms=132,
        smem_per_sm_kib=228,
        smem_per_block_kib=227,
        smem_per_block_default_kib=48,
        l2_mb=50,
        memory_gb=141,
        memory_type="HBM3e",
        bandwidth_gbs=4800,
        fp16_tensor_tflops=989,
        bf16_tensor_tflops=989,
        boost_clock_mhz=1980,
        fp32_tflops=67,
        sources={
            "datasheet": "NVIDIA H200 Tensor Core GPU datasheet (SXM): 141 GB HBM3e, 4.8 TB/s, "
            "1,979 TFLOPS FP16/BF16 with sparsity = ~989 dense",
            "shared memory": CUDA_GUIDE + " (cc 9.0: 228 KB per SM, 227 KB per block)",
            "L2": "Hopper whitepaper: 50 MB (the driver of the measured H200 reports 60 MiB)",
        },
    ),
}


@dataclass(frozen=True)
class MeasuredCeilings:
    """What one GPU actually reached in a microbenchmark (the roofline's two ceilings)."""

    gpu: str
    copy_bandwidth: float  # bytes/s, device-to-device copy, bytes read + written
    fp16_matmul_flops: float  # FLOP/s, fp16 8192 x 8192 x 8192 matmul
    date: str
    software: str
    source: str
    matmul_n: int = 8192  # the matmul's size: (n x n) @ (n x n)


# H200_MEASURED is read from the committed measurement at the end of this module.


@dataclass(frozen=True)
class PaperMeasurement:
    """The FlashAttention paper's Fig. 2 (left): GPT-2 medium on an A100, forward + backward."""

    hbm_gb_standard: float
    hbm_gb_flash: float
    runtime_ms_standard: float
    runtime_ms_flash: float
    gflops_standard: float
    gflops_flash: float
    source: str

    @property
    def traffic_reduction(self) -> float:
        return self.hbm_gb_standard / self.hbm_gb_flash

    @property
    def speedup(self) -> float:
        return self.runtime_ms_standard / self.runtime_ms_flash

    @property
    def extra_flops(self) -> float:
        """Relative FLOP increase of FlashAttention (the backward recomputes S and P)."""
        return self.gflops_flash / self.gflops_standard - 1


FA_PAPER_FIG2 = PaperMeasurement(
    hbm_gb_standard=40.3,
    hbm_gb_flash=4.4,
    runtime_ms_standard=41.7,
    runtime_ms_flash=7.3,
    gflops_standard=66.6,
    gflops_flash=75.2,
    source="Dao et al. 2022, FlashAttention (arXiv 2205.14135), Fig. 2 left: GPT-2 medium "
    "(seq. length 1024, head dim 64, 16 heads, batch size 64) on an A100",
)


@dataclass(frozen=True)
class Link:
    """A link between GPUs, as the vendor states it, and per direction (what one ring send gets).

    Vendors quote NVLink and PCIe as the sum of both directions; a ring step sends one way to the
    next GPU while receiving from the previous one, so the model uses half.
    """

    name: str
    bidirectional_gbs: float  # 10^9 bytes/s, both directions together, as quoted
    source: str

    @property
    def per_direction(self) -> float:
        """Bytes per second one way."""
        return self.bidirectional_gbs / 2 * 1e9


# Chapter "Beyond one GPU" (book/part2/beyond_one_gpu.ipynb): what a ring step's transfer costs.
LINKS: dict[str, Link] = {
    "NVLink 4 (H200 SXM)": Link(
        "NVLink 4, one H200 SXM to the NVSwitch fabric (18 links)",
        900,
        "NVIDIA H200 Tensor Core GPU datasheet: 'NVIDIA NVLink: 900GB/s' (SXM), "
        "'PCIe Gen5: 128GB/s'",
    ),
    "PCIe Gen5 x16": Link(
        "PCIe Gen5 x16",
        128,
        "NVIDIA H200 Tensor Core GPU datasheet: 'PCIe Gen5: 128GB/s' (both directions; 32 GT/s "
        "x 16 lanes, PCI-SIG PCIe 5.0 specification)",
    ),
    "InfiniBand NDR (one 400 Gb/s NIC per GPU)": Link(
        "InfiniBand NDR, one ConnectX-7 400 Gb/s port per GPU (between hosts)",
        100,
        "NVIDIA ConnectX-7 datasheet: 400 Gb/s per port = 50 GB/s each way (HGX H200 systems "
        "pair each GPU with one such NIC)",
    ),
}


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

    from .datafiles import data_path

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


# -- measuring the roofline's two ceilings (scripts/measure_ceilings.py) ----------------------
def _median_seconds(fn, repeats: int = 20, warmup: int = 3) -> float:
    """Median wall time of ``fn()`` in seconds (CPU fallback of ``triton.testing.do_bench``)."""
    import statistics
    import time

    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure_ceilings(
    device: str = "cuda", matmul_n: int = 8192, copy_bytes: int = 2**30, timer=None
) -> dict:
    """Measure the two roofline ceilings of one device, the way ``H200_MEASURED`` was measured.

    - copy bandwidth: ``b.copy_(a)`` of ``copy_bytes`` fp16 bytes, counted as bytes read plus
      bytes written (2 x copy_bytes) over the median time;
    - fp16 matmul: ``x @ y`` of two ``matmul_n`` x ``matmul_n`` fp16 matrices, 2 n^3 FLOPs over
      the median time.

    ``timer(fn) -> seconds``: by default ``triton.testing.do_bench`` (median, milliseconds
    converted) on CUDA and a median of wall times elsewhere (CPU: for testing the arithmetic
    only; a CPU has no fp16 tensor cores). Returns a dict with both ceilings in bytes/s and
    FLOP/s, the sizes, and the method, ready to be written to JSON next to the environment.
    """
    import torch

    matmul_n = check_positive_int(matmul_n, "matmul_n")
    copy_bytes = check_positive_int(copy_bytes, "copy_bytes")
    if copy_bytes % 2:
        raise ValueError(f"copy_bytes must be even (fp16 elements); got {copy_bytes}")
    if timer is None:
        if device.startswith("cuda"):
            import triton.testing

            def timer(fn):
                return triton.testing.do_bench(fn, return_mode="median") / 1e3
        else:
            timer = _median_seconds
    a = torch.ones(copy_bytes // 2, dtype=torch.float16, device=device)
    b = torch.empty_like(a)
    t_copy = timer(lambda: b.copy_(a))
    x = torch.randn(matmul_n, matmul_n, device=device).to(torch.float16)
    y = torch.randn(matmul_n, matmul_n, device=device).to(torch.float16)
    t_mm = timer(lambda: x @ y)
    if not (t_copy > 0 and t_mm > 0):
        raise RuntimeError(f"the timer returned non-positive times ({t_copy}, {t_mm}) s")
    return {
        "copy_bandwidth": 2 * copy_bytes / t_copy,
        "fp16_matmul_flops": 2 * matmul_n**3 / t_mm,
        "copy_bytes": copy_bytes,
        "matmul_n": matmul_n,
        "copy_seconds": t_copy,
        "matmul_seconds": t_mm,
        "method": "median time; copy counted as bytes read + written; matmul 2 n^3 FLOPs",
    }


def ceilings_from_record(record: dict, gpu: str | None = None) -> MeasuredCeilings:
    """A :class:`MeasuredCeilings` from a JSON record written by scripts/measure_ceilings.py.

    ``gpu``: the :data:`GPUS` key of the measured GPU (the record holds the driver's name).
    """
    try:
        env, res = record["environment"], record["ceilings"]
        return MeasuredCeilings(
            gpu=gpu or env["gpu"],
            copy_bandwidth=float(res["copy_bandwidth"]),
            fp16_matmul_flops=float(res["fp16_matmul_flops"]),
            date=env["date"],
            software=f"torch {env['torch']}, Triton {env['triton']}",
            source=f"measured with: {env['command']}",
            matmul_n=int(res["matmul_n"]),
        )
    except (KeyError, TypeError) as e:
        raise ValueError(
            "a ceilings record needs 'environment' (gpu, date, torch, triton, command) and "
            f"'ceilings' (copy_bandwidth, fp16_matmul_flops, matmul_n); missing {e}"
        ) from None


def _h200_measured() -> MeasuredCeilings:
    from .datafiles import load_json

    return ceilings_from_record(load_json("hardware/h200_ceilings.json"), gpu="H200-SXM")


# The roofline's ceilings on the course's H200: scripts/measure_ceilings.py, committed as
# course_kernels/data/hardware/h200_ceilings.json (GPU, versions, date and command inside). A
# repeat on the same machine minutes later (h200_ceilings_run2.json) gave the same copy bandwidth
# and a 4% lower matmul rate: the matmul ceiling is good to a few percent.
H200_MEASURED = _h200_measured()
