"""Session 17: the Gluon backward's CTA order (``SECTION``, ``scheduler._bwd_tile``) measured
against the plain grid, in one process, on the rows where a list-scheduling model predicts a
tail (notes/gluon_backward.md, "Session 17"):

    PYTHONPATH=. python experiments/gluon/bench_section.py --out DIR [--sections 0 4 8 16]

Rows: causal, and (session 18) a causal sliding window of 1024 keys (``window_left=1023``) and no
mask at all (``full``), B = 4,
H * d = 2048, N = 4K / 8K / 16K, d = 64 and 128 (``gluon_attention_backward``);
documents: 16,384 tokens in scripts/gpu_features.py's six documents, causal inside each, d = 64
and 128, flash-attn's packed layout read in place (``gluon_varlen_backward``, the path
``flash_attention_varlen`` takes). fp16 (or --dtype bfloat16). Each row: the backward with every SECTION, checked
against SECTION = 0 on the same inputs (dk and dv bit for bit: a CTA's own sums do not depend on
when it runs; dq within 4 fp16 ulps of its magnitude: only the order of its fp32 adds moves),
then timed (triton.testing.do_bench, median) in --rounds rounds, SECTION values interleaved,
the row's time the median round (the documents' offsets read once, as flash_attention_varlen
does after its first call: no device-to-host copy in the timed call). The kernels are compiled first by child processes in parallel
(they fill Triton's cache), so the timing process loads them.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [ROOT, os.path.join(ROOT, "scripts")]


def rows(args):
    dense = ("causal", "window", "full")
    out = [dict(mask=m, d=d, n=n) for m in dense for d in args.dims for n in args.ns]
    out += [dict(mask="documents", d=d, n=args.doc_tokens) for d in args.dims]
    return [dict(r, dtype=args.dtype) for r in out if r["mask"] in args.masks]


def _order(name):
    """'8' -> SECTION=8, 't8' -> TAIL=8 (the CTA orders of ``scheduler._bwd_tile``); any other
    schedule override as 'KEY=V[+KEY=V...]' (session 18: 'STAGES=3')."""
    if "=" in name:
        return {k: int(v) for k, v in (kv.split("=") for kv in name.split("+"))}
    return dict(TAIL=int(name[1:])) if name.startswith("t") else dict(SECTION=int(name))


def _cudnn_backward(q, k, v, do, causal, scale):
    """The backward alone of SDPA's cuDNN attention (its forward run once, outside the timing)."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    qg, kg, vg = (x.detach().requires_grad_(True) for x in (q, k, v))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        out = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal, scale=scale)
    return lambda: torch.autograd.grad(out, (qg, kg, vg), do, retain_graph=True)


def make_call(row, section, small=False):
    """A function computing the row's backward in CTA order ``section`` (see _order)."""
    import torch

    from course_kernels.gluon import backward_launch as GB
    from course_kernels.gluon import launch as G
    from gpu_features import doc_lengths

    d = row["d"]
    n = 1024 if small else row["n"]
    heads = 2048 // d
    g = torch.Generator(device="cuda").manual_seed(17)
    scale = 1.0 / math.sqrt(d)
    dt = getattr(torch, row.get("dtype", "float16"))
    if row["mask"] in ("causal", "window", "full"):  # window: 1024 keys a row (window_left 1023)
        win = 1023 if row["mask"] == "window" else None
        causal = row["mask"] != "full"
        q, k, v, do = (
            torch.randn(4, heads, n, d, device="cuda", dtype=dt, generator=g) for _ in range(4)
        )
        if section == "cudnn":  # session 18: SDPA's cuDNN backward on the same inputs
            if win is not None:
                raise ValueError("cudnn: SDPA has no sliding window (rows causal, full only)")
            return _cudnn_backward(q, k, v, do, causal, scale)
        o, lse = G.gluon_attention_forward(q, k, v, causal=causal, scale=scale, window_left=win)
        return lambda: GB.gluon_attention_backward(
            do, q, k, v, o, lse, causal, scale, window_left=win, **_order(section)
        )
    lengths = doc_lengths(n)
    cu = torch.tensor([0, *__import__("itertools").accumulate(lengths)], device="cuda").int()
    q, k, v, do = (
        torch.randn(1, heads, n, d, device="cuda", dtype=dt, generator=g) for _ in range(4)
    )
    o, lse = G.gluon_attention_forward(q, k, v, causal=True, scale=scale, cu_seqlens=cu)
    packed = [x[0].transpose(0, 1).contiguous() for x in (do, q, k, v, o)]
    lse_p = lse[0].contiguous()
    return lambda: GB.gluon_varlen_backward(  # offsets read once, as flash_attention_varlen does
        *packed, lse_p, cu, scale, packed=True, offsets_checked=not small, **_order(section)
    )  # fmt: skip


