"""Issue 22 on a GPU: the correctness tests, then the variants benchmark against FlexAttention and
PyTorch's ``varlen_attn``. Writes one JSON record (GPU, versions, date, command, every row).

    python scripts/gpu_features.py --part tests --out features_tests.json
    python scripts/gpu_features.py --part bench --out features_bench.json
    python scripts/gpu_features.py --dry-run            # list the rows; needs no GPU

Tests: ``pytest tests/gpu -q`` (flash-attn's adapted suite included) with
COURSE_KERNELS_AUTOTUNE=0 (one config per kernel: the suite checks semantics).

Benchmark rows: B = 4, H * d = 2048, fp16, d in {64, 128}, N in {4K, 8K, 16K}, masks: causal,
causal sliding window of 1024 keys (``window_size=(1023, 0)``; Flex: ``q - kv < 1024``), and
documents (16,384 tokens in 6 documents, causal within each: the course's
``flash_attention_varlen``, Flex with a document mask, ``varlen_attn``). Forward and backward
(backward alone, from a retained graph): the median of ``--rounds`` rounds, each the median of
``triton.testing.do_bench``, a group's providers interleaved round by round. TFLOP/s
count only unmasked work: 4 d H (visible pairs) forward, 2.5x that backward. Rows past
``--budget-s`` are recorded as skipped, so the run ends in time; the file is rewritten after
every row, so an interrupted run keeps what it measured.

The Serving and Below Triton chapters read its records (``course_kernels/data/bench/``, e.g.
``h200_features_bench_autotune.json``) through ``course_kernels.bench.features``.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import itertools
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MASKS = ("causal", "window", "document")
PROVIDERS = ("course", "flex", "varlen_attn")
DOC_TOKENS, DOCS = 16_384, 6
DEVICE = ["cuda"]  # --device cpu: a smoke test of the script in Triton's interpreter
ROW_NAME = "{provider} {pass} {mask} d={d} N={n}"  # a row as a record's "after" names it
SPUN_UP: list[float] = []  # the untimed first run of a process (clocks up before any row)


def row_options():  # a row's inputs and calls: experiments/gluon/clock_trace.py takes them too
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--batch", type=int, default=4, help="batch size of the dense rows")
    p.add_argument("--hidden", type=int, default=2048, help="H * d")
    p.add_argument("--window", type=int, default=1024, help="keys a row sees in 'window'")
    p.add_argument("--autotune", action="store_true", help="autotune the course kernels")
    p.add_argument("--device", default="cuda", help="cuda; cpu only smoke-tests this script")
    return p


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], parents=[row_options()])
    p.add_argument("--out", default="gpu_features.json", help="JSON file to write")
    p.add_argument("--part", choices=("tests", "bench", "all"), default="all", help="what to run")
    p.add_argument("--dry-run", action="store_true", help="list the benchmark rows and exit")
    p.add_argument("--d", type=int, nargs="+", default=[64, 128], help="head dims")
    p.add_argument("--n", type=int, nargs="+", default=[4096, 8192, 16384], help="seq lengths")
    p.add_argument("--masks", nargs="+", choices=MASKS, default=list(MASKS), help="mask kinds")
    p.add_argument("--providers", nargs="+", choices=PROVIDERS, default=list(PROVIDERS))
    p.add_argument("--passes", nargs="+", choices=("fwd", "bwd"), default=["fwd", "bwd"])
    p.add_argument("--doc-tokens", type=int, default=DOC_TOKENS, help="tokens of 'document'")
    p.add_argument("--budget-s", type=float, default=450.0, help="stop starting rows after this")
    p.add_argument("--warmup", type=int, default=250, help="do_bench warm-up (ms), session 35")
    p.add_argument("--rep", type=int, default=250, help="do_bench repetitions (ms)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds a row (median)")
    p.add_argument("--workers", type=int, default=12, help="pytest-xdist workers for the tests")
    p.add_argument("--verbose-tests", action="store_true", help="pytest -v (one line a test)")
    p.add_argument("--pytest-args", default="", help="extra pytest arguments for --part tests")
    p.add_argument("--tests-timeout-s", type=float, default=420.0, help="stop pytest after this")
    p.add_argument("--gluon-masked-backward", nargs="+", default=[],
                   choices=("window", "documents"),
                   help="an experiment: flash_attention takes the Gluon backward for these "
                   "masks at the --d dims (this process)")  # fmt: skip
    p.add_argument("--gluon-masked-forward", nargs="+", default=[], choices=("documents",),
                   help="the same for the Gluon forward")  # fmt: skip
    p.add_argument("--gluon-backward-defaults", nargs="+", default=[], metavar="KEY=V",
                   help="an experiment: Gluon backward switches made its defaults in this "
                   "process, e.g. DQ_CONVERT=2 KEEP_ACC=1 (BACKWARD_DQ_DEFAULTS); WINDOW_KEEP=0: "
                   "window calls without their own (BACKWARD_WINDOW_KEEP off)")  # fmt: skip
    return p.parse_args(argv)


def enable_gluon_masked(masks, dims, table="GLUON_MASKED_BACKWARD"):
    """--gluon-masked-backward (--gluon-masked-forward): list ``dims`` for ``masks`` in launch.
    GLUON_MASKED_BACKWARD (_FORWARD), in this process; returns what it was, for the record."""
    from course_kernels.triton import launch

    dims_of = getattr(launch, table)
    before = {m: dims_of[m] for m in masks}
    dims_of.update(dict.fromkeys(masks, tuple(dims)))
    return before


def doc_lengths(total=DOC_TOKENS, docs=DOCS):
    """Six documents of unequal length summing to ``total`` (a fixed, reproducible split)."""
    weights = [5, 1, 3, 2, 4, 1]
    lengths = [total * w // sum(weights) for w in weights[:docs]]
    lengths[0] += total - sum(lengths)
    return lengths


def visible_pairs(mask, n, window, lengths=None):
    """(query, key) pairs that are computed in exact arithmetic, per (batch, head)."""
    if mask == "causal":
        return n * (n + 1) // 2
    if mask == "window":
        w = min(window, n)
        return w * (w + 1) // 2 + (n - w) * w
    return sum(L * (L + 1) // 2 for L in lengths)


def rows(args):
    return [{"mask": mask, "d": d, "n": n, "provider": provider, "pass": pass_}
            for mask in args.masks for d in args.d
            for n in ([args.doc_tokens] if mask == "document" else args.n)
            for provider in args.providers for pass_ in args.passes]  # fmt: skip


def flops(row, args):
    heads = args.hidden // row["d"]
    batch = 1 if row["mask"] == "document" else args.batch
    pairs = visible_pairs(row["mask"], row["n"], args.window, doc_lengths(row["n"]))
    f = 4.0 * row["d"] * heads * batch * pairs
    return f * (2.5 if row["pass"] == "bwd" else 1.0)


def environment(args):
    import torch
    import triton

    def git(*a):
        try:
            return subprocess.check_output(["git", *a], cwd=ROOT, text=True).strip()
        except Exception:
            return None

    return {
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "device": args.device,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([sys.executable, *sys.argv]),
        "commit": git("rev-parse", "HEAD"),
        "dirty": bool(git("status", "--porcelain")),
        "autotune": args.autotune,
        "forward_choice": os.environ.get("COURSE_KERNELS_FORWARD", "auto"),
        "course_kernels_env": {k: v for k, v in os.environ.items() if k.startswith("COURSE_KERN")},
        "dtype": "float16",
    }


def run_tests(args):
    """pytest tests/gpu in a subprocess; returns a summary dict."""
    env = dict(os.environ, COURSE_KERNELS_AUTOTUNE="0")
    cmd = [sys.executable, "-m", "pytest", "tests/gpu", "-q", "-rf", "-p", "no:cacheprovider"]
    cmd += ["-v"] if args.verbose_tests else []
    if args.workers > 1 and importlib.util.find_spec("xdist") is not None:
        cmd += ["-n", str(args.workers)]  # compiling ~300 kernel variants is CPU-bound
    cmd += args.pytest_args.split()
    t0 = time.time()
    try:
        proc = subprocess.run(
            cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=args.tests_timeout_s
        )
        stdout, stderr, rc = proc.stdout, proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as exc:  # keep what ran
        stdout = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        stderr, rc = f"timed out after {args.tests_timeout_s} s", "timeout"
    lines = stdout.strip().splitlines()
    return {
        "command": " ".join(cmd),
        "returncode": rc,
        "seconds": round(time.time() - t0, 1),
        "summary": lines[-1] if lines else "",
        "failed": [ln for ln in lines if ln.startswith("FAILED")],
        "tail": "\n".join(lines[-60:]) + ("\n" + stderr[-2000:] if stderr else ""),
    }


def _bench(fn, args):
    import triton

    if DEVICE[0] != "cuda":  # the smoke test: one timed call
        fn()
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    if not SPUN_UP:  # a fresh process's first row ran slow in session 26: ~0.6 s untimed first
        SPUN_UP.append(triton.testing.do_bench(fn, warmup=300, rep=300))
    return triton.testing.do_bench(fn, warmup=args.warmup, rep=args.rep, return_mode="median")


def _inputs(row, args):
    import torch

    d, n = row["d"], row["n"]
    heads = args.hidden // d
    g = torch.Generator(device=DEVICE[0]).manual_seed(0)
    batch = 1 if row["mask"] == "document" else args.batch

    def r():
        return torch.randn(batch, heads, n, d, device=DEVICE[0], dtype=torch.float16, generator=g)

    return [r().requires_grad_() for _ in range(3)] + [r()]


def _varlen_attn(q, k, v, cu, max_len, causal_window):
    """torch.nn.attention.varlen.varlen_attn on packed (T, H, d), causal (+ window)."""
    import inspect

    from torch.nn.attention.varlen import varlen_attn

    params = inspect.signature(varlen_attn).parameters
    kw = {}
    if "window_size" in params:
        kw["window_size"] = causal_window
    elif "is_causal" in params:
        if causal_window[0] != -1:
            raise RuntimeError("this varlen_attn has no window_size")
        kw["is_causal"] = True
    return varlen_attn(q, k, v, cu, cu, max_len, max_len, **kw)


def make_fn(row, args, q, k, v):
    """A function computing the row's attention output from (q, k, v) in (B, H, N, d)."""
    import torch

    from course_kernels import flash_attention, flash_attention_varlen

    mask, provider, n = row["mask"], row["provider"], row["n"]
    w = args.window
    lengths = doc_lengths(n) if mask == "document" else [n] * q.shape[0]
    cu = torch.tensor([0, *itertools.accumulate(lengths)], device=DEVICE[0], dtype=torch.int32)
    window = (w - 1, 0) if mask == "window" else (-1, 0)

    def packed(x):  # (B, H, N, d) -> (B * N, H, d), a leaf of its own: no copy is timed
        y = x.detach().transpose(1, 2).reshape(-1, x.shape[1], x.shape[3]).contiguous()
        return y.requires_grad_(x.requires_grad)

    if provider == "course" and mask != "document":
        kw = {"window_size": (w - 1, 0)} if mask == "window" else {}
        return lambda: flash_attention(q, k, v, causal=True, **kw)
    if provider in ("course", "varlen_attn"):
        qp, kp, vp = packed(q), packed(k), packed(v)
        if provider == "course":
            fn = lambda: flash_attention_varlen(  # noqa: E731
                qp, kp, vp, cu, cu, max(lengths), max(lengths), causal=True
            )
        else:
            fn = lambda: _varlen_attn(qp, kp, vp, cu, max(lengths), window)  # noqa: E731
        fn.leaves = (qp, kp, vp)  # the packed copies are the graph's inputs (see measure)
        return fn
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    doc = torch.repeat_interleave(
        torch.arange(len(lengths), device=DEVICE[0]), torch.tensor(lengths, device=DEVICE[0])
    )

    def mask_mod(b, h, qi, ki):
        keep = qi >= ki
        if mask == "window":
            keep = keep & (qi - ki < w)
        if mask == "document":
            keep = keep & (doc[qi] == doc[ki])
        return keep

    block_mask = create_block_mask(mask_mod, None, None, n, n, device=DEVICE[0])
    # one static compile per shape and mask (no fallback to eager after 8 recompiles)
    for knob in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit"):
        if hasattr(torch._dynamo.config, knob):
            setattr(torch._dynamo.config, knob, 256)
    flex = torch.compile(flex_attention, dynamic=False)
    return lambda: flex(q, k, v, block_mask=block_mask)


