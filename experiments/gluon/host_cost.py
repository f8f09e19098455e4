"""Where the Gluon forward's host time goes, step by step (issue 23; the dispatch rule's cause).

    python experiments/gluon/host_cost.py --out DIR

``experiments/gluon/dispatch.py`` found the Gluon call up to 0.43 ms slower than the CUDA-graph
replay of the same call at small N, the ``tl`` call at most 0.05 ms. This times, on the host
only (``time.perf_counter`` around many calls, the GPU never waited for: the queue is drained
between steps), each step of ``course_kernels.gluon.launch.gluon_attention_forward`` and of the
whole ``flash_attention`` call with either forward, fp16, B = 4, H = 16, N = 512, d = 128 (a
kernel of ~0.024 ms, so the host dominates). Writes ``host_cost.json`` (environment, one row per
step: microseconds per call, median of 5 repeats of 200 calls).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from course_kernels.triton import _env as _triton_env  # noqa: E402,F401  (before any @jit)

import torch  # noqa: E402


def _us(fn, calls=200, repeats=5):
    """Host microseconds per call of ``fn`` (the GPU queue drained before each repeat)."""
    runs = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        runs.append((time.perf_counter() - t) / calls * 1e6)
        torch.cuda.synchronize()
    return statistics.median(runs)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="/tmp/host_cost", help="folder for host_cost.json")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        ap.error("needs a CUDA GPU")
    from course_kernels import flash_attention
    from course_kernels.bench import environment
    from course_kernels.gluon import launch as G
    from course_kernels.triton.launch import FORWARD_ENV

    gl, TensorDescriptor = G.gl, G.TensorDescriptor
    q, k, v = (torch.randn(4, 16, 512, 128, device="cuda", dtype=torch.float16) for _ in range(3))
    cfg = G.DEFAULT_CONFIG[128]
    bm, bn = 64, cfg["BN"]
    o = torch.empty_like(q)
    lse = torch.empty(q.shape[:3], device="cuda", dtype=torch.float32)
    q_layout = gl.NVMMASharedLayout.get_default_for([bm, 128], gl.float16)
    kv_layout = gl.NVMMASharedLayout.get_default_for([bn, 128], gl.float16)

    def make_descs():  # what gluon_attention_forward builds on every call
        return [
            TensorDescriptor.from_tensor(x.view(-1, 128), [b, 128], lay)
            for x, b, lay in ((q, bm, q_layout), (k, bn, kv_layout), (v, bn, kv_layout), (o, bm, q_layout))
        ]  # fmt: skip

    descs = make_descs()
    num_pid_m = math.ceil(512 / (bm * cfg["NUM_CONSUMERS"]))
    num_tiles = num_pid_m * 4 * 16
    consts = dict(BM=bm, BN=bn, HEAD_DIM=128, NUM_CONSUMERS=cfg["NUM_CONSUMERS"],
                  STAGES=cfg["STAGES"], QSTAGES=cfg["QSTAGES"], CAUSAL=False,
                  OVERLAP=True, CONSUMER_REGS=G.CONSUMER_REGS[cfg["NUM_CONSUMERS"]],
                  LPT=False, num_warps=4)  # fmt: skip

    def launch_only():
        G._attn_fwd_kernel[(num_tiles,)](*descs, o, lse, 512, 16, 1, 0.1, num_pid_m, num_tiles,
                                         **consts)  # fmt: skip

    def with_env(path):
        def call():
            os.environ[FORWARD_ENV] = path
            return flash_attention(q, k, v)

        return call

    steps = {
        "gluon_available()": G.gluon_available,
        "_check_inputs": lambda: G._check_inputs(q, k, v),
        "2 x NVMMASharedLayout.get_default_for": lambda: (
            gl.NVMMASharedLayout.get_default_for([bm, 128], gl.float16),
            gl.NVMMASharedLayout.get_default_for([bn, 128], gl.float16),
        ),
        "4 x TensorDescriptor.from_tensor": make_descs,
        "torch.empty_like + torch.empty (o, lse)": lambda: (
            torch.empty_like(q),
            torch.empty(q.shape[:3], device="cuda", dtype=torch.float32),
        ),
        "kernel launch only (_attn_fwd_kernel[grid])": launch_only,
        "gluon_attention_forward (whole)": lambda: G.gluon_attention_forward(q, k, v),
        "flash_attention, Gluon forward": with_env("gluon"),
        "flash_attention, tl forward": with_env("triton"),
    }
    for fn in steps.values():  # compile and warm every path first
        fn()
    rows = []
    for name, fn in steps.items():
        rows.append({"step": name, "us_per_call": _us(fn)})
        print(f"{rows[-1]['us_per_call']:9.1f} us  {name}", flush=True)
    os.environ.pop(FORWARD_ENV, None)
    env = environment()
    env["command"] = "python3 " + " ".join(sys.argv)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "host_cost.json"), "w") as f:
        json.dump({"environment": env, "shape": [4, 16, 512, 128], "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
