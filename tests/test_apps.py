"""The Applications chapter's GPU runs (course_kernels/apps/runs.py): what runs without a GPU."""

import json

import pytest

from course_kernels.apps import runs as apps


def test_apps_decode_bytes_counts_cache_once():
    # K and V read once: 2 * B * kv_heads * N * d elements, plus q read and out written.
    b = apps.decode_bytes(batch=1, kv_heads=8, n_keys=1024, head_dim=128, q_heads=32)
    assert b == 2 * (2 * 8 * 1024 * 128 + 2 * 32 * 128)
    assert apps.decode_bytes(2, 8, 1024, 128, 32, elem_bytes=4) == 4 * b


def test_apps_unknown_step_is_refused(tmp_path):
    with pytest.raises(ValueError, match="train, context, decode"):
        apps.run("prefill", tmp_path)


@pytest.mark.parametrize("step", apps.STEPS)
def test_apps_steps_need_a_gpu(step, tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the runs are exercised by scripts/gpu_apps.sh")
    with pytest.raises(RuntimeError, match="CUDA GPU"):
        apps.run(step, tmp_path)
    assert not list(tmp_path.iterdir())  # nothing half-written


def test_apps_save_records_environment(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    path = apps.save(tmp_path / "sub", "x.json", [{"a": 1}], "the command")
    data = json.loads(path.read_text())
    assert data["rows"] == [{"a": 1}]
    assert data["command"] == "the command"
    for key in ("gpu", "torch", "triton", "date"):
        assert key in data


def test_paged_summary_reads_a_run():
    """The Serving chapter's sentence from a paged run (synthetic rows: no GPU here)."""
    from course_kernels.apps.paged_runs import summary

    rows = []
    for b, n in ((1, 4096), (8, 131072)):
        rows.append({"batch": b, "context": n, "impl": "flash_decode_cudagraph", "page_size": None,
                     "us": 10.0 * b, "gb_per_s": 1000.0 * b, "host_us": 5.0})  # fmt: skip
        for p in (16, 256):
            for impl, us in (
                ("flash_decode_paged_cudagraph", 11.0 * b + p / 256),
                ("flash_decode_paged", 90.0),
            ):
                rows.append({"batch": b, "context": n, "impl": impl, "page_size": p, "us": us,
                             "gb_per_s": 900.0 * b, "host_us": 80.0 + p / 16,
                             "max_abs_err_vs_flash_decode": 1e-4})  # fmt: skip
    text, table = summary(rows, copy_bandwidth=4e12)
    assert "1.10 to 1.20 times" in text and "pages of 16: 1.10-1.11" in text
    assert "batch 8 and 131,072 tokens" in text and "pages of 16 (" in text
    assert "81 to 96 us" in text and len(table) == 4


# -- from a mutation audit: the runs' bookkeeping, with the GPU work replaced by stand-ins ---------
def test_apps_decode_bytes_counts_every_query_row():
    # n_q query rows: q read and out written once per row
    assert apps.decode_bytes(1, 8, 1024, 128, 32, n_q=4) == 2 * (
        2 * 8 * 1024 * 128 + 2 * 32 * 4 * 128
    )


@pytest.mark.parametrize(
    "step,name",
    [
        ("train", "gpt_train.json"),
        ("context", "gpt_context.json"),
        ("decode", "decode_bench.json"),
        ("paged", "paged_decode_bench.json"),
    ],
)
def test_apps_run_writes_each_steps_file(step, name, monkeypatch, tmp_path):
    pytest.importorskip("torch")
    from course_kernels.apps import paged_runs

    def fake(log=print):
        return [{"step": step}]

    for attr in ("train_runs", "context_runs", "decode_runs"):
        monkeypatch.setattr(apps, attr, fake)
    monkeypatch.setattr(paged_runs, "paged_decode_benchmark", fake)
    logged = []
    path = apps.run(step, tmp_path, log=logged.append)
    assert path == tmp_path / name
    data = json.loads(path.read_text())
    assert data["rows"] == [{"step": step}]
    assert data["command"] == f"python -m course_kernels apps {step} --out {tmp_path}"
    assert logged == [f"wrote {path}: 1 rows"]


def test_apps_host_us_is_microseconds_per_call(monkeypatch):
    torch = pytest.importorskip("torch")
    import types

    from course_kernels.apps import measure

    clock = iter([10.0, 10.5])
    monkeypatch.setattr(measure, "time", types.SimpleNamespace(perf_counter=lambda: next(clock)))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    calls = []
    assert apps._host_us(lambda: calls.append(1), calls=50) == pytest.approx(0.5 / 50 * 1e6)
    assert len(calls) == 50


def _fake_train(monkeypatch, oom=()):
    torch = pytest.importorskip("torch")
    from course_kernels.apps import gpt

    calls = []

    def train(attention, **kw):
        calls.append((attention, kw))
        if (attention, kw["context_len"]) in oom:
            raise torch.cuda.OutOfMemoryError("out of memory")
        return gpt.TrainResult(config={"c": 1}, losses=[3.0, 2.0], tokens_per_s=1e3,
                               peak_memory_bytes=2**30)  # fmt: skip

    monkeypatch.setattr(apps, "_require_cuda", lambda what: None)
    monkeypatch.setattr(gpt, "train", train)
    return calls


def test_apps_train_runs_each_attention_in_bf16_then_fp32(monkeypatch):
    torch = pytest.importorskip("torch")
    calls = _fake_train(monkeypatch)
    rows = apps.train_runs(steps=2, log=lambda *a: None)
    assert [(a, kw["amp_dtype"]) for a, kw in calls] == [
        ("flash", torch.bfloat16),
        ("standard", torch.bfloat16),
        ("sdpa", torch.bfloat16),
        ("flash", None),
        ("standard", None),
    ]
    assert [r["attention"] for r in rows] == ["flash", "standard", "sdpa", "flash", "standard"]
    assert all(kw["n_layer"] == 6 and kw["n_embd"] == 384 and kw["steps"] == 2 for _, kw in calls)


def test_apps_context_runs_record_out_of_memory(monkeypatch):
    _fake_train(monkeypatch, oom={("standard", 512)})
    logged = []
    rows = apps.context_runs(contexts=(256, 512), log=logged.append)
    assert [(r["attention"], r["context_len"], r["batch_size"]) for r in rows] == [
        (a, c, 4) for c in (256, 512) for a in ("flash", "standard", "sdpa")
    ]
    oom = rows[4]
    assert oom["note"] == "OOM" and oom["tokens_per_s"] is None
    assert rows[0]["tokens_per_s"] == 1e3 and rows[0]["final_loss"] == 2.0
    assert logged[0] == "T=256 flash: 1,000 tok/s 1.00 GiB" and logged[4] == "OOM"


def test_apps_decode_runs_llama_shapes(monkeypatch):
    seen = []

    def bench(contexts, batch, heads, kv_heads, head_dim):
        seen.append((heads, kv_heads, head_dim))
        return [{"context": 1024, "impl": "x", "ms": 0.5, "gb_per_s": 10.0, "host_us": 3.0,
                 "note": None}]  # fmt: skip

    monkeypatch.setattr(apps, "_require_cuda", lambda what: None)
    monkeypatch.setattr(apps, "decode_benchmark", bench)
    logged = []
    rows = apps.decode_runs(contexts=(1024,), log=logged.append)
    assert seen == [(32, 8, 128), (32, 32, 128)]
    assert [r["model"] for r in rows] == ["Llama-3-8B shape", "Llama-2-7B shape"]
    assert "   500.0 us" in logged[0]  # ms shown in microseconds


def _paged_rows():
    """Batch 1 and 4, one context each; paged graph times 1.5x / 1.25x the contiguous one."""
    rows = []
    for b, n, base_us, gbps, err in ((1, 2048, 10.0, 500.0, 1e-4), (4, 1024, 20.0, 800.0, 3e-3)):
        rows.append({"batch": b, "context": n, "impl": "flash_decode_cudagraph", "page_size": None,
                     "us": base_us, "gb_per_s": 2 * gbps, "host_us": 5.0})  # fmt: skip
        for p, f in ((16, 1.5), (64, 1.25)):
            for impl, us, host in (
                ("flash_decode_paged_cudagraph", base_us * f, 4.0),
                ("flash_decode_paged", 50.0, 70.0 + p),
            ):
                rows.append({"batch": b, "context": n, "impl": impl, "page_size": p, "us": us,
                             "gb_per_s": gbps + p, "host_us": host,
                             "max_abs_err_vs_flash_decode": err})  # fmt: skip
    return rows


def test_paged_summary_numbers():
    from course_kernels.apps.paged_runs import summary

    text, table = summary(_paged_rows(), copy_bandwidth=2e12)
    # the largest cache: batch 4 x 1,024 tokens (4,096) beats batch 1 x 2,048; pages of 16 first
    assert "At batch 4 and 1,024 tokens per sequence it read the cache at 816 GB/s" in text
    assert "pages of 16 (41% of the measured copy bandwidth)" in text  # 816e9 / 2e12
    assert "against 1,600 GB/s for the contiguous cache" in text
    assert "one paged step cost 86 to 134 us of host time" in text
    assert "differed from the contiguous kernel's by at most 3.0e-03" in text
    assert table[0] == [1, "2,048", 16, "10.0", "15.0", "1.50", "516"]


def test_host_path_captures_graphs_with_this_checkouts_measure_module():
    """experiments/hopper/host_path.py times CUDA-graph replays with ``apps.measure._graphed``
    loaded from its own checkout by path (its ``--baseline`` child imports another checkout's
    package, which may predate ``apps.measure``): the same function, whatever package the
    process imports."""
    import importlib.util
    import inspect
    from pathlib import Path

    from course_kernels.apps import measure

    path = Path(__file__).resolve().parents[1] / "experiments" / "hopper" / "host_path.py"
    spec = importlib.util.spec_from_file_location("host_path_for_test", path)
    host_path = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(host_path)
    loaded = host_path._this_checkouts_measure()
    assert Path(loaded.__file__).parts[-3:] == ("course_kernels", "apps", "measure.py")
    assert inspect.getsource(loaded._graphed) == inspect.getsource(measure._graphed)
