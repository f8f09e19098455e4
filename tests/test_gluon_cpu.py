"""The Gluon rung on a machine without Hopper (CI): it imports anywhere, says why it cannot run,
and rejects unsupported inputs with a message that says what was given."""

import json

import pytest

torch = pytest.importorskip("torch")

from course_kernels.datafiles import data_path  # noqa: E402
from course_kernels.gluon import launch as G  # noqa: E402


def test_imports_and_reports_availability():
    assert G.GLUON_TRITON_VERSION == "3.6"
    assert isinstance(G.gluon_available(), bool)


def test_unavailable_on_another_triton_version(monkeypatch):
    import triton

    monkeypatch.setattr(triton, "__version__", "3.5.1")
    assert G._triton_version_ok() is False
    assert G.gluon_available() is False
    if G.HAVE_GLUON:
        assert "3.5.1" in G.why_unavailable() and "3.6" in G.why_unavailable()


def test_the_pinned_version_is_accepted(monkeypatch):
    import triton

    monkeypatch.setattr(triton, "__version__", "3.6.0")
    assert G._triton_version_ok() is True


def test_clear_error_when_unavailable():
    if G.gluon_available():
        pytest.skip("Gluon is available here")
    q = torch.randn(1, 2, 16, 64, dtype=torch.float16)
    with pytest.raises(RuntimeError, match="unavailable"):
        G.gluon_attention_forward(q, q, q)


@pytest.mark.parametrize(
    "shapes, dtype, match",
    [
        (((1, 2, 16, 96), (1, 2, 16, 96)), torch.float16, "head dim 96"),
        (
            ((1, 2, 16, 64), (1, 2, 16, 64)),
            torch.float32,
            "float16 or all bfloat16, got torch.float32",
        ),
        (((1, 3, 16, 64), (1, 2, 16, 64)), torch.float16, "multiple of K/V heads"),
        (((1, 2, 16, 64), (1, 2, 17, 64)), torch.float16, "need same B, N, d"),
        (((2, 16, 64), (2, 16, 64)), torch.float16, "4-D"),
    ],
)
def test_unsupported_inputs_are_rejected_before_anything_runs(shapes, dtype, match):
    q = torch.randn(*shapes[0], dtype=dtype)
    k = torch.randn(*shapes[1], dtype=dtype)
    with pytest.raises(ValueError, match=match):
        G.gluon_attention_forward(q, k, k.clone())


def test_the_forward_choice_is_read_from_the_environment(monkeypatch):
    from course_kernels.triton import launch

    q = torch.randn(1, 2, 16, 64, dtype=torch.float16)
    monkeypatch.setenv(launch.FORWARD_ENV, "triton")
    assert launch._use_gluon(q, q) is False
    monkeypatch.setenv(launch.FORWARD_ENV, "cudnn")
    with pytest.raises(ValueError, match="auto, gluon, triton"):
        launch._use_gluon(q, q)
    monkeypatch.delenv(launch.FORWARD_ENV)
    assert launch._use_gluon(q, q) is False  # auto: CPU tensors never take the Gluon kernel
    if not G.gluon_available():
        monkeypatch.setenv(launch.FORWARD_ENV, "gluon")
        with pytest.raises(RuntimeError, match="gluon"):
            launch._use_gluon(q, q)


def test_the_backward_choice_is_read_from_the_environment(monkeypatch):
    from course_kernels.triton import launch

    q = torch.randn(1, 2, 16, 64, dtype=torch.float16)
    kv = torch.randn(1, 1, 16, 64, dtype=torch.float16)  # GQA: the Gluon backward refuses it
    monkeypatch.delenv(launch.BACKWARD_ENV, raising=False)
    monkeypatch.setattr(launch, "gluon_available", lambda: True)
    monkeypatch.setattr(launch, "INTERPRET", False)
    monkeypatch.setattr(launch, "_gluon_fits", lambda q, k: True)
    monkeypatch.setattr(launch, "_gluon_pays", lambda q, k: True)
    assert launch._use_gluon(q, q) is True  # the forward's auto, everything else equal
    assert launch._use_gluon(q, q, backward=True) is launch.GLUON_BACKWARD_AUTO
    monkeypatch.setattr(launch, "GLUON_BACKWARD_AUTO", True)
    assert launch._use_gluon(q, q, backward=True) is True
    assert launch._use_gluon(q, kv, backward=True) is False  # auto: GQA keeps the tl backward
    monkeypatch.setenv(launch.BACKWARD_ENV, "triton")
    assert launch._use_gluon(q, q, backward=True) is False
    assert launch._use_gluon(q, q) is True  # the forward's variable is another one
    monkeypatch.setenv(launch.BACKWARD_ENV, "gluon")
    assert launch._use_gluon(q, q, backward=True) is True
    with pytest.raises(ValueError, match="as many K/V heads as query heads; got .* 2 query and 1"):
        launch._use_gluon(q, kv, backward=True)
    monkeypatch.setenv(launch.BACKWARD_ENV, "fa3")
    with pytest.raises(ValueError, match="COURSE_KERNELS_BACKWARD='fa3'.*auto, gluon, triton"):
        launch._use_gluon(q, q, backward=True)


