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
