"""course_kernels.hardware: the table against its sources, and the helpers.

Each value is checked against the number in the cited source (NVIDIA datasheets and the CUDA C++
Programming Guide's compute capability table), so a typo in the table fails here.
"""

import math

import numpy as np
import pytest

from course_kernels import hardware as hw

# (gpu, field, value from the source)
SOURCE_VALUES = [
    ("T4", "compute_capability", "7.5"),
    ("T4", "sms", 40),
    ("T4", "smem_per_sm_kib", 64),
    ("T4", "smem_per_block_kib", 64),
    ("T4", "smem_per_block_default_kib", 48),
    ("T4", "bandwidth_gbs", 320),
    ("T4", "memory_gb", 16),
    ("T4", "fp16_tensor_tflops", 65),
    ("T4", "bf16_tensor_tflops", None),
    ("T4", "l2_mb", 4),
    ("A100-40GB", "bandwidth_gbs", 1555),
    ("A100-80GB", "bandwidth_gbs", 2039),
    ("A100-80GB", "smem_per_sm_kib", 164),
    ("A100-80GB", "smem_per_block_kib", 163),
    ("A100-80GB", "sms", 108),
    ("A100-80GB", "fp16_tensor_tflops", 312),
    ("A100-80GB", "l2_mb", 40),
    ("A100-80GB", "boost_clock_mhz", 1410),
    ("A100-80GB", "compute_capability", "8.0"),
    ("H100-SXM", "bandwidth_gbs", 3350),
    ("H100-SXM", "smem_per_sm_kib", 228),
    ("H100-SXM", "smem_per_block_kib", 227),
    ("H100-SXM", "sms", 132),
    ("H100-SXM", "l2_mb", 50),
    ("H100-SXM", "fp16_tensor_tflops", 989),
    ("H100-SXM", "compute_capability", "9.0"),
    ("H200-SXM", "bandwidth_gbs", 4800),
    ("H200-SXM", "memory_gb", 141),
    ("H200-SXM", "sms", 132),
    ("H200-SXM", "smem_per_block_kib", 227),
    ("H200-SXM", "fp16_tensor_tflops", 989),
    ("T4", "fp32_tflops", 8.1),
    ("A100-80GB", "fp32_tflops", 19.5),
    ("H100-SXM", "fp32_tflops", 67),
    ("H200-SXM", "fp32_tflops", 67),
    ("T4", "memory_type", "GDDR6"),
    ("T4", "boost_clock_mhz", 1590),
    ("A100-40GB", "compute_capability", "8.0"),
    ("A100-40GB", "sms", 108),
    ("A100-40GB", "smem_per_sm_kib", 164),
    ("A100-40GB", "smem_per_block_kib", 163),
    ("A100-40GB", "smem_per_block_default_kib", 48),
    ("A100-40GB", "l2_mb", 40),
    ("A100-40GB", "memory_gb", 40),
    ("A100-40GB", "memory_type", "HBM2"),
    ("A100-40GB", "fp16_tensor_tflops", 312),
    ("A100-40GB", "bf16_tensor_tflops", 312),
    ("A100-40GB", "boost_clock_mhz", 1410),
    ("A100-40GB", "fp32_tflops", 19.5),
    ("A100-80GB", "smem_per_block_default_kib", 48),
    ("A100-80GB", "memory_gb", 80),
    ("A100-80GB", "memory_type", "HBM2e"),
    ("A100-80GB", "bf16_tensor_tflops", 312),
    ("H100-SXM", "smem_per_block_default_kib", 48),
    ("H100-SXM", "memory_gb", 80),
    ("H100-SXM", "memory_type", "HBM3"),
    ("H100-SXM", "bf16_tensor_tflops", 989),
    ("H100-SXM", "boost_clock_mhz", 1980),
    ("H200-SXM", "compute_capability", "9.0"),
    ("H200-SXM", "smem_per_sm_kib", 228),
    ("H200-SXM", "smem_per_block_default_kib", 48),
    ("H200-SXM", "l2_mb", 50),
    ("H200-SXM", "memory_type", "HBM3e"),
    ("H200-SXM", "bf16_tensor_tflops", 989),
    ("H200-SXM", "boost_clock_mhz", 1980),
]


@pytest.mark.parametrize("gpu,field,value", SOURCE_VALUES)
def test_hardware_table_matches_sources(gpu, field, value):
    assert getattr(hw.GPUS[gpu], field) == value


