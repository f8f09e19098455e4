"""Command line: ``python -m course_kernels <command>`` (GPU measurements; see ``bench.py``).

bench      TFLOP/s of this kernel vs SDPA's backends and naive attention (JSON, CSV, PNG);
           --providers ...,tutorial adds Triton's fused-attention tutorial, loaded from the
           file named by $COURSE_KERNELS_TUTORIAL (see course_kernels.bench.load_tutorial)
sweep      forward TFLOP/s of each block-size / warps / stages config (tuning chapter)
memory     extra memory of one forward / forward+backward vs N
dram run   the cases for ``ncu`` (DRAM bytes); ``dram parse`` turns ncu's CSV into data
gpu-check  one quick correctness check per dtype, and the versions
apps       the Applications chapter's runs: train, context, decode, paged (``apps/runs.py``)
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def _ints(text):
    return tuple(int(x) for x in text.split(","))


def _check_choices(ap, flag, text, allowed):
    bad = [x for x in text.split(",") if x not in allowed]
    if bad:
        ap.error(
            f"{flag}: unknown {', '.join(map(repr, bad))}; choose from {', '.join(allowed)} "
            "(comma-separated)"
        )


def _cuda() -> bool:
    from ._probe import cuda_available

    return cuda_available()


def main(argv=None) -> int:
    script = os.path.basename(sys.argv[0] or "")  # the console script says its own name
    ap = argparse.ArgumentParser(
        prog=script if script == "course-kernels" else "python -m course_kernels",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("bench", help="TFLOP/s vs SDPA backends and naive attention")
    b.add_argument("--out", default="course_kernels/data/bench")
    b.add_argument("--dtypes", default="float16,bfloat16")
    b.add_argument("--ds", type=_ints, default=(64, 128))
    b.add_argument("--ns", type=_ints, default=(1024, 2048, 4096, 8192, 16384))
    b.add_argument("--causal", choices=["both", "yes", "no"], default="both")
    b.add_argument("--modes", default="fwd,bwd")
    b.add_argument("--providers", default="flash,sdpa-flash,sdpa-cudnn,sdpa-efficient,naive")
    b.add_argument("--batch", type=int, default=4)
    b.add_argument("--hidden", type=int, default=2048, help="heads x head_dim")
    b.add_argument("--no-check", action="store_true")
    sw = sub.add_parser("sweep", help="forward TFLOP/s of each kernel config")
    sw.add_argument("--out", default="course_kernels/data/bench")
    sw.add_argument("--n", type=int, default=4096)
    sw.add_argument("--ds", type=_ints, default=(64, 128))
    m = sub.add_parser("memory", help="extra memory vs N, naive vs this kernel")
    m.add_argument("--out", default="course_kernels/data/memory")
    m.add_argument("--ns", type=_ints, default=(4096, 8192, 16384, 32768, 65536))
    dr = sub.add_parser("dram", help="DRAM bytes with Nsight Compute")
    dr.add_argument("action", choices=["run", "parse"])
    dr.add_argument("--ncu-csv", help="parse: ncu --csv --page raw output")
    dr.add_argument("--cases", help="parse: file whose last line is the JSON case list")
    dr.add_argument("--out", default="course_kernels/data/dram/dram_bytes.csv")
    dr.add_argument("--command", default="", help="parse: the command that produced the CSV")
    sub.add_parser("gpu-check", help="quick correctness check and versions")
    a = sub.add_parser("apps", help="Applications chapter: GPT training, context length, decode")
    a.add_argument(
        "step",
        choices=["train", "context", "decode", "paged"],
        help="train: loss curves per attention; context: tokens/s and memory vs "
        "context length; decode: one decode step vs a long KV cache; paged: the same step "
        "over a paged KV cache (block table) vs the contiguous one",
    )
    a.add_argument(
        "--out",
        default="course_kernels/data/apps",
        help="folder for the step's JSON file (default: %(default)s)",
    )
    args = ap.parse_args(argv)

    from . import bench

    if args.cmd == "bench":
        _check_choices(ap, "--dtypes", args.dtypes, ("float16", "bfloat16", "float32"))
        _check_choices(ap, "--modes", args.modes, ("fwd", "bwd"))
        _check_choices(ap, "--providers", args.providers, bench.PROVIDERS)
    if args.cmd == "dram" and args.action == "parse" and not (args.ncu_csv and args.cases):
        ap.error(
            "dram parse needs --ncu-csv (ncu --csv --page raw output) and --cases (the "
            "output of `dram run`, whose last line is the JSON case list)"
        )
    gpu_commands = ("bench", "sweep", "memory", "gpu-check", "apps")
    if (args.cmd in gpu_commands or (args.cmd == "dram" and args.action == "run")) and not _cuda():
        print(
            f"python -m course_kernels {args.cmd}: needs a CUDA GPU (it times or profiles the "
            "kernels on one), and torch sees none here. On a CPU, the chapters run the kernels "
            "in Triton's interpreter, and `dram parse` works on a CSV made elsewhere.",
            file=sys.stderr,
        )
        return 2

    if args.cmd == "bench":
        causals = {"both": (False, True), "yes": (True,), "no": (False,)}[args.causal]
        rows = bench.run_bench(
            args.out,
            dtypes=tuple(args.dtypes.split(",")),
            ds=args.ds,
            ns=args.ns,
            causals=causals,
            modes=tuple(args.modes.split(",")),
            providers=tuple(args.providers.split(",")),
            batch=args.batch,
            hidden=args.hidden,
            check=not args.no_check,
        )
        print(bench.format_ratio_table(rows))
        bad = [r for r in rows if r.get("check") and not r["check"]["ok"]]
        print(f"correctness: {len(bad)} failing shapes")
        return 1 if bad else 0
    if args.cmd == "sweep":
        rows = bench.run_sweep(args.out, n=args.n, ds=args.ds)
        for r in rows:
            print(
                {
                    k: r.get(k)
                    for k in (
                        "d",
                        "causal",
                        "block_m",
                        "block_n",
                        "num_warps",
                        "num_stages",
                        "tflops",
                        "max_abs_error",
                        "error",
                    )
                }
            )
        return 0
    if args.cmd == "memory":
        bench.run_memory(args.out, ns=args.ns)
        return 0
    if args.cmd == "dram":
        if args.action == "run":
            bench.dram_cases()
            return 0
        with open(args.cases) as f:
            lines = f.readlines()
        cases = json.loads([ln for ln in lines if ln.startswith("[{")][-1])
        envs = [json.loads(ln)["environment"] for ln in lines if ln.startswith('{"environment"')]
        bench.parse_ncu_csv(
            args.ncu_csv, cases, args.out, command=args.command, env=envs[-1] if envs else None
        )
        with open(args.out) as f:
            print(f.read())
        return 0
    if args.cmd == "gpu-check":
        return 0 if bench.gpu_check() else 1
    if args.cmd == "apps":
        from .apps import runs as apps

        apps.run(args.step, args.out)
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
