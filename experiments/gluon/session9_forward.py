"""Issue 23's forward set, the Gluon default against cuDNN in three fresh processes (worst of
three per row; one timing a side: cuDNN's spread reads as a deficit, notes/gluon.md session 23;
``gpu_session.sh fwd_vs_cudnn`` interleaves), then levers on the rows below 1.0. One command:

    PYTHONPATH=. python experiments/gluon/session9_forward.py --out $OUT --budget 230  # --dry-run

The parent process never touches CUDA; each phase is a child process of this script:

0. ``warm``: one unrecorded process that runs every row once, so that Triton's on-disk cache
   holds the default kernels before anything is timed (``warmup``: each row's first seconds).
1. ``measure`` x 3: fresh processes, each timing the 24 rows (B = 4, H x d = 2048, d = 64 and
   128, N = 4K / 8K / 16K, causal and not, fp16 and bf16): cuDNN (SDPA's cuDNN backend) and the
   Gluon forward as ``flash_attention``'s auto path calls it (``gluon_attention_forward(q, k, v,
   causal, scale)``: ``schedule_config``'s default for the call), back to back, session 7's
   ``time_row`` (median of ``triton.testing.do_bench``). ``table``: per row the ratio of each
   process and the worst of three.
2. ``candidates``: on the rows whose worst ratio is below 1.0 (at least the 4 lowest causal rows,
   at most 6), each lever is first checked against the float64 reference (session 7's ``check``,
   flash-attn's rule; sections of 0.1 MiB there: 1-2 heads and a partial last one), then timed
   beside cuDNN and the default; then up to two more timing-only processes (``cand_time``) while
   the budget lasts: ``candidates.table[i].worst`` is the worst ratio over those passes.

Levers (``LEVERS``: switches over the call's default; causal calls keep CAUSAL_CONFIG's others):
``sect8`` (LPT order within 8 MiB L2 sections of heads), ``rowmask`` (block 0's one-compare mask),
both, ``session8`` (the schedule before them), ``ostage`` (O's own staging tile), ``pingpong``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
for p in (ROOT, HERE):
    if p not in sys.path:
        sys.path.insert(0, p)

from course_kernels.gluon import launch as G  # noqa: E402  (CPU-safe)

TAG = "h200_session9_forward"
PROCESSES = 3
ROWS = [  # (N, dtype, d, causal): the d = 64 causal rows first
    (N, dt, d, causal)
    for d in (64, 128)
    for causal in (True, False)
    for N in (4096, 8192, 16384)
    for dt in ("float16", "bfloat16")
]
LEVERS = {  # name -> (switches added to the call's default schedule, causal rows only); priority
    "sect8": (dict(LPT=True, LPT_SECTION_MB=8), True),
    "rowmask": (dict(ROW_MASK=True), False),
    "sect8_rowmask": (dict(LPT=True, LPT_SECTION_MB=8, ROW_MASK=True), True),
    "session8": (dict(LPT=False, LPT_SECTION_MB=0, ROW_MASK=False), False),  # before session 9
    "ostage": (dict(O_STAGE=True), False),  # session 10: O through its own staging tile
    "pingpong": (dict(PINGPONG=True), False),  # session 11: FA3's turns to issue the GEMMs
}
CHECK_SECTION_MB = 0.1  # the sectioned order in the checks: sections of 1-2 heads
CHECK_SHAPES = [(1, 3, 3, 300), (1, 2, 2, 17), (2, 4, 2, 1000), (1, 5, 5, 2053)]
MIN_CAND_ROWS, MAX_CAND_ROWS = 4, 6


def lever_cfg(name, d, causal, check=False):
    """The overrides of lever ``name`` for a call (d, causal), or None where it does not apply:
    the default's switches (``CAUSAL_CONFIG`` / ``NONCAUSAL_CONFIG``) plus the lever's own."""
    switches, causal_only = LEVERS[name]
    if causal_only and not causal:
        return None
    cfg = {**(G.CAUSAL_CONFIG[d] if causal else G.NONCAUSAL_CONFIG[d]), **switches}
    if check and "LPT_SECTION_MB" in cfg:
        cfg["LPT_SECTION_MB"] = CHECK_SECTION_MB
    return cfg


def row_key(r):
    return (r["N"], r["dtype"], r["d"], r["causal"])


def label(N, dt, d, causal):
    return f"{dt} d={d} N={N // 1024}K {'causal' if causal else 'full'}"


# ----------------------------------------------------------------- CPU: plan and compiles
def compiles(cfgs_by_shape):
    """Distinct kernel compiles of (cfg, d, causal, dtype, B, H, Hkv, N) launches: the constexprs
    (the schedule, SECTION from the shape) and Triton's specialisation of the int arguments."""
    from session8_levers import _spec

    keys = set()
    for cfg, d, causal, dt, B, H, Hkv, N in cfgs_by_shape:
        full = G.schedule_config(d, causal, N, **cfg)
        npm = math.ceil(N / (64 * full["NUM_CONSUMERS"]))
        sec = 0
        if full["LPT"] and causal and full.get("LPT_SECTION_MB"):
            sec = G.lpt_section(N, d, H // Hkv, B * H, 2, full["LPT_SECTION_MB"])
        ints = (N, H, H // Hkv, npm, npm * B * H)
        keys.add((str(sorted(full.items())), sec, d, causal, dt, tuple(map(_spec, ints))))
    return len(keys)


def candidate_launches(rows):
    out = []
    for N, dt, d, causal in rows:
        for name in LEVERS:
            cfg = lever_cfg(name, d, causal)
            if cfg is not None:  # the timed launch, then the checks' (fp16)
                out.append((cfg, d, causal, dt, 4, 2048 // d, 2048 // d, N))
                out += [(lever_cfg(name, d, causal, True), d, causal, "float16", *s_) for s_ in CHECK_SHAPES]  # fmt: skip
    return out


def dry_run(budget, chosen):
    print(f"0. warm-up process: {len(ROWS)} rows once (unrecorded)")
    print(f"1. {PROCESSES} fresh processes x {len(ROWS)} rows (cuDNN, Gluon default):")
    for r in ROWS:
        print("   ", label(*r))
    n_default = compiles([({}, d, c, dt, 4, 2048 // d, 2048 // d, N) for N, dt, d, c in ROWS])
    print(f"   default kernels to compile: {n_default}")
    example = [r for r in ROWS if r[2] == 64 and r[3]][:MAX_CAND_ROWS]
    print(f"2. candidates {chosen} on the rows below 1.0 (4-6), e.g. d = 64 causal:")
    for name in chosen:
        print(f"   {name:14s} {lever_cfg(name, 64, True)}")
    print(f"   their compiles for those 6 rows: {compiles(candidate_launches(example))}")
    print(f"budget {budget:.0f} s (the later candidate passes are skipped first)")


# ----------------------------------------------------------------- GPU children
def _inputs(N, dt, d):
    import torch

    torch.manual_seed(0)
    return [torch.randn(4, 2048 // d, N, d, device="cuda", dtype=getattr(torch, dt)) for _ in "qkv"]


def child_warm(deadline):
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    out = []
    for N, dt, d, causal in ROWS:
        if time.time() > deadline:
            break
        q, k, v = _inputs(N, dt, d)
        t = time.time()
        G.gluon_attention_forward(q, k, v, causal=causal)
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
        torch.cuda.synchronize()
        out.append(dict(N=N, dtype=dt, d=d, causal=causal, first_calls_s=time.time() - t))
    return dict(rows=out)


def child_time(rows, variants_of, deadline):
    """session 7's time_row for each row (cuDNN first, then each variant), until the deadline."""
    import torch
    from session7_levers import time_row

    out, skipped, t = [], [], time.time()
    for N, dt, d, causal in rows:
        if time.time() > deadline - (3 if N >= 16384 else 1.5):
            skipped.append(dict(N=N, dtype=dt, d=d, causal=causal))
            continue
        row = time_row(N, getattr(torch, dt), d, causal, variants_of(d, causal))
        out.append(row)
        cells = " ".join(f"{k} {v:.3f}" for k, v in row["ratio_vs_cudnn"].items())
        print(f"  {label(N, dt, d, causal):28s} cuDNN {row['tflops']['cudnn']:6.1f}  {cells}")
    return dict(rows=out, skipped=skipped, timing_s=round(time.time() - t, 1))


def child_candidates(rows, levers, deadline, check):
    import session7_levers as S7

    res = dict(checks=[])
    ok = list(levers)
    if check:
        S7.CHECK_SHAPES = CHECK_SHAPES  # read by S7.check at call time
        for name in levers:
            for d, causal in sorted({(r[2], r[3]) for r in rows}):
                cfg = lever_cfg(name, d, causal, check=True)
                if cfg is None:
                    continue
                if time.time() > deadline - 30:  # not checked in time: not timed
                    res["checks"].append(dict(variant=name, d=d, causal=causal, ok=False))
                    print(f"  CHECK SKIPPED (no time) {name} d={d} causal={causal}", flush=True)
                    continue
                try:
                    checked = S7.check(cfg, d, causal)
                except Exception as e:  # a compile error or a fault: this lever is not timed
                    checked = [dict(d=d, causal=causal, ok=False, error=repr(e)[:400])]
                for r in checked:
                    r["variant"] = name
                    res["checks"].append(r)
                    if not r["ok"]:  # logged at once: a pass that times out returns nothing
                        print("  CHECK FAILED " + json.dumps(r, default=str), flush=True)
        ok = [n for n in levers if all(r["ok"] for r in res["checks"] if r["variant"] == n)]
        print(f"  checks: {sum(r['ok'] for r in res['checks'])}/{len(res['checks'])} pass")

    def variants(d, causal):
        vs = {n: lever_cfg(n, d, causal) for n in ok}
        return {"default": {}, **{n: c for n, c in vs.items() if c is not None}}

    res.update(child_time(rows, variants, deadline), timed_levers=ok)
    return res


def child_main(a):
    from course_kernels.bench import environment

    rows = [tuple(r) for r in json.loads(a.rows)] if a.rows else ROWS
    if a.child == "warm":
        res = child_warm(a.deadline)
    elif a.child == "measure":
        res = child_time(rows, lambda d, c: {"default": {}}, a.deadline)
    else:
        levers = json.loads(a.levers)
        res = child_candidates(rows, levers, a.deadline, check=a.child == "candidates")
    res["environment"] = environment()
    res["pid"] = os.getpid()
    Path(a.part).write_text(json.dumps(res, default=str))


# ----------------------------------------------------------------- parent
def source_tree():
    """The git commit and whether the tree differs from it (None without git), and a hash of the
    kernel's sources and this script (what the numbers belong to, with or without git)."""

    def git(*args):
        try:
            return subprocess.check_output(
                ["git", *args], cwd=ROOT, text=True, stderr=subprocess.DEVNULL
            ).strip()
        except Exception:
            return None

    h = hashlib.sha256()
    files = sorted(Path(ROOT, "course_kernels", "gluon").glob("*.py")) + [Path(__file__)]
    for f in files:
        h.update(f.name.encode() + f.read_bytes())
    status = git("status", "--porcelain")
    return dict(
        commit=git("rev-parse", "HEAD"),
        dirty=None if status is None else bool(status),
        sources_sha256=h.hexdigest()[:16],
        sources=[str(f.relative_to(ROOT)) for f in files],
    )


def aggregate(passes, names):
    """Per row: each pass's ratio of every variant, and the worst (lowest) over the passes."""
    table = {}
    for i, p in enumerate(passes):
        for r in p.get("rows", []):
            t = table.setdefault(
                row_key(r), dict(zip(("N", "dtype", "d", "causal"), row_key(r), strict=True))
            )
            for n in names:
                if n in r["ratio_vs_cudnn"]:
                    t.setdefault("ratios", {}).setdefault(n, {})[i] = r["ratio_vs_cudnn"][n]
            t.setdefault("tflops_cudnn", {})[i] = r["tflops"]["cudnn"]
    for t in table.values():
        t["worst"] = {n: min(v.values()) for n, v in t.get("ratios", {}).items()}
        t["complete"] = {n: len(v) == len(passes) for n, v in t.get("ratios", {}).items()}
    return list(table.values())


def pick_rows(table):
    """The candidates' rows: those whose worst default ratio is below 1.0 (lowest first, at most
    MAX_CAND_ROWS), filled up to MIN_CAND_ROWS with the lowest causal rows; and (worst, row) of
    every row measured in all processes, lowest first."""
    done = [t for t in table if t.get("complete", {}).get("default")]
    below = sorted((t["worst"]["default"], row_key(t)) for t in done)
    rows = [k for w, k in below if w < 1.0][:MAX_CAND_ROWS]
    for _, k in below:
        if len(rows) < MIN_CAND_ROWS and k[3] and k not in rows:
            rows.append(k)
    return rows, below


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="results", help="directory of the JSON file")
    ap.add_argument("--tag", default=TAG)
    ap.add_argument("--budget", type=float, default=230.0, help="seconds for the whole command")
    ap.add_argument("--dry-run", action="store_true", help="list the plan; no GPU")
    ap.add_argument("--child", choices=["warm", "measure", "candidates", "cand_time"])
    for hidden in ("--part", "--rows", "--levers"):  # a child's arguments
        ap.add_argument(hidden, help=argparse.SUPPRESS)
    ap.add_argument("--deadline", type=float, help=argparse.SUPPRESS)
    ap.add_argument("--candidates", default=",".join(LEVERS), help="levers to time, a,b,...")
    a = ap.parse_args()
    if a.child:
        return child_main(a)
    chosen = [n for n in a.candidates.split(",") if n]
    if not chosen or set(chosen) - set(LEVERS):
        ap.error(f"--candidates {a.candidates!r}: choose from {', '.join(LEVERS)}")
    if a.dry_run:
        return dry_run(a.budget, chosen)
    t0 = time.time()
    end = t0 + a.budget
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, a.tag + ".json")
    tmp = tempfile.mkdtemp(prefix="session9_")
    data = dict(
        meta=dict(
            command="PYTHONPATH=. python " + " ".join(sys.argv),
            tree=source_tree(),
            timer="triton.testing.do_bench median (warmup 20 ms, rep 60 ms at N = 4K, 100 ms "
            "above), cuDNN then the Gluon variants, back to back in one process",
            flops="4*B*H*N^2*d, halved for causal",
            default_config={str(k): v for k, v in G.DEFAULT_CONFIG.items()},
            causal_config={str(k): v for k, v in G.CAUSAL_CONFIG.items()},
            levers={k: dict(switches=LEVERS[k][0], causal_only=LEVERS[k][1]) for k in chosen},
            check_shapes=CHECK_SHAPES,
            check_section_mb=CHECK_SECTION_MB,
            budget_s=a.budget,
        ),
        warmup=None,
        processes=[],
        table=[],
        candidates=None,
    )

    def save():
        data["meta"]["elapsed_s"] = round(time.time() - t0, 1)
        Path(path).write_text(json.dumps(data, indent=1, default=str))

    def child(mode, deadline, **kw):
        part = os.path.join(tmp, f"{mode}_{len(os.listdir(tmp))}.json")
        cmd = [sys.executable, os.path.abspath(__file__), "--child", mode, "--part", part]
        cmd += ["--deadline", str(deadline)]
        for k, v in kw.items():
            cmd += [f"--{k}", json.dumps(v)]
        t = time.time()
        print(f"[{mode} at {t - t0:.0f}s]", flush=True)
        try:
            subprocess.run(cmd, timeout=max(5.0, deadline - time.time() + 10), check=False)
        except subprocess.TimeoutExpired:
            return dict(error="timed out")
        if not os.path.exists(part):
            return dict(error="no result (the child failed; its output is above)")
        res = json.loads(Path(part).read_text())
        res["wall_s"] = round(time.time() - t, 1)
        return res

    # 0. warm-up (unrecorded timings), 1. three measuring processes
    data["warmup"] = child("warm", t0 + 0.35 * a.budget)
    save()
    for _ in range(PROCESSES):  # each may take up to a fifth of the budget (expected: ~20 s)
        data["processes"].append(child("measure", min(end, time.time() + 0.2 * a.budget)))
        data["meta"]["environment"] = data["processes"][0].get("environment")
        data["table"] = aggregate(data["processes"], ["default"])
        save()
    rows, below = pick_rows(data["table"])
    low = [
        dict(zip(("N", "dtype", "d", "causal"), k, strict=True), worst=w)
        for w, k in below
        if w < 1.0
    ]
    data["summary"] = dict(
        rows_measured=len(below), rows_below_1=low, worst=below[0][0] if below else None
    )
    print(
        f"worst of {PROCESSES}: {len(data['summary']['rows_below_1'])} rows below 1.0", flush=True
    )
    for t in sorted(data["table"], key=lambda t: t["worst"].get("default", 9)):
        print(f"  {label(*row_key(t)):28s} worst {t['worst'].get('default', float('nan')):.3f}")
    save()
    # 2. candidates on those rows: checks + a first timing pass, then fresh timing passes
    if not rows or time.time() > end - 40:
        data["candidates"] = dict(rows=rows, skipped="no time left" if rows else "no rows")
        return save()
    cand = dict(rows=[list(r) for r in rows], passes=[])
    data["candidates"] = cand
    first = child("candidates", end - 25, rows=cand["rows"], levers=chosen)
    cand["checks"] = first.pop("checks", [])
    cand["passes"].append(first)
    timed = first.get("timed_levers", [])
    per_pass = first.get("timing_s", 30) + 12  # a fresh process's start-up: ~10 s
    while len(cand["passes"]) < PROCESSES and timed and time.time() + per_pass < end:
        cand["passes"].append(child("cand_time", end - 10, rows=cand["rows"], levers=timed))
    cand["table"] = aggregate(cand["passes"], ["default", *timed])
    save()
    print(f"candidates (worst of {len(cand['passes'])} passes):", flush=True)
    for t in cand["table"]:
        cells = " ".join(f"{n} {w:.3f}" for n, w in t["worst"].items())
        print(f"  {label(*row_key(t)):28s} {cells}", flush=True)
    save()
    print(f"wrote {path} [{time.time() - t0:.0f}s]", flush=True)


if __name__ == "__main__":
    main()