def test_hardware_every_table_value_is_checked_against_a_source():
    """SOURCE_VALUES covers every number of every GPU, so a typo anywhere in the table fails."""
    import dataclasses

    checked = {(gpu, field) for gpu, field, _ in SOURCE_VALUES}
    for key, g in hw.GPUS.items():
        for f in dataclasses.fields(g):
            if f.name not in ("name", "sources"):
                assert (key, f.name) in checked, (key, f.name)


def test_hardware_every_gpu_cites_sources():
    for key, g in hw.GPUS.items():
        assert g.sources, key
        assert any("datasheet" in s.lower() for s in g.sources.values()), key
        assert any("Programming Guide" in s for s in g.sources.values()), key


def test_hardware_measured_h200_ceilings():
    from course_kernels.datafiles import load_json

    m = hw.H200_MEASURED
    record = load_json("hardware/h200_ceilings.json")  # scripts/measure_ceilings.py on the H200
    assert m.copy_bandwidth == record["ceilings"]["copy_bandwidth"]
    assert m.fp16_matmul_flops == record["ceilings"]["fp16_matmul_flops"]
    assert m.date == record["environment"]["date"] and "H200" in record["environment"]["gpu"]
    assert "measure_ceilings.py" in m.source
    # measured ceilings are below the datasheet peaks
    assert m.copy_bandwidth < hw.GPUS[m.gpu].bandwidth
    assert m.fp16_matmul_flops < hw.GPUS[m.gpu].fp16_flops


def test_hardware_sram_elements_a100_is_163_kib_of_fp16():
    a100 = hw.GPUS["A100-80GB"]
    assert a100.sram_elements() == 163 * 1024 // 2 == 83456
    assert a100.sram_elements(per="sm") == 164 * 1024 // 2
    assert a100.sram_elements(bytes_per_element=4) == 163 * 1024 // 4
    with pytest.raises(ValueError, match="per"):
        a100.sram_elements(per="chip")
    with pytest.raises(ValueError, match="bytes_per_element"):
        a100.sram_elements(bytes_per_element=0)


def test_hardware_traffic_ratio_values_from_facts():
    a100 = hw.GPUS["A100-80GB"]
    assert hw.traffic_ratio(a100.sram_elements(), 64) == pytest.approx(10.19, abs=0.01)
    assert hw.traffic_ratio(a100.sram_elements(), 128) == pytest.approx(2.55, abs=0.01)
    assert hw.traffic_ratio(hw.GPUS["T4"].sram_elements(), 128) == pytest.approx(1.0)
    assert hw.traffic_ratio(100_000, 100) == 5.0  # the article's Q10
    with pytest.raises(ValueError, match="head_dim"):
        hw.traffic_ratio(1000, 0)


def test_hardware_chip_shared_memory_bandwidth_is_the_19_tbs_estimate():
    a100 = hw.GPUS["A100-80GB"]
    assert a100.shared_memory_bandwidth() / 1e12 == pytest.approx(19.49, abs=0.01)
    assert a100.shared_memory_bandwidth() / a100.sms / 1e12 < 0.2  # per SM: far below 19 TB/s


def test_hardware_transfer_time_is_d_over_b():
    assert hw.transfer_time(2e12, 2e12) == 1.0
    assert hw.transfer_time(0, 1.0) == 0.0
    # one fp16 8192 x 8192 matrix on an A100 80 GB: ~66 us (FACTS: "not milliseconds")
    t = hw.transfer_time(8192**2 * 2, hw.GPUS["A100-80GB"].bandwidth)
    assert t * 1e6 == pytest.approx(65.8, abs=0.1)
    for bad in (0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="bandwidth"):
            hw.transfer_time(1.0, bad)
    with pytest.raises(ValueError, match="data_bytes"):
        hw.transfer_time(-1, 1.0)


def test_hardware_roofline_and_ridge():
    peak, bw = 758e12, 4.22e12
    ridge = hw.ridge_point(peak, bw)
    assert ridge == pytest.approx(179.6, abs=0.1)
    got = hw.roofline(np.array([1.0, ridge, 10 * ridge]), peak, bw)
    assert got[0] == pytest.approx(bw) and got[1] == pytest.approx(peak) and got[2] == peak


