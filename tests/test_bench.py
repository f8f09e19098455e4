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


# -- from a mutation audit: what the timings' records and messages say, checked on the CPU --------
def _cpu_randn(monkeypatch):
    """torch.randn that ignores device="cuda", so the GPU benchmarks' loops run on the CPU."""
    randn = torch.randn
    monkeypatch.setattr(torch, "randn", lambda *a, device=None, **kw: randn(*a, **kw))


ENV = {
    "gpu": "Some GPU",
    "torch": "9.9",
    "triton": "8.8",
    "date": "2026-01-01",
    "command": "python -m course_kernels bench --x",
}


def test_environment_records_autotune_command_variables_and_tutorial(monkeypatch, tmp_path):
    import os
    import sys

    from course_kernels.bench import speed

    for k in [k for k in os.environ if k.startswith("COURSE_KERNELS_")]:
        monkeypatch.delenv(k)
    monkeypatch.setattr(sys, "argv", ["prog", "bench", "--ns", "1024"])
    env = speed.environment()
    assert env["autotune"] is True  # the default: on
    assert env["command"] == f"{os.path.basename(sys.executable)} -m course_kernels bench --ns 1024"
    assert env["course_kernels_env"] == {} and env["tutorial"] is None
    tut = tmp_path / "tut.py"
    tut.write_bytes(b"# x\n")
    monkeypatch.setenv("COURSE_KERNELS_AUTOTUNE", "0")
    monkeypatch.setenv("COURSE_KERNELS_FOO", "bar")
    monkeypatch.setenv(bench.TUTORIAL_ENV, str(tut))
    env = speed.environment()
    assert env["autotune"] is False
    assert env["course_kernels_env"] == {
        "COURSE_KERNELS_AUTOTUNE": "0",
        "COURSE_KERNELS_FOO": "bar",
        bench.TUTORIAL_ENV: str(tut),
    }
    import hashlib

    assert env["tutorial"]["sha256"] == hashlib.sha256(b"# x\n").hexdigest()


def test_peak_extra_mib_is_the_peak_above_the_live_memory_in_mib(monkeypatch):
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda: None)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda: 5 * 2**20)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda: 8 * 2**20)
    assert bench._peak_extra_mib(lambda: None) == 3.0


def _check_inputs(dtype=torch.float16):
    g = torch.Generator().manual_seed(0)
    q, k = (4 * torch.randn(1, 3, 64, 16, generator=g) for _ in range(2))  # peaky softmax
    v, do = (torch.randn(1, 3, 64, 16, generator=g) for _ in range(2))
    return [x.to(dtype) for x in (q, k, v, do)]


def test_check_correctness_budgets_are_2x_for_o_and_3x_for_gradients():
    """Each budget is factor x the naive same-dtype error against fp32 math, on batch 0 and the
    first two heads (computed here with the formula written out)."""
    import numpy as np

    from course_kernels.testing import max_abs_error

    q, k, v, do = _check_inputs()
    sl = (slice(0, 1), slice(0, 2))
    r_in = [x[sl].float().requires_grad_() for x in (q, k, v)]
    n_in = [x[sl].clone().requires_grad_() for x in (q, k, v)]
    ref, nai = bench.naive_attention(*r_in, True), bench.naive_attention(*n_in, True)
    dref = torch.autograd.grad(ref, r_in, do[sl].float())
    dnai = torch.autograd.grad(nai, n_in, do[sl])
    # an exact answer (fp32 math on every head) passes
    f_in = [x.float().requires_grad_() for x in (q, k, v)]
    out = bench.naive_attention(*f_in, True)
    grads = torch.autograd.grad(out, f_in, do.float())
    res = bench.check_correctness(q, k, v, do, True, out, grads)
    assert res["ok"] is True
    for name, r, n, factor in [("O", ref, nai, 2.0)] + [
        (nm, r, n, 3.0) for nm, r, n in zip(("dQ", "dK", "dV"), dref, dnai, strict=True)
    ]:
        r = r.detach().double().numpy()
        e = max_abs_error(n.detach().float().numpy(), r)
        floor = 8 * np.finfo(np.float32).eps * max(1.0, float(np.abs(r).max()))
        assert factor * e > floor  # the naive error, not the floor, sets the budget here
        assert res[name]["budget"] == pytest.approx(factor * e, rel=1e-6), name
        assert res[name]["ok"] is True


