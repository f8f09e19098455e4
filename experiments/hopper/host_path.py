"""Host time of one ``flash_attention`` call at N = 1K, with the direct launch and without it
(issue 22: "N = 1K robust"; notes/kernel.md item 14).

    python experiments/hopper/host_path.py --out DIR                  # on a GPU, < 90 s
    python experiments/hopper/host_path.py --out DIR --baseline REPO  # + another checkout's code
    python experiments/hopper/host_path.py --cpu                      # CPU: launches stubbed

On a GPU, per shape (B = 4, H * d = 2048, N = 1024, fp16, d = 64/128, causal or not) and per
call (``fwd``: ``flash_attention`` on inputs that require grad; ``bwd``: ``autograd.grad`` on a
retained graph, as the benchmark times it; ``fwd+bwd``), three times per call in microseconds:
``host`` (100 calls back to back, the GPU never waited for: the Python path alone while the
GPU queue has room), ``wall`` (the same calls with a synchronisation at the end: whichever of
host and GPU is slower) and ``graph`` (a CUDA-graph replay of the same call: the GPU alone).
Paths: ``jit`` (``JITFunction.run`` every call, ``configs.DIRECT = False``), ``direct``
(the compiled kernel's launcher), ``sdpa-flash`` (FlashAttention-2 in PyTorch, the target),
and with ``--baseline`` the same calls in a child process importing another checkout's
``course_kernels`` (e.g. ``main``). Median of 5 repeats. Autotuning is off (one config per
kernel: the host path does not depend on it; ``--autotune`` turns it on). Writes
``host_path.json`` (environment, rows).

``--cpu``: no GPU; every kernel launch is stubbed out and the Python path of a call is timed on
small CPU tensors, with a count of the torch ops per call that would launch a CUDA kernel.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SHAPES = [(d, causal) for d in (64, 128) for causal in (False, True)]
CALLS = ("fwd", "bwd", "fwd+bwd")
# aten ops that allocate or make views: no CUDA kernel. Any other op per call launches one.
NO_KERNEL = {"empty_like", "empty", "empty_strided", "detach", "view", "alias", "as_strided",
             "_reshape_alias", "t", "transpose", "expand", "unsqueeze", "squeeze", "reshape"}  # fmt: skip


def _import(repo):
    sys.path.insert(0, repo)
    os.environ.setdefault("COURSE_KERNELS_AUTOTUNE", "0")
    import course_kernels

    print(f"course_kernels from {os.path.dirname(course_kernels.__file__)}", file=sys.stderr)
    from course_kernels.triton import flash

    return flash


def _calls(fn, q, k, v, do, causal):
    """The three calls of one path: closures over fixed inputs."""
    import torch

    out = fn(q, k, v, causal)

    def fwd():
        return fn(q, k, v, causal)

    def bwd():
        return torch.autograd.grad(out, (q, k, v), do, retain_graph=True)

    def fwd_bwd():
        return torch.autograd.grad(fn(q, k, v, causal), (q, k, v), do)

    return {"fwd": fwd, "bwd": bwd, "fwd+bwd": fwd_bwd}


def _times(call, n=100, repeats=5):
    """(host, wall) microseconds per call, medians of ``repeats`` runs of ``n`` calls."""
    import torch

    host, wall = [], []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            call()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        host.append((t1 - t0) / n * 1e6)
        wall.append((t2 - t0) / n * 1e6)
    return statistics.median(host), statistics.median(wall)


def _this_checkouts_measure():
    """``course_kernels/apps/measure.py`` of the checkout this file is in, loaded by its path:
    the ``--baseline`` child imports another checkout's ``course_kernels``, which may predate
    that module (it appeared in session 21), and the capture must be the same in both."""
    import importlib.util

    path = os.path.join(ROOT, "course_kernels", "apps", "measure.py")
    spec = importlib.util.spec_from_file_location("_host_path_measure", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _graph_us(call, n=100, repeats=5):
    """Microseconds per replay of ``call`` captured in a CUDA graph (``apps.measure._graphed``);
    None if it cannot be."""
    import torch

    try:
        replay = _this_checkouts_measure()._graphed(call)
    except Exception as exc:  # e.g. a backward the graph cannot hold
        print(f"  (no graph: {exc!r:.100})", flush=True)
        return None
    runs = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            replay()
        torch.cuda.synchronize()
        runs.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(runs)


def measure(paths_only=None) -> list[dict]:
    """Rows for this process's ``course_kernels``: paths ``jit`` and ``direct`` (or ``main``
    when it has no direct launch) and ``sdpa-flash``."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from course_kernels.triton.flash import flash_attention

    from course_kernels.triton import configs

    plans = configs if hasattr(configs, "KernelPlan") else None  # None: before the direct launch

    def sdpa(q, k, v, causal):
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    def course(q, k, v, causal):
        return flash_attention(q, k, v, causal=causal)

    paths = {"sdpa-flash": (sdpa, None)}
    if plans is None:
        paths["main"] = (course, None)
    else:
        paths.update({"jit": (course, False), "direct": (course, True)})
    if paths_only:
        paths = {p: paths[p] for p in paths_only if p in paths}
    rows = []
    for d, causal in SHAPES:
        h = 2048 // d
        q, k, v, do = (
            torch.randn(4, h, 1024, d, device="cuda", dtype=torch.float16) for _ in range(4)
        )
        q, k, v = (x.requires_grad_() for x in (q, k, v))
        for path, (fn, direct) in paths.items():
            if direct is not None:
                plans.DIRECT = direct
            for call_name, call in _calls(fn, q, k, v, do, causal).items():
                for _ in range(3):  # tune, compile, first fn.run per plan
                    call()
                host, wall = _times(call)
                row = dict(path=path, call=call_name, d=d, causal=causal, N=1024, B=4, H=h,
                           host_us=host, wall_us=wall, graph_us=_graph_us(call))  # fmt: skip
                rows.append(row)
                g = row["graph_us"]
                print(f"d={d:3d} causal={causal!s:5} {call_name:7s} {path:10s} host {host:7.1f} "
                      f"wall {wall:7.1f} graph {g if g is None else round(g, 1)} us", flush=True)  # fmt: skip
        if plans is not None:
            plans.DIRECT = True
    return rows