def compile_in_children(script, jobs, timeout):
    """One child process per job (``script --child a,b,...``), all at once: they compile the
    kernels into Triton's cache, so the timing process only loads them. {job: the end of its
    stderr} for each child that failed or ran past ``timeout`` seconds."""
    procs = [subprocess.Popen([sys.executable, script, "--child", ",".join(map(str, job))],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
             for job in jobs]  # fmt: skip
    bad = {}
    for p, job in zip(procs, jobs, strict=True):
        try:
            _, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            err = "timed out"
        if p.returncode:
            bad[job] = err[-1500:]
    return bad


def prewarm(args):
    """One child per (row kind, d, SECTION): the compile failures, each with its job."""
    jobs = sorted({(r["mask"], r["d"], s, r["dtype"]) for r in rows(args) for s in args.sections})
    bad = compile_in_children(__file__, jobs, args.compile_timeout)
    return [dict(job=",".join(map(str, j)), error=e) for j, e in bad.items()]


def interleaved(calls, names, rounds):
    """Time each call (triton.testing.do_bench, median) in ``rounds`` rounds, names interleaved:
    {"ms": every round's time, "speedup": the first name's median round over each one's}. The
    warm-up and timing ms are 10 and 60 unless $BENCH_WARMUP / $BENCH_REP say otherwise (session
    35: 250 each times every call at its own steady clock, notes/gluon_backward.md)."""
    import triton

    warmup, rep = (
        float(os.environ.get(k, v)) for k, v in (("BENCH_WARMUP", 10), ("BENCH_REP", 60))
    )
    ms = {s: [] for s in names}
    for _ in range(rounds):
        for s in names:
            ms[s].append(triton.testing.do_bench(calls[s], warmup=warmup, rep=rep))
    mid = {s: sorted(v)[(len(v) - 1) // 2] for s, v in ms.items()}  # the median round
    return dict(ms={str(s): [round(x, 4) for x in v] for s, v in ms.items()},
                speedup={str(s): round(mid[names[0]] / mid[s], 4) for s in names})  # fmt: skip


def base_parser(doc, tag):
    """The argument parser of a timing script here, with the two arguments each takes: --out (a
    directory) and --tag (the JSON file's stem)."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--out", default="results", help="directory for the JSON file")
    ap.add_argument("--tag", default=tag, help="stem of the JSON file name")
    return ap


def new_record(script, argv):
    """The JSON record of a run: GPU, versions, date, the command that regenerates it (with the
    $BENCH_WARMUP / $BENCH_REP it ran under in front, if set), no rows."""
    from course_kernels.bench.speed import environment

    args = argv if argv is not None else sys.argv[1:]
    env = [f"{k}={os.environ[k]}" for k in ("BENCH_WARMUP", "BENCH_REP") if k in os.environ]
    cmd = " ".join([*env, "python experiments/gluon/" + os.path.basename(script), *args])
    return dict(environment(), command=cmd, rows=[])


def save(record, path):
    with open(path, "w") as f:
        json.dump(record, f, indent=1)


def keep(record, path, row):
    """Add a timed row to the record, print it, and write the record so far (a later row that
    hangs or crashes leaves the earlier ones on disk)."""
    record["rows"].append(row)
    print(json.dumps(row), flush=True)
    save(record, path)


def time_rows(record, path, rows, variants, args, t0, compiled, make_call, check, timer):
    """The timing loop of this script and sweep_forward.py. For each row: the variants that
    compiled for it (``compiled(row, v)``; the first is the baseline: a row without it is
    recorded as such), each checked against the baseline's result (``check(base, got, row)``),
    then timed by ``timer`` (:func:`interleaved`) in ``args.rounds`` rounds; rows past
    ``args.budget_s`` seconds from ``t0`` are recorded as skipped. The record is written after
    every row."""
    import torch

    for row in rows:
        if time.time() - t0 > args.budget_s:
            record["rows"].append(dict(row, status=f"skipped: past --budget-s {args.budget_s}"))
            continue
        names = [v for v in variants if compiled(row, v)]
        if not names or names[0] != variants[0]:
            record["rows"].append(dict(row, status="the baseline did not compile"))
            continue
        calls = {v: make_call(row, v) for v in names}
        base = calls[names[0]]()
        checks = {v: check(base, calls[v](), row) for v in names[1:]}
        timed = timer(calls, names, args.rounds)
        left_out = [v for v in variants if v not in names]
        keep(record, path, dict(row, status="ok", **timed, checks=checks, left_out=left_out))
        del calls, base
        torch.cuda.empty_cache()
    save(record, path)


def main(argv=None):
    ap = base_parser(__doc__, "section")
    ap.add_argument(
        "--sections", nargs="+", default=["0", "4", "8", "16"],
        help="CTA orders: N for SECTION=N, tN for TAIL=N, KEY=V[+KEY=V], cudnn (0: the baseline)",
    )  # fmt: skip
    ap.add_argument("--dims", type=int, nargs="+", default=[64, 128], help="head dims")
    ap.add_argument(
        "--ns", type=int, nargs="+", default=[4096, 8192, 16384], help="N (causal, window)"
    )
    ap.add_argument(
        "--masks", nargs="+", default=["causal", "documents"], help="causal window full documents"
    )
    ap.add_argument("--rounds", type=int, default=2, help="timing rounds (SECTIONs interleaved)")
    ap.add_argument("--doc-tokens", type=int, default=16384, help="tokens of the documents row")
    ap.add_argument("--budget-s", type=float, default=300.0, help="stop starting rows after this")
    ap.add_argument("--compile-timeout", type=float, default=240.0, help="per compile child")
    ap.add_argument("--dtype", default="float16", choices=("float16", "bfloat16"))
    ap.add_argument("--child", help=argparse.SUPPRESS)  # internal: mask,d,section,dtype
    args = ap.parse_args(argv)
    if args.child:
        mask, d, s, dt = args.child.split(",")
        if s == "cudnn":
            return
        make_call(dict(mask=mask, d=int(d), n=0, dtype=dt), s, small=True)()
        return
    import torch

    t0 = time.time()
    record = new_record(__file__, argv)
    record["compile_failures"] = prewarm(args)
    record["compile_s"] = round(time.time() - t0, 1)
    print(f"compiled in {record['compile_s']} s; failures: {len(record['compile_failures'])}")
    failed = {tuple(b["job"].split(",")[:3]) for b in record["compile_failures"]}
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"{args.tag}.json")
    ulp = 2**-7 if args.dtype == "bfloat16" else 2**-10

    def check(base, got, row):  # dk, dv bit for bit; dq within 4 ulps of the baseline's largest
        dq_tol = 4 * ulp * base[0].abs().max().item()
        out = dict(
            dk_dv_bitwise=bool(torch.equal(got[1], base[1]) and torch.equal(got[2], base[2])),
            dq_max_diff=(got[0].float() - base[0].float()).abs().max().item(),
            dq_tolerance=dq_tol,
        )
        return dict(out, ok=out["dk_dv_bitwise"] and out["dq_max_diff"] <= dq_tol)

    def compiled(row, s):  # a section that did not compile for this (mask, d) is left out
        return (row["mask"], str(row["d"]), s) not in failed

    time_rows(record, path, rows(args), args.sections, args, t0, compiled, make_call, check,
              interleaved)  # fmt: skip


if __name__ == "__main__":
    main()
