"""Does the kernel that ran just before a timed kernel set its speed? (session 34.) For each pair
(predecessor, follower) of one benchmark row: the card idles for ``--idle-ms``, the predecessor
runs back to back for about ``--pred-ms``, then the follower for about ``--follow-ms`` with a
CUDA event between every two calls, while a host thread reads the SM clock and the power through
NVML every ``--sample-ms``. The record keeps every call's time and every sample, placed on one
time axis whose zero is the follower's first call; the summary gives, for each pair, the median
call time and SM clock in windows after that zero (0-10 ms, 10-50, 50-150, 150 to the end).

    python experiments/gluon/clock_trace.py --mask window --d 128 --n 8192 16384 --out trace.json

Predecessors: ``idle`` (none: the follower starts on an idle card) and each provider's forward;
followers: each provider's backward (``--followers`` adds forwards). Each pair runs ``--repeats``
times, the pairs in a rotating order. The rows and calls are ``scripts/gpu_features.py``'s (the
same inputs, masks and FlexAttention compile), so a trace explains that script's numbers.
Session 34 found that a backward timed in ``gpu_features.py``'s 50 ms rounds right after the
course's forward ran 2-5% slower than after FlexAttention's (notes/gluon_backward.md); this
measures how long that lasts. ``--device cpu`` smoke-tests the script (course kernel only, host
timer, no NVML)."""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WINDOWS_MS = ((0.0, 10.0), (10.0, 50.0), (50.0, 150.0), (150.0, math.inf))


class Nvml:
    """The SM clock (MHz) and power (W) of one GPU through libnvidia-ml, read with ctypes (no
    Python package needed); ``ok`` is False where the library or the GPU is missing."""

    def __init__(self, index: int = 0):
        self.ok = False
        try:
            self.lib = ctypes.CDLL("libnvidia-ml.so.1")
            self.handle = ctypes.c_void_p()
            if (
                self.lib.nvmlInit_v2() == 0
                and self.lib.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(self.handle)) == 0
            ):
                self.ok = self.read() is not None
        except (OSError, AttributeError):
            pass

    def read(self) -> tuple[float, float] | None:
        clock, milliwatts = ctypes.c_uint(), ctypes.c_uint()
        if self.lib.nvmlDeviceGetClockInfo(self.handle, 1, ctypes.byref(clock)) != 0:  # 1: SM
            return None
        if self.lib.nvmlDeviceGetPowerUsage(self.handle, ctypes.byref(milliwatts)) != 0:
            return None
        return float(clock.value), milliwatts.value / 1000.0


class Sampler(threading.Thread):
    """Appends (host seconds, SM MHz, watts) to ``samples`` every ``period_s`` until stopped."""

    def __init__(self, nvml: Nvml, period_s: float):
        super().__init__(daemon=True)
        self.nvml, self.period_s, self.samples = nvml, period_s, []
        self.halt = threading.Event()

    def run(self):
        while not self.halt.is_set():
            got = self.nvml.read()
            if got:
                self.samples.append((time.perf_counter(), *got))
            time.sleep(self.period_s)


def schedule(preds: list[str], followers: list[str], repeats: int) -> list[tuple[str, str]]:
    """Every (predecessor, follower) pair ``repeats`` times; repeat r starts r pairs further on,
    so no pair always runs first or always follows the same pair."""
    pairs = [(p, f) for f in followers for p in preds]
    return [pairs[(r + i) % len(pairs)] for r in range(repeats) for i in range(len(pairs))]


def call_starts(call_ms: list[float]) -> list[float]:
    """Each call's start (ms after the first call's start), calls back to back."""
    out, t = [], 0.0
    for ms in call_ms:
        out.append(t)
        t += ms
    return out


def window_medians(call_ms, samples, windows=WINDOWS_MS) -> list[dict]:
    """For each window [a, b) of ms after the follower's start: the median time of the calls that
    start in it and the median SM clock and power of the samples in it (None where empty).
    ``samples``: (ms after the follower's start, MHz, W)."""
    starts = call_starts(call_ms)
    out = []
    for a, b in windows:
        calls = [ms for s, ms in zip(starts, call_ms, strict=True) if a <= s < b]
        inside = [s for s in samples if a <= s[0] < b]
        out.append({
            "from_ms": a, "to_ms": None if math.isinf(b) else b, "calls": len(calls),
            "ms": round(statistics.median(calls), 4) if calls else None,
            "mhz": round(statistics.median(s[1] for s in inside)) if inside else None,
            "watts": round(statistics.median(s[2] for s in inside)) if inside else None,
        })  # fmt: skip
    return out