def test_check_correctness_fails_a_wrong_head_or_gradient():
    q, k, v, do = _check_inputs()
    f_in = [x.float().requires_grad_() for x in (q, k, v)]
    out = bench.naive_attention(*f_in, False)
    grads = torch.autograd.grad(out, f_in, do.float())
    budget = bench.check_correctness(q, k, v, do, False, out, grads)["O"]["budget"]
    bad = out.detach().clone()
    bad[0, 1, 5, 3] += 2.5 * budget / 2  # 2.5x the naive error, on head 1: over O's 2x
    res = bench.check_correctness(q, k, v, do, False, bad, grads)
    assert res["O"]["ok"] is False and res["ok"] is False
    dq_budget = bench.check_correctness(q, k, v, do, False, out, grads)["dQ"]["budget"]
    dq = grads[0].clone()
    dq[0, 0, 7, 2] += 2.5 * dq_budget / 3  # 2.5x the naive error: within dQ's 3x
    res = bench.check_correctness(q, k, v, do, False, out, (dq, *grads[1:]))
    assert res["dQ"]["ok"] is True and res["ok"] is True
    dq[0, 0, 7, 2] += dq_budget  # now over
    res = bench.check_correctness(q, k, v, do, False, out, (dq, *grads[1:]))
    assert res["dQ"]["ok"] is False and res["ok"] is False
    assert set(bench.check_correctness(q, k, v, do, False, out, None)) == {"O", "ok"}


def _fake_bench(monkeypatch, ms=2.0, mib=3.0):
    from course_kernels.bench import speed

    _cpu_randn(monkeypatch)
    monkeypatch.setattr(speed, "environment", lambda: dict(ENV))

    def provider(p):
        if p == "sdpa-cudnn":

            def refuse(q, k, v, causal):
                raise RuntimeError("no cuDNN here")

            return refuse
        return bench.naive_attention

    monkeypatch.setattr(speed, "provider_fn", provider)
    monkeypatch.setattr(speed, "_time_one", lambda *a: (ms, mib))


def test_run_bench_records_tflops_and_writes_its_files(monkeypatch, tmp_path):
    import csv
    import json

    _fake_bench(monkeypatch, ms=2.0, mib=3.0)
    rows = bench.run_bench(
        tmp_path,
        dtypes=("float16",),
        ds=(8,),
        ns=(16,),
        causals=(True,),
        modes=("fwd", "bwd"),
        providers=("flash", "sdpa-cudnn"),
        batch=2,
        hidden=32,
        log=lambda *a: None,
    )
    ok = [r for r in rows if r["mode"] in ("fwd", "bwd")]
    assert [(r["provider"], r["mode"]) for r in ok] == [("flash", "fwd"), ("flash", "bwd")]
    heads = 32 // 8
    fwd_flops = 4 * 2 * heads * 16 * 16 * 8 / 2  # causal: half
    for r, flops in zip(ok, (fwd_flops, 2.5 * fwd_flops), strict=True):
        assert r["heads"] == heads and r["ms"] == 2.0 and r["peak_extra_mib"] == 3.0
        assert r["tflops"] == pytest.approx(flops / 2e-3 / 1e12)  # FLOPs / seconds / 1e12
        assert r["check"]["ok"] is True
    (err,) = [r for r in rows if r["mode"] == "error"]
    assert err["provider"] == "sdpa-cudnn" and "no cuDNN here" in err["error"]
    head, *body = (tmp_path / "bench.csv").read_text().splitlines()
    assert (
        head == "# Some GPU; torch 9.9; triton 8.8; 2026-01-01; python -m course_kernels bench --x"
    )
    recs = list(csv.DictReader(body))
    assert [(r["provider"], r["mode"], r["check_ok"]) for r in recs] == [
        ("flash", "fwd", "True"),
        ("flash", "bwd", "True"),
    ]  # the refused provider is in bench.json only
    saved = json.loads((tmp_path / "bench.json").read_text())
    assert saved["environment"] == ENV and len(saved["results"]) == 3
    assert (tmp_path / "ratios.csv").exists() and (tmp_path / "bench.png").exists()


