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
