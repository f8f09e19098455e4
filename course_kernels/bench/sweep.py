"""The forward config sweep (``python -m course_kernels sweep``); configs are data.

Split from :mod:`course_kernels.bench` (which re-exports these names).
"""

from __future__ import annotations

import json
import os
import sys
from functools import partial

from .._compat import renamed_kwargs
from .speed import attention_flops, environment


# (BLOCK_M, BLOCK_N, num_warps, num_stages) swept by ``python -m course_kernels sweep``.
SWEEP_CONFIGS = (
    (64, 32, 4, 2),
    (64, 64, 4, 3),
    (64, 128, 4, 3),
    (128, 32, 4, 3),
    (128, 64, 4, 2),
    (128, 64, 4, 3),
    (128, 64, 8, 3),
    (128, 64, 8, 4),
    (128, 128, 8, 2),
    (128, 128, 8, 3),
)


@renamed_kwargs(block_m="block_q", block_n="block_k")
def forced_forward_config(block_q, block_k, num_warps, num_stages):
    """Context manager: run the forward kernel with exactly one config (no autotuning).

    Clears both Triton's autotuning cache and ``flash``'s per-shape cache of tuned configs, so
    the forced config is really the one launched; restores everything on exit.
    """
    import contextlib

    import triton

    from ..triton import flash
    from ..triton import forward as triton_forward

    @contextlib.contextmanager
    def forced():
        kernel = triton_forward._attn_fwd
        saved = kernel.configs
        kernel.configs = [
            triton.Config(
                {"BLOCK_M": block_q, "BLOCK_N": block_k}, num_warps=num_warps, num_stages=num_stages
            )
        ]
        kernel.cache.clear()
        flash._TUNED.clear()
        try:
            yield
        finally:
            kernel.configs = saved
            kernel.cache.clear()
            flash._TUNED.clear()

    return forced()


def run_sweep(
    out_dir,
    n=4096,
    ds=(64, 128),
    causals=(False, True),
    batch=4,
    hidden=2048,
    dtype="float16",
    configs=SWEEP_CONFIGS,
    log=print,
):
    """Forward TFLOP/s of each (BLOCK_M, BLOCK_N, warps, stages) config; writes sweep.json."""
    import torch
    import torch.nn.functional as F
    import triton
    from tqdm import tqdm

    from ..triton.flash import flash_attention

    os.makedirs(out_dir, exist_ok=True)
    env = environment()
    env["autotune"] = False  # every config is forced alone (forced_forward_config): no autotuning
    rows = []
    cases = [(d, c, cfg) for d in ds for c in causals for cfg in configs]
    for d, causal, cfg in tqdm(cases, desc="sweep", file=sys.stdout, mininterval=5):
        heads = hidden // d
        torch.manual_seed(d)
        q, k, v = (
            torch.randn(batch, heads, n, d, device="cuda", dtype=getattr(torch, dtype))
            for _ in range(3)
        )
        row = {
            "d": d,
            "causal": causal,
            "N": n,
            "batch": batch,
            "heads": heads,
            "dtype": dtype,
            "block_m": cfg[0],  # the record keeps Triton's names (BLOCK_M, BLOCK_N) lowercased
            "block_n": cfg[1],
            "num_warps": cfg[2],
            "num_stages": cfg[3],
        }
        try:
            with forced_forward_config(*cfg):
                out = flash_attention(q, k, v, causal=causal)
                ref = F.scaled_dot_product_attention(
                    q.float(), k.float(), v.float(), is_causal=causal
                )
                row["max_abs_error"] = float((out.float() - ref).abs().max())
                ms = triton.testing.do_bench(
                    partial(flash_attention, q, k, v, causal=causal),
                    warmup=10,
                    rep=40,
                    return_mode="median",
                )
            row["ms"] = ms
            row["tflops"] = attention_flops(batch, heads, n, d, causal, "fwd") / ms * 1e-9
        except Exception as exc:  # e.g. out of shared memory: recorded, not fatal
            row["error"] = repr(exc)[:300]
            log(f"config {cfg} d={d} causal={causal}: {exc!r}"[:300])
        rows.append(row)
        with open(os.path.join(out_dir, "sweep.json"), "w") as f:
            json.dump({"environment": env, "results": rows}, f, indent=1)
    return rows