def test_run_bench_skips_naive_past_its_memory_limit(monkeypatch, tmp_path):
    import csv

    from course_kernels.bench import speed

    _fake_bench(monkeypatch)
    # naive's N x N tensors: batch x heads x N^2 x 4 bytes (float32) x 3
    monkeypatch.setattr(speed, "NAIVE_LIMIT_BYTES", 1 * 4 * 16 * 16 * 4 * 3)
    kw = dict(dtypes=("float32",), ds=(8,), causals=(False,), modes=("fwd",), batch=1)
    rows = bench.run_bench(
        tmp_path, ns=(16, 32), providers=("naive",), hidden=32, check=False, **kw
    )
    assert [r["N"] for r in rows] == [16]  # N = 32 passes the limit: skipped, not an error
    recs = list(csv.DictReader((tmp_path / "bench.csv").read_text().splitlines()[1:]))
    assert [r["check_ok"] for r in recs] == [""]  # not checked: empty, not False


def test_time_one_takes_the_median_of_the_forward_or_the_backward_alone(monkeypatch):
    import triton

    from course_kernels.bench import speed

    seen = []

    def do_bench(fn, warmup, rep, return_mode):
        seen.append(return_mode)
        fn()
        return 1.5

    monkeypatch.setattr(triton.testing, "do_bench", do_bench)
    monkeypatch.setattr(speed, "_peak_extra_mib", lambda fn: 7.0)
    calls = []
    q, k, v, do = (torch.randn(1, 1, 4, 8, requires_grad=True) for _ in range(4))

    def fn(q, k, v, causal):
        calls.append(causal)
        return bench.naive_attention(q, k, v, causal)

    out = fn(q, k, v, True)
    assert speed._time_one(fn, q, k, v, do, True, out, "fwd") == (1.5, 7.0)
    assert calls == [True, True]
    assert speed._time_one(fn, q, k, v, do, True, out, "bwd") == (1.5, 7.0)
    assert calls == [True, True]  # the backward alone: no new forward
    assert seen == ["median", "median"]


def test_gpu_check_fails_a_kernel_with_a_large_error(monkeypatch):
    from course_kernels.triton import flash as flash_mod

    monkeypatch.setattr(torch, "randn", lambda *a, device=None, **kw: torch.zeros(*a, **kw))

    def off_by(delta):
        return lambda q, k, v, causal: torch.zeros_like(q) + delta

    monkeypatch.setattr(flash_mod, "flash_attention", off_by(0.0))
    assert bench.gpu_check(log=lambda *a: None) is True
    monkeypatch.setattr(flash_mod, "flash_attention", off_by(0.5))
    assert bench.gpu_check(log=lambda *a: None) is False
    monkeypatch.setattr(flash_mod, "flash_attention", off_by(float("nan")))
    assert bench.gpu_check(log=lambda *a: None) is False


def test_ratio_table_is_sorted_by_shape_then_mode():
    rows = [
        _row("flash", 300, n=8192),
        _row("flash", 100, "fwd"),
        _row("flash", 50, "bwd"),
    ]
    table = bench.ratio_table(rows)
    assert [(r["N"], r["mode"]) for r in table] == [(4096, "bwd"), (4096, "fwd"), (8192, "fwd")]


def test_write_ratios_header_names_the_command(tmp_path):
    path = tmp_path / "ratios.csv"
    bench.write_ratios(path, ENV, [_row("flash", 400)])
    head = path.read_text().splitlines()[0]
    assert head == (
        "# flash / sdpa TFLOP/s ratios; Some GPU; torch 9.9; triton 8.8; 2026-01-01; "
        "python -m course_kernels bench --x"
    )


def test_plot_bench_panels_titles_axes_and_points(tmp_path):
    rows = [_row("flash", 400), _row("flash", 100, "bwd"), _row("flash", 410, n=8192)]
    for c, t in ((True, 200), (True, 50)):
        rows.append({**_row("flash", t, "fwd" if t == 200 else "bwd"), "causal": c})
    rows.append({**_row("flash", 7), "dtype": "bfloat16"})
    fig = bench.plot_bench(rows, tmp_path / "b.png", ENV)
    assert len(fig.axes) == 8  # 5 panels in rows of 4; the spare ones are switched off
    shown = [ax for ax in fig.axes if ax.axison]
    titles = [ax.get_title() for ax in shown]
    assert titles == [
        "bfloat16 d=64 full fwd",
        "float16 d=64 full bwd",
        "float16 d=64 full fwd",
        "float16 d=64 causal bwd",
        "float16 d=64 causal fwd",
    ]
    full_fwd = shown[2]
    (line,) = full_fwd.get_lines()
    assert list(line.get_xdata()) == [4096, 8192] and list(line.get_ydata()) == [400, 410]
    assert full_fwd.get_xscale() == "log" and full_fwd.get_ylabel() == "TFLOP/s"
    assert fig._suptitle.get_text() == "Some GPU, torch 9.9, Triton 8.8"


