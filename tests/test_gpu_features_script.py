"""scripts/gpu_features.py's pure-Python parts (the GPU run itself is on the H200): the rows it
would measure, the unmasked work it counts, the documents it packs."""

from __future__ import annotations

import datetime
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import gpu_features  # noqa: E402


def test_rows_and_flops():
    args = gpu_features.parse_args([])
    rows = gpu_features.rows(args)
    # causal and window: 2 d x 3 N x 3 providers x 2 passes; documents: 2 d x 3 x 2
    assert len(rows) == 2 * 2 * 3 * 3 * 2 + 2 * 3 * 2
    assert {r["n"] for r in rows if r["mask"] == "document"} == {16_384}
    causal = {"mask": "causal", "d": 64, "n": 4096, "pass": "fwd"}
    want = 4.0 * 64 * 32 * 4 * (4096 * 4097 // 2)  # H = 2048 / 64, B = 4, N (N + 1) / 2 pairs
    assert gpu_features.flops(causal, args) == want
    assert gpu_features.flops({**causal, "pass": "bwd"}, args) == 2.5 * want


def test_visible_pairs_by_brute_force():
    import numpy as np

    n, w = 50, 8
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    assert gpu_features.visible_pairs("window", n, w) == int(((j <= i) & (i - j < w)).sum())
    assert gpu_features.visible_pairs("causal", n, w) == int((j <= i).sum())
    lengths = gpu_features.doc_lengths()
    assert len(lengths) == 6 and sum(lengths) == 16_384 and min(lengths) > 1000
    assert gpu_features.visible_pairs("document", 0, 0, [3, 4]) == 6 + 10


def test_dry_run_lists_rows_without_a_gpu():
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gpu_features.py"), "--dry-run", "--d", "128"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rows = [json.loads(line) for line in out.splitlines()]
    assert rows and all(r["d"] == 128 and r["gflop"] > 0 for r in rows)


def test_backward_timing_differentiates_the_graphs_own_inputs(monkeypatch):
    """The timed backward is ``torch.autograd.grad`` with respect to the tensors each provider's
    graph starts from (the packed copies for varlen calls), so no gradient accumulates into
    ``.grad`` between timed calls (no add kernels timed). On the CPU, course kernel only."""
    import argparse

    import torch

    monkeypatch.setattr(gpu_features, "DEVICE", ["cpu"])
    args = argparse.Namespace(window=16, batch=1, hidden=64)
    for mask in ("causal", "window", "document"):
        row = {"mask": mask, "n": 96, "d": 32, "provider": "course"}
        q, k, v, do = gpu_features._inputs(row, args)
        fn = gpu_features.make_fn(row, args, q, k, v)
        leaves = getattr(fn, "leaves", (q, k, v))
        out = fn()
        grads = torch.autograd.grad(out, leaves, do.transpose(1, 2).reshape(out.shape)
                                    if out.shape != do.shape else do)  # fmt: skip
        assert [g.shape for g in grads] == [x.shape for x in leaves]
        assert all(x.grad is None for x in (q, k, v, *leaves))
        assert (mask == "document") == (leaves[0] is not q)


def test_gluon_masked_backward_is_an_explicit_experiment(monkeypatch):
    """--gluon-masked-backward lists the --d dims for the named masks in the package's
    GLUON_MASKED_BACKWARD (this process only) and returns what was there; without it nothing
    changes; unknown masks are refused by argparse."""
    from course_kernels.triton import launch

    monkeypatch.setattr(launch, "GLUON_MASKED_BACKWARD", {"window": (), "documents": ()})
    assert gpu_features.parse_args([]).gluon_masked_backward == []
    args = gpu_features.parse_args(["--gluon-masked-backward", "documents", "--d", "128"])
    before = gpu_features.enable_gluon_masked(args.gluon_masked_backward, args.d)
    assert before == {"documents": ()}
    assert launch.GLUON_MASKED_BACKWARD == {"window": (), "documents": (128,)}
    with pytest.raises(SystemExit):
        gpu_features.parse_args(["--gluon-masked-backward", "causal"])
    monkeypatch.setattr(launch, "GLUON_MASKED_FORWARD", {"documents": ()})
    assert gpu_features.parse_args([]).gluon_masked_forward == []
    args = gpu_features.parse_args(["--gluon-masked-forward", "documents"])
    before = gpu_features.enable_gluon_masked(
        args.gluon_masked_forward, args.d, "GLUON_MASKED_FORWARD"
    )
    assert before == {"documents": ()} and launch.GLUON_MASKED_FORWARD == {"documents": (64, 128)}
    assert launch.GLUON_MASKED_BACKWARD == {"window": (), "documents": (128,)}  # not touched
    with pytest.raises(SystemExit):
        gpu_features.parse_args(["--gluon-masked-forward", "window"])


def test_ratios_pair_each_row_with_the_course_row_of_its_shape(monkeypatch):
    """course_over_other: course TFLOP/s over each other provider's, on the same mask, d, N and
    pass only; failed rows give no ratio."""
    speed = {("course", 64): 300.0, ("flex", 64): 200.0, ("course", 128): 500.0,
             ("flex", 128): 400.0}  # fmt: skip

    def fake_measure(row, args):
        if row["provider"] == "flex" and row["pass"] == "bwd" and row["d"] == 128:
            raise RuntimeError("no backward")
        t = speed[row["provider"], row["d"]] * (2 if row["pass"] == "bwd" else 1)
        return gpu_features.flops(row, args) / (t * 1e9)  # ms at t TFLOP/s

    monkeypatch.setattr(gpu_features, "measure", fake_measure)
    args = gpu_features.parse_args(["--masks", "window", "--d", "64", "128", "--n", "4096",
                                    "--providers", "course", "flex"])  # fmt: skip
    record = {"rows": []}
    gpu_features.run_bench(args, record, lambda: None)
    assert record["course_over_other"] == pytest.approx(
        {
            "window d=64 N=4096 fwd vs flex": 1.5,
            "window d=64 N=4096 bwd vs flex": 1.5,
            "window d=128 N=4096 fwd vs flex": 1.25,
        },
        abs=2e-3,
    )


def test_rounds_interleave_a_groups_providers_and_keep_the_median(monkeypatch):
    """--rounds R: each (mask, d, N) group's rows are timed round by round (course, Flex, course,
    Flex, ...), not R times in a row; a row's ms is the median of its rounds; a row that fails
    once stays failed; past --budget-s a row with no round is skipped, one with rounds keeps them;
    each round's start and end (wall clock) are kept beside its time."""
    calls, clock = [], [0.0]
    times = iter([4.0, 9.0, 1.0, 8.0, 2.0, 6.0] + [5.0] * 20)  # medians 2, 8; means not

    def fake_measure(row, args):
        calls.append((row["d"], row["provider"]))
        clock[0] += 1.0
        if row["d"] == 128 and row["provider"] == "flex":
            raise RuntimeError("no kernel")
        return next(times)

    monkeypatch.setattr(gpu_features, "measure", fake_measure)
    monkeypatch.setattr(gpu_features.time, "time", lambda: clock[0])
    args = gpu_features.parse_args(["--masks", "window", "--d", "64", "128", "--n", "4096",
                                    "--providers", "course", "flex", "--passes", "fwd",
                                    "--rounds", "3", "--budget-s", "7.5"])  # fmt: skip
    record = {"rows": []}
    gpu_features.run_bench(args, record, lambda: None)
    assert calls[:6] == [(64, "course"), (64, "flex")] * 3
    assert calls[6:] == [(128, "course"), (128, "flex")]  # flex failed once: never again
    by = {(r["d"], r["provider"]): r for r in record["rows"]}
    assert by[64, "course"]["rounds_ms"] == [4.0, 1.0, 2.0] and by[64, "course"]["ms"] == 2.0
    assert by[64, "flex"]["ms"] == 8.0 and by[64, "flex"]["status"] == "ok"
    # each round's wall-clock span, to be read beside a log of the card's clock (session 33)
    assert by[64, "course"]["rounds_at"] == [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]]
    assert by[64, "flex"]["rounds_at"] == [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]
    # each round's predecessor: the row timed just before it (session 34: it sets the clock)
    assert by[64, "course"]["after"] == [None, "flex fwd window d=64 N=4096",
                                         "flex fwd window d=64 N=4096"]  # fmt: skip
    assert by[64, "flex"]["after"] == ["course fwd window d=64 N=4096"] * 3
    assert by[128, "course"]["after"] == ["flex fwd window d=64 N=4096"]  # across groups
    assert "after" not in by[128, "flex"]  # failed rounds name none
    assert by[128, "course"]["rounds_ms"] == [5.0] and by[128, "course"]["status"] == "ok"
    assert by[128, "flex"]["status"].startswith("error: RuntimeError")
    assert record["course_over_other"]["window d=64 N=4096 fwd vs flex"] == 4.0


