"""course_kernels.bench: the parts that run without a GPU (FLOP convention, ratio table, ncu
parsing, naive attention, forcing one kernel config). The timings themselves need a GPU and are
committed as data (course_kernels/data/bench/), never asserted in a test."""

import math

import pytest
import torch
import torch.nn.functional as F

from course_kernels import bench
from course_kernels.bench import providers as _providers  # noqa: F401  (bench.providers below)
from course_kernels.triton import flash
from course_kernels.triton import forward as triton_forward


def test_flop_convention_matches_anchors():
    # 4 B H N^2 d; halved for causal; x2.5 for the backward (ANCHORS.md, the Triton tutorial)
    assert bench.attention_flops(4, 32, 1024, 64, False, "fwd") == 4 * 4 * 32 * 1024**2 * 64
    assert bench.attention_flops(4, 32, 1024, 64, True, "fwd") == 2 * 4 * 32 * 1024**2 * 64
    assert bench.attention_flops(1, 1, 10, 8, False, "bwd") == 2.5 * 4 * 100 * 8


def _row(provider, tflops, mode="fwd", n=4096):
    return {
        "provider": provider,
        "dtype": "float16",
        "d": 64,
        "N": n,
        "causal": False,
        "mode": mode,
        "tflops": tflops,
    }


def test_ratio_table_divides_by_the_right_provider():
    rows = [
        _row("flash", 400),
        _row("sdpa-flash", 300),
        _row("sdpa-cudnn", 500),
        _row("flash", 200, "bwd"),
        _row("sdpa-flash", 100, "bwd"),
    ]
    table = {r["mode"]: r for r in bench.ratio_table(rows)}
    assert table["fwd"]["vs_sdpa_flash"] == pytest.approx(4 / 3)
    assert table["fwd"]["vs_sdpa_cudnn"] == pytest.approx(0.8)
    assert table["bwd"]["vs_sdpa_flash"] == pytest.approx(2.0)
    assert math.isnan(table["bwd"]["vs_sdpa_cudnn"])  # no cuDNN row: NaN, not a made-up ratio
    assert "| float16 | 64 | 4096 | no | fwd | 400 | 1.33 | 0.80 |" in bench.format_ratio_table(
        rows
    )


def test_write_ratios_records_provenance_and_ratios(tmp_path):
    import csv

    env = {
        "gpu": "Some GPU",
        "torch": "9.9",
        "triton": "8.8",
        "date": "2026-01-01",
        "command": "python -m course_kernels bench",
    }
    rows = [_row("flash", 400), _row("sdpa-flash", 300), _row("sdpa-cudnn", 500)]
    path = tmp_path / "ratios.csv"
    bench.write_ratios(path, env, rows)
    head, *body = path.read_text().splitlines()
    assert head.startswith("# ") and "Some GPU" in head and "2026-01-01" in head
    (rec,) = list(csv.DictReader(body))
    assert float(rec["vs_sdpa_flash"]) == pytest.approx(4 / 3)
    assert float(rec["vs_sdpa_cudnn"]) == pytest.approx(0.8)


def test_parse_ncu_csv_sums_kernels_per_stream(tmp_path):
    raw = tmp_path / "ncu.csv"
    raw.write_text(
        '"ID","Stream","Kernel Name","dram__bytes_read.sum","dram__bytes_write.sum"\n'
        '"","","","byte","byte"\n'
        '"0","7","gemm","1,000","500"\n'
        '"1","7","softmax","2,000","1,000"\n'
        '"2","9","_attn_fwd","300","4"\n'
    )
    cases = [
        {"provider": "naive", "N": 1024, "batch": 1, "heads": 4, "d": 64},
        {"provider": "flash", "N": 1024, "batch": 1, "heads": 4, "d": 64},
    ]
    out = bench.parse_ncu_csv(raw, cases, tmp_path / "out.csv", command="test")
    lines = out.read_text().splitlines()
    assert lines[2].startswith("naive,1024,1,4,64,float16,3000,1500,2,")
    assert lines[3].startswith("flash,1024,1,4,64,float16,300,4,1,")
    with pytest.raises(RuntimeError, match="2 streams for 1 cases"):
        bench.parse_ncu_csv(raw, cases[:1], tmp_path / "x.csv")


@pytest.mark.parametrize("causal", [False, True])
def test_naive_attention_matches_sdpa(causal):
    q, k, v = (torch.randn(1, 2, 19, 8, dtype=torch.float64) for _ in range(3))
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    torch.testing.assert_close(bench.naive_attention(q, k, v, causal), expected)


