"""The Gluon rung on a machine without Hopper (CI): it imports anywhere, says why it cannot run,
and rejects unsupported inputs with a message that says what was given."""

import itertools
import json
import types
from pathlib import Path

import numpy as np

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
        (
            ((1, 2, 16, 96), (1, 2, 16, 96)),
            torch.float16,
            "head dim 96 not supported .64, 128 or 256",
        ),
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
    kv = torch.randn(1, 1, 16, 64, dtype=torch.float16)  # GQA: auto leaves it to tl
    monkeypatch.delenv(launch.BACKWARD_ENV, raising=False)
    monkeypatch.setattr(launch, "gluon_available", lambda: True)
    monkeypatch.setattr(launch, "INTERPRET", False)
    monkeypatch.setattr(launch, "_gluon_fits", lambda q, k, dims: True)
    monkeypatch.setattr(launch, "_gluon_pays", lambda q, k: True)
    assert launch._use_gluon(q, q) is True  # the forward's auto, everything else equal
    assert launch.GLUON_BACKWARD_AUTO == (64, 128)  # measured: session 10 (64), 12 (128)
    assert launch._use_gluon(q, q, backward=True) is True
    q128 = torch.randn(1, 2, 16, 128, dtype=torch.float16)
    assert launch._use_gluon(q128, q128, backward=True) is True
    monkeypatch.setattr(launch, "GLUON_BACKWARD_AUTO", (64,))
    assert launch._use_gluon(q128, q128, backward=True) is False  # auto follows the tuple
    assert launch._use_gluon(q128, q128) is True  # the forward's auto takes both
    assert launch.GLUON_BACKWARD_GQA is True  # timed in session 20: 1.08-1.24x the tl backward
    assert launch._use_gluon(q, kv, backward=True) is True  # auto: GQA takes the Gluon backward
    monkeypatch.setattr(launch, "GLUON_BACKWARD_GQA", False)  # the switch off: tl
    assert launch._use_gluon(q, kv, backward=True) is False
    monkeypatch.setenv(launch.BACKWARD_ENV, "gluon")  # asked for: GQA runs the Gluon backward
    assert launch._use_gluon(q, kv, backward=True) is True
    q3 = torch.randn(1, 3, 16, 64, dtype=torch.float16)  # 3 query heads over 2 K/V heads
    with pytest.raises(ValueError, match="3 query and 2 K/V heads"):
        launch._use_gluon(q3, torch.randn(1, 2, 16, 64), backward=True)
    monkeypatch.delenv(launch.BACKWARD_ENV)
    # the Gluon backward's dQ atomics are not bit-reproducible: deterministic mode keeps tl
    monkeypatch.setattr(torch, "are_deterministic_algorithms_enabled", lambda: True)
    assert launch._use_gluon(q, q, backward=True) is False
    assert launch._use_gluon(q, q) is True  # the forward is deterministic either way
    monkeypatch.setenv(launch.BACKWARD_ENV, "gluon")
    assert launch._use_gluon(q, q, backward=True) is True  # asked for by name: it runs
    monkeypatch.setattr(torch, "are_deterministic_algorithms_enabled", lambda: False)
    monkeypatch.delenv(launch.BACKWARD_ENV)
    monkeypatch.setenv(launch.BACKWARD_ENV, "triton")
    assert launch._use_gluon(q, q, backward=True) is False
    assert launch._use_gluon(q, q) is True  # the forward's variable is another one
    monkeypatch.setenv(launch.BACKWARD_ENV, "gluon")
    assert launch._use_gluon(q, q, backward=True) is True
    assert launch._use_gluon(q, kv, backward=True) is True  # GQA, asked for by name
    monkeypatch.setenv(launch.BACKWARD_ENV, "fa3")
    with pytest.raises(ValueError, match="COURSE_KERNELS_BACKWARD='fa3'.*auto, gluon, triton"):
        launch._use_gluon(q, q, backward=True)


def test_the_backward_hands_the_gluon_kernel_the_natural_log_lse(monkeypatch):
    """Where the backward choice says Gluon, ``_backward_c`` returns what the Gluon backward
    returns, given the lse in natural-log units, the causal flag and (session 14) a causal
    window's left side, asking the choice whether a window backward may run there; masks it does
    not take (a window of one key, two-sided windows, softcap, ALiBi, varlen) never ask for it."""
    from course_kernels.triton import launch
    from course_kernels.triton.masks import CAUSAL, PLAIN, Variant

    asked, calls = [], []

    def use(q, k, backward=False, mask=""):
        asked.append(mask)
        return True

    def fake(do, q, k, v, o, lse, causal, scale, window_left=None):
        calls.append((lse, causal, scale, window_left))
        return "dq", "dk", "dv"

    monkeypatch.setattr(launch, "_use_gluon", use)
    monkeypatch.setattr(launch, "gluon_attention_backward", fake)
    q, k, v, o, do = (torch.randn(1, 2, 8, 64) for _ in range(5))
    lse_c = torch.randn(1, 2, 8)
    cases = [(PLAIN, False, None), (CAUSAL, True, None)]
    cases += [(Variant(causal=True, window=(4, 0)), True, 4)]
    for variant, want_causal, want_left in cases:
        assert launch._backward_c(do, q, k, v, o, lse_c, variant, 0.3) == ("dq", "dk", "dv")
        lse, causal, scale, left = calls[-1]
        assert torch.equal(lse, lse_c * variant.units(0.3)[1]) and causal is want_causal
        assert scale == 0.3 and left == want_left
    assert asked == ["", "", "window"]
    for variant in (
        Variant(causal=True, window=(0, 0)),  # one key a row: tl's exact closed form
        Variant(causal=False, window=(4, 4)),  # two-sided
        Variant(causal=True, softcap=30.0),
    ):
        dq, dk, dv = launch._backward_c(do, q, k, v, o, lse_c, variant, 0.3)  # the tl kernels
        assert len(asked) == 3 and len(calls) == 3 and dq.shape == q.shape


def test_head_dim_256_autos_in_the_forward_only(monkeypatch):
    """d = 256 (FA3's shape: two consumers, K/V blocks of 64 keys, one Q stage) passes its GPU
    tests and ran at 1.66-1.87x the tl forward on an H100 (data/gluon/h100_d256_session21_tl.json):
    ``auto`` and ``$COURSE_KERNELS_FORWARD=gluon`` take it, ``$...=triton`` does not, and the Gluon
    backward (d = 64 or 128) never does."""
    from types import SimpleNamespace

    from course_kernels.triton import launch

    def t(d, is_cuda=True, dtype=torch.float16):  # what _gluon_fits reads of a tensor
        return SimpleNamespace(is_cuda=is_cuda, dtype=dtype, shape=(1, 2, 16, d))

    assert launch._gluon_fits(t(256), t(256), launch.GLUON_FORWARD_DIMS)
    assert not launch._gluon_fits(t(256), t(256), launch.GLUON_BACKWARD_DIMS)
    assert not launch._gluon_fits(t(96), t(96), launch.GLUON_FORWARD_DIMS)
    assert not launch._gluon_fits(t(256, False), t(256), launch.GLUON_FORWARD_DIMS)
    assert not launch._gluon_fits(t(256, True, torch.float32), t(256), launch.GLUON_FORWARD_DIMS)
    monkeypatch.setattr(launch, "INTERPRET", False)
    monkeypatch.setattr(launch, "gluon_available", lambda: True)
    monkeypatch.setattr(launch, "_gluon_pays", lambda q, k: True)
    monkeypatch.setattr(launch, "_gluon_fits", lambda q, k, dims: q.shape[3] in dims)
    q = {d: torch.empty(1, 2, 16, d, device="meta") for d in (64, 128, 256)}
    for env in (launch.FORWARD_ENV, launch.BACKWARD_ENV):
        monkeypatch.delenv(env, raising=False)
    assert [launch._use_gluon(q[d], q[d]) for d in (64, 128, 256)] == [True, True, True]
    assert launch._use_gluon(q[256], q[256], backward=True) is False
    monkeypatch.setenv(launch.FORWARD_ENV, "gluon")
    assert launch._use_gluon(q[256], q[256]) is True
    monkeypatch.setenv(launch.FORWARD_ENV, "triton")
    assert launch._use_gluon(q[256], q[256]) is False
    monkeypatch.setenv(launch.BACKWARD_ENV, "gluon")
    with pytest.raises(ValueError, match=r"d in \(64, 128\).*d = 256"):
        launch._use_gluon(q[256], q[256], backward=True)


