"""Why is the varlen (document-mask) path slow at d = 128? One diagnostic run on a GPU.

Issue 22's autotuned features benchmark (course_kernels/data/bench/h200_features_bench_autotune.json)
put ``flash_attention_varlen`` at 0.71x FlexAttention forward and 0.74x backward at d = 128 on
16,384 causal tokens in 6 documents, while the dense causal path is at or above Flex. This script
times, in one process (fp16, H * d = 2048, the benchmark's 6 documents):

- ``varlen``: the course varlen call, autotuned, forward and backward, and the configs it chose;
- ``varlen_cfg``: the varlen forward with each forward config forced (no autotuning);
- ``dense_docs``: the dense ``tl`` path (``COURSE_KERNELS_FORWARD=triton``) on each document as
  its own B = 1 call, summed (what the varlen kernel should cost, launches aside);
- ``flex``: FlexAttention with the document mask (the benchmark's baseline);
- per-kernel GPU times from ``torch.profiler`` (forward, dQ, dK/dV) and the compiled kernels'
  registers, spills and shared memory.

    python experiments/hopper/varlen_diag.py --out $OUT/varlen_diag.json
"""

from __future__ import annotations

import argparse
import collections
import datetime
import importlib.util
import itertools
import json
import platform
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def _features():
    spec = importlib.util.spec_from_file_location("gpu_features", ROOT / "scripts/gpu_features.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def bench(fn):
    import triton

    return triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median")


def kernel_times(fn, iters=5):
    """GPU microseconds per call of each kernel name, from torch.profiler."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    try:
        return _kernel_times(fn, iters, torch, ProfilerActivity, profile)
    except Exception as e:  # noqa: BLE001 - a diagnostic: record, do not stop
        return {"error": repr(e)[:300]}


def _kernel_times(fn, iters, torch, ProfilerActivity, profile):
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    out = collections.defaultdict(float)
    for ev in prof.events():
        if ev.device_type.name == "CUDA":
            out[ev.name[:60]] += ev.device_time / iters
    return dict(sorted(out.items(), key=lambda kv: -kv[1])[:8])


def compiled_meta(jit_fn):
    """(name, constants, regs, spills, shared) of every compiled kernel of an autotuned kernel."""
    fn = getattr(jit_fn, "fn", jit_fn)
    rows = []
    for cache in getattr(fn, "device_caches", {}).values():
        kernels = cache[0] if isinstance(cache, tuple) else cache
        for k in kernels.values():
            try:
                rows.append(
                    {
                        "name": k.name,
                        "constants": str(getattr(k.src, "constants", ""))[:400],
                        "num_warps": k.metadata.num_warps,
                        "num_stages": k.metadata.num_stages,
                        "regs": k.n_regs,
                        "spills": k.n_spills,
                        "shared": k.metadata.shared,
                    }
                )
            except Exception as e:  # noqa: BLE001 - a diagnostic: record, do not stop
                rows.append({"error": repr(e)})
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="varlen_diag.json", help="JSON file to write")
    p.add_argument("--d", type=int, nargs="+", default=[128, 64], help="head dims")
    args = p.parse_args(argv)

    import os

    import torch
    import triton

    from course_kernels import flash_attention, flash_attention_varlen
    from course_kernels.triton import launch
    from course_kernels.triton.configs import fwd_gpu_configs
    from course_kernels.triton.forward import _attn_fwd
    from course_kernels.triton.backward import _attn_bwd_dkdv, _attn_bwd_dq
    from course_kernels.triton.masks import Variant

    feat = _features()
    lengths = feat.doc_lengths()
    total = sum(lengths)
    cu = torch.tensor([0, *itertools.accumulate(lengths)], device="cuda", dtype=torch.int32)
    pairs = sum(n * (n + 1) // 2 for n in lengths)
    record = {
        "environment": {
            "gpu": torch.cuda.get_device_name(),
            "torch": torch.__version__,
            "triton": triton.__version__,
            "python": platform.python_version(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": " ".join([sys.executable, *sys.argv]),
        },
        "lengths": lengths,
        "rows": [],
    }

    def add(**row):
        record["rows"].append(row)
        print(json.dumps(row), flush=True)
        Path(args.out).write_text(json.dumps(record, indent=1))

    os.environ["COURSE_KERNELS_AUTOTUNE"] = "1"

    def run_d(d):
        H = 2048 // d
        fl = 4.0 * d * H * pairs
        g = torch.Generator(device="cuda").manual_seed(0)
        qp, kp, vp = (
            torch.randn(
                total, H, d, device="cuda", dtype=torch.float16, generator=g
            ).requires_grad_()
            for _ in range(3)
        )
        dop = torch.randn(total, H, d, device="cuda", dtype=torch.float16, generator=g)
        mx = max(lengths)

        def var_fwd():
            return flash_attention_varlen(qp, kp, vp, cu, cu, mx, mx, causal=True)

        with torch.no_grad():
            ms = bench(var_fwd)
        add(d=d, what="varlen", pass_="fwd", ms=ms, tflops=fl / ms / 1e9)
        out = var_fwd()
        ms = bench(lambda: out.backward(dop, retain_graph=True))
        add(d=d, what="varlen", pass_="bwd", ms=ms, tflops=2.5 * fl / ms / 1e9)
        names = {id(_attn_fwd): "fwd", id(_attn_bwd_dq): "dq", id(_attn_bwd_dkdv): "dkdv"}
        chosen = {
            names[key[0]] + str(key[1:]): str(val)
            for key, val in launch._TUNED.items()
            if key[0] in names
        }
        add(d=d, what="varlen_chosen", configs=chosen)
        add(
            d=d,
            what="varlen_kernels_fwd_bwd",
            us=kernel_times(lambda: var_fwd().backward(dop)),
        )

        # each forward config forced on the varlen forward
        variant = Variant(causal=True, bottom_right=True)
        key = (id(_attn_fwd), qp.device, qp.dtype, mx, mx, d, variant, False, True)
        for cfg in fwd_gpu_configs():
            launch._TUNED[key] = cfg.all_kwargs()
            try:
                with torch.no_grad():
                    ms = bench(var_fwd)
                add(d=d, what="varlen_cfg", cfg=str(cfg), ms=ms, tflops=fl / ms / 1e9)
            except Exception as e:  # noqa: BLE001
                add(d=d, what="varlen_cfg", cfg=str(cfg), error=repr(e)[:300])
        launch._TUNED.pop(key, None)

        # the dense tl path on each document alone (B = 1), summed
        os.environ["COURSE_KERNELS_FORWARD"] = "triton"
        tot_f = tot_b = 0.0
        for n in lengths:
            q, k, v = (
                torch.randn(
                    1, H, n, d, device="cuda", dtype=torch.float16, generator=g
                ).requires_grad_()
                for _ in range(3)
            )
            do = torch.randn(1, H, n, d, device="cuda", dtype=torch.float16, generator=g)
            with torch.no_grad():
                tot_f += bench(lambda q=q, k=k, v=v: flash_attention(q, k, v, causal=True))
            o = flash_attention(q, k, v, causal=True)
            tot_b += bench(lambda o=o, do=do: o.backward(do, retain_graph=True))
        add(d=d, what="dense_docs_tl", pass_="fwd", ms=tot_f, tflops=fl / tot_f / 1e9)
        add(d=d, what="dense_docs_tl", pass_="bwd", ms=tot_b, tflops=2.5 * fl / tot_b / 1e9)
        q, k, v = (
            torch.randn(
                1, H, total, d, device="cuda", dtype=torch.float16, generator=g
            ).requires_grad_()
            for _ in range(3)
        )
        fl_full = 4.0 * d * H * total * (total + 1) / 2
        with torch.no_grad():
            ms = bench(lambda: flash_attention(q, k, v, causal=True))
        add(d=d, what="dense_16k_tl", pass_="fwd", ms=ms, tflops=fl_full / ms / 1e9)
        os.environ.pop("COURSE_KERNELS_FORWARD")

        # FlexAttention, the benchmark's baseline (B = 1, H, 16K, d with a document mask)
        row = {"mask": "document", "provider": "flex", "n": total, "d": d, "pass": "fwd"}
        fa = argparse.Namespace(window=1024)
        feat.DEVICE[0] = "cuda"
        fn = feat.make_fn(row, fa, q, k, v)
        with torch.no_grad():
            ms = bench(fn)
        add(d=d, what="flex", pass_="fwd", ms=ms, tflops=fl / ms / 1e9)
        o = fn()
        do = torch.randn_like(o)
        ms = bench(lambda: o.backward(do, retain_graph=True))
        add(d=d, what="flex", pass_="bwd", ms=ms, tflops=2.5 * fl / ms / 1e9)
        add(d=d, what="flex_kernels_fwd_bwd", us=kernel_times(lambda: fn().backward(do)))

    for d in args.d:
        run_d(d)
    for name, kern in (("fwd", _attn_fwd), ("dq", _attn_bwd_dq), ("dkdv", _attn_bwd_dkdv)):
        add(what="compiled", kernel=name, meta=compiled_meta(kern))


if __name__ == "__main__":
    main()