def test_the_backward_hands_the_gluon_kernel_the_natural_log_lse(monkeypatch):
    """Where the backward choice says Gluon, ``_backward_c`` returns what the Gluon backward
    returns, given the lse in natural-log units and the causal flag; masks it does not take
    (windows, bottom-right, ALiBi, varlen) never ask for it."""
    from course_kernels.triton import launch
    from course_kernels.triton.masks import CAUSAL, PLAIN, Variant

    asked, calls = [], []
    monkeypatch.setattr(launch, "_use_gluon", lambda q, k, backward=False: asked.append(1) or True)

    def fake(do, q, k, v, o, lse, causal, scale):
        calls.append((lse, causal, scale))
        return "dq", "dk", "dv"

    monkeypatch.setattr(launch, "gluon_attention_backward", fake)
    q, k, v, o, do = (torch.randn(1, 2, 8, 64) for _ in range(5))
    lse_c = torch.randn(1, 2, 8)
    for variant in (PLAIN, CAUSAL):
        assert launch._backward_c(do, q, k, v, o, lse_c, variant, 0.3) == ("dq", "dk", "dv")
        lse, causal, scale = calls[-1]
        assert torch.equal(lse, lse_c * variant.units(0.3)[1]) and causal is variant.causal
        assert scale == 0.3
    assert len(asked) == 2
    window = Variant(causal=True, window=(4, 0))
    dq, dk, dv = launch._backward_c(do, q, k, v, o, lse_c, window, 0.3)  # the tl kernels
    assert len(asked) == 2 and len(calls) == 2 and dq.shape == q.shape


def test_auto_takes_the_gluon_forward_only_from_gluon_min_work():
    """The measured rule (course_kernels/data/gluon/h200_dispatch.json): at B = 4, H x d = 2048
    the Gluon forward's host path loses up to N = 2K and wins from N = 4K."""
    from course_kernels.triton import launch

    def pays(b, h, n_q, n_k, d):
        q = torch.empty(b, h, n_q, d, device="meta")
        return launch._gluon_pays(q, torch.empty(b, h, n_k, d, device="meta"))

    assert not pays(4, 32, 2048, 2048, 64) and not pays(4, 16, 2048, 2048, 128)
    assert pays(4, 32, 4096, 4096, 64) and pays(4, 16, 4096, 4096, 128)
    assert pays(1, 1, 1, 1, launch.GLUON_MIN_WORK) and not pays(
        1, 1, 1, 1, launch.GLUON_MIN_WORK - 1
    )
    assert pays(1, 8, 1 << 13, 1 << 14, 64)  # 2**36 with Nk = 2 Nq (Nq * Nq would be 2**35)
    rows = json.loads(data_path("gluon/h200_dispatch.json").read_text())["rows"]
    assert {r["N"] for r in rows} == {512, 1024, 2048, 4096}
    for n in (512, 1024, 4096):  # N = 2K is split; the rule gives it the tl forward
        at_n = [r for r in rows if r["N"] == n]
        won = sum(r["gluon_ms"] < r["triton_ms"] for r in at_n)
        taken = {pays(r["batch"], r["heads"], n, n, r["d"]) for r in at_n}
        assert taken == {n == 4096}
        assert won == len(at_n) if n == 4096 else won <= len(at_n) // 4, (n, won)


def test_causal_calls_add_the_causal_schedule_and_overrides_win():
    """schedule_config: DEFAULT_CONFIG[d], plus CAUSAL_CONFIG[d] for causal calls without
    overrides; with overrides, exactly the caller's schedule (the lever experiments and tests)."""
    from course_kernels.gluon import launch

    for d in launch.DEFAULT_CONFIG:
        assert launch.schedule_config(d, False) == launch.DEFAULT_CONFIG[d]
        causal = launch.schedule_config(d, True)
        assert causal == {**launch.DEFAULT_CONFIG[d], **launch.CAUSAL_CONFIG[d]}
        assert causal["SKIP_DEAD"] is True
        assert launch.schedule_config(d, True, SKIP_DEAD=False)["SKIP_DEAD"] is False
        assert launch.schedule_config(d, False, STAGES=4)["STAGES"] == 4
        # another lever: exactly the caller's schedule, without the causal switches
        assert (
            launch.schedule_config(d, True, 1) == launch.DEFAULT_CONFIG[d]
        )  # no switches at N = 1
        with pytest.raises(ValueError, match="N = 1"):
            launch.schedule_config(d, True, 1, SKIP_DEAD=True)
        lpt = launch.schedule_config(d, True, LPT=True)
        assert lpt == {**launch.DEFAULT_CONFIG[d], "LPT": True} and "SKIP_DEAD" not in lpt
    assert launch.CAUSAL_CONFIG[64]["ALIGN_END"] and "ALIGN_END" not in launch.CAUSAL_CONFIG[128]
    assert launch.DEFAULT_CONFIG[64].get("SKIP_DEAD", False) is False  # non-causal: unchanged
