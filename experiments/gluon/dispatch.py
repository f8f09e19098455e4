"""Which forward should ``flash_attention`` pick at small N: the Gluon FA3-schedule kernel or the
``tl`` kernel? Measured on the GPU, both forced through ``$COURSE_KERNELS_FORWARD`` in one process.

    python experiments/gluon/dispatch.py --out DIR [--ns 512,1024,2048,4096] [--dtypes float16]

For every (dtype, d, causal, N) of B = 4, H * d = 2048: the forward through ``flash_attention``
with the Gluon kernel and with the ``tl`` kernel (autotuned), and SDPA's flash backend (FA2), each
as the median of ``triton.testing.do_bench`` (the host launch path included, as a user calls it);
and for both of ours the replay of a CUDA graph of the call (``do_bench_cudagraph``: the GPU time
alone). plain - graph is the host cost that the GPU did not hide. Writes ``dispatch.json``
(environment: GPU, versions, date, command) after every row.

Why: at N = 1K on the H200 (session 6, experiments/data/bench/h200_n1024_gluon_default.json) the
Gluon default ran at 0.25-0.91x FA2 through the plain launch path, while its CUDA-graph replay was
0.07-0.12 ms, as fast as FA2's kernel or faster: the host path, not the kernel.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from course_kernels.triton import _env as _triton_env  # noqa: E402,F401  (before any @jit)

import torch  # noqa: E402
import triton  # noqa: E402

from course_kernels import flash_attention  # noqa: E402
from course_kernels.bench import attention_flops, environment, provider_fn  # noqa: E402
from course_kernels.triton.launch import FORWARD_ENV  # noqa: E402


def _call(path, q, k, v, causal):
    os.environ[FORWARD_ENV] = path  # read by launch._use_gluon at every call
    return flash_attention(q, k, v, causal=causal)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="/tmp/dispatch", help="folder for dispatch.json")
    ap.add_argument("--ns", default="512,1024,2048,4096", help="sequence lengths")
    ap.add_argument("--dtypes", default="float16,bfloat16", help="torch dtypes")
    ap.add_argument("--batch", type=int, default=4, help="batch size")
    ap.add_argument("--hidden", type=int, default=2048, help="H * d")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        ap.error("times kernels: needs a CUDA GPU")
    env = environment()
    env["command"] = "python3 " + " ".join(sys.argv)
    sdpa, rows = provider_fn("sdpa-flash"), []
    os.makedirs(args.out, exist_ok=True)
    for dt in args.dtypes.split(","):
        for d in (64, 128):
            for causal in (False, True):
                for n in (int(x) for x in args.ns.split(",")):
                    heads = args.hidden // d
                    torch.manual_seed(n + d)
                    q, k, v = (
                        torch.randn(
                            args.batch, heads, n, d, device="cuda", dtype=getattr(torch, dt)
                        )
                        for _ in range(3)
                    )
                    row = {"dtype": dt, "d": d, "N": n, "causal": causal, "batch": args.batch,
                           "heads": heads,
                           "gflop": attention_flops(args.batch, heads, n, d, causal, "fwd") / 1e9}  # fmt: skip
                    ref = sdpa(q, k, v, causal=causal)
                    for path in ("gluon", "triton"):
                        out = _call(path, q, k, v, causal)
                        row[f"{path}_max_err"] = (out.float() - ref.float()).abs().max().item()

                        def fn(path=path, q=q, k=k, v=v, causal=causal):
                            return _call(path, q, k, v, causal)

                        row[f"{path}_ms"] = triton.testing.do_bench(
                            fn, warmup=10, rep=60, return_mode="median"
                        )
                        os.environ[FORWARD_ENV] = path  # fixed while the graph is captured
                        row[f"{path}_graph_ms"] = triton.testing.do_bench_cudagraph(
                            lambda q=q, k=k, v=v, causal=causal: flash_attention(
                                q, k, v, causal=causal
                            ),
                            rep=60,
                            return_mode="median",
                        )
                    row["fa2_ms"] = triton.testing.do_bench(
                        lambda q=q, k=k, v=v, causal=causal: sdpa(q, k, v, causal=causal),
                        warmup=10,
                        rep=60,
                        return_mode="median",
                    )
                    print(json.dumps(row), flush=True)
                    rows.append(row)
                    with open(os.path.join(args.out, "dispatch.json"), "w") as f:
                        json.dump({"environment": env, "rows": rows}, f, indent=1)
    os.environ.pop(FORWARD_ENV, None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