def measure(row, args):
    import torch

    q, k, v, do = _inputs(row, args)
    fn = make_fn(row, args, q, k, v)
    if row["pass"] == "fwd":
        with torch.no_grad():
            ms = _bench(fn, args)
    else:
        out = fn()
        if out.shape != do.shape:  # packed outputs
            do = do.transpose(1, 2).reshape(out.shape)

        leaves = getattr(fn, "leaves", (q, k, v))

        def bwd():  # returns the gradients: nothing accumulates into .grad (no add kernels timed)
            return torch.autograd.grad(out, leaves, do, retain_graph=True)

        ms = _bench(bwd, args)
    return ms


def run_bench(args, record, write):
    """A (mask, d, N) group's rows (every provider and pass) timed in --rounds interleaved rounds,
    so that a clock or thermal drift meets every provider alike; a row's time: its median round."""
    t0, last = time.time(), [None]  # last: the row timed just before (it sets the clock: s. 34)
    for _, group in itertools.groupby(rows(args), key=lambda r: (r["mask"], r["d"], r["n"])):
        group = list(group)
        for _ in range(args.rounds):
            for row in group:
                if "error" in row.get("status", "") or time.time() - t0 > args.budget_s:
                    row.setdefault("status", f"skipped: past --budget-s {args.budget_s}")
                    continue
                try:
                    at = [round(time.time(), 2)]  # the round's wall-clock span (a clock log's key)
                    row.setdefault("rounds_ms", []).append(round(measure(row, args), 4))
                    row.setdefault("rounds_at", []).append(at + [round(time.time(), 2)])
                    row.setdefault("after", []).append(last[0])  # each round's predecessor
                    last[0], row["status"] = ROW_NAME.format_map(row), "ok"
                except Exception as exc:  # a provider missing in this torch, an OOM, ...
                    row["status"] = f"error: {type(exc).__name__}: {str(exc)[:300]}"
        for row in group:
            if row["status"] == "ok":
                ms = statistics.median(row["rounds_ms"])
                row.update(ms=round(ms, 4), tflops=round(flops(row, args) / ms / 1e9, 1))
            print(json.dumps(row), flush=True)
            record["rows"].append(row)
            write()
    record["bench_seconds"] = round(time.time() - t0, 1)
    ratios, key = {}, ("mask", "d", "n", "pass")
    ok = [r for r in record["rows"] if r.get("status") == "ok"]
    course = {tuple(c[x] for x in key): c for c in ok if c["provider"] == "course"}
    for r in ok:
        mine = course.get(tuple(r[x] for x in key))
        if r["provider"] != "course" and mine:
            name = f"{r['mask']} d={r['d']} N={r['n']} {r['pass']} vs {r['provider']}"
            ratios[name] = round(r["ms"] / mine["ms"], 3)  # same work: time over time
    record["course_over_other"] = ratios