def summarize(traces: list[dict]) -> list[dict]:
    """One line per (N, predecessor, follower): each window's median over the repeats of the
    per-trace medians, and the last window's time over the same follower's after ``idle``."""
    groups: dict[tuple, list[dict]] = {}
    for t in traces:
        groups.setdefault((t["n"], t["pred"], t["follower"]), []).append(t)
    out = []
    for (n, pred, follower), ts in groups.items():
        wins = []
        for i in range(len(ts[0]["windows"])):
            vals = [t["windows"][i] for t in ts]
            med = {}
            for k in ("ms", "mhz", "watts"):
                got = [v[k] for v in vals if v[k] is not None]
                med[k] = statistics.median(got) if got else None
            wins.append({"from_ms": vals[0]["from_ms"], "to_ms": vals[0]["to_ms"], **med})
        out.append({"n": n, "pred": pred, "follower": follower, "repeats": len(ts),
                    "windows": wins})  # fmt: skip
    for line in out:
        base = next((x for x in out if (x["n"], x["pred"], x["follower"])
                     == (line["n"], "idle", line["follower"])), None)  # fmt: skip
        last, ref = line["windows"][-1]["ms"], base and base["windows"][-1]["ms"]
        line["last_over_idle"] = round(last / ref, 4) if ref and last is not None else None
    return out


def make_calls(gf, args, n: int) -> dict[str, object]:
    """'{provider} {pass}' -> a function making one call of gpu_features.py's row (mask, d, n)."""
    import torch

    ns = argparse.Namespace(window=args.window, batch=args.batch, hidden=args.hidden)
    calls = {}
    for provider in args.providers:
        row = {"mask": args.mask, "d": args.d, "n": n, "provider": provider}
        q, k, v, do = gf._inputs(row, ns)
        fn = gf.make_fn(row, ns, q, k, v)

        def fwd(fn=fn):
            with torch.no_grad():
                return fn()

        out = fn()
        grad = do if out.shape == do.shape else do.transpose(1, 2).reshape(out.shape)
        leaves = getattr(fn, "leaves", (q, k, v))
        calls[f"{provider} fwd"] = fwd
        calls[f"{provider} bwd"] = lambda out=out, leaves=leaves, grad=grad: torch.autograd.grad(
            out, leaves, grad, retain_graph=True
        )
    return calls


class Timer:
    """Marks between calls: CUDA events on a GPU, host time after a synchronous call on the CPU."""

    def __init__(self, device: str):
        import torch

        self.torch, self.cuda = torch, device == "cuda"

    def mark(self):
        if self.cuda:
            ev = self.torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def ms(self, a, b) -> float:
        return a.elapsed_time(b) if self.cuda else (b - a) * 1e3

    def sync(self):
        if self.cuda:
            self.torch.cuda.synchronize()


def trace(calls, timer, sampler, pred, follower, args, per_call_ms) -> dict:
    """One pair: idle, the predecessor for ~--pred-ms, the follower for ~--follow-ms."""
    timer.sync()
    time.sleep(args.idle_ms / 1e3)
    first = len(sampler.samples) if sampler else 0
    t0 = time.perf_counter()
    m0 = timer.mark()  # the card is idle: this mark runs at t0 (to ~10 us)
    if pred != "idle":
        for _ in range(max(1, math.ceil(args.pred_ms / per_call_ms[pred]))):
            calls[pred]()
    marks = [timer.mark()]
    if timer.cuda:  # the calls are queued ahead of the card: a count from the measured call time
        for _ in range(max(2, math.ceil(args.follow_ms / per_call_ms[follower]))):
            calls[follower]()
            marks.append(timer.mark())
    else:  # synchronous calls: until --follow-ms have passed (an estimate taken while the CPU
        # was busier would end the run before the last window, leaving it without a call)
        tf = time.perf_counter()
        while len(marks) < 3 or (time.perf_counter() - tf) * 1e3 < args.follow_ms:
            calls[follower]()
            marks.append(timer.mark())
    timer.sync()
    time.sleep(args.sample_ms * 2 / 1e3)
    call_ms = [timer.ms(a, b) for a, b in zip(marks[:-1], marks[1:], strict=True)]
    zero = t0 + timer.ms(m0, marks[0]) / 1e3  # the follower's first call, on the host's clock
    got = sampler.samples[first:] if sampler else []
    samples = [(round((t - zero) * 1e3, 2), mhz, w) for t, mhz, w in got]
    return {"pred": pred, "follower": follower, "pred_ms": round(timer.ms(m0, marks[0]), 3),
            "call_ms": [round(x, 4) for x in call_ms], "samples": samples,
            "windows": window_medians(call_ms, samples)}  # fmt: skip