def test_hardware_attention_flops_and_bytes():
    assert hw.attention_flops(1024, 64) == 4 * 1024**2 * 64
    assert hw.attention_flops(1024, 64, causal=True) == 2 * 1024**2 * 64
    assert hw.attention_flops(1024, 64, backward=True) == 2.5 * 4 * 1024**2 * 64
    assert hw.standard_attention_bytes(1024, 64) == (4 * 1024**2 + 4 * 1024 * 64) * 2
    assert (
        hw.standard_attention_bytes(1024, 64, scale_pass=True) == (6 * 1024**2 + 4 * 1024 * 64) * 2
    )


def test_hardware_load_measurements_matches_anchors():
    rows = hw.load_measurements("anchors/h200_sdpa_2026-11-29.csv")
    assert len(rows) == 24
    row = next(
        r
        for r in rows
        if r["d"] == 128 and r["N"] == 16384 and r["causal"] == "no" and r["mode"] == "fwd"
    )
    assert (row["sdpa_cudnn"], row["sdpa_flash"], row["tutorial"]) == (598, 350, 542)
    assert row["naive"] is None  # not run at that size
    traffic = hw.load_measurements("data/anchors/h200_dram_traffic_2026-11-29.csv")  # old spelling
    assert traffic == hw.load_measurements("anchors/h200_dram_traffic_2026-11-29.csv")
    for r in traffic:  # the model column is (4N^2 + 4Nd) x 2 bytes x 4 heads, in MB
        assert r["model_mb"] == pytest.approx(
            hw.standard_attention_bytes(int(r["N"]), 64) * 4 / 1e6, rel=0.01
        )
        assert r["qkvo_once_mb"] == pytest.approx(4 * r["N"] * 64 * 2 * 4 / 1e6, rel=0.02)


def test_hardware_load_measurements_missing_file_says_where(monkeypatch):
    monkeypatch.delenv("COURSE_REPO_URL", raising=False)  # package data: no repository, no network
    with pytest.raises(
        FileNotFoundError, match=r"no_such_file.csv.*package's data folder.*anchors/h200"
    ):
        hw.load_measurements("anchors/no_such_file.csv")


def test_hardware_h100_is_not_double_the_a100():  # erratum E14
    ratio = hw.GPUS["H100-SXM"].bandwidth / hw.GPUS["A100-80GB"].bandwidth
    assert math.isclose(ratio, 1.64, abs_tol=0.01)


def test_hardware_matmul_to_nonmatmul_is_the_fa2_papers_16x_on_the_a100():
    # FA2 paper Sec. 3.1: 312 TFLOP/s fp16 matmul vs 19.5 TFLOP/s non-matmul fp32 = 16x.
    assert hw.GPUS["A100-80GB"].matmul_to_nonmatmul() == pytest.approx(16.0)
    assert hw.GPUS["H100-SXM"].matmul_to_nonmatmul() == pytest.approx(989 / 67)
    no_rate = hw.GPU(**{**hw.GPUS["T4"].__dict__, "fp32_tflops": None})
    with pytest.raises(ValueError, match="no FP32"):
        no_rate.matmul_to_nonmatmul()


def test_hardware_fa_paper_fig2_values_and_ratios():
    f = hw.FA_PAPER_FIG2
    assert (f.hbm_gb_standard, f.hbm_gb_flash, f.runtime_ms_standard, f.runtime_ms_flash) == (
        40.3,
        4.4,
        41.7,
        7.3,
    )
    assert (f.gflops_standard, f.gflops_flash) == (66.6, 75.2)
    assert f.traffic_reduction == pytest.approx(9.16, abs=0.01)
    assert f.speedup == pytest.approx(5.71, abs=0.01)
    assert f.extra_flops == pytest.approx(0.129, abs=0.001)  # the "+13%" of the errata


def test_hardware_bank_conflict_degree_column_of_a_row_major_tile():
    # 32 threads read column 0 of a row-major fp16 tile with 64 columns (128-byte rows): one bank.
    assert hw.bank_conflict_degree([t * 128 for t in range(32)]) == 32
    # Padding each row by 4 bytes shifts every row by one bank: conflict-free.
    assert hw.bank_conflict_degree([t * 132 for t in range(32)]) == 1
    # XOR swizzle of the 4-byte word index by the row: conflict-free without padding.
    assert hw.bank_conflict_degree([t * 128 + 4 * (0 ^ t) for t in range(32)]) == 1
    # Consecutive words: one per bank; the same word for all threads: a broadcast.
    assert hw.bank_conflict_degree([4 * t for t in range(32)]) == 1
    assert hw.bank_conflict_degree([64] * 32) == 1
    # Two threads per bank with distinct words: 2-way.
    assert hw.bank_conflict_degree([8 * t for t in range(32)]) == 2
    with pytest.raises(ValueError, match="empty"):
        hw.bank_conflict_degree([])
    with pytest.raises(ValueError, match="integers"):
        hw.bank_conflict_degree([-4])


