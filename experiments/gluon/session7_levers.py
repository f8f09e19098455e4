"""Session 7's levers for the Gluon forward's short causal rows, checked and timed beside cuDNN in
one process (notes/gluon.md, "Session 7"). One command:

    PYTHONPATH=. python experiments/gluon/session7_levers.py --out $OUT

Variants (keyword overrides of ``gluon_attention_forward``; the default config is the baseline):

* ``default``      one CTA per tile, head-major, heaviest tile of each head first
* ``lpt_grid``     one CTA per tile, heaviest tiles of ALL heads first (causal only)
* ``dynamic``      persistent CTAs, tiles drawn from an atomic counter (FA3's scheduler)
* ``dynamic_lpt``  the same with the all-heads heaviest-first order (causal only)
* ``serial``       d = 64 only: the OVERLAP=False consumer (its checks run in a child process,
                   so an illegal memory access cannot take the rest of the run with it; timed
                   only if every check passed)

1. Correctness of every variant (fp16, d = 64 and 128, causal and not) against a float64
   reference with flash-attn's rule (kernel error <= 2x SDPA's error vs float64) at
   N = 1, 17, 200, 1000 (GQA 4:2), 2053; a failed check prints where the wrong rows are.
2. Timing (median of ``triton.testing.do_bench``) of each variant and SDPA's cuDNN backend at
   B = 4, H x d = 2048, N = 4K (fp16 and bf16), 8K, 16K (fp16), d = 64 and 128, causal and not,
   N = 4K first (the LPT variants: causal fp16 rows only, to keep the compile time in budget). The JSON file is rewritten after every row; a time budget (``--budget``, 230 s)
   skips what is left rather than overrun.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

from bench_forward import ref_attention_f64, sdpa  # noqa: E402
from course_kernels.gluon import launch as G  # noqa: E402

VARIANTS = {  # in order of priority: the checks of the later ones are skipped if time runs short
    "default": {},
    "dynamic": dict(DYNAMIC=True),
    "lpt_grid": dict(LPT=True),
    "dynamic_lpt": dict(DYNAMIC=True, LPT=True),
}
CAUSAL_ONLY = {"lpt_grid", "dynamic_lpt"}  # LPT changes nothing without a causal mask
SERIAL = {64: dict(OVERLAP=False), 128: dict(OVERLAP=False, NUM_CONSUMERS=1)}
CHECK_SHAPES = [(1, 2, 2, 1), (1, 2, 2, 17), (1, 2, 2, 200), (2, 4, 2, 1000), (1, 2, 2, 2053)]
T0 = time.time()


def elapsed():
    return time.time() - T0


def where_wrong(o, ref, d, nc):
    """Rows of O outside flash-attn's bound, described by tile slice (which consumer's rows)."""
    bad = ((o.double() - ref).abs().amax(dim=-1) > 1e-2).nonzero().tolist()  # (b, h, row)
    bm_tile = 64 * nc
    slices = sorted({(r % bm_tile) // 64 for _, _, r in bad})
    return dict(n_bad_rows=len(bad), first=bad[:8], consumer_slices=slices)


def check(cfg, d, causal, dtype=torch.float16):
    out = []
    for i, (B, H, Hkv, N) in enumerate(CHECK_SHAPES):
        torch.manual_seed(1000 + i)
        q = torch.randn(B, H, N, d, device="cuda", dtype=dtype)
        k = torch.randn(B, Hkv, N, d, device="cuda", dtype=dtype)
        v = torch.randn(B, Hkv, N, d, device="cuda", dtype=dtype)
        scale = 1.0 / math.sqrt(d)
        ref_o, ref_lse = ref_attention_f64(q, k, v, causal, scale)
        torch.empty(B * H * N * d * 4, device="cuda").fill_(float("nan"))  # poison
        o, lse = G.gluon_attention_forward(q, k, v, causal=causal, scale=scale, **cfg)
        torch.cuda.synchronize()
        e_k = (o.double() - ref_o).abs().max().item()
        e_s = (sdpa(q, k, v, causal, scale).double() - ref_o).abs().max().item()
        e_l = (lse.double() - ref_lse).abs().max().item()
        ok = math.isfinite(e_k) and e_k <= 2 * e_s + 1e-5 and math.isfinite(e_l) and e_l <= 1e-3
        r = dict(B=B, H=H, H_kv=Hkv, N=N, d=d, causal=causal, dtype=str(dtype)[6:])
        r.update(cfg=str(cfg), err_kernel=e_k, err_sdpa=e_s, err_lse=e_l, ok=bool(ok))
        if not ok:
            nc = cfg.get("NUM_CONSUMERS", G.DEFAULT_CONFIG[d]["NUM_CONSUMERS"])
            r["wrong"] = where_wrong(o, ref_o, d, nc)
            print("CHECK FAIL", r, flush=True)
        out.append(r)
    return out


def serial_child(out_dir):
    """--serial-check: the OVERLAP=False checks, in their own process."""
    res = []
    path = os.path.join(out_dir, "serial_checks.json")
    for d, cfg in SERIAL.items():
        for causal in (False, True):
            try:
                res += check(cfg, d, causal)
            except Exception as e:  # an illegal memory access ends this process's CUDA context
                res.append(dict(d=d, causal=causal, cfg=str(cfg), ok=False, error=repr(e)[:400]))
                Path(path).write_text(json.dumps(res, indent=1))
                return
            Path(path).write_text(json.dumps(res, indent=1))


def time_ms(fn, rep):
    import triton

    return triton.testing.do_bench(fn, warmup=20, rep=rep, return_mode="median")


def rows_plan():
    plan = []
    for N in (4096, 8192, 16384):
        for dtype in (torch.float16, torch.bfloat16) if N == 4096 else (torch.float16,):
            for d in (64, 128):
                for causal in (True, False):
                    plan.append((N, dtype, d, causal))
    return plan


def time_row(N, dtype, d, causal, variants):
    B, H = 4, 2048 // d
    torch.manual_seed(0)
    q, k, v = (torch.randn(B, H, N, d, device="cuda", dtype=dtype) for _ in range(3))
    scale, rep = 1.0 / math.sqrt(d), (60 if N <= 4096 else 100)
    flops = 4 * B * H * N * N * d * (0.5 if causal else 1.0)
    row = dict(N=N, dtype=str(dtype)[6:], d=d, causal=causal, B=B, H=H, tflops={}, ms={})

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)

    fns = {"cudnn": cudnn}
    for name, cfg in variants.items():
        if name in CAUSAL_ONLY and (not causal or dtype != torch.float16):
            continue  # no LPT without a mask; bf16 rows: default and dynamic only (compile time)
        fns[name] = lambda cfg=cfg: G.gluon_attention_forward(
            q, k, v, causal=causal, scale=scale, **cfg
        )
    for name, fn in fns.items():
        try:
            ms = time_ms(fn, rep)
        except Exception as e:
            print(f"{name} failed: {e!r}"[:300], flush=True)
            ms = float("nan")
        row["ms"][name], row["tflops"][name] = ms, flops / ms / 1e9
    c = row["tflops"]["cudnn"]
    row["ratio_vs_cudnn"] = {k: t / c for k, t in row["tflops"].items() if k != "cudnn"}
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="results", help="directory of the JSON file")
    ap.add_argument("--tag", default="h200_session7_levers")
    ap.add_argument("--budget", type=float, default=230.0, help="seconds for the whole run")
    ap.add_argument("--serial-check", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    if a.serial_check:
        return serial_child(a.out)
    import triton

    meta = dict(
        gpu=torch.cuda.get_device_name(),
        torch=torch.__version__,
        triton=triton.__version__,
        cudnn=torch.backends.cudnn.version(),
        date=datetime.datetime.now().isoformat(timespec="seconds"),
        command="PYTHONPATH=. python " + " ".join(sys.argv),
        timer="triton.testing.do_bench median (warmup 20 ms, rep 60 ms at N = 4K, 100 ms above)",
        flops="4*B*H*N^2*d, halved for causal",
        default_config={str(k): v for k, v in G.DEFAULT_CONFIG.items()},
        variants={k: str(v) for k, v in VARIANTS.items()},
        serial={str(k): str(v) for k, v in SERIAL.items()},
    )
    data = dict(meta=meta, checks=[], serial_checks=None, rows=[], skipped=[])
    path = os.path.join(a.out, a.tag + ".json")

    def save():
        data["meta"]["elapsed_s"] = round(elapsed(), 1)
        Path(path).write_text(json.dumps(data, indent=1))

    # 0. the serial consumer's checks, in a child process started first (runs beside this one)
    child = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "--serial-check", "--out", a.out],
        stdout=sys.stdout,
        stderr=sys.stderr,
    )
    # 1. correctness of every variant but the default (verified in run 2 and by the GPU tests)
    unchecked = set()
    for name, cfg in VARIANTS.items():
        if name == "default":
            continue
        if elapsed() > 0.45 * a.budget:
            unchecked.add(name)  # not checked, so not timed
            continue
        for d in (64, 128):
            for causal in (True, False) if name not in CAUSAL_ONLY else (True,):
                for r in check(cfg, d, causal):
                    r["variant"] = name
                    data["checks"].append(r)
        save()
        print(f"[checks of {name} done at {elapsed():.0f}s]", flush=True)
    failed = {r["variant"] for r in data["checks"] if not r["ok"]}
    print(f"checks: {sum(r['ok'] for r in data['checks'])}/{len(data['checks'])} pass", flush=True)
    try:
        child.wait(timeout=max(1.0, 120 - elapsed()))
    except subprocess.TimeoutExpired:
        child.kill()
    sp = os.path.join(a.out, "serial_checks.json")
    data["serial_checks"] = (
        json.loads(Path(sp).read_text()) if os.path.exists(sp) else "child gave no result"
    )
    n_serial = 2 * 2 * len(CHECK_SHAPES)
    serial_ok = isinstance(data["serial_checks"], list) and len(data["serial_checks"]) == n_serial
    serial_ok = serial_ok and all(r["ok"] for r in data["serial_checks"])
    save()
    # 2. timings: a variant that failed a check is not timed
    data["unchecked_variants"] = sorted(unchecked)
    variants = {k: v for k, v in VARIANTS.items() if k not in failed | unchecked}
    print(f"{'row':34s} " + " ".join(f"{k:>11s}" for k in ["cudnn", *variants, "serial"]))
    for N, dtype, d, causal in rows_plan():
        if elapsed() > a.budget - (25 if N >= 16384 else 12):
            data["skipped"].append(dict(N=N, dtype=str(dtype)[6:], d=d, causal=causal))
            continue
        vs = dict(variants)
        if d == 64 and serial_ok:
            vs["serial"] = SERIAL[64]
        row = time_row(N, dtype, d, causal, vs)
        data["rows"].append(row)
        save()
        label = f"{row['dtype']} d={d} N={N} {'causal' if causal else 'full'}"
        cells = [f"{row['tflops']['cudnn']:7.1f}"] + [
            f"{row['tflops'][k]:6.1f} {row['ratio_vs_cudnn'][k]:.2f}"
            if k in row["tflops"]
            else " " * 11
            for k in [*variants, "serial"]
        ]
        print(f"{label:34s} " + " ".join(f"{c:>11s}" for c in cells), flush=True)
    print(f"wrote {path} [{elapsed():.0f}s]", flush=True)


if __name__ == "__main__":
    main()
