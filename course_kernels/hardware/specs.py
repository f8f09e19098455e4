"""The GPU data tables the book computes with, each number with its source: :data:`GPUS`
(datasheet and programming-guide values), the architecture constants, :data:`LINKS` (GPU-to-GPU
links), :data:`FA_PAPER_FIG2` (the FlashAttention paper's measurement) and the
:class:`MeasuredCeilings` record type.

Chapter: "The GPU memory hierarchy" (book/chapters/01_memory_hierarchy.ipynb). Every public name is re-exported
from :mod:`course_kernels.hardware`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .._validate import check_positive_int

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
    fp16_matmul_flops: float  # FLOP/s, the matmul ceiling: the best 16-bit dense matmul measured
    date: str
    software: str
    source: str
    matmul_n: int = 8192  # the size of the matmul that set the ceiling: (n x n) @ (n x n)
    matmul_method: str = ""  # how the ceiling was measured (shapes, repeats, statistic, clocks)


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