def test_hardware_architecture_constants_match_the_cuda_guide():
    assert (hw.WARP_SIZE, hw.SMEM_BANKS, hw.SMEM_BANK_BYTES) == (32, 32, 4)
    assert (hw.REGISTERS_PER_SM, hw.MAX_REGISTERS_PER_THREAD) == (64 * 1024, 255)
    # the size of the product that set the ceiling (the largest dimension for a non-square one)
    assert hw.H200_MEASURED.matmul_n in (4096, 8192, 16384)


def test_hardware_measure_ceilings_arithmetic_with_a_fixed_timer():
    pytest.importorskip("torch")
    # A timer that says every call takes 2 ms: the ceilings are then pure arithmetic.
    res = hw.measure_ceilings("cpu", matmul_n=16, copy_bytes=2048, timer=lambda fn: (fn(), 2e-3)[1])
    assert res["copy_bandwidth"] == pytest.approx(2 * 2048 / 2e-3)  # read + written
    assert res["fp16_matmul_flops"] == pytest.approx(2 * 16**3 / 2e-3)
    with pytest.raises(ValueError, match="even"):
        hw.measure_ceilings("cpu", matmul_n=4, copy_bytes=3, timer=lambda fn: 1.0)
    with pytest.raises(RuntimeError, match="non-positive"):
        hw.measure_ceilings("cpu", matmul_n=4, copy_bytes=4, timer=lambda fn: 0.0)