def gpu_main(args) -> int:
    import torch

    if not torch.cuda.is_available():
        print("needs a CUDA GPU (or --cpu)")
        return 2
    from course_kernels.bench import environment

    env = environment()
    env["command"] = "python " + " ".join(sys.argv)
    t0 = time.time()
    rows = measure()
    if args.baseline:
        child = subprocess.run(
            [sys.executable, __file__, "--child", args.baseline] + (["--autotune"] if args.autotune else []),
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        rows += json.loads(child.stdout.strip().splitlines()[-1])
        env["baseline"] = os.path.abspath(args.baseline)
    env["seconds"] = round(time.time() - t0, 1)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "host_path.json"), "w") as f:
        json.dump({"environment": env, "rows": rows}, f, indent=1)
    print(f"wrote {os.path.join(args.out, 'host_path.json')} ({env['seconds']} s)")
    return 0


def cpu_main(args) -> int:
    """Launches stubbed: CPU microseconds per call on small CPU tensors (process time, min and
    median of 31 runs of 300 calls), and the torch ops per call."""
    import cProfile
    import pstats

    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    flash = _import(args.repo)
    from course_kernels.triton import launch

    from course_kernels.triton import configs

    if hasattr(configs, "KernelPlan"):
        configs.KernelPlan.launch = lambda self, tensors: None
    else:  # a checkout before the launch plans
        launch._launch = lambda *a, **k: None

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = collections.Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops[func.overloadpacket.__name__] += 1
            return func(*args, **(kwargs or {}))

    q, k, v, do = (torch.randn(1, 2, 64, 64, dtype=torch.float16) for _ in range(4))
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    out = {"repo": os.path.abspath(args.repo), "rows": []}
    for causal in (False, True):
        for name, call in _calls(lambda *a: flash.flash_attention(*a[:3], causal=a[3]), q, k, v, do, causal).items():  # fmt: skip
            call()
            with Count() as c:
                call()
            runs = []
            for _ in range(31):  # CPU time of this process: the machine may be shared
                t0 = time.process_time_ns()
                for _ in range(300):
                    call()
                runs.append((time.process_time_ns() - t0) / 300 / 1e3)
            kernels = {op: n for op, n in c.ops.items() if op not in NO_KERNEL}
            row = dict(call=name, causal=causal, min_us=min(runs), median_us=statistics.median(runs),
                       ops=dict(c.ops), kernel_ops=kernels)  # fmt: skip
            out["rows"].append(row)
            print(f"causal={causal!s:5} {name:7s} min {row['min_us']:6.1f} median "
                  f"{row['median_us']:6.1f} us  ops {dict(c.ops)}", flush=True)  # fmt: skip
    if args.profile:
        calls = _calls(lambda *a: flash.flash_attention(*a[:3], causal=a[3]), q, k, v, do, True)
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(2000):
            calls["fwd+bwd"]()
        pr.disable()
        pstats.Stats(pr).sort_stats("tottime").print_stats(25)
    print(json.dumps(out))
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="/tmp/host_path", help="folder for host_path.json")
    ap.add_argument("--baseline", help="another checkout (e.g. main) measured in a child process")
    ap.add_argument("--autotune", action="store_true", help="keep autotuning on")
    ap.add_argument("--cpu", action="store_true", help="CPU, launches stubbed")
    ap.add_argument("--repo", default=ROOT, help="--cpu: the checkout whose course_kernels to time")
    ap.add_argument("--profile", action="store_true", help="--cpu: also a cProfile of fwd+bwd")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.autotune:
        os.environ["COURSE_KERNELS_AUTOTUNE"] = "1"
    if args.cpu:
        return cpu_main(args)
    if args.child:  # the baseline: print its rows as JSON on the last line
        _import(args.child)
        rows = measure(paths_only=["main", "jit", "direct"])
        print(json.dumps([{**r, "path": "baseline:" + r["path"]} for r in rows]))
        return 0
    _import(ROOT)
    return gpu_main(args)


if __name__ == "__main__":
    sys.exit(main())