def test_head_dim_256_schedule_fits_hoppers_shared_memory():
    """The d = 256 schedule's Q stages and K/V ring (the buffers forward.py allocates) fit the
    227 KiB of shared memory a Hopper CTA may use; d = 128's two Q stages would not."""
    for causal in (False, True):
        cfg = G.schedule_config(256, causal, 4096)
        q_bytes = cfg["QSTAGES"] * cfg["NUM_CONSUMERS"] * 64 * 256 * 2
        kv_bytes = 2 * cfg["STAGES"] * cfg["BN"] * 256 * 2
        assert q_bytes + kv_bytes <= 227 * 1024, cfg
        assert 2 * q_bytes + kv_bytes > 227 * 1024  # a second Q stage (d = 128's) would not
    assert G.schedule_config(256, True, 4096)["SKIP_DEAD"] is True
    assert "ROW_MASK" not in G.schedule_config(256, True, 4096, window=True)


@pytest.mark.parametrize("mask", ["window", "documents"])
def test_masked_backwards_run_only_at_their_listed_dims(monkeypatch, mask):
    """A causal window's or packed documents' Gluon backward runs only at the head dims that
    GLUON_MASKED_BACKWARD lists for it, under ``auto`` and ``gluon`` alike (elsewhere the tl
    backward, whatever the choice); plain and causal ones follow GLUON_BACKWARD_AUTO under
    ``auto``; ``triton`` and deterministic mode never."""
    from course_kernels.triton import launch

    monkeypatch.setattr(launch, "INTERPRET", False)
    monkeypatch.setattr(launch, "_gluon_fits", lambda q, k, dims: True)
    monkeypatch.setattr(launch, "gluon_available", lambda: True)
    q = torch.empty(1, 1, 1 << 12, 64, device="meta")
    k = torch.empty(1, 1, 1 << 24, 64, device="meta")  # enough work for GLUON_MIN_WORK
    for choice in ("auto", "gluon"):
        monkeypatch.setenv(launch.BACKWARD_ENV, choice)
        for dims in ((), (128,), (64,)):
            monkeypatch.setitem(launch.GLUON_MASKED_BACKWARD, mask, dims)
            assert launch._use_gluon(q, k, True, mask) is (64 in dims)
            plain = choice == "gluon" or 64 in launch.GLUON_BACKWARD_AUTO
            assert launch._use_gluon(q, k, True) is plain
        torch.use_deterministic_algorithms(True)
        try:
            assert not launch._use_gluon(q, k, True, mask)
        finally:
            torch.use_deterministic_algorithms(False)
    monkeypatch.setenv(launch.BACKWARD_ENV, "triton")
    assert not launch._use_gluon(q, k, True, mask)


@pytest.mark.parametrize(
    "pass_, files, masks",
    [
        ("bwd", "masked_bwd", (("document", "documents"),)),
        ("bwd", "session16_window_bwd", (("window", "window"),)),
        ("fwd", "docs_fwd", (("document", "documents"),)),
    ],
)
def test_masked_dims_are_where_the_measurement_chose_gluon(pass_, files, masks):
    """GLUON_MASKED_BACKWARD (_FORWARD) lists a (mask, d) exactly where the Gluon kernel beat the
    tl one by at least 3% against FlexAttention in every row (two H100 runs each, Flex in each
    process): backward documents at d = 64 and 128 (session 15); the window at d = 128 only
    (session 16, after its one-compare mask; d = 64 lost at two N of three); forward documents at
    d = 128 (d = 64 lost 6%)."""
    from course_kernels.bench import features
    from course_kernels.triton import launch

    names = {"gluon": f"bench/h100_features_bench_{files}_gluon.json",
             "tl": f"bench/h100_features_bench_{files}_tl.json"}  # fmt: skip
    runs = {name: json.loads(data_path(path).read_text()) for name, path in names.items()}
    side = "backward" if pass_ == "bwd" else "forward"
    assert {m for _, m in masks} <= set(runs["gluon"]["args"][f"gluon_masked_{side}"])
    assert not runs["tl"]["args"].get(f"gluon_masked_{side}")
    table = getattr(launch, f"GLUON_MASKED_{side.upper()}")
    ratio = {
        (name, r["mask"], r["d"], r["n"]): r["ratio"]
        for name, rec in runs.items()
        for r in features.comparisons(rec, "flex")
        if r["pass"] == pass_
    }
    for mask, key in masks:
        chosen = []
        for d in (64, 128):
            ns = sorted(n for name, m, dd, n in ratio if (name, m, dd) == ("tl", mask, d))
            assert len(ns) >= 1 and all(("gluon", mask, d, n) in ratio for n in ns)
            if all(ratio["gluon", mask, d, n] >= 1.03 * ratio["tl", mask, d, n] for n in ns):
                chosen.append(d)
        assert tuple(chosen) == table[key], (mask, chosen)


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
    overrides (NONCAUSAL_CONFIG[d] for the others); with overrides, exactly the caller's schedule (the lever experiments and tests)."""
    from course_kernels.gluon import launch

    for d in launch.DEFAULT_CONFIG:
        full = launch.schedule_config(d, False)
        assert full == {**launch.DEFAULT_CONFIG[d], **launch.NONCAUSAL_CONFIG[d]}
        assert full.get("PINGPONG", False) is (d == 64)  # session 12: ping-pong at d = 64 only
        assert launch.schedule_config(d, False, 1) == launch.DEFAULT_CONFIG[d]
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


def test_defer_is_the_d64_causal_default_where_a_head_has_few_tiles():
    """Session 29 (an H100, h100_fwd_defer_session29_*): each head's 6 lightest tiles last
    (DEFER) gained at N = 4K (22 tiles of 192 rows a head) in every process and was mixed at
    8K, so the default takes it up to DEFER_MAX_TILES tiles only; causal d = 64 only, no window,
    no documents; a caller's override is kept at any N (the experiments)."""
    from course_kernels.gluon import launch

    assert launch.DEFER_MAX_TILES == 22 and launch.CAUSAL_CONFIG[64]["DEFER"] == 6
    for n in (2, 192, 3000, 4096, 22 * 192):
        assert launch.schedule_config(64, True, n)["DEFER"] == 6, n
    for n in (22 * 192 + 1, 8192, 16384):
        assert "DEFER" not in launch.schedule_config(64, True, n), n
    assert "DEFER" not in launch.schedule_config(64, True, 4096, window=True)
    assert "DEFER" not in launch.schedule_config(64, True, 4096, docs=True)
    for d in (128, 256):
        assert "DEFER" not in launch.schedule_config(d, True, 4096)
    for d in launch.DEFAULT_CONFIG:
        assert "DEFER" not in launch.schedule_config(d, False, 4096)
    assert launch.schedule_config(64, True, 16384, DEFER=4)["DEFER"] == 4
    assert "DEFER" in launch.SCHEDULE_KEYS


def test_lpt_section_fits_the_budget_in_powers_of_two_of_kv_heads():
    """Session 9: heads per section of the sectioned LPT order (FA3's L2-sized sections)."""
    from course_kernels.gluon.launch import lpt_section

    mib = 2**20
    # d = 64, N = 4K, fp16: 1 MiB of K and V per K/V head; 16 MiB -> 16 heads
    assert lpt_section(4096, 64, 1, 128, 2, 16) == 16
    assert lpt_section(8192, 64, 1, 128, 2, 16) == 8
    assert lpt_section(16384, 128, 1, 64, 2, 16) == 2
    assert lpt_section(4096, 64, 1, 128, 2, 12) == 8  # 12 heads fit: rounded down to 8
    assert lpt_section(4096, 64, 1, 128, 2, 0.25) == 1  # less than one head: still one
    assert lpt_section(4096, 64, 4, 128, 2, 16) == 64  # GQA: 16 K/V heads x 4 query heads
    assert lpt_section(1000, 64, 1, 10, 2, 1) == 4  # 256,000 B per head: 4 fit in 1 MiB
    assert lpt_section(200, 64, 2, 4, 2, 16) == 4  # never more than B x H
    for n, d, g, bh, mb in [(4096, 64, 1, 128, 16), (777, 128, 2, 48, 3), (64, 64, 1, 9, 1)]:
        s = lpt_section(n, d, g, bh, 2, mb)
        kv = s // g
        assert s % g == 0 or s == bh
        if s < bh:
            assert kv & (kv - 1) == 0  # a power of two of K/V heads
            assert kv == 1 or kv * 2 * n * d * 2 <= mb * mib < 2 * kv * 2 * n * d * 2


def _order(section, num_pid_m, n_hz, causal=True, defer=0):
    from course_kernels.gluon import scheduler

    if not scheduler.HAVE_GLUON:
        pytest.skip("triton.experimental.gluon not importable here")
    fn = scheduler._tile_coords.fn  # the kernel's own code, run on Python ints
    lpt = section is not None
    return [
        fn(t, num_pid_m, num_pid_m * n_hz, causal, lpt, section or 0, defer)
        for t in range(num_pid_m * n_hz)
    ]