def test_hardware_measure_ceilings_script_writes_a_record_that_reads_back(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    import importlib.util
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / "measure_ceilings.py"
    spec = importlib.util.spec_from_file_location("measure_ceilings", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = tmp_path / "ceilings.json"
    assert mod.main(["--out", str(out), "--device", "cpu", "--small"]) == 0
    record = json.loads(out.read_text())
    c = hw.ceilings_from_record(record)
    assert c.copy_bandwidth > 0 and c.fp16_matmul_flops > 0 and c.matmul_n == 64
    # the extended format: several shapes and dtypes, the ceiling is the best run's best rate
    runs = record["ceilings"]["matmul_runs"]
    assert {r["dtype"] for r in runs} == {"float16", "bfloat16"} and len(runs) == 4
    assert c.fp16_matmul_flops == max(r["best_flops"] for r in runs)
    assert all(r["worst_flops"] <= r["mean_flops"] <= r["best_flops"] for r in runs)
    assert "best of 4 runs" in c.matmul_method
    first_format = {  # the H200 record of 2026-11-30 (experiments/data/hardware/), abridged
        "environment": dict(record["environment"], date="2026-11-30T19:16:40+00:00"),
        "ceilings": {
            "copy_bandwidth": 4233463387011.161,
            "fp16_matmul_flops": 691078625987215.2,
            "matmul_n": 8192,
        },
    }
    old = hw.ceilings_from_record(first_format)
    assert "one run" in old.matmul_method and old.matmul_n == 8192
    assert old.fp16_matmul_flops == 691078625987215.2
    assert (
        "measure_ceilings.py" in record["environment"]["command"] and record["environment"]["date"]
    )
    with pytest.raises(ValueError, match="ceilings"):
        hw.ceilings_from_record({"environment": record["environment"]})


def test_hardware_rates_in_base_units():
    h100 = hw.GPUS["H100-SXM"]
    assert h100.fp16_flops == 989e12  # TFLOP/s -> FLOP/s
    assert h100.bandwidth == 3350e9  # GB/s (10^9) -> bytes/s


def test_hardware_links_per_direction_from_the_quoted_rates():
    per_dir = {name: link.per_direction for name, link in hw.LINKS.items()}
    assert per_dir["NVLink 4 (H200 SXM)"] == 900e9 / 2
    assert per_dir["PCIe Gen5 x16"] == 128e9 / 2
    assert per_dir["InfiniBand NDR (one 400 Gb/s NIC per GPU)"] == 400e9 / 8  # bits -> bytes


def test_hardware_bank_conflict_degree_counts_words_not_bytes():
    # 32 threads read consecutive fp16 elements: two threads per 4-byte word, one broadcast each.
    assert hw.bank_conflict_degree([2 * t for t in range(32)]) == 1
    assert hw.bank_conflict_degree([0]) == 1  # one thread: one transaction
    # 8-byte bank words (bank_bytes=8): consecutive 8-byte elements are conflict-free...
    assert hw.bank_conflict_degree([8 * t for t in range(32)], bank_bytes=8) == 1
    # ...and with 16 banks the 32 words fall two to a bank.
    assert hw.bank_conflict_degree([4 * t for t in range(32)], banks=16) == 2


@pytest.mark.parametrize(
    "addresses,kw,match",
    [
        ([True], {}, "integers"),
        ([4.5], {}, "integers"),
        ([0], {"banks": 0}, "banks"),
        ([0], {"bank_bytes": 0}, "bank_bytes"),
    ],
)
def test_hardware_bank_conflict_degree_bad_input(addresses, kw, match):
    with pytest.raises(ValueError, match=match):
        hw.bank_conflict_degree(addresses, **kw)


def _record(runs=None, **ceilings):
    env = {"gpu": "NVIDIA X", "date": "2026-01-01", "torch": "2", "triton": "3", "command": "c"}
    res = {"copy_bandwidth": 1e12, "fp16_matmul_flops": 5e14, "matmul_n": 8192, **ceilings}
    if runs is not None:
        res["matmul_runs"] = runs
    return {"environment": env, "ceilings": res}


def test_hardware_ceilings_from_record_non_square_best_run():
    """The ceiling's matmul_n is the largest dimension of the best run when it is not square."""
    run = {"dtype": "float16", "repeats": 3, "mean_flops": 5e14}
    runs = [
        {**run, "shape": [4096, 4096, 4096], "best_flops": 6e14},
        {**run, "shape": [8192, 4096, 16384], "best_flops": 7e14},
    ]
    c = hw.ceilings_from_record(_record(runs), gpu="H200-SXM")
    assert (c.fp16_matmul_flops, c.matmul_n, c.gpu) == (7e14, 16384, "H200-SXM")
    assert "best of 2 runs" in c.matmul_method


@pytest.mark.parametrize(
    "record",
    [
        _record(matmul_n="big"),  # ValueError inside
        _record(copy_bandwidth=None),  # TypeError inside
        {"environment": None, "ceilings": {}},
    ],
)
def test_hardware_ceilings_from_record_malformed_values_say_what_is_needed(record):
    with pytest.raises(ValueError, match="a ceilings record needs"):
        hw.ceilings_from_record(record)


def _scripted_timer(*seconds):
    """A timer that returns the given times, one per call, and never runs ``fn``."""
    it = iter(seconds)
    return lambda fn: next(it)


def test_hardware_measure_ceilings_times_each_ceiling_separately():
    pytest.importorskip("torch")
    timer = _scripted_timer(1e-3, 4e-3)  # the copy is timed first, then the matmul
    res = hw.measure_ceilings("cpu", matmul_n=16, copy_bytes=2048, timer=timer)
    assert res["copy_bandwidth"] == pytest.approx(2 * 2048 / 1e-3)
    assert res["fp16_matmul_flops"] == pytest.approx(2 * 16**3 / 4e-3)
    assert (res["copy_seconds"], res["matmul_seconds"]) == (1e-3, 4e-3)
    for bad in ((1e-3, 0.0), (0.0, 1e-3)):
        with pytest.raises(RuntimeError, match="non-positive"):
            hw.measure_ceilings("cpu", matmul_n=4, copy_bytes=4, timer=_scripted_timer(*bad))
    with pytest.raises(ValueError, match="matmul_n"):
        hw.measure_ceilings("cpu", matmul_n=0, copy_bytes=4, timer=lambda fn: 1.0)


def test_hardware_cpu_timer_is_the_median_after_warmup(monkeypatch):
    """The CPU fallback of do_bench: warm-up calls untimed, then the median of the timed ones."""
    import time

    from course_kernels.hardware import ceilings

    clock = [0.0]
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])
    durations = iter([100.0] * 3 + [1.0] + [2.0] * 3 + [50.0])  # 3 warm-up calls, then 5 timed

    def fn():
        clock[0] += next(durations)

    assert ceilings._median_seconds(fn, repeats=5, warmup=3) == 2.0
