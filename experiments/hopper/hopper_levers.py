"""Hopper measurements for notes/kernel.md and the book's "What each Hopper lever did" chapter.

    python experiments/hopper/hopper_levers.py overhead --out DIR   # host time per call, N = 1K profile
    python experiments/hopper/hopper_levers.py meta --out DIR       # registers / shared memory per config
    python experiments/hopper/hopper_levers.py levers --out DIR     # TMA, warp specialization, FMA A/B
    python experiments/hopper/hopper_levers.py check                # the lever kernel vs SDPA (CPU or GPU)
    python experiments/hopper/hopper_levers.py bench --out DIR      # `python -m course_kernels bench` with
                                                         # the tutorial (fewer configs to tune)
    python experiments/hopper/hopper_levers.py n1k --out DIR        # N = 1024 again, --repeats times

Each writes one JSON (``host_overhead.json``, ``config_meta.json``, ``levers.json``) holding
the environment (GPU, versions, date, command) next to its rows. ``levers`` times an
*experimental* forward kernel (not the package's): the package's forward loop with switches
for tensor-descriptor (TMA) loads of K and V, Triton's automatic warp specialization of the key
loop, and the tutorial's FMA form of the softmax rescaling, so that each lever is measured
against the same kernel with the switch off, in the same process.

Modules (next to this script; their names are importable from here): ``hopper_lever_kernel``
(the experimental forward), ``hopper_config_meta`` (registers / shared memory per config),
``hopper_host_overhead`` (host time per call), ``hopper_bench`` (the benchmark with the
tutorial, the N = 1024 repeats), ``hopper_env`` (the environment record). This script holds the
lever A/B, the backward's d = 128 config A/B and the command line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from functools import partial

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the modules below, by name
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from course_kernels.triton import _env as _triton_env  # noqa: E402  (TRITON_INTERPRET before @jit)

import torch  # noqa: E402

# re-exported: tests/test_hopper_levers.py reads them as hopper_levers.<name>
from hopper_bench import (  # noqa: E402
    TUTORIAL_CONFIGS as TUTORIAL_CONFIGS,
    _tuned_configs as _tuned_configs,
    cmd_bench,
    cmd_n1k,
    trim_tutorial as trim_tutorial,
)
from hopper_config_meta import (  # noqa: E402
    _meta,
    _meta_worker as _meta_worker,
    cmd_meta,
    kernel_configs as kernel_configs,
)
from hopper_env import _env  # noqa: E402
from hopper_host_overhead import (  # noqa: E402
    _host_us as _host_us,
    _nograd as _nograd,
    cmd_overhead,
    cmd_overhead_bwd,
)
from hopper_lever_kernel import (  # noqa: E402
    LEVER_CONFIGS,
    LOG2E as LOG2E,
    VARIANTS,
    TensorDescriptor,
    _lever_fwd as _lever_fwd,
    _lever_inner as _lever_inner,
    _lever_step as _lever_step,
    lever_attention,
)


def cmd_check(args):
    """The experimental kernel against SDPA at small sizes (interpreter on CPU, or the GPU)."""
    dev = _triton_env.device_kind()
    dtype = torch.float16 if dev == "cuda" else torch.float32
    torch.manual_seed(0)
    bad = 0
    for causal in (False, True):
        q, k, v = (torch.randn(1, 2, 128, 32, device=dev, dtype=dtype) for _ in range(3))
        ref = torch.nn.functional.scaled_dot_product_attention(
            q.float(), k.float(), v.float(), is_causal=causal
        )
        for name, (tma, ws, fma) in VARIANTS.items():
            if (tma and TensorDescriptor is None) or (ws and dev == "cpu"):
                continue
            o, _ = lever_attention(
                q, k, v, causal, 64, 32, 4, 1 if dev == "cpu" else 3, tma, ws, fma
            )
            err = float((o.float() - ref).abs().max())
            ok = err < (2e-3 if dtype == torch.float16 else 1e-5)
            bad += not ok
            print(f"causal={causal} {name}: max abs error {err:.2e} {'ok' if ok else 'FAIL'}")
    return 1 if bad else 0


def cmd_levers(args):
    from triton.testing import do_bench

    from course_kernels.bench import attention_flops
    from course_kernels.triton.flash import flash_attention

    env, rows = _env(), []
    n, batch, hidden = args.n, 4, 2048
    path = os.path.join(args.out, args.levers_file)
    variants = {k: VARIANTS[k] for k in args.variants.split(",")}
    configs = (
        LEVER_CONFIGS
        if not args.configs
        else tuple(tuple(int(x) for x in c.split("/")) for c in args.configs.split(","))
    )
    for dt, rep in ((dt, rep) for rep in range(args.repeats) for dt in args.dtypes.split(",")):
        dtype = getattr(torch, dt)
        for d in (int(x) for x in args.ds.split(",")):
            for causal in (False, True):
                heads = hidden // d
                torch.manual_seed(d)
                q, k, v = (
                    torch.randn(batch, heads, n, d, device="cuda", dtype=dtype) for _ in range(3)
                )
                ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
                flops = attention_flops(batch, heads, n, d, causal, "fwd")
                base = {
                    "dtype": dt,
                    "d": d,
                    "N": n,
                    "causal": causal,
                    "batch": batch,
                    "heads": heads,
                    "repeat": rep,
                }
                ms = do_bench(
                    lambda q=q, k=k, v=v, causal=causal: flash_attention(q, k, v, causal=causal),
                    warmup=10,
                    rep=40,
                    return_mode="median",
                )
                rows.append(
                    {
                        **base,
                        "variant": "package (autotuned)",
                        "ms": ms,
                        "tflops": flops / ms * 1e-9,
                    }
                )
                for name, (tma, ws, fma) in variants.items():
                    for cfg in configs:
                        row = {
                            **base,
                            "variant": name,
                            "block_m": cfg[0],
                            "block_n": cfg[1],
                            "num_warps": cfg[2],
                            "num_stages": cfg[3],
                        }
                        try:
                            o, kern = lever_attention(q, k, v, causal, *cfg, tma, ws, fma)
                            row["max_abs_error_vs_sdpa"] = float(
                                (o.float() - ref.float()).abs().max()
                            )
                            row.update(_meta(kern))
                            ms = do_bench(
                                partial(lever_attention, q, k, v, causal, *cfg, tma, ws, fma),
                                warmup=10,
                                rep=40,
                                return_mode="median",
                            )
                            row.update(ms=ms, tflops=flops / ms * 1e-9)
                        except Exception as exc:  # a variant that does not compile: recorded
                            row["error"] = repr(exc)[:300]
                        rows.append(row)
                        print(
                            json.dumps(
                                {
                                    k: row.get(k)
                                    for k in (
                                        "dtype",
                                        "d",
                                        "causal",
                                        "variant",
                                        "block_m",
                                        "block_n",
                                        "num_warps",
                                        "tflops",
                                        "n_regs",
                                        "shared",
                                        "error",
                                    )
                                }
                            ),
                            flush=True,
                        )
                        with open(path, "w") as f:
                            json.dump({"environment": env, "results": rows}, f, indent=1)
                q = k = v = ref = None
    return 0


def cmd_bwd_ab(args):
    """Backward: the autotuner's config lists vs the lists with extra configs (same process, A
    then B at each shape); records the chosen configs. ``--extra d128``: the head-dim-128 tiles
    that do not spill (at d = 128); ``--extra deep``: 4-warp tiles with 4-5 pipeline stages, the
    Triton tutorial's depth (``--ds`` picks the head dims)."""
    from triton.testing import do_bench

    from course_kernels.triton import flash
    from course_kernels.triton import backward as triton_backward
    from course_kernels.triton import configs as triton_backward_configs
    from course_kernels.bench import attention_flops
    from course_kernels.triton.flash import flash_attention

    env, rows = _env(), []
    kernels = {"dkdv": triton_backward._attn_bwd_dkdv, "dq": triton_backward._attn_bwd_dq}
    extra = {
        "d128": {"dkdv": triton_backward.DKDV_D128_CONFIGS, "dq": triton_backward.DQ_D128_CONFIGS},
        "deep": {
            "dkdv": triton_backward_configs.DKDV_DEEP_CONFIGS,
            "dq": triton_backward_configs.DQ_DEEP_CONFIGS,
        },
    }[args.extra]
    old = {name: list(k.configs) for name, k in kernels.items()}
    full = {name: old[name] + list(extra[name]) for name in kernels}
    names = {id(k): name for name, k in kernels.items()}
    batch = 4
    ds = [128] if args.extra == "d128" else [int(x) for x in args.ds.split(",")]
    shapes = [(d, n, c) for d in ds for n in (int(x) for x in args.ns.split(",")) for c in (0, 1)]
    for d, n, causal in shapes:
        causal, heads = bool(causal), 2048 // d
        torch.manual_seed(n)
        q, k, v, do = (
            torch.randn(batch, heads, n, d, device="cuda", dtype=torch.float16) for _ in range(4)
        )
        for x in (q, k, v):
            x.requires_grad_()
        out = flash_attention(q, k, v, causal=causal)
        label = "with d=128 configs" if args.extra == "d128" else f"with {args.extra} configs"
        for variant, lists in (("old configs", old), (label, full)):
            for name, kern in kernels.items():
                kern.configs = lists[name]
                kern.cache.clear()
            flash._TUNED.clear()
            torch.autograd.grad(out, (q, k, v), do, retain_graph=True)  # tunes
            chosen = {names[key[0]]: cfg for key, cfg in flash._TUNED.items() if key[0] in names}
            ms = do_bench(
                lambda out=out, q=q, k=k, v=v, do=do: torch.autograd.grad(
                    out,
                    (q, k, v),
                    do,
                    retain_graph=True,
                ),
                warmup=10,
                rep=50,
                return_mode="median",
            )
            row = {
                "d": d,
                "N": n,
                "causal": causal,
                "dtype": "float16",
                "batch": batch,
                "heads": heads,
                "variant": variant,
                "ms": ms,
                "tflops": attention_flops(batch, heads, n, d, causal, "bwd") / ms * 1e-9,
                "chosen": {k_: {kk: vv for kk, vv in v_.items()} for k_, v_ in chosen.items()},
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
            with open(os.path.join(args.out, f"bwd_{args.extra}_ab.json"), "w") as f:
                json.dump({"environment": env, "results": rows}, f, indent=1)
        q = k = v = do = out = None
    for name, kern in kernels.items():
        kern.configs = old[name]
        kern.cache.clear()
    flash._TUNED.clear()
    return 0


def main():
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "cmd",
        choices=["overhead", "overhead-bwd", "meta", "levers", "check", "bench", "n1k", "bwd-ab"],
    )
    ap.add_argument("--out", default=".")
    ap.add_argument("--n", type=int, default=8192)
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--dtypes", default="float16")
    ap.add_argument("--ns", default="1024,2048,4096,8192,16384")
    ap.add_argument("--providers", default="flash,sdpa-flash,sdpa-cudnn,tutorial")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--no-check", action="store_true")
    ap.add_argument("--ds", default="128,64")
    ap.add_argument("--modes", default="fwd,bwd")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--configs", default="", help="levers: BM/BN/warps/stages,... ")
    ap.add_argument("--levers-file", default="levers.json")
    ap.add_argument(
        "--extra", choices=["d128", "deep"], default="d128", help="bwd-ab: configs to add"
    )
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    return {
        "overhead": cmd_overhead,
        "meta": cmd_meta,
        "levers": cmd_levers,
        "check": cmd_check,
        "bench": cmd_bench,
        "n1k": cmd_n1k,
        "overhead-bwd": cmd_overhead_bwd,
        "bwd-ab": cmd_bwd_ab,
    }[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