@pytest.mark.parametrize("defer, num_pid_m, n_hz", [(4, 22, 128), (1, 5, 3), (2, 3, 7), (6, 43, 9)])
def test_deferred_order_ends_on_every_heads_lightest_tiles(defer, num_pid_m, n_hz):
    """DEFER (session 29): every tile exactly once; first each head's other tiles, head after
    head, heaviest first (the head-major order without them); then the `defer` lightest tiles
    of every head (pid_m < defer), the heaviest of them first, heads innermost. A wrong split
    point, a swapped index or a light-first tail fails here."""
    order = _order(None, num_pid_m, n_hz, defer=defer)
    assert sorted(order) == [(m, h) for m in range(num_pid_m) for h in range(n_hz)]
    lead = (num_pid_m - defer) * n_hz
    assert order[:lead] == [(m, h) for h in range(n_hz) for m in reversed(range(defer, num_pid_m))]
    assert order[lead:] == [(m, h) for m in reversed(range(defer)) for h in range(n_hz)]
    assert _order(None, num_pid_m, n_hz, defer=0) == _order(None, num_pid_m, n_hz)


@pytest.mark.parametrize(
    "section, num_pid_m, n_hz",
    [(4, 22, 128), (16, 22, 128), (4, 5, 10), (3, 7, 8), (8, 4, 8), (16, 3, 5), (1, 6, 4)],
)
def test_sectioned_lpt_order_is_heaviest_first_within_l2_sections(section, num_pid_m, n_hz):
    """Every tile exactly once; the heads in consecutive sections of `section` heads (the last
    may hold fewer); within a section the heaviest query blocks (largest pid_m under causal
    masking) of all its heads first, heads innermost: exactly FA3's order."""
    order = _order(section, num_pid_m, n_hz)
    assert sorted(order) == [(m, h) for m in range(num_pid_m) for h in range(n_hz)]
    expect = []
    for first in range(0, n_hz, section):
        heads = range(first, min(first + section, n_hz))
        expect += [(m, h) for m in reversed(range(num_pid_m)) for h in heads]
    assert order == expect