def test_gluon_backward_defaults_are_an_explicit_experiment(monkeypatch):
    """--gluon-backward-defaults KEY=V (session 31: to time DQ_CONVERT = 2 with KEEP_ACC through
    flash_attention beside Flex before either is a default) sets the Gluon backward's defaults
    in this process and returns what they were; the schedule a call then runs has them; a key
    the backward does not have, a value it does not take or a non-integer stops the run with a
    message naming what is accepted."""
    from course_kernels.gluon import backward_launch as GB

    monkeypatch.setattr(GB, "BACKWARD_DQ_DEFAULTS", dict(GB.BACKWARD_DQ_DEFAULTS))
    assert gpu_features.parse_args([]).gluon_backward_defaults == []
    args = gpu_features.parse_args(["--gluon-backward-defaults", "DQ_CONVERT=2", "KEEP_ACC=1"])
    before = gpu_features.set_backward_defaults(args.gluon_backward_defaults)
    assert before == {"DQ_CONVERT": False, "KEEP_ACC": False}
    cfg = GB._schedule(128, True, False, False, {})  # a plain causal call at d = 128
    assert cfg["DQ_CONVERT"] == 2 and cfg["KEEP_ACC"] == 1
    for bad, says in (("NOPE=1", "is not KEY=integer"), ("KEEP_ACC=yes", "is not KEY=integer"),
                      ("DQ_CONVERT=3", r"DQ_CONVERT takes \(False, True, 2\)")):  # fmt: skip
        with pytest.raises(SystemExit, match=says):
            gpu_features.set_backward_defaults([bad])


