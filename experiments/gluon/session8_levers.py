"""Session 8's levers for the Gluon forward's d = 64 causal rows, checked and timed beside cuDNN in
one process (notes/gluon.md, "Session 8"). One command on the H200:

    PYTHONPATH=. python experiments/gluon/session8_levers.py --out $OUT --budget 170

``--dry-run`` lists the checks, the rows and the number of kernel compiles without a GPU;
``--diagnose`` prints the per-tile work table behind the variants (CPU, no torch kernels).

Variants (keyword overrides of ``gluon_attention_forward``, per head dim; ``default`` is the
current ``DEFAULT_CONFIG``: dynamic persistent, d = 64 three consumers, BN = 128, STAGES = 3):

* ``skip``         SKIP_DEAD: a consumer warpgroup skips (only waits for and releases) the K/V
                   blocks wholly masked for its own 64 rows: rows past N in the last tile, and
                   under causal masking the blocks right of its diagonal
* ``skip_end``     SKIP_DEAD + ALIGN_END: query tiles end at the last row instead of starting at
                   row 0, so the partial 192-row tile is the first (causal: lightest) one of each
                   head, not the heaviest; its warpgroups with rows before row 0 skip it
* ``skip_end_s4``  the same with a 4-stage K/V ring (d = 64 only: 180.6 KB of shared memory)
* ``nc2``          d = 64 with two consumer warpgroups (128-row tiles, 240 registers each): no
                   partial tile and no wholly masked block at N = 4K/8K/16K, one fewer warpgroup

1. Correctness of every variant (fp16; d = 64 causal and not, d = 128 causal for the kernel
   switches) against the float64 reference with flash-attn's rule, reusing session 7's ``check``,
   at N = 17, 200, 300, 1000 (GQA 4:2) and 2053: one tile with two dead warpgroups, the partial
   tile first or last, one dead warpgroup (N = 300 with ALIGN_END), no partial tile.
2. Timing (median of ``triton.testing.do_bench``, session 7's ``time_row``) at B = 4,
   H x d = 2048: d = 64, N = 4K / 8K / 16K, causal and not, fp16 and bf16, plus d = 128 N = 4K
   causal fp16 as a guard; the causal N = 4K rows first. The JSON file is rewritten after every
   row; the time budget skips what is left rather than overrun.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
for p in (ROOT, HERE):
    if p not in sys.path:
        sys.path.insert(0, p)

TAG = "h200_session8_levers"
BM = 64
VARIANTS = {  # name -> {head dim: overrides, or None}; in order of priority (checks, budget)
    # the schedule before session 8 (launch.CAUSAL_CONFIG, adopted from this run, is off here)
    "default": {
        64: dict(SKIP_DEAD=False, ALIGN_END=False),
        128: dict(SKIP_DEAD=False, ALIGN_END=False),
    },
    "skip_end": {
        64: dict(SKIP_DEAD=True, ALIGN_END=True),
        128: dict(SKIP_DEAD=True, ALIGN_END=True),
    },
    "skip": {64: dict(SKIP_DEAD=True), 128: dict(SKIP_DEAD=True)},
    "nc2": {64: dict(NUM_CONSUMERS=2, CONSUMER_REGS=240), 128: None},
    "skip_end_s4": {64: dict(SKIP_DEAD=True, ALIGN_END=True, STAGES=4), 128: None},
}
# (B, H, H_kv, N); variants of config knobs only (nc2) are checked on the first two
CHECK_SHAPES = [(1, 2, 2, 200), (1, 3, 3, 300), (1, 2, 2, 17), (2, 4, 2, 1000), (1, 2, 2, 2053)]
CONFIG_ONLY = {"nc2"}


def check_plan():
    """(variant, d, causal, shapes): fp16 float64 checks of every variant but the default."""
    out = []
    for name, per_d in VARIANTS.items():
        if name == "default":
            continue
        shapes = CHECK_SHAPES[:2] if name in CONFIG_ONLY else CHECK_SHAPES
        for d, cfg in per_d.items():
            if cfg is None:
                continue
            for causal in (True, False) if d == 64 else (True,):
                out.append((name, d, causal, shapes))
    return out


def rows_plan():
    """(N, dtype name, d, causal) timed, the most important first."""
    plan = []
    for N in (4096, 8192, 16384):
        for causal in (True, False):
            for dt in ("float16", "bfloat16"):
                plan.append((N, dt, 64, causal))
        if N == 4096:
            plan.insert(2, (4096, "float16", 128, True))  # the d = 128 guard, after d = 64 causal
    return plan


# ----------------------------------------------------------------- CPU: the work per tile
def _spec(x):
    """Triton specialises an int argument on == 1 and on divisibility by 16."""
    return (x == 1, x % 16 == 0)


def compile_key(cfg, d, causal, dtype, B, H, Hkv, N):
    """What makes a new kernel compile: the constexprs (config, causal, dtype) and the
    specialisation of the int arguments (N, H, G, num_pid_m, num_tiles)."""
    from course_kernels.gluon.launch import DEFAULT_CONFIG  # CPU-safe import

    full = dict(DEFAULT_CONFIG[d], **cfg)
    npm = math.ceil(N / (BM * full["NUM_CONSUMERS"]))
    ints = (N, H, H // Hkv, npm, npm * B * H)
    return (tuple(sorted(full.items())), d, causal, dtype, tuple(_spec(x) for x in ints))


def count_compiles():
    keys = set()
    for name, d, causal, shapes in check_plan():
        for B, H, Hkv, N in shapes:
            keys.add(compile_key(VARIANTS[name][d], d, causal, "float16", B, H, Hkv, N))
    for N, dt, d, causal in rows_plan():
        for per_d in VARIANTS.values():
            if per_d[d] is not None:
                keys.add(compile_key(per_d[d], d, causal, dt, 4, 2048 // d, 2048 // d, N))
    return len(keys)


def work_per_head(N, NC=3, BN=128, causal=True, skip=False, align_end=False):
    """Warpgroup-steps (one warpgroup, one K/V block: QK^T, softmax, PV) of one head, as the
    kernel runs them: ``steps`` computed, ``dead`` computed although the block is wholly masked
    for that warpgroup's rows, ``masked`` computed with the mask (block 0 always, the diagonal,
    the ragged last block), ``alone`` blocks of tiles with a single live warpgroup (it has the
    SM's tensor cores to itself and cannot hide its own softmax), ``useful``: the fraction of
    the computed score area that is kept."""
    BMT = BM * NC
    npm = math.ceil(N / BMT)
    shift = npm * BMT - math.ceil(N / BM) * BM if align_end else 0
    w = dict(tiles=npm, blocks=0, steps=0, dead=0, masked=0, alone=0, area=0)
    for p in range(npm):
        off = p * BMT - shift
        nb = math.ceil((min(N, off + BMT) if causal else N) / BN)
        w["blocks"] += nb
        live = []
        for c in range(NC):
            om = off + c * BM
            n_mine = math.ceil(min(N, om + BM) / BN) if causal else nb
            n_mine = min(nb, n_mine) if 0 <= om < N else 0
            live.append(n_mine > 0)
            if n_mine == 0 and align_end:
                continue  # rows before row 0 always skip (nothing to store)
            n_run = n_mine if skip else nb
            w["steps"] += n_run
            w["dead"] += n_run - n_mine
            n_free = min(N // BN, om // BN if causal else N, n_run)
            w["masked"] += n_run - max(n_free, 1) + 1
            rows = range(max(om, 0), min(om + BM, N))
            w["area"] += sum((r + 1) if causal else N for r in rows)
        if skip and sum(live) == 1:
            w["alone"] += nb
    w["useful"] = w["area"] / (w["steps"] * BM * BN)
    return w


def model_time(w, NC, a):
    """Time of one head in tile-block units (one K/V block with all NC warpgroups live = 1), a
    block computed by a warpgroup alone costing ``a`` (a crude throughput model: a
    warpgroup-step costs 1/NC whoever else is running, except alone)."""
    return (w["steps"] - w["alone"]) / NC + w["alone"] * a


def diagnose():
    """The work table (fractions of the computed warpgroup-steps; ``alone`` as a fraction of
    the head's time) and the model's speed-up over the default for a = 0.4 and 0.7."""
    print(
        f"{'N':>6} {'mask':>6} {'tile':>8} {'variant':>10} {'tiles':>5} {'blk/tile':>8} "
        f"{'steps/tile':>10} {'dead':>6} {'masked':>6} {'alone':>6} {'useful':>6} {'model':>11}"
    )
    configs = [
        ("default", 3, 128, False, False),
        ("skip", 3, 128, True, False),
        ("skip_end", 3, 128, True, True),
        ("nc2", 2, 128, False, False),
        ("BN=64", 3, 64, False, False),
        ("BN=192", 3, 192, False, False),
    ]
    for N in (4096, 8192, 16384):
        for causal in (True, False):
            base = work_per_head(N, 3, 128, causal)
            for name, NC, BN, skip, end in configs:
                w = work_per_head(N, NC, BN, causal, skip, end)
                s = w["steps"]
                model = ""
                if name.startswith("skip"):
                    t0 = model_time(base, 3, 0)
                    lo, hi = (t0 / model_time(w, NC, a) for a in (0.7, 0.4))
                    model = f"{lo:.3f}-{hi:.3f}"
                print(
                    f"{N:>6} {'causal' if causal else 'full':>6} {BM * NC:>4}x{BN:<3} {name:>10} "
                    f"{w['tiles']:>5} {w['blocks'] / w['tiles']:>8.2f} {s / w['tiles']:>10.2f} "
                    f"{w['dead'] / s:>6.3f} {w['masked'] / s:>6.3f} "
                    f"{w['alone'] / model_time(w, NC, 1 / NC):>6.3f} {w['useful']:>6.3f} {model:>11}"
                )


def dry_run(budget):
    checks = check_plan()
    n_checks = sum(len(s) for *_, s in checks)
    print(f"checks ({n_checks} launches, fp16, float64 reference):")
    for name, d, causal, shapes in checks:
        print(
            f"  {name:12s} d={d:<3d} {'causal' if causal else 'full':6s} N={[s[3] for s in shapes]}"
        )
    print("timed rows (cuDNN + every variant with a config at that head dim):")
    for N, dt, d, causal in rows_plan():
        vs = [k for k, v in VARIANTS.items() if v[d] is not None]
        print(f"  {dt:8s} d={d:<3d} N={N:<5d} {'causal' if causal else 'full':6s} {vs}")
    n = count_compiles()
    print(f"kernel compiles: {n} (~1.5-2 s each on the H200 host); budget {budget:.0f} s")


# ----------------------------------------------------------------- GPU
def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="results", help="directory of the JSON file")
    ap.add_argument("--tag", default=TAG)
    ap.add_argument("--budget", type=float, default=170.0, help="seconds for the whole run")
    ap.add_argument("--dry-run", action="store_true", help="list what would run; no GPU")
    ap.add_argument("--diagnose", action="store_true", help="the work-per-tile table; no GPU")
    a = ap.parse_args()
    if a.diagnose:
        return diagnose()
    if a.dry_run:
        return dry_run(a.budget)
    t0 = time.time()
    import json

    import session7_levers as S7  # check(), time_row(): session 7's machinery
    import torch

    from course_kernels.bench import environment

    G = S7.G
    S7.CHECK_SHAPES = CHECK_SHAPES  # read by S7.check at call time
    env = environment()
    env["command"] = "PYTHONPATH=. python " + " ".join(sys.argv)
    meta = dict(
        environment=env,
        timer="triton.testing.do_bench median (warmup 20 ms, rep 60 ms at N = 4K, 100 ms above)",
        flops="4*B*H*N^2*d, halved for causal",
        default_config={str(k): v for k, v in G.DEFAULT_CONFIG.items()},
        variants={k: {str(d): v for d, v in per_d.items()} for k, per_d in VARIANTS.items()},
        check_shapes=CHECK_SHAPES,
        compiles_planned=count_compiles(),
    )
    data = dict(meta=meta, checks=[], rows=[], skipped=[], unchecked_variants=[])
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, a.tag + ".json")

    def save():
        data["meta"]["elapsed_s"] = round(time.time() - t0, 1)
        Path(path).write_text(json.dumps(data, indent=1, default=str))

    # 1. checks, in order of priority; a variant not checked in time is not timed
    for name, d, causal, shapes in check_plan():
        if time.time() - t0 > 0.5 * a.budget:
            data["unchecked_variants"].append(name)
            continue
        S7.CHECK_SHAPES = shapes
        try:
            res = S7.check(VARIANTS[name][d], d, causal)
        except Exception as e:  # a fault ends the CUDA context: record it, time nothing more
            data["checks"].append(dict(variant=name, d=d, causal=causal, ok=False, error=repr(e)))
            save()
            raise
        for r in res:
            r["variant"] = name
        data["checks"] += res
        save()
        print(f"[checks {name} d={d} causal={causal} at {time.time() - t0:.0f}s]", flush=True)
    failed = {r["variant"] for r in data["checks"] if not r["ok"]}
    bad = failed | set(data["unchecked_variants"])
    print(f"checks: {sum(r['ok'] for r in data['checks'])}/{len(data['checks'])} pass", flush=True)
    # 2. timings
    names = [k for k in VARIANTS if k not in bad]
    print(f"{'row':30s} {'cudnn':>7s} " + " ".join(f"{k:>12s}" for k in names), flush=True)
    for N, dt, d, causal in rows_plan():
        if time.time() - t0 > a.budget - (20 if N >= 16384 else 8):
            data["skipped"].append(dict(N=N, dtype=dt, d=d, causal=causal))
            continue
        vs = {k: VARIANTS[k][d] for k in names if VARIANTS[k][d] is not None}
        row = S7.time_row(N, getattr(torch, dt), d, causal, vs)
        data["rows"].append(row)
        save()
        cells = [
            f"{row['tflops'][k]:6.1f} {row['ratio_vs_cudnn'][k]:.3f}" if k in vs else ""
            for k in names
        ]
        label = f"{dt} d={d} N={N} {'causal' if causal else 'full'}"
        print(
            f"{label:30s} {row['tflops']['cudnn']:7.1f} " + " ".join(f"{c:>12s}" for c in cells),
            flush=True,
        )
    save()
    print(f"wrote {path} [{time.time() - t0:.0f}s]", flush=True)


if __name__ == "__main__":
    main()
