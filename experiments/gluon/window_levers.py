"""Session 11: the Gluon forward's causal sliding window (issue 22's window rows: B = 4,
H x d = 2048, fp16, window_size = (1023, 0)), its schedule variants timed against the tl forward
in one process (median of ``triton.testing.do_bench``), each variant first checked against a
float64 reference on a small shape (flash-attn's 2x rule against SDPA with the mask).

    PYTHONPATH=. python experiments/gluon/window_levers.py --out $OUT/h200_window_levers.json

``--window 0`` times plain causal rows instead (``--full``: non-causal), against SDPA's cuDNN
backend, for levers of issue 23 (``pingpong``: the call's default schedule plus ``PINGPONG``).
FlexAttention's times for the same rows are in the features benchmark
(experiments/data/bench/h200_window_fwd_gluon.json); notes/gluon.md (session 11) says what
was predicted and what was measured.
"""

import argparse
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

VARIANTS = {  # name -> schedule overrides (None: the call's default; "+X": the default and X=True)
    "default": None,
    "nc2": dict(NUM_CONSUMERS=2, STAGES=3, SKIP_DEAD=True),
    "nc2_s2": dict(NUM_CONSUMERS=2, STAGES=2, SKIP_DEAD=True),
    "no_align": dict(SKIP_DEAD=True),
    "lpt": dict(SKIP_DEAD=True, ALIGN_END=True, LPT=True),
    "static": dict(SKIP_DEAD=True, ALIGN_END=True, DYNAMIC=False),
    "bn64": dict(BN=64, SKIP_DEAD=True, ALIGN_END=True),
    "bn64_s4": dict(BN=64, STAGES=4, SKIP_DEAD=True, ALIGN_END=True),
    "ostage": dict(SKIP_DEAD=True, ALIGN_END=True, O_STAGE=True),
    "bn64_nc2": dict(BN=64, NUM_CONSUMERS=2, STAGES=4, SKIP_DEAD=True),
    "pingpong": "+PINGPONG",  # session 11: FA3's turns to issue the GEMMs
}


def overrides(name, d, window, causal=True):
    """The schedule keywords of variant ``name`` for a call at head dim d."""
    v = VARIANTS[name]
    if isinstance(v, str):  # the call's own default plus one switch
        from course_kernels.gluon import launch as G

        return {**G.schedule_config(d, causal, 4096, window), v[1:]: True}
    return v or {}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="JSON file to write")
    p.add_argument("--d", type=int, nargs="+", default=[64, 128], help="head dims")
    p.add_argument("--n", type=int, nargs="+", default=[4096, 8192, 16384], help="seq lengths")
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    p.add_argument("--window", type=int, default=1024, help="keys a row sees; 0: plain causal")
    p.add_argument("--dtype", default="float16", choices=["float16", "bfloat16"])
    p.add_argument("--full", action="store_true", help="with --window 0: non-causal rows")
    p.add_argument("--budget", type=float, default=240.0, help="stop starting rows after (s)")
    args = p.parse_args(argv)

    import torch
    import torch.nn.functional as F
    import triton

    import course_kernels
    from course_kernels.bench import environment
    from course_kernels.gluon import launch as G

    t0 = time.time()
    left = args.window - 1 if args.window > 0 else None  # None: causal rows against cuDNN
    causal = not args.full
    if args.full and left is not None:
        p.error("--full needs --window 0")
    dt = getattr(torch, args.dtype)
    res = {"environment": environment(), "args": vars(args), "checks": [], "rows": []}
    res["environment"]["command"] = " ".join(["python"] + sys.argv)
    ok = {}
    for d in args.d:  # correctness first: one small shape per variant and head dim
        g = torch.Generator(device="cuda").manual_seed(d)
        q, k, v = (torch.randn(2, 3, 1500, d, device="cuda", dtype=dt, generator=g)
                   for _ in range(3))  # fmt: skip
        i = torch.arange(1500, device="cuda")
        mask = (i[None, :] <= i[:, None]) & (i[None, :] >= i[:, None] - (300 if left else 9999))
        mask = mask | args.full
        s = (q.double() @ k.double().transpose(-1, -2) / math.sqrt(d)).masked_fill(~mask, -math.inf)
        ref = torch.softmax(s, -1) @ v.double()
        sd_err = (
            (F.scaled_dot_product_attention(q, k, v, attn_mask=mask).double() - ref).abs().max()
        )
        for name in args.variants:
            try:
                w = 300 if left else None
                o, _ = G.gluon_attention_forward(
                    q, k, v, causal, None, w, **overrides(name, d, bool(w), causal)
                )
                err = (o.double() - ref).abs().max().item()
                ok[(d, name)] = err <= 2 * sd_err.item() + 1e-5
                res["checks"].append(
                    dict(d=d, variant=name, err=err, sdpa_err=sd_err.item(), ok=ok[(d, name)])
                )
            except Exception as e:  # a variant that does not compile is recorded, not fatal
                ok[(d, name)] = False
                res["checks"].append(
                    dict(d=d, variant=name, error=f"{type(e).__name__}: {e}"[:400])
                )
            print(res["checks"][-1], flush=True)
    for d in args.d:
        for n in args.n:
            if time.time() - t0 > args.budget:
                break
            h = 2048 // d
            q, k, v = (torch.randn(4, h, n, d, device="cuda", dtype=dt) for _ in range(3))
            seen = n * n if args.full else sum(min(i + 1, args.window or n) for i in range(n))
            flops = 4.0 * 4 * h * d * seen  # keys each row sees, summed over the rows
            row = dict(d=d, n=n, ms={}, tflops={})

            def tl_fwd(q=q, k=k, v=v):
                return course_kernels.flash_attention(q, k, v, causal=True, window_size=(left, 0))

            if left is None:  # the baseline of issue 23: SDPA's cuDNN backend
                from torch.nn.attention import SDPBackend, sdpa_kernel

                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):

                    def fn(q=q, k=k, v=v):
                        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

                    row["ms"]["cudnn"] = triton.testing.do_bench(fn, warmup=10, rep=40)
            else:
                os.environ["COURSE_KERNELS_FORWARD"] = "triton"
                row["ms"]["tl"] = triton.testing.do_bench(tl_fwd, warmup=10, rep=40)
                os.environ.pop("COURSE_KERNELS_FORWARD")
            for name in args.variants:
                if not ok[(d, name)]:
                    continue
                cfg = overrides(name, d, left is not None, causal)

                def fn(q=q, k=k, v=v, c=cfg):
                    return G.gluon_attention_forward(q, k, v, causal, None, left, **c)

                row["ms"][name] = triton.testing.do_bench(fn, warmup=10, rep=40)
            row["tflops"] = {key: flops / (ms * 1e-3) / 1e12 for key, ms in row["ms"].items()}
            res["rows"].append(row)
            print(json.dumps(row), flush=True)
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
    print("wrote", args.out)


if __name__ == "__main__":
    main()