def test_window_keep_0_turns_the_window_default_off(monkeypatch):
    """WINDOW_KEEP=0 (session 33: to time the window default against the one before it in the
    same way) turns BACKWARD_WINDOW_KEEP off at every head dim in this process and returns what
    it was; a window call at d = 128 then runs neither DQ_CONVERT = 2 nor KEEP_ACC; WINDOW_KEEP=1
    is not taken (the module's table is the way to turn it on)."""
    from course_kernels.gluon import backward_launch as GB

    monkeypatch.setattr(GB, "BACKWARD_WINDOW_KEEP", {64: False, 128: True})
    assert GB._schedule(128, True, True, False, {})["KEEP_ACC"] is True
    before = gpu_features.set_backward_defaults(["WINDOW_KEEP=0"])
    assert before == {"WINDOW_KEEP": {64: False, 128: True}}
    cfg = GB._schedule(128, True, True, False, {})
    assert cfg["KEEP_ACC"] is False and cfg["DQ_CONVERT"] is False
    with pytest.raises(SystemExit, match="is not KEY=integer"):
        gpu_features.set_backward_defaults(["WINDOW_KEEP=1"])


def test_clock_rounds_puts_each_rows_rounds_beside_the_clock_log(tmp_path):
    """experiments/gluon/clock_rounds.py (session 33): the median SM clock, power and temperature
    of the nvidia-smi samples inside a row's rounds (rounds_at), not outside them; the log's
    header and non-sample lines skipped; --offset-s moves the log's times; a row none of whose
    rounds holds a sample says so; a record without its log stops the run naming the file."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "experiments" / "gluon" / "clock_rounds.py"
    spec = importlib.util.spec_from_file_location("clock_rounds", path)
    cr = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cr)
    t0 = 1_800_000_000.0  # 2027-01-15 08:00:00 UTC

    def stamp(dt):  # nvidia-smi's format, in UTC
        when = datetime.datetime.fromtimestamp(t0 + dt, datetime.timezone.utc)
        return when.strftime("%Y/%m/%d %H:%M:%S.%f")[:-3]

    lines = ["timestamp, clocks.current.sm [MHz], power.draw [W], temperature.gpu",
             "Failed to read power: not supported"]  # fmt: skip
    for dt, mhz, w in ((0.5, 1980, 690), (1.0, 1700, 700), (1.5, 1750, 699), (3.0, 1400, 300)):
        lines.append(f"{stamp(dt)}, {mhz} MHz, {w}.00 W, 60")
    rec = {"environment": {"command": "gpu_features.py"}, "rows": [
        {"provider": "course", "pass": "bwd", "mask": "window", "d": 128, "n": 4096, "ms": 1.0,
         "status": "ok", "rounds_at": [[t0 + 0.9, t0 + 1.6]]},
        {"provider": "flex", "pass": "bwd", "mask": "window", "d": 128, "n": 4096, "ms": 1.1,
         "status": "ok", "rounds_at": [[t0 + 2.0, t0 + 2.5]]}]}  # fmt: skip
    (tmp_path / "p.json").write_text(json.dumps(rec))
    (tmp_path / "p.clocks.csv").write_text("\n".join(lines) + "\n")
    samples = cr.read_clocks(tmp_path / "p.clocks.csv")
    assert [s[1] for s in samples] == [1980, 1700, 1750, 1400] and samples[0][0] == t0 + 0.5
    course, flex = cr.row_clocks(rec, samples)
    assert course["samples"] == 2 and course["sm_mhz"] == 1725.0 and course["watts"] == 699.5
    assert flex["samples"] == 0 and flex["sm_mhz"] is None
    shifted = cr.row_clocks(rec, cr.read_clocks(tmp_path / "p.clocks.csv", offset_s=-1.0))
    assert shifted[1]["sm_mhz"] == 1400.0 and shifted[0]["sm_mhz"] is None
    assert cr.main([str(tmp_path / "p.json"), "--out", str(tmp_path / "c.json")]) == 0
    assert json.loads((tmp_path / "c.json").read_text())["p.json"]["rows"][0]["temp_c"] == 60.0
    (tmp_path / "q.json").write_text(json.dumps(rec))
    with pytest.raises(SystemExit, match="no clock log beside it"):
        cr.main([str(tmp_path / "q.json")])


def _clock_trace():
    path = ROOT / "experiments" / "gluon" / "clock_trace.py"
    spec = importlib.util.spec_from_file_location("clock_trace", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_clock_trace_pairs_rotate_and_windows_count_from_the_followers_start():
    """experiments/gluon/clock_trace.py (session 34): every (predecessor, follower) pair runs
    --repeats times in a rotating order; a window holds the calls that *start* in it (calls back
    to back) and the clock samples whose time falls in it; the summary's last window is compared
    with the same follower's after an idle card, at the same N."""
    ct = _clock_trace()
    # the rows' options are gpu_features.py's own (one definition): same names, same defaults
    mine, theirs = ct.parse_args(["--batch", "2"]), gpu_features.parse_args(["--batch", "2"])
    for key in ("batch", "hidden", "window", "autotune", "device"):
        assert getattr(mine, key) == getattr(theirs, key)
    assert (mine.batch, mine.hidden, mine.window, mine.device) == (2, 2048, 1024, "cuda")
    order = ct.schedule(["idle", "a fwd"], ["a bwd", "b bwd"], repeats=3)
    pairs = [("idle", "a bwd"), ("a fwd", "a bwd"), ("idle", "b bwd"), ("a fwd", "b bwd")]
    assert sorted(order) == sorted(pairs * 3) and order[:4] == pairs
    assert [order[4], order[8]] == [pairs[1], pairs[2]]  # each repeat starts one pair later

    call_ms = [4.0, 4.0, 6.0, 30.0, 200.0, 1.0]  # starts 0, 4, 8, 14, 44, 244
    assert ct.call_starts(call_ms) == [0.0, 4.0, 8.0, 14.0, 44.0, 244.0]
    samples = [(-5.0, 1000, 700), (2.0, 1500, 650), (9.9, 1700, 640), (10.0, 1900, 500),
               (151.0, 1980, 300)]  # fmt: skip
    w = ct.window_medians(call_ms, samples)
    assert [x["calls"] for x in w] == [3, 2, 0, 1]
    assert [x["ms"] for x in w] == [4.0, 115.0, None, 1.0]
    assert [x["mhz"] for x in w] == [1600, 1900, None, 1980]  # the -5 ms sample is before zero
    assert w[-1]["to_ms"] is None and w[0]["watts"] == 645

    def t(n, pred, follower, last):
        return {"n": n, "pred": pred, "follower": follower,
                "windows": [{"from_ms": 0.0, "to_ms": None, "ms": last, "mhz": None,
                             "watts": None}]}  # fmt: skip

    lines = ct.summarize([t(8, "idle", "c bwd", 2.0), t(8, "idle", "c bwd", 4.0),
                          t(8, "c fwd", "c bwd", 3.3), t(16, "idle", "c bwd", 10.0),
                          t(16, "c fwd", "c bwd", 10.5), t(8, "c fwd", "f bwd", 5.0),
                          t(32, "idle", "c bwd", 2.0), t(32, "c fwd", "c bwd", None)])  # fmt: skip
    by = {(x["n"], x["pred"], x["follower"]): x for x in lines}
    assert (
        by[8, "idle", "c bwd"]["windows"][0]["ms"] == 3.0 and by[8, "idle", "c bwd"]["repeats"] == 2
    )
    assert by[8, "c fwd", "c bwd"]["last_over_idle"] == 1.1
    assert by[16, "c fwd", "c bwd"]["last_over_idle"] == 1.05
    assert by[8, "c fwd", "f bwd"]["last_over_idle"] is None  # no idle trace of that follower
    assert by[32, "c fwd", "c bwd"]["last_over_idle"] is None  # no call in its last window


