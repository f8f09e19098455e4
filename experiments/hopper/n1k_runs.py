"""N = 1024 in fresh processes (issue 22: "every row of the N = 1K set >= 1.0x FA2 in each of
three fresh processes, worst of three"), with the configs each process's autotuner chose.

    python experiments/hopper/n1k_runs.py n1k --out DIR --repeats 3 --warm --dtypes float16,bfloat16

``n1k``: ``--warm`` runs one unrecorded process first (a fresh machine's Triton cache is cold:
compiling the autotuning lists takes minutes), then ``--repeats`` fresh processes of ``n1k-one``,
each running ``course_kernels.bench.run_bench`` at N = 1024 (course kernel and PyTorch's
FlashAttention-2 backend) and timing each call both as the benchmark does (the host launches
every call) and replayed from a CUDA graph (the GPU alone). A process that times out is recorded
as such; the file is rewritten after every process. ``--cudagraph-tuning`` times candidate
configs inside a CUDA graph (``triton.testing.do_bench_cudagraph``: no host time in the tuning).
Writes ``n1024_configs.json`` (environment, runs).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from functools import partial

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from schedule_levers import DEVICE, _env, _inputs, _ms, flash, flash_launch, torch, triton  # noqa: E402

from course_kernels.triton.backward import _attn_bwd_dkdv  # noqa: E402
from course_kernels.triton.forward import _attn_fwd  # noqa: E402


def _cudagraph_bench(fn, quantiles):
    return triton.testing.do_bench_cudagraph(fn, rep=25, quantiles=quantiles)


def cmd_n1k_one(args):
    """One fresh process: run_bench at N = 1024, then print the chosen configs as JSON."""
    from course_kernels import bench
    from course_kernels.triton import backward as triton_backward

    kernels = {"_attn_fwd": _attn_fwd, "_attn_bwd_dq": triton_backward._attn_bwd_dq,
               "_attn_bwd_dkdv": _attn_bwd_dkdv}  # fmt: skip
    if args.cudagraph_tuning:
        for name, kernel in kernels.items():
            if not hasattr(kernel, "do_bench"):
                sys.exit(f"{name} has no do_bench in Triton {triton.__version__}: cannot switch")
            kernel.do_bench = _cudagraph_bench  # Autotuner's timing function (Triton >= 3.0)
    rows = bench.run_bench(tempfile.mkdtemp(prefix="n1k_"), dtypes=tuple(args.dtypes.split(",")),
                           ns=(1024,), providers=("flash", "sdpa-flash"), check=False,
                           log=lambda *a: print(*a, file=sys.stderr))  # fmt: skip
    graph_rows = _plain_vs_graph(args.dtypes.split(","))
    names = {id(k): n for n, k in kernels.items()}
    tuned = [{"kernel": names.get(key[0], "?"), "key": [str(x) for x in key[2:]], "config": cfg}
             for key, cfg in flash_launch._TUNED.items()]  # fmt: skip
    print("RESULT " + json.dumps({"rows": rows, "tuned_configs": tuned, "graph": graph_rows}))
    return 0


def _plain_vs_graph(dtypes, n=1024):
    """Each call timed as the benchmark times it (``do_bench``: the host launches every call)
    and replayed from a CUDA graph (``do_bench_cudagraph``: GPU time alone). If only the first
    swings between processes, the swing is on the host."""
    from course_kernels.bench import provider_fn

    sdpa = provider_fn("sdpa-flash")
    rows = []
    for dt in dtypes:
        for d in (64, 128):
            for causal in (False, True):
                q, k, v, do = _inputs(getattr(torch, dt), d, n)
                scale = d**-0.5
                o, lse2 = flash._forward(q, k, v, causal, scale)
                calls = {
                    ("flash", "fwd"): partial(flash._forward, q, k, v, causal, scale),
                    ("flash", "bwd"): partial(flash._backward, do, q, k, v, o, lse2, causal, scale),
                    ("sdpa-flash", "fwd"): partial(sdpa, q, k, v, causal),
                }
                for (impl, mode), fn in calls.items():
                    with torch.no_grad():
                        fn()
                        plain = _ms(fn)
                        graph = triton.testing.do_bench_cudagraph(fn, rep=60)
                    rows.append({"dtype": dt, "d": d, "N": n, "causal": causal, "impl": impl,
                                 "mode": mode, "plain_ms": plain, "graph_ms": graph})  # fmt: skip
    return rows


def cmd_n1k(args):
    """``--repeats`` fresh processes of ``n1k-one`` (each tunes anew); all rows and configs."""
    runs = []
    cmd = [sys.executable, os.path.abspath(__file__), "n1k-one", "--out", args.out,
           "--dtypes", args.dtypes] + (["--cudagraph-tuning"] if args.cudagraph_tuning else [])  # fmt: skip
    if args.warm:  # one unrecorded process first: fills Triton's compile cache on a fresh machine
        t0 = time.perf_counter()
        with contextlib.suppress(subprocess.TimeoutExpired):
            subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
        print(f"warm-up process: {time.perf_counter() - t0:.0f} s", flush=True)
    name = "n1024_cudagraph_tuning.json" if args.cudagraph_tuning else "n1024_configs.json"
    os.makedirs(args.out, exist_ok=True)
    for i in range(args.repeats):
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
        except subprocess.TimeoutExpired as e:  # recorded as such; the other runs still count
            runs.append(
                {"error": f"timed out after {args.timeout} s", "stderr": str(e.stderr)[-2000:]}
            )
            print(f"run {i}: timed out", flush=True)
        else:
            line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
            runs.append(json.loads(line[-1][7:]) if line else {"error": proc.stderr[-2000:]})
            print(f"run {i}: rc={proc.returncode}, {time.perf_counter() - t0:.0f} s", flush=True)
        with open(os.path.join(args.out, name), "w") as f:  # after every run: a kill keeps the rest
            json.dump(
                {"environment": _env(), "warm_up_process": args.warm, "runs": runs}, f, indent=1
            )
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "what", choices=["n1k", "n1k-one"], help="n1k: the fresh processes; n1k-one: one"
    )
    ap.add_argument("--out", default="/tmp/n1k_runs", help="folder for the JSON file")
    ap.add_argument("--dtypes", default="float16", help="comma-separated torch dtypes")
    ap.add_argument("--repeats", type=int, default=3, help="fresh processes to run")
    ap.add_argument("--timeout", type=int, default=300, help="seconds per process")
    ap.add_argument("--warm", action="store_true",
                    help="run one unrecorded process first (cold Triton cache on a fresh machine)")  # fmt: skip
    ap.add_argument("--cudagraph-tuning", action="store_true",
                    help="autotune with do_bench_cudagraph (no host time in the choice)")  # fmt: skip
    args = ap.parse_args(argv)
    if DEVICE != "cuda":
        ap.error("times kernels: needs a CUDA GPU")
    return {"n1k": cmd_n1k, "n1k-one": cmd_n1k_one}[args.what](args)


if __name__ == "__main__":
    sys.exit(main())