def test_lpt_order_without_sections_and_head_major_order_are_unchanged():
    npm, n_hz = 5, 6
    assert _order(None, npm, n_hz) == [(npm - 1 - t % npm, t // npm) for t in range(npm * n_hz)]
    assert _order(None, npm, n_hz, causal=False) == [(t % npm, t // npm) for t in range(npm * n_hz)]
    assert _order(0, npm, n_hz) == [(npm - 1 - t // n_hz, t % n_hz) for t in range(npm * n_hz)]
    # one section holding every head is the all-heads LPT order
    assert _order(n_hz, npm, n_hz) == _order(0, npm, n_hz)


def test_session9_levers_are_the_d128_causal_default_and_overrides_replace_them():
    """Measured in session 10: causal calls at d = 128 take the sectioned LPT order (8 MiB) and
    ROW_MASK; d = 64 and non-causal calls keep the session-8 schedule; an override still gives
    exactly the caller's schedule."""
    from course_kernels.gluon import launch

    causal = launch.schedule_config(128, True, 4096)
    assert causal["LPT"] and causal["LPT_SECTION_MB"] == 8 and causal["ROW_MASK"]
    assert causal["SKIP_DEAD"]
    for d, c in ((64, True), (64, False), (128, False)):
        cfg = launch.schedule_config(d, c, 4096)
        assert not cfg.get("ROW_MASK") and not cfg.get("LPT_SECTION_MB") and not cfg["LPT"]
    for d in launch.DEFAULT_CONFIG:
        off = launch.schedule_config(d, True, 4096, ROW_MASK=False)
        assert not off["ROW_MASK"] and not off.get("LPT_SECTION_MB") and not off["LPT"]
        cfg = launch.schedule_config(d, True, 4096, LPT=True, LPT_SECTION_MB=16, ROW_MASK=True)
        assert cfg["LPT"] and cfg["LPT_SECTION_MB"] == 16 and cfg["ROW_MASK"]


def test_sweep_forward_script_adds_a_variant_to_the_rows_default_and_checks_it():
    """experiments/gluon/sweep_forward.py (session 22): a variant's overrides keep the row's
    default switches (``gluon_attention_forward`` replaces them when given any), '0' is the
    default itself and must come first, and the check against the default refuses an output
    more than 4 ulps of its largest entry away or a logsumexp more than 1e-3 away."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "experiments" / "gluon" / "sweep_forward.py"
    spec = importlib.util.spec_from_file_location("sweep_forward", path)
    sw = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sw)
    from course_kernels.gluon import launch

    assert sw.parse("0") == {} and sw.parse("STAGES=2+QSTAGES=1") == {"STAGES": 2, "QSTAGES": 1}
    causal64 = dict(mask="causal", d=64, n=4096, dtype="float16")
    assert sw.overrides(causal64, "0") == launch.schedule_config(64, True, 4096)
    assert sw.overrides(causal64, "0")["DEFER"] == 6  # session 29: the default at 4K ...
    assert "DEFER" not in sw.overrides(dict(causal64, n=8192), "0")  # ... not at 8K
    cfg = sw.overrides(dict(causal64, mask="full"), "NUM_CONSUMERS=2")
    assert cfg == {**launch.DEFAULT_CONFIG[64], **launch.NONCAUSAL_CONFIG[64], "NUM_CONSUMERS": 2}
    cfg = sw.overrides(dict(causal64, d=128), "ROW_MASK=0")
    assert cfg["ROW_MASK"] == 0 and cfg["SKIP_DEAD"] and cfg["LPT"]
    with pytest.raises(ValueError):
        sw.parse("STAGES")
    with pytest.raises(SystemExit):
        sw.main(["--variants", "cudnn", "0"])
    o = torch.randn(2, 8, dtype=torch.float16)
    lse = torch.randn(2, dtype=torch.float32)
    tol = 4 * 2**-10 * o.abs().max().item()
    assert sw.check((o, lse), (o, lse), "float16")["ok"]
    assert sw.check((o, lse), (o + 0.9 * tol, lse), "float16")["ok"]
    assert not sw.check((o, lse), (o + 2 * tol, lse), "float16")["ok"]
    assert not sw.check((o, lse), (o, lse + 0.01), "float16")["ok"]
    assert sw.check((o, lse), (o, None), "float16")["ok"]  # cuDNN: O only
    rows = sw.rows(types.SimpleNamespace(masks=["causal", "full"], dims=[64], ns=[4096, 8192],
                                         dtype="bfloat16"))  # fmt: skip
    assert len(rows) == 4 and {r["dtype"] for r in rows} == {"bfloat16"}


def test_sweep_forward_leaves_out_what_did_not_compile_and_records_every_row(tmp_path, monkeypatch):
    """sweep_forward.main with the GPU parts stood in for: a variant that failed to compile for
    one head dim is left out of that head dim's rows only (and named in ``left_out``), a row
    whose default failed is recorded as such, and every row lands in the JSON file."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "experiments" / "gluon" / "sweep_forward.py"
    spec = importlib.util.spec_from_file_location("sweep_forward_main", path)
    sw = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sw)
    o, lse = torch.ones(2, 4, dtype=torch.float16), torch.zeros(2)
    bad = {("full", 128, "STAGES=3", "float16"): "out of resources",
           ("causal", 128, "0", "float16"): "failed"}  # fmt: skip
    monkeypatch.setattr(sw, "prewarm", lambda args: bad)
    monkeypatch.setattr(sw, "make_call", lambda row, v: lambda: (o, None if v == "cudnn" else lse))
    monkeypatch.setattr(
        sw, "interleaved", lambda calls, names, rounds: dict(speedup={s: 1.0 for s in names})
    )
    monkeypatch.setattr(sw, "new_record", lambda script, argv: dict(command="x", rows=[]))
    sw.main(["--out", str(tmp_path), "--tag", "t", "--variants", "0", "cudnn", "STAGES=3",
             "--dims", "64", "128", "--masks", "full", "causal", "--rounds", "1"])  # fmt: skip
    rec = json.loads((tmp_path / "t.json").read_text())
    rows = {(r["mask"], r["d"]): r for r in rec["rows"]}
    assert len(rows) == 4
    assert rows["full", 128]["left_out"] == ["STAGES=3"]
    assert rows["full", 64]["left_out"] == [] and set(rows["full", 64]["checks"]) == {
        "cudnn", "STAGES=3"}  # fmt: skip
    assert all(c["ok"] for c in rows["full", 64]["checks"].values())
    assert rows["causal", 128]["status"] == "the baseline did not compile"
    assert rec["compile_failures"] and len(rec["compile_failures"]) == 2


def test_session9_script_keeps_the_causal_switches_and_takes_the_worst_of_three():
    """experiments/gluon/session9_forward.py: a lever's overrides keep the default's causal
    switches (overrides replace them), the table takes the worst process per row, and the
    candidates run on the rows below 1.0 (at least the 4 lowest causal ones)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "experiments" / "gluon" / "session9_forward.py"
    spec = importlib.util.spec_from_file_location("session9_forward", path)
    s9 = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(s9)
    from course_kernels.gluon import launch

    assert len(s9.ROWS) == 24 and len(set(s9.ROWS)) == 24
    for name in s9.LEVERS:
        for d in (64, 128):
            cfg, own = s9.lever_cfg(name, d, True), s9.LEVERS[name][0]
            kept = {k: v for k, v in launch.CAUSAL_CONFIG[d].items() if k not in own}
            assert {k: cfg[k] for k in kept} == kept and "SKIP_DEAD" in kept
    assert s9.lever_cfg("session8", 64, True)["ROW_MASK"] is False  # the schedule before
    assert s9.lever_cfg("sect8", 64, False) is None
    assert s9.lever_cfg("rowmask", 64, False) == {"ROW_MASK": True, "PINGPONG": True}
    assert s9.lever_cfg("rowmask", 128, False) == {"ROW_MASK": True}  # non-causal switches kept
    assert s9.lever_cfg("sect8", 64, True, check=True)["LPT_SECTION_MB"] == s9.CHECK_SECTION_MB

    def row(N, causal, ratio):
        return dict(N=N, dtype="float16", d=64, causal=causal, ratio_vs_cudnn=dict(default=ratio),
                    tflops=dict(cudnn=400.0))  # fmt: skip

    passes = [
        dict(rows=[row(4096, True, 0.99), row(8192, True, 1.05), row(4096, False, 1.1)]),
        dict(rows=[row(4096, True, 1.02), row(8192, True, 0.97), row(4096, False, 1.2)]),
        dict(rows=[row(4096, True, 1.01), row(8192, True, 1.03)]),  # one row missing
    ]
    table = {s9.row_key(t): t for t in s9.aggregate(passes, ["default"])}
    assert table[(4096, "float16", 64, True)]["worst"]["default"] == 0.99
    assert table[(8192, "float16", 64, True)]["worst"]["default"] == 0.97
    assert not table[(4096, "float16", 64, False)]["complete"]["default"]
    rows, below = s9.pick_rows(list(table.values()))
    assert rows == [(8192, "float16", 64, True), (4096, "float16", 64, True)]
    assert len(below) == 2  # the incomplete row is not judged


def test_schedule_options_are_checked_by_name():
    """A misspelt schedule keyword is an error that lists the accepted ones, not a silent
    no-op; every key the launch reads is accepted (session 10's O_STAGE included)."""
    from course_kernels.gluon import launch

    with pytest.raises(ValueError, match=r"unknown schedule option\(s\) \['ROWMASK'\]; accepted"):
        launch.schedule_config(64, True, 4096, ROWMASK=True)
    for key in ("O_STAGE", "ROW_MASK", "LPT_SECTION_MB", "CONSUMER_REGS", "BN", "DYNAMIC",
                "PACK_P", "LAZY"):  # fmt: skip
        assert key in launch.SCHEDULE_KEYS
    assert launch.schedule_config(128, False, 4096, O_STAGE=True)["O_STAGE"] is True
    assert launch.schedule_config(64, True, 4096, PACK_P=True)["PACK_P"] is True
    # O_STAGE (never adopted) is off in every default, windows and documents included; PACK_P
    # (session 37's rule, adopted after session 38's GPU suite) only in plain d = 64 causal calls
    for d, c, n, w, x in itertools.product((64, 128, 256), (False, True), (4096, 16384),
                                           (False, True), (False, True)):  # fmt: skip
        cfg = launch.schedule_config(d, c, n, w and c, x and c)
        assert not cfg.get("O_STAGE") and not cfg.get("LAZY")  # LAZY: session 38, untimed
        assert cfg.get("PACK_P", False) is (d == 64 and c and not (w or x)), (d, c, n, w, x)
    assert launch.schedule_config(64, True, 4096, DEFER=0) == {**launch.DEFAULT_CONFIG[64],
                                                                "DEFER": 0}  # fmt: skip
    import inspect

    from course_kernels.gluon import forward

    if forward.HAVE_GLUON:
        params = inspect.signature(forward._attn_fwd_kernel.fn).parameters
        assert params["O_STAGE"].default is False and params["PACK_P"].default is False
        assert params["LAZY"].default is False and "LAZY" in forward.SWITCHES


def test_pack_p_in_the_causal_default_stays_off_windows_and_documents():
    """CAUSAL_CONFIG[64] takes PACK_P (session 37's rule, adopted in session 38): a plain causal
    call runs it at any N, while a window or packed documents (never timed with it) leave it out,
    as they leave DEFER out; DEFER alone leaves past DEFER_MAX_TILES tiles a head."""
    from course_kernels.gluon import launch

    assert launch.CAUSAL_CONFIG[64]["PACK_P"] is True
    for c, n, w, x in itertools.product((False, True), (4096, 16384), *[(False, True)] * 2):
        cfg = launch.schedule_config(64, c, n, w and c, x and c)
        assert cfg.get("PACK_P", False) is (c and not (w or x)), (c, n, w, x)
        assert ("DEFER" in cfg) is (c and n == 4096 and not (w or x)), (c, n, w, x)
    assert "PACK_P" not in launch.schedule_config(64, True, 4096, DEFER=0)  # overrides: exactly


def _window_fns(monkeypatch):
    from course_kernels.gluon import producer

    if not producer.HAVE_GLUON:
        pytest.skip("triton.experimental.gluon not importable here")
    monkeypatch.setattr(producer, "_edge_mid", producer._edge_mid.fn)  # called by _window_mid
    return producer._window_first.fn, producer._window_mid.fn  # the kernel's code, on ints


@pytest.mark.parametrize("bn", [64, 128])
def test_window_block_ranges_match_a_brute_force_mask(monkeypatch, bn):
    """Session 11's causal sliding window (row i sees keys [i - w, i]): the producer loads a
    tile's blocks from _window_first(tile start) on, each warpgroup computes from its own first
    block j0 (no row sees a key before it, some row sees a key in it), and the blocks
    [j_mid, n_free) that the consumer leaves unmasked are wholly visible to all its rows."""
    first_fn, mid_fn = _window_fns(monkeypatch)
    bm = 64
    for n in (17, 64, 200, 1000, 2053):
        for w in (0, 1, 63, 64, 100, 127, 128, 191, 700):
            for nc in (2, 3):
                for off_tile in range(-bm * (nc - 1), n, bm * nc):  # ALIGN_END: negative starts
                    j_lo = first_fn(off_tile, w, bn)
                    n_blocks = -(-min(n, off_tile + bm * nc) // bn)
                    for c in range(nc):
                        off_m = off_tile + c * bm
                        rows = [r for r in range(off_m, off_m + bm) if 0 <= r < n]
                        if not rows:
                            continue
                        j0 = first_fn(off_m, w, bn)
                        n_live = min(n_blocks, -(-min(n, off_m + bm) // bn))
                        assert j_lo <= j0 < n_live
                        seen = {j // bn for r in rows for j in range(max(r - w, 0), r + 1)}
                        assert min(seen) == j0 and max(seen) == n_live - 1
                        j_mid = mid_fn(off_m, w, j0, n_live, bm, bn)
                        assert j0 + 1 <= j_mid <= n_live
                        n_free = min(n // bn, off_m // bn, n_blocks)
                        for j in range(j_mid, n_free):
                            assert all(
                                max(r - w, 0) <= j * bn and j * bn + bn - 1 <= r for r in rows
                            )


def test_window_left_is_checked_and_a_wide_window_is_plain_causal():
    assert G._check_window(None, True, 100) == -1
    assert G._check_window(0, True, 100) == 0 and G._check_window(98, True, 100) == 98
    assert G._check_window(99, True, 100) == -1 and G._check_window(10**9, True, 100) == -1
    for bad in (-1, True, 2.0, "8"):
        with pytest.raises(ValueError, match="window_left must be None or an int >= 0"):
            G._check_window(bad, True, 100)
    with pytest.raises(ValueError, match="causal=True"):
        G._check_window(8, False, 100)


def test_a_window_call_leaves_row_mask_out():
    """ROW_MASK's one compare covers block 0; a window's first block is another one."""
    for d in G.DEFAULT_CONFIG:
        cfg = G.schedule_config(d, True, 4096, True)
        left_out = ("ROW_MASK", "DEFER", "PACK_P")  # PACK_P: timed on plain causal rows only
        want = {k: v for k, v in G.CAUSAL_CONFIG[d].items() if k not in left_out}
        assert {k: cfg[k] for k in want} == want and not set(left_out) & set(cfg)
        with pytest.raises(ValueError, match="ROW_MASK cannot be combined"):
            G.schedule_config(d, True, 4096, True, ROW_MASK=True)
    assert G.schedule_config(128, True, 4096)["ROW_MASK"]  # without a window: unchanged


def test_gluon_form_of_each_variant():
    """Which variants the Gluon forward computes, and with which (causal, window_left)."""
    from course_kernels.triton.masks import Variant

    assert Variant().gluon_form() == (False, None)
    assert Variant(causal=True).gluon_form() == (True, None)
    assert Variant(causal=True, bottom_right=True).gluon_form() == (True, None)
    assert Variant(causal=True, window=(1023, -1)).gluon_form() == (True, 1023)
    assert Variant(window=(1023, 0)).gluon_form() == (True, 1023)  # the same mask
    assert Variant(window=(-1, 0)).gluon_form() == (True, None)
    for v in (
        Variant(causal=True, window=(0, 0)),  # one key per row: tl keeps P = 1 exact
        Variant(window=(5, -1)),
        Variant(window=(-1, 3)),
        Variant(window=(8, 8)),
        Variant(causal=True, softcap=30.0),
        Variant(softcap=5.0),
    ):
        assert v.gluon_form() is None, v


def test_the_forward_passes_the_window_to_the_gluon_call(monkeypatch):
    """flash_attention's window_size=(left, 0) reaches the Gluon forward as (causal, window_left)
    with the scale in its place; the lse comes back in the tl kernels' units."""
    from course_kernels.triton import launch
    from course_kernels.triton.masks import Variant

    calls = []

    def fake(q, k, v, causal=False, scale=None, window_left=None, **cfg):
        calls.append((causal, scale, window_left))
        return torch.zeros_like(q), torch.ones(q.shape[:3])

    monkeypatch.setattr(launch, "_use_gluon", lambda q, k, backward=False: True)
    monkeypatch.setattr(launch, "gluon_attention_forward", fake)
    q = torch.randn(1, 2, 8, 64)
    for variant, want in (
        (Variant(window=(5, 0)), (True, 0.5, 5)),
        (Variant(causal=True), (True, 0.5, None)),
        (Variant(), (False, 0.5, None)),
    ):
        o, lse_c = launch._forward_c(q, q, q, variant, 0.5)
        assert calls[-1] == want and torch.allclose(lse_c, torch.full_like(lse_c, 2.0))
    assert len(calls) == 3


def test_pingpong_is_an_option_and_needs_the_overlapped_steps():
    """PINGPONG (session 11) takes turns in the overlapped steps only: the serial steps take none,
    so with OVERLAP=False the consumers' turn counts would part and the kernel would hang."""
    assert "PINGPONG" in G.SCHEDULE_KEYS
    for d in G.DEFAULT_CONFIG:
        assert G.schedule_config(d, False, 4096, PINGPONG=True)["PINGPONG"] is True
        assert "PINGPONG" not in G.schedule_config(d, True, 4096)  # off by default
        with pytest.raises(ValueError, match="needs OVERLAP=True"):
            G.schedule_config(d, True, 4096, PINGPONG=True, OVERLAP=False)


# ------------------------------------------- session 15: packed causal documents in the forward
class _Tokens:
    """An int32 pointer as the kernel's ``_left_first`` / ``_left_mid`` use it (``ptr + i``,
    ``gl.load``), over a Python list: so the CPU runs their code on ints."""

    def __init__(self, values, at=0):
        self.values, self.at = values, at

    def __add__(self, i):
        return _Tokens(self.values, self.at + i)


def _doc_fns(monkeypatch):
    import types

    from course_kernels.gluon import producer

    if not producer.HAVE_GLUON:
        pytest.skip("triton.experimental.gluon not importable here")
    shim = types.SimpleNamespace(load=lambda p: p.values[p.at], minimum=min)
    monkeypatch.setattr(producer, "gl", shim)
    monkeypatch.setattr(producer, "_edge_mid", producer._edge_mid.fn)
    return producer._left_first.fn, producer._left_mid.fn


@pytest.mark.parametrize("bn", [64, 128])
def test_document_block_ranges_match_a_brute_force_mask(monkeypatch, bn):
    """DOCS (row i sees keys [start(i), i], start(i) its document's first token): the producer
    loads a tile's blocks from _left_first(tile start) on, each warpgroup computes from its own
    first block j0 (no row sees a key before it, some row sees one in it), and the blocks
    [j_mid, n_free) that the consumer leaves unmasked are wholly visible to all its rows (a
    document boundary inside a tile included)."""
    first_fn, mid_fn = _doc_fns(monkeypatch)
    bm = 64
    for lengths in ([17], [1, 1, 1], [64, 64], [100, 3, 250, 1, 700], [130, 1000, 5, 2, 900],
                    [2053], [63, 65, 127, 129, 191, 193]):  # fmt: skip
        n = sum(lengths)
        starts = [s for i, s in enumerate(np.cumsum([0, *lengths[:-1]])) for _ in range(lengths[i])]
        left = (0, _Tokens([int(s) for s in starts]))
        for nc in (2, 3):
            for off_tile in range(0, n, bm * nc):
                j_lo = first_fn(off_tile, left, n, bn, True)
                n_blocks = -(-min(n, off_tile + bm * nc) // bn)
                for c in range(nc):
                    off_m = off_tile + c * bm
                    rows = [r for r in range(off_m, off_m + bm) if r < n]
                    if not rows:
                        continue
                    j0 = first_fn(off_m, left, n, bn, True)
                    n_live = min(n_blocks, -(-min(n, off_m + bm) // bn))
                    assert j_lo <= j0 < n_live
                    seen = {j // bn for r in rows for j in range(starts[r], r + 1)}
                    assert min(seen) == j0 and max(seen) == n_live - 1
                    j_mid = mid_fn(off_m, left, n, j0, n_live, bm, bn, True)
                    assert j0 + 1 <= j_mid <= n_live
                    n_free = min(n // bn, off_m // bn, n_blocks)
                    for j in range(j_mid, n_free):
                        assert all(starts[r] <= j * bn and j * bn + bn - 1 <= r for r in rows)


def test_a_documents_call_leaves_row_mask_and_align_end_out():
    """Documents start their tiles at row 0 (no ALIGN_END) and mask their own first blocks (no
    ROW_MASK); asking for either with documents is an error."""
    for d in G.DEFAULT_CONFIG:
        cfg = G.schedule_config(d, True, 4096, False, True)
        off = ("ROW_MASK", "ALIGN_END", "DEFER", "PACK_P")  # PACK_P: timed on plain causal rows
        want = {k: v for k, v in G.CAUSAL_CONFIG[d].items() if k not in off}
        assert {k: cfg[k] for k in want} == want
        assert not any(k in cfg for k in off)
        for switch in ("ROW_MASK", "ALIGN_END"):
            with pytest.raises(ValueError, match=f"{switch} cannot be combined with"):
                G.schedule_config(d, True, 4096, False, True, **{switch: True})
    assert G.schedule_config(64, True, 4096)["ALIGN_END"]  # without documents: unchanged


def test_the_documents_forward_checks_its_inputs_before_the_gpu():
    """gluon_attention_forward(cu_seqlens=) and gluon_varlen_forward say what is wrong with the
    offsets or the layout on any machine; valid inputs then meet only the missing GPU."""
    q = torch.randn(1, 2, 10, 64, dtype=torch.float16)
    cu = torch.tensor([0, 4, 10], dtype=torch.int32)
    bad = [
        (dict(causal=False, cu_seqlens=cu), "packed causal documents"),
        (dict(causal=True, window_left=3, cu_seqlens=cu), "packed causal documents"),
        (dict(causal=True, cu_seqlens=cu.float()), "1-D int32 or int64"),
        (dict(causal=True, cu_seqlens=torch.tensor([0, 4, 9])), "rise from 0 to N = 10"),
        (dict(causal=True, cu_seqlens=torch.tensor([0, 6, 4, 10])), "rise from 0 to N = 10"),
    ]
    for kwargs, match in bad:
        with pytest.raises(ValueError, match=match):
            G.gluon_attention_forward(q, q, q, **kwargs)
    q2 = torch.randn(2, 2, 10, 64, dtype=torch.float16)
    with pytest.raises(ValueError, match="one sequence, B = 1; got B = 2"):
        G.gluon_attention_forward(q2, q2, q2, causal=True, cu_seqlens=cu)
    packed = q[0].transpose(0, 1)  # (total, H, d)
    with pytest.raises(
        ValueError, match=r"packed \(total, heads, d\) tensor, got \(1, 2, 10, 64\)"
    ):
        G.gluon_varlen_forward(q, q, q, cu)
    with pytest.raises(ValueError, match="rise from 0 to N = 10"):
        G.gluon_varlen_forward(packed, packed, packed, torch.tensor([0, 11]))
    for call in (lambda: G.gluon_attention_forward(q, q, q, True, cu_seqlens=cu),
                 lambda: G.gluon_varlen_forward(packed, packed, packed, cu)):  # fmt: skip
        with pytest.raises(RuntimeError, match="unavailable"):
            call()


def test_packed_documents_take_the_gluon_forward_only_at_its_listed_dims(monkeypatch):
    """``_forward_c`` on packed varlen inputs: causal documents with one cu_seqlens tensor go to
    gluon_varlen_forward (the offsets already checked, the lse back in the tl kernels' units)
    only at the dims GLUON_MASKED_FORWARD lists (set here); two offsets tensors, a non-causal
    mask or ALiBi never; under ``triton`` never."""
    from course_kernels.triton import launch
    from course_kernels.triton.masks import CAUSAL, PLAIN

    calls = []

    def fake(q, k, v, cu, scale, offsets_checked=False, **cfg):
        calls.append((cu, scale, offsets_checked))
        return "o", torch.full((q.shape[1], q.shape[0]), 3.0)

    monkeypatch.setattr(launch, "INTERPRET", False)
    monkeypatch.setattr(launch, "_gluon_fits", lambda q, k, dims: True)
    monkeypatch.setattr(launch, "gluon_available", lambda: True)
    monkeypatch.setattr(launch, "gluon_varlen_forward", fake)
    monkeypatch.setitem(launch.GLUON_MASKED_FORWARD, "documents", (64,))
    q = torch.empty(1 << 14, 4, 64, device="meta")  # enough work for GLUON_MIN_WORK
    cu, other = torch.tensor([0, 1 << 14]), torch.tensor([0, 1 << 14])
    for choice in ("auto", "gluon"):
        monkeypatch.setenv(launch.FORWARD_ENV, choice)
        o, lse_c = launch._forward_c(q, q, q, CAUSAL, 0.5, None, (cu, cu, 1 << 14, 1 << 14))
        assert o == "o" and calls[-1] == (cu, 0.5, True)
        assert torch.allclose(lse_c, torch.full_like(lse_c, 3.0 / CAUSAL.units(0.5)[1]))
    assert not launch._gluon_docs(q, q, CAUSAL, None, (cu, other, 1, 1), False)
    assert not launch._gluon_docs(q, q, PLAIN, None, (cu, cu, 1, 1), False)
    assert not launch._gluon_docs(q, q, CAUSAL, torch.ones(1, 4), (cu, cu, 1, 1), False)
    q128 = torch.empty(1 << 14, 4, 128, device="meta")
    assert not launch._gluon_docs(q128, q128, CAUSAL, None, (cu, cu, 1, 1), False)  # not listed
    monkeypatch.setenv(launch.FORWARD_ENV, "triton")
    assert not launch._gluon_docs(q, q, CAUSAL, None, (cu, cu, 1, 1), False)
    assert len(calls) == 2


# ------------------------------------------- mutation audit: what decides the kernel, pinned
def _auto_hopper(monkeypatch):
    """``_use_gluon`` under ``auto`` as on a Hopper GPU: CUDA-less tensors are let through by
    ``_gluon_fits``'s other checks (shapes, dtype) with ``is_cuda`` faked."""
    from course_kernels.triton import launch

    monkeypatch.setattr(launch, "INTERPRET", False)
    monkeypatch.setattr(launch, "gluon_available", lambda: True)
    for env in (launch.FORWARD_ENV, launch.BACKWARD_ENV):
        monkeypatch.delenv(env, raising=False)
    return launch


def _cuda_like(b, h, n, d, dtype=torch.float16):
    from types import SimpleNamespace

    return SimpleNamespace(is_cuda=True, dtype=dtype, shape=(b, h, n, d))


def test_gluon_fits_takes_bf16_and_needs_nq_equal_nk():
    from course_kernels.triton import launch

    dims = launch.GLUON_FORWARD_DIMS
    for dtype in (torch.float16, torch.bfloat16):
        assert launch._gluon_fits(_cuda_like(1, 2, 16, 64, dtype), _cuda_like(1, 2, 16, 64), dims)
    assert not launch._gluon_fits(_cuda_like(1, 2, 16, 64), _cuda_like(1, 2, 32, 64), dims)
    assert not launch._gluon_fits(_cuda_like(1, 2, 32, 64), _cuda_like(1, 2, 16, 64), dims)


def test_gluon_pays_counts_query_heads_not_kv_heads():
    """GQA: the work is B x Hq x Nq x Nk x d (each query head reads its K/V head)."""
    from course_kernels.triton import launch

    q = torch.empty(1, 8, 1 << 13, 64, device="meta")  # 8 * 2**13 * 2**13 * 64 = 2**35
    kv = torch.empty(1, 1, 1 << 14, 64, device="meta")  # Nk = 2 Nq: 2**36 in all
    assert launch._gluon_pays(q, kv)
    assert not launch._gluon_pays(q[:, :4], kv)


def test_auto_needs_every_condition(monkeypatch):
    """``auto`` takes the Gluon forward only when it fits, pays, Gluon is available and Triton
    compiles (not the interpreter); each condition alone turns it off. A GQA forward is taken
    (only the backward's GQA waits for GLUON_BACKWARD_GQA)."""
    launch = _auto_hopper(monkeypatch)
    monkeypatch.setattr(launch, "_gluon_fits", lambda q, k, dims: True)
    monkeypatch.setattr(launch, "_gluon_pays", lambda q, k: True)
    q = torch.empty(1, 4, 16, 64, device="meta")
    kv = torch.empty(1, 2, 16, 64, device="meta")
    assert launch._use_gluon(q, q) and launch._use_gluon(q, kv)  # the forward: GQA too
    monkeypatch.setattr(launch, "GLUON_BACKWARD_GQA", False)
    assert launch._use_gluon(q, q, backward=True) and not launch._use_gluon(q, kv, backward=True)
    monkeypatch.setattr(launch, "GLUON_BACKWARD_GQA", True)
    assert launch._use_gluon(q, kv, backward=True)
    monkeypatch.setattr(launch, "_gluon_pays", lambda q, k: False)
    assert not launch._use_gluon(q, q) and not launch._use_gluon(q, q, backward=True)
    monkeypatch.setattr(launch, "_gluon_pays", lambda q, k: True)
    monkeypatch.setattr(launch, "gluon_available", lambda: False)
    assert not launch._use_gluon(q, q) and not launch._use_gluon(q, q, backward=True)
    monkeypatch.setattr(launch, "gluon_available", lambda: True)
    monkeypatch.setattr(launch, "INTERPRET", True)
    assert not launch._use_gluon(q, q) and not launch._use_gluon(q, q, backward=True)


def test_masked_and_backward_dims_do_not_follow_the_forwards_auto_tuple(monkeypatch):
    """GLUON_FORWARD_AUTO is the plain forward's: a masked forward follows its own
    GLUON_MASKED_FORWARD entry, the backward GLUON_BACKWARD_AUTO (both checked first)."""
    launch = _auto_hopper(monkeypatch)
    monkeypatch.setattr(launch, "_gluon_fits", lambda q, k, dims: q.shape[3] in dims)
    monkeypatch.setattr(launch, "_gluon_pays", lambda q, k: True)
    monkeypatch.setattr(launch, "GLUON_FORWARD_AUTO", (64,))
    q128, q256 = (torch.empty(1, 2, 16, d, device="meta") for d in (128, 256))
    assert not launch._use_gluon(q128, q128)
    assert launch._use_gluon(q128, q128, backward=True)
    monkeypatch.setitem(launch.GLUON_MASKED_FORWARD, "documents", (128, 256))
    assert launch._use_gluon(q128, q128, False, "documents")
    assert launch._use_gluon(q256, q256, False, "documents")  # not in GLUON_FORWARD_AUTO


def test_packed_documents_backward_asks_with_the_backward_table(monkeypatch):
    """``_gluon_docs(..., backward=True)`` reads GLUON_MASKED_BACKWARD and $COURSE_KERNELS_
    BACKWARD, not the forward's: at d = 64 packed documents take the Gluon backward, not the
    Gluon forward."""
    from course_kernels.triton.masks import CAUSAL

    launch = _auto_hopper(monkeypatch)
    monkeypatch.setattr(launch, "_gluon_fits", lambda q, k, dims: True)
    monkeypatch.setattr(launch, "_gluon_pays", lambda q, k: True)
    assert 64 in launch.GLUON_MASKED_BACKWARD["documents"]
    assert 64 not in launch.GLUON_MASKED_FORWARD["documents"]
    q = torch.empty(1 << 10, 2, 64, device="meta")
    cu = torch.tensor([0, 1 << 10])
    varlen = (cu, cu, 1 << 10, 1 << 10)
    assert launch._gluon_docs(q, q, CAUSAL, None, varlen, True)
    assert not launch._gluon_docs(q, q, CAUSAL, None, varlen, False)
    monkeypatch.setenv(launch.BACKWARD_ENV, "triton")
    assert not launch._gluon_docs(q, q, CAUSAL, None, varlen, True)


def test_alibi_and_varlen_never_reach_the_dense_gluon_kernels(monkeypatch):
    """The Gluon kernels have no ALiBi and no cu_seqlens (but packed documents'): with ALiBi, or
    packed inputs with two offsets tensors, the tl kernels run even where the choice says Gluon."""
    from course_kernels.triton import launch
    from course_kernels.triton.masks import CAUSAL

    def boom(*args, **kwargs):
        raise AssertionError("a dense Gluon kernel was called")

    monkeypatch.setattr(launch, "_use_gluon", lambda *args, **kwargs: True)
    monkeypatch.setattr(launch, "gluon_attention_forward", boom)
    monkeypatch.setattr(launch, "gluon_attention_backward", boom)
    g = torch.Generator().manual_seed(3)
    q, k, v, do = (torch.randn(1, 2, 8, 16, generator=g) for _ in range(4))
    alibi = torch.full((1, 2), 0.5)
    o, lse_c = launch._forward_c(q, k, v, CAUSAL, 0.3, alibi)
    dq, dk, dv = launch._backward_c(do, q, k, v, o, lse_c, CAUSAL, 0.3, alibi)
    assert o.shape == q.shape and dq.shape == q.shape and dk.shape == k.shape
    qp, kp, vp = (x[0].transpose(0, 1).contiguous() for x in (q, k, v))  # (8, 2, 16) packed
    cu_q, cu_k = torch.tensor([0, 3, 8], dtype=torch.int32), torch.tensor([0, 3, 8]).int()
    o, lse_c = launch._forward_c(qp, kp, vp, CAUSAL, 0.3, None, (cu_q, cu_k, 5, 5))
    assert o.shape == qp.shape and lse_c.shape == (2, 8)


def _fake_hopper(monkeypatch, capability=(9, 0), cuda=True, version="3.6.0"):
    """gluon_available's view of a machine: Gluon importable, Triton ``version``, a CUDA device
    of ``capability`` (``cuda``: whether torch says CUDA is available)."""
    import triton

    monkeypatch.setattr(G, "HAVE_GLUON", True)
    monkeypatch.setattr(G, "_AVAILABLE", {})
    monkeypatch.setattr(triton, "__version__", version)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda dev=None: capability)


@pytest.mark.parametrize(
    "machine, want",
    [
        (dict(), True),
        (dict(capability=(10, 0)), False),  # Blackwell: not the Hopper kernel's
        (dict(capability=(8, 0)), False),
        (dict(cuda=False), False),
        (dict(version="3.5.1"), False),
        (dict(version="3.60.0"), False),  # not 3.6.x
        (dict(version="3.6"), True),
    ],
)
def test_gluon_is_available_only_on_hopper_with_triton_36(monkeypatch, machine, want):
    _fake_hopper(monkeypatch, **machine)
    assert G.gluon_available() is want


def test_why_unavailable_names_the_missing_piece(monkeypatch):
    import triton

    monkeypatch.setattr(G, "HAVE_GLUON", False)
    monkeypatch.setattr(G, "IMPORT_ERROR", ImportError("no gluon here"))
    assert "did not import" in G.why_unavailable() and "no gluon here" in G.why_unavailable()
    monkeypatch.setattr(G, "HAVE_GLUON", True)
    monkeypatch.setattr(triton, "__version__", "3.6.1")
    assert "compute capability 9.x" in G.why_unavailable()


@pytest.mark.parametrize(
    "q_shape, k_shape, v_shape, dtypes, match",
    [
        ((2, 2, 16, 64), (1, 2, 16, 64), (1, 2, 16, 64), (), "need same B, N, d"),
        ((1, 2, 16, 64), (1, 2, 16, 128), (1, 2, 16, 128), (), "need same B, N, d"),
        ((1, 2, 16, 64), (1, 2, 16, 64), (1, 1, 16, 64), (), "need same B, N, d"),
        ((1, 2, 16, 64),) * 3
        + ((torch.float16, torch.float16, torch.bfloat16), "must all be float16"),
        ((1, 2, 16, 64),) * 3
        + ((torch.float16, torch.bfloat16, torch.float16), "must all be float16"),
    ],
)
def test_the_forward_checks_k_and_v_against_q(q_shape, k_shape, v_shape, dtypes, match):
    dq, dk, dv = dtypes or (torch.float16,) * 3
    q, k, v = torch.randn(q_shape).to(dq), torch.randn(k_shape).to(dk), torch.randn(v_shape).to(dv)
    with pytest.raises(ValueError, match=match):
        G.gluon_attention_forward(q, k, v)


def test_window_schedule_details():
    """A window's own K/V block (64 keys at d = 64) unless the caller sets the schedule; the
    error for ROW_MASK with a window names the window; ALIGN_END at N = 1 is refused too."""
    assert G.schedule_config(64, True, 4096, window=True)["BN"] == 64
    assert G.schedule_config(64, True, 4096, window=True, BN=128)["BN"] == 128
    with pytest.raises(ValueError, match=r"ROW_MASK cannot be combined with a sliding window"):
        G.schedule_config(128, True, 4096, window=True, ROW_MASK=True)
    with pytest.raises(ValueError, match="ALIGN_END at N = 1"):
        G.schedule_config(64, True, 1, ALIGN_END=True)


def test_consumer_registers_fit_hoppers_register_file():
    """Each consumer warpgroup's setmaxnreg budget x 128 threads, with a producer warpgroup of
    at least 24 registers a thread, fits the SM's 65,536 registers (3 consumers: 160 each)."""
    for nc, regs in G.CONSUMER_REGS.items():
        assert (nc * regs + 24) * 128 <= 65536, (nc, regs)


def test_the_device_check_covers_all_three_tensors(monkeypatch):
    from types import SimpleNamespace

    monkeypatch.setattr(G, "gluon_available", lambda: True)
    cuda, cpu = (
        SimpleNamespace(is_cuda=True, device="cuda:0"),
        SimpleNamespace(is_cuda=False, device="cpu"),
    )
    G._check_device(cuda, cuda, cuda, "f")
    for args in ((cpu, cuda, cuda), (cuda, cpu, cuda), (cuda, cuda, cpu)):
        with pytest.raises(ValueError, match="must be CUDA tensors"):
            G._check_device(*args, "f")


class _NoValues(torch.Tensor):
    """Offsets whose values must not be read (a device-to-host copy the caller has done)."""

    def tolist(self):
        raise AssertionError("cu_seqlens read again")


def test_checked_offsets_are_not_read_again_and_offsets_live_on_qs_device():
    q = torch.randn(1, 2, 10, 64, dtype=torch.float16)
    cu = torch.tensor([0, 4, 10], dtype=torch.int32)
    spy = cu.as_subclass(_NoValues)
    start = G._doc_bounds(spy, True, None, q, True, "start")
    assert start.as_subclass(torch.Tensor).tolist() == [0] * 4 + [4] * 6
    with pytest.raises(AssertionError, match="read again"):
        G._doc_bounds(spy, True, None, q, False, "start")
    packed = torch.randn(10, 2, 64, dtype=torch.float16)
    with pytest.raises(RuntimeError, match="unavailable"):  # past the offsets, at the GPU check
        G.gluon_varlen_forward(packed, packed, packed, spy, offsets_checked=True)
    with pytest.raises(ValueError, match="on q's device"):
        G._doc_bounds(cu.to("meta"), True, None, q, False, "start")


def _ncu_summary():
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "experiments" / "gluon" / "ncu_summary.py"
    spec = importlib.util.spec_from_file_location("ncu_summary", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_ncu_summary_reads_each_launch_of_a_raw_csv():
    """experiments/gluon/ncu_summary.py (session 23) on a committed raw CSV: ncu's warning lines
    skipped, one entry per launch (the Gluon forward, then cuDNN's), the SM-active share the
    ratio of the two cycle counts; a text without ncu's header is refused, not read as empty."""
    mod = _ncu_summary()
    root = Path(__file__).resolve().parents[1]
    text = (root / "experiments/data/gluon/h100_ncu_fwd_64_causal_4096_session23.csv").read_text()
    assert text.startswith("==WARNING==")
    ours, cudnn = mod.read_launches(text)
    assert ours["kernel"] == "_attn_fwd_kernel" and "cudnn" in cudnn["kernel"]
    assert ours["duration_ns"] == 668288 and ours["block_size"] == 512
    assert ours["sm_active_fraction"] == round(ours["sm_active_cycles"] / ours["elapsed_cycles"], 4)
    assert 0.9 < ours["sm_active_fraction"] < cudnn["sm_active_fraction"] < 1
    with pytest.raises(ValueError, match="no ncu CSV header"):
        mod.read_launches("==PROF== nothing profiled\n")


@pytest.mark.parametrize(
    "name", ["h100_ncu_forward_session23.json", "h100_ncu_pack_p_session38.json"]
)
def test_the_shipped_ncu_forward_summary_is_the_summary_of_its_csvs(name):
    """Each shipped Nsight Compute summary is what ncu_summary.py makes of the raw CSVs its
    record names: every number it holds (no number edited by hand; metrics the script learnt
    later, such as session 38's instruction count, may be absent from an older record)."""
    mod = _ncu_summary()
    root = Path(__file__).resolve().parents[1]
    rec = json.loads((root / "course_kernels/data/gluon" / name).read_text())
    labels = [r["row"] for r in rec["launches"][::2]]
    again = mod.summarise(
        {lab: (root / f).read_text() for lab, f in zip(labels, rec["meta"]["files"], strict=True)}
    )
    assert [{k: a[k] for k in r} for a, r in zip(again, rec["launches"], strict=True)] == rec[
        "launches"
    ]
    if "session38" in name:  # the instruction count is what the chapter reads there
        assert all(r["executed_instructions"] > 1e8 for r in rec["launches"])


def test_forward_tail_model_follows_the_kernels_tile_order():
    """experiments/gluon/tail_model.py's forward (session 23): the tile costs under causal
    masking with ALIGN_END (the partial tile first, one live consumer), and the order it hands
    tiles out in is the kernel's own ``_tile_coords`` (run on Python ints) for head-major,
    LPT and sectioned LPT; LPT shortens the modelled makespan at 4K."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "experiments" / "gluon" / "tail_model.py"
    spec = importlib.util.spec_from_file_location("tail_model", path)
    tm = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tm)
    costs = tm.forward_tiles(4096, 3)
    assert len(costs) == 22 and costs[0] == 1 + 2 and costs[-1] == 4096 // 128 + 2
    assert costs == sorted(costs)  # later tiles see more keys
    assert tm.forward_tiles(4096, 3, align_end=False)[-1] == 32 + 2
    heads, n_m = 12, len(costs)
    for section in (None, 0, 8, 5):  # None: head-major (LPT off)
        kernel = [costs[pid_m] for pid_m, _ in _order(section, n_m, heads)]
        assert tm.forward_order(costs, heads, section is not None, section or 0) == kernel
    for defer in (1, 4, 7):  # session 29's DEFER
        kernel = [costs[pid_m] for pid_m, _ in _order(None, n_m, heads, defer=defer)]
        assert tm.forward_order(costs, heads, defer=defer) == kernel
    ideal = sum(costs) * 128 / tm.SMS
    plain = tm.makespan(tm.forward_order(costs, 128)) / ideal
    lpt = tm.makespan(tm.forward_order(costs, 128, True, 16)) / ideal
    defer4 = tm.makespan(tm.forward_order(costs, 128, defer=4)) / ideal
    assert plain > 1.04 and lpt < 1.01 and defer4 < 1.01


def test_worst_of_three_reads_interleaved_records(tmp_path):
    """experiments/gluon/worst_of_three.py (session 23): issue 23's measure from the committed
    interleaved forward records (three processes a dtype): the kernel's ratio is the inverse of
    cuDNN's speedup, the worst is the minimum over processes, per dtype; a row one process did
    not time is incomplete and not counted; records from two GPUs or without cuDNN are refused."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "experiments" / "gluon" / "worst_of_three.py"
    spec = importlib.util.spec_from_file_location("worst_of_three", path)
    w3 = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(w3)
    files = [str(data_path(f"gluon/h100_fwd4k_interleaved_session23_{dt}_run{i}.json"))
             for dt in ("float16", "bfloat16") for i in (1, 2, 3)]  # fmt: skip
    out = w3.main([*files, "--out", str(tmp_path / "t.json")])
    fp16 = out["tables"]["float16"]
    assert fp16["processes"] == 3 and fp16["complete_rows"] == 4 and fp16["at_goal"] == 3
    row = next(r for r in fp16["rows"] if r["mask"] == "causal" and r["d"] == 64)
    assert row["worst"] == min(row["ratios"]) and 0.95 < row["worst"] < 0.96 and not row["at_goal"]
    assert json.loads((tmp_path / "t.json").read_text())["tables"]["bfloat16"]["at_goal"] == 3
    recs = [json.loads(Path(f).read_text()) for f in files[:3]]
    recs[2]["rows"] = recs[2]["rows"][1:]  # the third process missed a row
    t = w3.table(recs, 1.0)
    assert t["complete_rows"] == 3 and sum(not r["complete"] for r in t["rows"]) == 1
    other = dict(recs[0], gpu="NVIDIA H200")
    with pytest.raises(ValueError, match="more than one GPU"):
        w3.ratios([recs[0], other])
    bare = dict(recs[0], rows=[dict(r, speedup={"0": 1.0}) for r in recs[0]["rows"]])
    with pytest.raises(ValueError, match="no cudnn variant"):
        w3.ratios([bare])


def test_worst_of_three_reads_another_variant_as_the_kernel(tmp_path):
    """worst_of_three.py --variant (session 37): a variant timed in the same rounds is read
    against cuDNN as speedup[variant] / speedup[cudnn] (its median round against cuDNN's), the
    default's ratio is unchanged by the option, and a row without the variant is refused."""
    import importlib.util

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location(
        "worst_of_three", root / "experiments" / "gluon" / "worst_of_three.py"
    )
    w3 = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(w3)
    data = root / "experiments" / "data" / "gluon"
    files = [str(data / f"h100_fwd_defer_session34_4k_float16_run{i}.json") for i in (1, 2, 3)]
    recs = [json.loads(Path(f).read_text()) for f in files]
    want = [r["rows"][0]["speedup"]["DEFER=4"] / r["rows"][0]["speedup"]["cudnn"] for r in recs]
    out = w3.main([*files, "--variant", "DEFER=4", "--out", str(tmp_path / "t.json")])
    row = out["tables"]["float16"]["rows"][0]
    assert row["ratios"] == [round(x, 4) for x in want] and out["variant"] == "DEFER=4"
    assert row["worst"] == round(min(want), 4) < 1.0  # DEFER = 4 lost to the default (session 34)
    default = w3.table(recs, 1.0)["rows"][0]["ratios"]
    assert default == [round(1 / r["rows"][0]["speedup"]["cudnn"], 4) for r in recs]
    assert default != row["ratios"]
    with pytest.raises(ValueError, match="no PACK_P=1 variant"):
        w3.ratios(recs, variant="PACK_P=1")


def test_the_gpu_suite_can_run_under_a_candidate_causal_default(tmp_path):
    """tests/gpu/conftest.py --gluon-causal-default D:KEY=V (session 37): a timed lever is run
    under the whole GPU suite as the causal default before the package takes it. The specs
    change the given table only, as ints; malformed specs, unknown head dims and unknown keys
    are usage errors that say what is accepted; and pytest accepts the option."""
    import importlib.util
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("gpu_conftest", root / "tests/gpu/conftest.py")
    conf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conf)
    table = {d: dict(c) for d, c in G.CAUSAL_CONFIG.items()}
    assert conf.candidate_defaults(["64:PACK_P=0", "128:DEFER=4"], table) == [
        (64, "PACK_P", 0),
        (128, "DEFER", 4),
    ]
    assert table[64]["PACK_P"] == 0 and table[128]["DEFER"] == 4
    assert G.CAUSAL_CONFIG[64]["PACK_P"] is True  # the package's own table untouched
    for bad, what in (("PACK_P=1", "expected D:KEY=V"), ("64:PACK_P=yes", "expected D:KEY=V"),
                      ("32:PACK_P=1", "head dims"), ("64:PACKP=1", "keys")):  # fmt: skip
        with pytest.raises(pytest.UsageError, match=what):
            conf.candidate_defaults([bad], table)

    def collect(spec):
        return subprocess.run(
            [sys.executable, "-m", "pytest", "tests/gpu/test_gpu_gluon.py", "-p",
             "no:cacheprovider", "--co", "--gluon-causal-default", spec],
            cwd=root, capture_output=True, text=True, timeout=300,
        )  # fmt: skip

    run = collect("64:PACK_P=0")
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert "Gluon causal default candidates: ['64:PACK_P=0']" in run.stdout
    assert "'DEFER': 6, 'PACK_P': 0}" in run.stdout  # the table the tests will read
    bad = collect("64:PACKP=1")
    assert bad.returncode != 0 and "keys [" in bad.stdout + bad.stderr