def _ncu(tmp_path, body):
    raw = tmp_path / "ncu.csv"
    raw.write_text(
        "==PROF== Connected to process 1234\n"
        '"ID","Stream","Kernel Name","dram__bytes_read.sum","dram__bytes_write.sum"\n'
        '"","","","byte","byte"\n' + body
    )
    return raw


def test_parse_ncu_csv_reads_ncu_output_with_log_lines_and_names_kernels(tmp_path):
    import csv

    long = "k" * 50
    raw = _ncu(tmp_path, f'"0","7","gemm","10","5"\n"1","7","{long}","20","1"\n')
    cases = [{"provider": "naive", "N": 1024, "batch": 1, "heads": 4, "d": 64}]
    out = bench.parse_ncu_csv(raw, cases, tmp_path / "out.csv", command="the cmd")
    head, *body = out.read_text().splitlines()
    assert head == "# DRAM bytes per forward, Nsight Compute; the cmd"
    (rec,) = list(csv.DictReader(body))
    assert rec["dram_read_bytes"] == "30" and rec["n_kernels"] == "2"
    assert rec["kernels"] == "gemm;" + "k" * 40  # names cut at 40 characters, ';'-separated


def test_parse_ncu_csv_refuses_fewer_streams_than_cases_or_missing_metrics(tmp_path):
    raw = _ncu(tmp_path, '"0","7","gemm","10","5"\n')
    cases = [{"provider": p, "N": 1024, "batch": 1, "heads": 4, "d": 64} for p in ("a", "b")]
    with pytest.raises(RuntimeError, match="1 streams for 2 cases"):
        bench.parse_ncu_csv(raw, cases, tmp_path / "out.csv")
    bare = tmp_path / "bare.csv"
    bare.write_text('"ID","Stream","Kernel Name"\n"0","7","gemm"\n')
    with pytest.raises(RuntimeError, match="0 streams for 1 cases"):
        bench.parse_ncu_csv(bare, cases[:1], tmp_path / "out.csv")


def test_tutorial_origin_may_be_on_any_of_the_first_five_lines(monkeypatch, tmp_path):
    import hashlib

    fake = tmp_path / "tut.py"
    fake.write_text(
        "#!/usr/bin/env python\n# header\n# source: triton 3.6\ndef attention(): pass\n"
    )
    monkeypatch.setenv(bench.TUTORIAL_ENV, str(fake))
    prov = bench.providers._tutorial_provenance()
    assert prov["origin"] == "source: triton 3.6"
    monkeypatch.setenv(bench.TUTORIAL_ENV, str(tmp_path / "missing.py"))
    assert bench.providers._tutorial_provenance() is None
    monkeypatch.setattr(bench.providers, "_TUTORIALS", {})
    mod = bench.load_tutorial(str(fake))
    assert bench.load_tutorial(str(fake)) is mod  # loaded once per process
    assert mod.__sha256__ == hashlib.sha256(fake.read_bytes()).hexdigest()


def test_tutorial_provider_refuses_bfloat16(monkeypatch, tmp_path):
    fake = tmp_path / "tut.py"
    fake.write_text("def attention(q, k, v, causal, sm_scale):\n    return q\n")
    monkeypatch.setenv(bench.TUTORIAL_ENV, str(fake))
    q = torch.zeros(1, 1, 4, 16, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="float16 only"):
        bench.provider_fn("tutorial")(q, q, q, False)


def test_sdpa_providers_pick_their_backend_and_pass_causal(monkeypatch):
    import contextlib

    import torch.nn.attention as attn
    from torch.nn.attention import SDPBackend

    used = []

    @contextlib.contextmanager
    def sdpa_kernel(backend):
        used.append(backend)
        yield

    monkeypatch.setattr(attn, "sdpa_kernel", sdpa_kernel)
    q, k, v = (torch.randn(1, 2, 9, 8, dtype=torch.float64) for _ in range(3))
    for name in ("sdpa-flash", "sdpa-cudnn", "sdpa-efficient"):
        out = bench.provider_fn(name)(q, k, v, True)
        torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=True))
    assert used == [
        SDPBackend.FLASH_ATTENTION,
        SDPBackend.CUDNN_ATTENTION,
        SDPBackend.EFFICIENT_ATTENTION,
    ]


