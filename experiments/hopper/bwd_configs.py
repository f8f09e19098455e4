"""The backward kernels' configs, forced one at a time, on the masks issue 22 measures (GPU).

`varlen_diag.py` found the dK/dV kernel at 1.54 ms of a 2.25 ms backward at d = 128 on 6 causal
documents (0.77x FlexAttention's backward). This script asks whether another tile does better:
for each case it runs the autotuned backward once, then replaces the tuned config of one kernel
(dK/dV, then dQ) with each candidate and reads every kernel's GPU time from ``torch.profiler``.
Cases: 6 causal documents in 16K tokens (varlen), dense causal and a 1K causal window at N = 8K
(B = 4); d = 128 (and d = 64 for the documents); fp16, H x d = 2048.

    python experiments/hopper/bwd_configs.py --out $OUT/bwd_configs.json
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import platform
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

# (BLOCK_M1 query rows per step, BLOCK_N1 keys per program, warps, stages)
DKDV = [
    (64, 128, 8, 3),
    (64, 128, 8, 2),
    (32, 128, 8, 3),
    (64, 64, 4, 3),
    (64, 64, 8, 3),
    (32, 64, 4, 3),
    (64, 64, 4, 4),
    (128, 64, 8, 3),
    (32, 128, 4, 3),
]
# (BLOCK_N2 keys per step, BLOCK_M2 query rows per program, warps, stages)
DQ = [
    (64, 128, 8, 3),
    (32, 128, 4, 3),
    (64, 64, 4, 3),
    (32, 64, 4, 3),
    (64, 128, 8, 2),
    (128, 128, 8, 2),
    (64, 64, 4, 4),
]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="bwd_configs.json", help="JSON file to write")
    p.add_argument("--cases", nargs="+", default=["doc128", "causal128", "window128", "doc64"])
    args = p.parse_args(argv)
    os.environ["COURSE_KERNELS_AUTOTUNE"] = "1"

    import torch
    import triton

    from course_kernels import flash_attention, flash_attention_varlen
    from course_kernels.triton import launch
    from course_kernels.triton.backward import _attn_bwd_dkdv, _attn_bwd_dq
    from varlen_diag import _features, compiled_meta, kernel_times

    lengths = _features().doc_lengths()
    cu = torch.tensor([0, *itertools.accumulate(lengths)], device="cuda", dtype=torch.int32)
    record = {
        "environment": {
            "gpu": torch.cuda.get_device_name(),
            "torch": torch.__version__,
            "triton": triton.__version__,
            "python": platform.python_version(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": " ".join([sys.executable, *sys.argv]),
        },
        "rows": [],
    }

    def add(**row):
        record["rows"].append(row)
        print(json.dumps(row), flush=True)
        Path(args.out).write_text(json.dumps(record, indent=1))

    def case_fn(case):
        d = int(case[-3:] if case.endswith("128") else case[-2:])
        H = 2048 // d
        g = torch.Generator(device="cuda").manual_seed(0)
        shape = (sum(lengths), H, d) if case.startswith("doc") else (4, H, 8192, d)
        q, k, v = (
            torch.randn(shape, device="cuda", dtype=torch.float16, generator=g).requires_grad_()
            for _ in range(3)
        )
        do = torch.randn(shape, device="cuda", dtype=torch.float16, generator=g)
        if case.startswith("doc"):
            m = max(lengths)
            out = flash_attention_varlen(q, k, v, cu, cu, m, m, causal=True)
        elif case.startswith("window"):
            out = flash_attention(q, k, v, causal=True, window_size=(1023, 0))
        else:
            out = flash_attention(q, k, v, causal=True)
        return lambda: out.backward(do, retain_graph=True)

    # lever 15 (notes/kernel.md): the varlen forward call, now without a sync per call
    from varlen_diag import bench

    for d in (128, 64):
        q, k, v = (torch.randn(sum(lengths), 2048 // d, d, device="cuda").half() for _ in range(3))
        m = max(lengths)
        with torch.no_grad():
            ms = bench(
                lambda q=q, k=k, v=v, m=m: flash_attention_varlen(
                    q, k, v, cu, cu, m, m, causal=True
                )
            )
        add(case=f"doc{d}", what="varlen_fwd_call", ms=ms)

    for case in args.cases:
        bwd = case_fn(case)
        bwd()  # tunes both kernels
        torch.cuda.synchronize()
        tuned = {
            key: val
            for key, val in launch._TUNED.items()
            if key[0] in (id(_attn_bwd_dkdv), id(_attn_bwd_dq))
        }
        add(case=case, what="tuned", us=kernel_times(bwd), configs=[str(v) for v in tuned.values()])
        for kern, names, cands in (
            (_attn_bwd_dkdv, ("BLOCK_M1", "BLOCK_N1"), DKDV),
            (_attn_bwd_dq, ("BLOCK_N2", "BLOCK_M2"), DQ),
        ):
            keys = [key for key in tuned if key[0] == id(kern)]
            for a, b, w, s in cands:
                cfg = {names[0]: a, names[1]: b, "num_warps": w, "num_ctas": 1, "num_stages": s}
                for key in keys:
                    launch._TUNED[key] = cfg
                try:
                    us = kernel_times(bwd)
                except Exception as e:  # noqa: BLE001 - out of resources etc.: record it
                    us = {"error": repr(e)[:300]}
                add(case=case, what=kern.fn.__name__, cfg=[a, b, w, s], us=us)
            for key in keys:
                launch._TUNED[key] = tuned[key]
    for name, kern in (("dq", _attn_bwd_dq), ("dkdv", _attn_bwd_dkdv)):
        add(what="compiled", kernel=name, meta=compiled_meta(kern))


if __name__ == "__main__":
    main()