def _fmt(x, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def parse_args(argv=None):
    """This script's options, after scripts/gpu_features.py's row options (--batch, --hidden,
    --window, --autotune, --device: the same rows as that script's)."""
    if str(ROOT / "scripts") not in sys.path:
        sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]
    import gpu_features as gf

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], parents=[gf.row_options()])
    p.add_argument("--mask", choices=("causal", "window", "document"), default="window")
    p.add_argument("--d", type=int, default=128, help="head dim")
    p.add_argument("--n", type=int, nargs="+", default=[8192, 16384], help="seq lengths")
    p.add_argument("--providers", nargs="+", choices=("course", "flex"), default=["course", "flex"])
    p.add_argument("--followers", nargs="+", choices=("fwd", "bwd"), default=["bwd"])
    p.add_argument("--repeats", type=int, default=3, help="times each pair runs")
    p.add_argument("--idle-ms", type=float, default=400.0, help="idle card before each pair")
    p.add_argument("--pred-ms", type=float, default=200.0, help="the predecessor's run (ms)")
    p.add_argument("--follow-ms", type=float, default=400.0, help="the follower's run (ms)")
    p.add_argument("--sample-ms", type=float, default=2.0, help="NVML sampling period (ms)")
    p.add_argument("--out", default="clock_trace.json", help="JSON file to write")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)  # puts scripts/ on sys.path
    if not args.autotune:
        os.environ["COURSE_KERNELS_AUTOTUNE"] = "0"  # read when course_kernels loads
    import gpu_features as gf

    gf.DEVICE[0] = args.device
    nvml = Nvml() if args.device == "cuda" else None
    sampler = Sampler(nvml, args.sample_ms / 1e3) if nvml and nvml.ok else None
    if sampler:
        sampler.start()
    timer = Timer(args.device)
    record = {"environment": gf.environment(args), "args": vars(args), "nvml": bool(sampler),
              "traces": []}  # fmt: skip
    preds = ["idle"] + [f"{p} fwd" for p in args.providers]
    followers = [f"{p} {x}" for x in args.followers for p in args.providers]
    for n in args.n:
        calls = make_calls(gf, args, n)
        per_call_ms = {}
        for name, fn in calls.items():  # compile, then each call's time for the run lengths
            fn(), fn()
            timer.sync()
            a = timer.mark()
            for _ in range(3):
                fn()
            b = timer.mark()
            timer.sync()  # an event's time is readable only once it has run
            per_call_ms[name] = max(timer.ms(a, b) / 3, 1e-3)
        for pred, follower in schedule(preds, followers, args.repeats):
            t = {"n": n, **trace(calls, timer, sampler, pred, follower, args, per_call_ms)}
            record["traces"].append(t)
            last = t["windows"][-1]
            print(f"N={n} {pred:>10} -> {follower}: first {t['windows'][0]['ms']} ms, last "
                  f"{last['ms']} ms, {last['mhz']} MHz", flush=True)  # fmt: skip
    if sampler:
        sampler.halt.set()
    record["summary"] = summarize(record["traces"])
    for line in record["summary"]:
        cells = "  ".join(f"{_fmt(w['ms'], '.4f')} ms {_fmt(w['mhz'], '.0f')} MHz"
                          for w in line["windows"])  # fmt: skip
        print(f"N={line['n']} {line['pred']:>10} -> {line['follower']}: {cells}  "
              f"last/idle {line['last_over_idle']}")  # fmt: skip
    Path(args.out).write_text(json.dumps(record) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
