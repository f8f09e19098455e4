"""Session 20: the Gluon backward with GQA (``GROUP``, session 19) against the ``tl`` backward
on the same GQA inputs, and against the Gluon backward on the same call with K/V repeated to
every query head (the prediction in notes/gluon_backward.md, "GQA in the Gluon backward").

    PYTHONPATH=. python experiments/gluon/bench_gqa.py --out DIR [--groups 4 8] [--ns 4096 16384]

Rows: B = 4, H * d = 2048 query heads, H / GROUP K/V heads, d = 64 and 128, N = 4K and 16K,
causal and not, fp16 (or --dtype). Each row runs ``flash_attention``'s backward (autograd of one
forward, ``retain_graph``) with ``$COURSE_KERNELS_BACKWARD`` set to ``triton`` and to ``gluon``
(read by ``launch._use_gluon`` at every backward), then the Gluon backward on K/V repeated with
``repeat_interleave`` (SDPA's ``enable_gqa`` head mapping), checks the three against each other
(the Gluon GQA gradients against the tl ones and against the repeated call's, dK and dV summed
over each group in fp32: max |diff| within 4 ulps of each gradient's magnitude), and times them in --rounds interleaved rounds of
``triton.testing.do_bench`` (median); the row's time is the median round. Writes DIR/TAG.json
(environment: GPU, versions, date, command) after every row.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from course_kernels.triton import _env as _triton_env  # noqa: E402,F401  (before any @jit)

import torch  # noqa: E402
import triton  # noqa: E402

from course_kernels import flash_attention  # noqa: E402
from course_kernels.bench import environment  # noqa: E402
from course_kernels.triton.launch import BACKWARD_ENV  # noqa: E402

PATHS = ("triton", "gluon", "gluon_repeated")


def make_calls(b, hq, group, n, d, causal, dtype):
    """One closure a path, each returning (dq, dk, dv) for the same q, k, v, do."""
    g = torch.Generator(device="cuda").manual_seed(20)
    q, do = (torch.randn(b, hq, n, d, device="cuda", dtype=dtype, generator=g) for _ in range(2))
    k, v = (
        torch.randn(b, hq // group, n, d, device="cuda", dtype=dtype, generator=g) for _ in range(2)
    )
    calls = {}
    for path in PATHS:
        kk, vv = (
            (x.repeat_interleave(group, dim=1) for x in (k, v)) if path.endswith("ed") else (k, v)
        )
        qg, kg, vg = (x.detach().requires_grad_(True) for x in (q, kk, vv))
        os.environ[BACKWARD_ENV] = "auto"
        out = flash_attention(qg, kg, vg, causal=causal)
        env = "triton" if path == "triton" else "gluon"

        def call(out=out, ins=(qg, kg, vg), env=env):
            os.environ[BACKWARD_ENV] = env
            return torch.autograd.grad(out, ins, do, retain_graph=True)

        calls[path] = call
    return calls


def check(calls, group, dtype):
    ulp = 2**-7 if dtype == torch.bfloat16 else 2**-10
    got = {p: [t.float() for t in calls[p]()] for p in PATHS}
    b, hq, n, d = got["gluon_repeated"][1].shape
    rep = got["gluon_repeated"]
    summed = [rep[0]] + [x.view(b, hq // group, group, n, d).sum(2) for x in rep[1:]]
    out = {}
    for name, other in (("vs_tl", got["triton"]), ("vs_repeated", summed)):
        diffs = [(a - c).abs().max().item() for a, c in zip(got["gluon"], other, strict=True)]
        tols = [4 * ulp * c.abs().max().item() for c in other]
        out[name] = dict(
            max_diff=diffs, tolerance=tols, ok=all(x <= t for x, t in zip(diffs, tols, strict=True))
        )
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="results", help="directory for the JSON file")
    ap.add_argument("--tag", default="gqa_backward", help="stem of the JSON file name")
    ap.add_argument("--groups", type=int, nargs="+", default=[4], help="query heads per K/V head")
    ap.add_argument("--dims", type=int, nargs="+", default=[128, 64], help="head dims")
    ap.add_argument("--ns", type=int, nargs="+", default=[4096, 16384], help="sequence lengths")
    ap.add_argument("--causal", type=int, nargs="+", default=[1, 0], help="1 causal, 0 not")
    ap.add_argument("--rounds", type=int, default=5, help="timing rounds (paths interleaved)")
    ap.add_argument("--budget-s", type=float, default=200.0, help="stop starting rows after this")
    ap.add_argument("--dtype", default="float16", choices=("float16", "bfloat16"))
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        ap.error("times kernels: needs a CUDA GPU")
    dtype = getattr(torch, args.dtype)
    record = dict(environment(), command="python3 experiments/gluon/bench_gqa.py " + " ".join(
        argv if argv is not None else sys.argv[1:]), rows=[])  # fmt: skip
    os.makedirs(args.out, exist_ok=True)
    path, t0 = os.path.join(args.out, f"{args.tag}.json"), time.time()
    for group in args.groups:
        for d in args.dims:
            for causal in args.causal:
                for n in args.ns:
                    row = dict(group=group, d=d, causal=bool(causal), n=n, b=4, hq=2048 // d,
                               dtype=args.dtype)  # fmt: skip
                    if time.time() - t0 > args.budget_s:
                        record["rows"].append(dict(row, status="skipped: past --budget-s"))
                        continue
                    calls = make_calls(4, 2048 // d, group, n, d, bool(causal), dtype)
                    row["checks"] = check(calls, group, dtype)
                    ms = {p: [] for p in PATHS}
                    for _ in range(args.rounds):
                        for p in PATHS:
                            ms[p].append(triton.testing.do_bench(calls[p], warmup=10, rep=60))
                    med = {p: sorted(v)[(len(v) - 1) // 2] for p, v in ms.items()}
                    row.update(status="ok", ms={p: [round(x, 4) for x in v] for p, v in ms.items()},
                               gluon_over_tl=round(med["triton"] / med["gluon"], 4),
                               gluon_over_repeated=round(med["gluon_repeated"] / med["gluon"], 4))  # fmt: skip
                    record["rows"].append(row)
                    print(json.dumps({k: row[k] for k in row if k != "ms"}), flush=True)
                    with open(path, "w") as f:
                        json.dump(record, f, indent=1)
                    del calls
                    torch.cuda.empty_cache()
    os.environ.pop(BACKWARD_ENV, None)
    with open(path, "w") as f:
        json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