def test_forced_forward_config_is_the_one_launched_and_is_restored():
    q, k, v = (torch.randn(1, 2, 40, 16) for _ in range(3))
    before = list(triton_forward._attn_fwd.configs)
    flash.flash_attention(q, k, v)  # remember a tuned config for this shape
    with bench.forced_forward_config(16, 16, 4, 1):
        out = flash.flash_attention(q, k, v, causal=True)
        (launched,) = flash._TUNED.values()
        assert (launched["BLOCK_M"], launched["BLOCK_N"]) == (16, 16)  # the config's kwargs
    assert triton_forward._attn_fwd.configs == before
    assert flash._TUNED == {}
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=True))


def test_plot_bench_labels_and_keeps_the_backend(tmp_path):
    import matplotlib

    backend = matplotlib.get_backend()
    rows = [
        _row("flash", 400),
        _row("sdpa-flash", 300),
        _row("naive", 50),
        _row("flash", 410, n=8192),
        _row("sdpa-flash", 310, n=8192),
    ]
    env = {"gpu": "Some GPU", "torch": "9.9", "triton": "8.8"}
    fig = bench.plot_bench(rows, tmp_path / "b.png", env)
    assert (tmp_path / "b.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    ax = fig.axes[0]
    labels = ax.get_legend_handles_labels()[1]
    assert labels == ["this course's kernel", "SDPA FlashAttention-2", "naive attention"]
    colors = {line.get_label(): line.get_color() for line in ax.get_lines()}
    assert colors["naive attention"] == "C4"  # its place in PROVIDERS, even with cuDNN absent
    assert matplotlib.get_backend() == backend


def test_tutorial_provider_needs_the_file(monkeypatch, tmp_path):
    monkeypatch.delenv(bench.TUTORIAL_ENV, raising=False)
    with pytest.raises(RuntimeError, match=r"06-fused-attention.py.*COURSE_KERNELS_TUTORIAL"):
        bench.provider_fn("tutorial")
    other = tmp_path / "other.py"
    other.write_text("x = 1\n")
    with pytest.raises(RuntimeError, match="defines no attention"):
        bench.load_tutorial(str(other))


def test_tutorial_provider_calls_attention_in_fp16_only(monkeypatch, tmp_path):
    """A stand-in file with the tutorial's interface: attention(q, k, v, causal, sm_scale)."""
    fake = tmp_path / "06-fused-attention.py"
    fake.write_text(
        "# source: a stand-in for the test\nimport torch.nn.functional as F\n"
        "def attention(q, k, v, causal, sm_scale):\n"
        "    return F.scaled_dot_product_attention(q, k, v, is_causal=causal,"
        " scale=sm_scale)\n"
    )
    monkeypatch.setenv(bench.TUTORIAL_ENV, str(fake))
    fn = bench.provider_fn("tutorial")
    q, k, v = (torch.randn(1, 2, 8, 16, dtype=torch.float16) for _ in range(3))
    want = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)
    assert torch.allclose(fn(q, k, v, True).float(), want, atol=2e-3)
    with pytest.raises(ValueError, match="float16 only"):
        fn(q.float(), k.float(), v.float(), True)
    prov = bench.providers._tutorial_provenance()
    assert len(prov["sha256"]) == 64 and prov["origin"] == "source: a stand-in for the test"


def test_ratio_table_against_the_tutorial():
    rows = [_row("flash", 400), _row("tutorial", 500), _row("sdpa-flash", 200)]
    (r,) = bench.ratio_table(rows)
    assert r["vs_tutorial"] == pytest.approx(0.8) and r["vs_sdpa_flash"] == pytest.approx(2.0)


def test_bench_split_by_job_keeps_the_old_names():
    from course_kernels.bench import dram as bench_dram
    from course_kernels.bench import memory as bench_memory
    from course_kernels.bench import report as bench_report
    from course_kernels.bench import sweep as bench_sweep

    assert bench.run_sweep is bench_sweep.run_sweep
    assert bench.SWEEP_CONFIGS is bench_sweep.SWEEP_CONFIGS
    assert bench.forced_forward_config is bench_sweep.forced_forward_config
    assert bench.parse_ncu_csv is bench_dram.parse_ncu_csv
    assert bench.run_memory is bench_memory.run_memory
    assert bench.format_ratio_table is bench_report.format_ratio_table
    with pytest.raises(AttributeError, match="has no attribute 'no_such_job'"):
        bench.no_such_job  # noqa: B018


def test_every_name_the_bench_package_lists_resolves_to_its_module():
    import importlib

    for name, module in bench._WHERE.items():
        sub = importlib.import_module(f"course_kernels.bench.{module}")
        assert getattr(bench, name) is getattr(sub, name), name
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = bench.nope
