"""Split-KV decoding on the GPU: the benchmark's rows are complete and its kernels correct."""

import math

import pytest

torch = pytest.importorskip("torch")


def test_decode_benchmark_rows():
    from course_kernels.apps import runs as apps

    rows = apps.decode_benchmark(contexts=(256, 2048), heads=8, kv_heads=2, head_dim=64)
    impls = {r["impl"] for r in rows}
    assert {
        "flash_decode",
        "flash_decode_splits1",
        "flash_decode_cudagraph",
        "flash_attention_fwd",
        "sdpa_math",
    } <= impls
    for r in rows:
        if r["ms"] is None:  # a backend that refused the shape says why
            assert r["note"].startswith("not run")
            continue
        assert r["ms"] > 0 and math.isfinite(r["gb_per_s"]) and r["gb_per_s"] > 0
        assert r["host_us"] > 0
        if r["impl"] in ("flash_decode", "flash_decode_splits1"):
            assert r["max_abs_err_vs_sdpa"] < 1e-2
            assert r["num_splits"] >= 1
    assert [r["num_splits"] for r in rows if r["impl"] == "flash_decode_splits1"] == [1, 1]


def test_flash_decode_is_graph_capturable():
    """The default path never waits for the GPU: capturing it in a CUDA graph would fail if it
    did (a host sync is illegal during capture). The replay gives the same numbers."""
    from course_kernels.serving import decode

    torch.manual_seed(0)
    q = torch.randn(2, 8, 1, 64, device="cuda", dtype=torch.float16)
    k, v = (torch.randn(2, 2, 3000, 64, device="cuda", dtype=torch.float16) for _ in range(2))
    want = decode.flash_decode(q, k, v)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = decode.flash_decode(q, k, v)
    q.copy_(torch.randn_like(q))  # new query, same buffers: the replay must follow it
    graph.replay()
    torch.cuda.synchronize()
    assert torch.allclose(got, decode.flash_decode(q, k, v), atol=0, rtol=0)
    assert not torch.allclose(got, want, atol=1e-3)


def test_paged_decode_benchmark_rows():
    from course_kernels.apps.paged_runs import paged_decode_benchmark

    rows = paged_decode_benchmark(
        contexts=(1000,), batches=(2,), page_sizes=(16, 64), log=lambda *a: None
    )
    impls = {(r["page_size"], r["impl"]) for r in rows}
    assert (None, "flash_decode_cudagraph") in impls
    assert {(16, "flash_decode_paged_cudagraph"), (64, "flash_decode_paged")} <= impls
    for r in rows:
        assert r["us"] > 0 and r["gb_per_s"] > 0 and r["host_us"] > 0
        if r["page_size"] is not None:
            assert r["max_abs_err_vs_flash_decode"] < 1e-2


def test_flash_decode_paged_is_graph_capturable():
    """check_table=False waits for nothing: the step captures in a CUDA graph and replays."""
    from course_kernels.serving.paged_decode import flash_decode_paged

    torch.manual_seed(0)
    q = torch.randn(2, 8, 1, 64, device="cuda", dtype=torch.float16)
    kp, vp = (torch.randn(40, 16, 2, 64, device="cuda", dtype=torch.float16) for _ in range(2))
    table = torch.randperm(40, device="cuda", dtype=torch.int32)[:38].view(2, 19)
    lens = torch.tensor([300, 17], device="cuda", dtype=torch.int32)
    want = flash_decode_paged(q, kp, vp, table, lens)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = flash_decode_paged(q, kp, vp, table, lens, check_table=False)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.allclose(got, want, atol=0, rtol=0)
