"""The benchmark with Triton's fused-attention tutorial as a provider, and the N = 1024 repeats
(experiments/hopper/hopper_levers.py ``bench`` and ``n1k``; re-exported there): ``python -m course_kernels
bench`` with the tutorial's autotuning trimmed, and the configs the autotuner chose recorded.
"""

from __future__ import annotations

import json
import os
import sys

from hopper_env import _env


# The tutorial autotunes its forward over ~28 configs per (N, head dim); the benchmark keeps its
# Hopper-sized ones (BLOCK_M, BLOCK_N, num_stages, num_warps) to bound tuning time, as the
# anchor measurement did ("autotuned over a reduced config set").
TUTORIAL_CONFIGS = (
    (128, 64, 3, 4),
    (128, 128, 3, 8),
    (64, 64, 3, 4),
    (128, 64, 4, 4),
    (128, 128, 2, 8),
)


def trim_tutorial(module):
    """Keep TUTORIAL_CONFIGS in the tutorial's forward autotuners; drop BLOCK_N > HEAD_DIM."""
    kept = {}
    for name in ("_attn_fwd_tma", "_attn_fwd"):
        kern = getattr(module, name, None)
        if kern is None or not hasattr(kern, "configs"):
            continue
        cs = [
            c
            for c in kern.configs
            if (c.kwargs.get("BLOCK_M"), c.kwargs.get("BLOCK_N"), c.num_stages, c.num_warps)
            in TUTORIAL_CONFIGS
        ]
        if cs:
            kern.configs = cs
        previous = getattr(kern, "early_config_prune", None)

        def prune(configs, named_args, _previous=previous, **kwargs):
            if _previous is not None:
                configs = _previous(configs, named_args, **kwargs)
            hd = kwargs.get("HEAD_DIM", named_args.get("HEAD_DIM"))
            ok = [c for c in configs if hd is None or c.kwargs.get("BLOCK_N", 0) <= hd]
            return ok or configs

        kern.early_config_prune = prune
        kept[name] = len(kern.configs)
    return kept


def cmd_bench(args):
    from course_kernels import bench

    providers = args.providers.split(",")
    note = {"command": "python3 " + " ".join(sys.argv)}
    if "tutorial" in providers:
        mod = bench.load_tutorial()
        note["tutorial_configs_kept"] = trim_tutorial(mod)
    rows = bench.run_bench(
        args.out,
        dtypes=tuple(args.dtypes.split(",")),
        ds=tuple(int(x) for x in args.ds.split(",")),
        ns=tuple(int(x) for x in args.ns.split(",")),
        modes=tuple(args.modes.split(",")),
        providers=tuple(providers),
        check=not args.no_check,
    )
    for r in rows:  # this tutorial version's backward always applies the causal mask
        if r["provider"] == "tutorial" and r.get("mode") == "bwd" and not r["causal"]:
            r.update(
                mode="error",
                error="not comparable: this tutorial version's backward "
                "is causal-only (it masks as if causal=True)",
                bwd_ms_causal_only=r["ms"],
            )
    with open(os.path.join(args.out, "bench.json")) as f:
        env = json.load(f)["environment"]
    note["tuned_configs"] = _tuned_configs()
    bench._write_bench(args.out, {**env, **note}, rows)
    print(bench.format_ratio_table(rows))
    return 0


def _tuned_configs():
    """The config autotuning chose per kernel and shape key (flash._TUNED), JSON-friendly."""
    from course_kernels.triton import flash
    from course_kernels.triton import backward as triton_backward
    from course_kernels.triton import forward as triton_forward

    names = {
        id(triton_forward._attn_fwd): "_attn_fwd",
        id(triton_backward._attn_bwd_dkdv): "_attn_bwd_dkdv",
        id(triton_backward._attn_bwd_dq): "_attn_bwd_dq",
    }
    return [
        {
            "kernel": names.get(key[0], "?"),
            "key": [str(x) for x in key[2:]],
            "config": {
                k: (v if isinstance(v, (int, float, str, bool)) or v is None else str(v))
                for k, v in cfg.items()
            },
        }
        for key, cfg in flash._TUNED.items()
    ]


def cmd_n1k(args):
    """N = 1024 only, ``--repeats`` separate runs of run_bench (flash, sdpa-flash, sdpa-cudnn)."""
    from course_kernels import bench

    runs, tuned = [], []
    for i in range(args.repeats):
        sub = os.path.join(args.out, f"n1k_run{i}")
        rows = bench.run_bench(
            sub,
            dtypes=tuple(args.dtypes.split(",")),
            ns=(1024,),
            providers=("flash", "sdpa-flash", "sdpa-cudnn"),
            check=False,
        )
        runs.append(rows)
        tuned.append(_tuned_configs())
    with open(os.path.join(args.out, "n1024_repeats.json"), "w") as f:
        json.dump({"environment": _env(), "runs": runs, "tuned_configs": tuned}, f, indent=1)
    return 0
