"""Session 18: where the Gluon backward's time goes, kernel by kernel (torch.profiler), on the
rows that sit lowest against FlexAttention and cuDNN (notes/gluon_backward.md, "Session 18"):

    PYTHONPATH=. python experiments/gluon/profile_backward.py --out DIR

One call of ``gluon_attention_backward`` launches four kernels: the dQ accumulator's zeroing
(``torch.zeros``, a fill kernel), ``_bwd_preprocess`` (D = rowsum(dO * O), L log2 e), the main
``_attn_bwd_kernel`` and the dq epilogue (fp32 -> the input dtype). The three beside the main
kernel move O(N d) bytes, the main kernel does O(N^2 d) (or O(N w d) under a window) work: at
short windows and short N their share is largest. Each row: --calls calls after a warm-up, the
CUDA time of each kernel summed over the calls and divided by their number (microseconds), and
the wall time of a call from CUDA events. fp16, B = 4, H * d = 2048.

Session 30: ``--rows`` (MASK:D:N, e.g. window:128:4096) and ``--variants`` (schedule overrides as
in bench_section.py, e.g. ``0 DQ_CONVERT=1 ZERO_ACC=1``: each row profiled once per variant) show
what an in-kernel change costs the main kernel beside the small kernels it removes:

    PYTHONPATH=. python experiments/gluon/profile_backward.py --out DIR --tag convert \
        --rows window:128:4096 window:128:16384 --variants 0 DQ_CONVERT=1 ZERO_ACC=1
"""

from __future__ import annotations

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(os.path.dirname(HERE)), HERE]

ROWS = [
    dict(mask="window", d=128, n=4096),
    dict(mask="window", d=128, n=16384),
    dict(mask="causal", d=128, n=4096),
    dict(mask="full", d=64, n=4096),
    dict(mask="full", d=64, n=16384),
]


def profile_row(row, calls, variant="0"):
    import torch
    from torch.profiler import ProfilerActivity, profile

    from bench_section import make_call

    fn = make_call(row, variant)
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    torch.cuda.synchronize()
    wall_us = start.elapsed_time(end) * 1000 / calls
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    kernels = {}
    for ev in prof.key_averages():
        us = getattr(ev, "device_time_total", None) or getattr(ev, "cuda_time_total", 0)
        if us:
            kernels[ev.key[:90]] = round(us / calls, 1)
    total = sum(kernels.values())
    return dict(row, wall_us=round(wall_us, 1), kernels_us=kernels, kernels_total_us=round(total, 1),
                share={k: round(v / total, 4) for k, v in kernels.items()})  # fmt: skip


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="results", help="directory for the JSON file")
    ap.add_argument("--tag", default="h100_profile_backward_session18", help="JSON file stem")
    ap.add_argument("--calls", type=int, default=10, help="calls profiled per row")
    ap.add_argument(
        "--rows",
        nargs="+",
        default=None,
        help="MASK:D:N rows (mask window, causal, full or documents; default: the five)",
    )
    ap.add_argument(
        "--variants",
        nargs="+",
        default=["0"],
        help="schedule overrides, bench_section.py's form ('0': SECTION = 0, the default "
        "but for documents, whose default a no-op override such as ZERO_ACC=0 keeps)",
    )
    args = ap.parse_args(argv)
    rows = ROWS if args.rows is None else [_row(r) for r in args.rows]
    from course_kernels.bench.speed import environment

    record = dict(environment(), command="PYTHONPATH=. python experiments/gluon/"
                  + " ".join([os.path.basename(__file__)] + (argv or sys.argv[1:])), rows=[])  # fmt: skip
    for row in rows:
        for variant in args.variants:
            out = dict(profile_row(row, args.calls, variant), variant=variant)
            out["bytes_beside_main_MB"] = round(_side_bytes(row) / 1e6, 1)
            record["rows"].append(out)
            print(json.dumps(out), flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, args.tag + ".json"), "w") as f:
        json.dump(record, f, indent=1)


def _row(text):
    """'window:128:4096' -> dict(mask="window", d=128, n=4096); an error naming the form."""
    parts = text.split(":")
    if len(parts) != 3 or parts[0] not in ("window", "causal", "full", "documents"):
        raise SystemExit(
            f"--rows takes MASK:D:N (mask window, causal, full or documents), got {text!r}"
        )
    return dict(mask=parts[0], d=int(parts[1]), n=int(parts[2]))


def _side_bytes(row):
    """HBM bytes of the three kernels beside the main one: zeroing the fp32 dQ (write), the
    preprocess (read O, dO), the dq epilogue (read fp32 dQ, write dq)."""
    elems = 4 * (2048 // row["d"]) * row["n"] * row["d"]
    return elems * (4 + 2 * 2 + 4 + 2)


if __name__ == "__main__":
    main()