def test_clock_trace_runs_on_the_cpu(tmp_path):
    """--device cpu: the course kernel's rows (Triton's interpreter), host timer, no NVML; the
    record keeps each trace's calls and the summary pairs each follower with its idle trace."""
    out = tmp_path / "trace.json"
    cmd = [sys.executable, str(ROOT / "experiments" / "gluon" / "clock_trace.py"), "--device",
           "cpu", "--providers", "course", "--mask", "window", "--d", "32", "--n", "64",
           "--hidden", "64", "--batch", "1", "--window", "16", "--repeats", "1", "--idle-ms", "1",
           "--pred-ms", "1", "--follow-ms", "400", "--out", str(out)]  # fmt: skip
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    run = subprocess.run(cmd, timeout=300, env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    rec = json.loads(out.read_text())
    assert rec["nvml"] is False and rec["args"]["mask"] == "window"
    assert [(t["pred"], t["follower"]) for t in rec["traces"]] == [
        ("idle", "course bwd"),
        ("course fwd", "course bwd"),
    ]
    assert all(len(t["call_ms"]) >= 2 and min(t["call_ms"]) > 0 for t in rec["traces"])
    # on the CPU the follower runs until --follow-ms have passed (not a count from an estimate
    # taken while the CPU was busier: that left the last window without a call, session 36)
    assert all(sum(t["call_ms"]) >= 400 for t in rec["traces"])
    assert all(t["windows"][-1]["calls"] >= 1 for t in rec["traces"])
    assert rec["traces"][0]["pred_ms"] < rec["traces"][1]["pred_ms"]  # idle: no calls before
    assert [x["last_over_idle"] for x in rec["summary"]][0] == 1.0