def set_backward_defaults(pairs):
    """--gluon-backward-defaults: each KEY=V made the Gluon backward's default in this process
    (returns what they were, for the record); a key or value it does not take stops the run."""
    from course_kernels.gluon import backward_launch as GB

    before = {}
    for pair in pairs:
        key, _, val = pair.partition("=")
        if pair == "WINDOW_KEEP=0":  # session 33: the window default before it took KEEP_ACC
            before[key] = dict(GB.BACKWARD_WINDOW_KEEP)
            GB.BACKWARD_WINDOW_KEEP.update(dict.fromkeys(GB.BACKWARD_WINDOW_KEEP, False))
            continue
        if key not in GB.BACKWARD_DQ_DEFAULTS or not val.lstrip("-").isdigit():
            raise SystemExit(f"--gluon-backward-defaults: {pair!r} is not KEY=integer with KEY "
                             f"one of {sorted(GB.BACKWARD_DQ_DEFAULTS)}")  # fmt: skip
        if int(val) not in GB._ACCEPTED[key]:
            raise SystemExit(f"--gluon-backward-defaults: {key} takes {GB._ACCEPTED[key]}")
        before[key] = GB.BACKWARD_DQ_DEFAULTS[key]
        GB.BACKWARD_DQ_DEFAULTS[key] = int(val)
    return before


def main(argv=None):
    args = parse_args(argv)
    if args.dry_run:
        for row in rows(args):
            print(json.dumps({**row, "gflop": round(flops(row, args) / 1e9, 1)}))
        return 0
    DEVICE[0] = args.device
    if not args.autotune:
        os.environ["COURSE_KERNELS_AUTOTUNE"] = "0"  # read when course_kernels loads
    sys.path.insert(0, str(ROOT))
    record = {"environment": environment(args), "args": vars(args), "rows": []}
    for side in ("backward", "forward"):
        if masks := getattr(args, f"gluon_masked_{side}"):
            table = f"GLUON_MASKED_{side.upper()}"
            record[f"{table.lower()}_before"] = enable_gluon_masked(masks, args.d, table)
    if gbd := args.gluon_backward_defaults:
        record["gluon_backward_defaults_before"] = set_backward_defaults(gbd)
    out = Path(args.out)
    write = lambda: out.write_text(json.dumps(record, indent=1) + "\n")  # noqa: E731
    if args.part in ("tests", "all"):
        record["tests"] = run_tests(args)
        print(record["tests"]["summary"], flush=True)
        write()
    if args.part in ("bench", "all"):
        run_bench(args, record, write)
    write()
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