def test_flash_provider_passes_causal():
    q, k, v = (torch.randn(1, 2, 16, 16) for _ in range(3))
    out = bench.provider_fn("flash")(q, k, v, True)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=True))


def test_forced_forward_config_sets_each_field():
    with bench.forced_forward_config(32, 16, 2, 1):
        (cfg,) = triton_forward._attn_fwd.configs
        assert cfg.kwargs == {"BLOCK_M": 32, "BLOCK_N": 16}
        assert (cfg.num_warps, cfg.num_stages) == (2, 1)


def test_run_sweep_records_each_config(monkeypatch, tmp_path):
    import json

    import triton

    _cpu_randn(monkeypatch)
    monkeypatch.setattr(triton.testing, "do_bench", lambda *a, **kw: 4.0)
    monkeypatch.delenv("COURSE_KERNELS_AUTOTUNE", raising=False)
    rows = bench.run_sweep(
        tmp_path, n=32, ds=(16,), causals=(True,), batch=1, hidden=32,
        configs=((32, 16, 2, 1),), log=lambda *a: None,
    )  # fmt: skip
    (r,) = rows
    assert (r["block_m"], r["block_n"], r["num_warps"], r["num_stages"]) == (32, 16, 2, 1)
    assert r["heads"] == 2 and r["ms"] == 4.0 and r["max_abs_error"] < 1e-2
    flops = 4 * 1 * 2 * 32 * 32 * 16 / 2  # causal: half
    assert r["tflops"] == pytest.approx(flops / 4e-3 / 1e12)
    saved = json.loads((tmp_path / "sweep.json").read_text())
    assert saved["environment"]["autotune"] is False and saved["results"] == rows


def test_memory_fwd_bwd_is_the_full_attention_backward():
    from course_kernels.bench import memory

    q, k, v, do = (torch.randn(1, 2, 8, 4, dtype=torch.float64) for _ in range(4))
    grads = memory._fwd_bwd(bench.naive_attention, q, k, v, do)
    ins = [x.clone().requires_grad_() for x in (q, k, v)]
    want = torch.autograd.grad(F.scaled_dot_product_attention(*ins), ins, do)
    for g, w in zip(grads, want, strict=True):
        torch.testing.assert_close(g, w)


def test_run_memory_rows_and_out_of_memory(monkeypatch, tmp_path):
    import json

    from course_kernels.bench import memory

    _cpu_randn(monkeypatch)
    monkeypatch.setattr(memory, "environment", lambda: dict(ENV))
    monkeypatch.setattr(memory, "_peak_extra_mib", lambda fn: (fn(), 1.5)[1])

    def provider(p):
        def fn(q, k, v, causal):
            if p == "naive" and q.shape[2] > 8:
                raise torch.OutOfMemoryError("too big")
            return bench.naive_attention(q, k, v, causal)

        return fn

    monkeypatch.setattr(memory, "provider_fn", provider)
    rows = bench.run_memory(tmp_path, ns=(8, 16), batch=1, heads=2, d=4, log=lambda *a: None)
    assert [(r["provider"], r["N"]) for r in rows] == [
        (p, n) for n in (8, 16) for p in ("naive", "sdpa-flash", "flash")
    ]
    assert rows[0]["fwd_extra_mib"] == 1.5 and rows[0]["fwd_bwd_extra_mib"] == 1.5
    assert rows[3]["error"] == "out of memory" and "fwd_extra_mib" not in rows[3]
    saved = json.loads((tmp_path / "memory.json").read_text())
    assert saved == {"environment": ENV, "results": rows}


def test_check_correctness_in_float32_writes_json():
    """``bench --dtypes float32``: the naive fp32 run equals the reference, so each budget is
    error_budget's floor; it was a numpy.float32, and bench.json's json.dump raised TypeError
    after the first shape."""
    import json

    g = torch.Generator().manual_seed(0)
    q, k, v, do = (torch.randn(1, 2, 16, 8, generator=g) for _ in range(4))
    for x in (q, k, v):
        x.requires_grad_()
    res = bench.check_correctness(q, k, v, do, False, bench.naive_attention(q, k, v, False), None)
    assert all(type(r["budget"]) is float for r in res.values() if isinstance(r, dict)), res
    json.loads(json.dumps(res))
