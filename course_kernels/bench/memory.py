"""Extra memory of attention vs N (``python -m course_kernels memory``).

Split from :mod:`course_kernels.bench` (which re-exports these names).
"""

from __future__ import annotations

import json
import os
from functools import partial

from .speed import _peak_extra_mib, environment
from .providers import provider_fn


def _fwd_bwd(fn, q, k, v, do):
    """One forward and backward on fresh leaf copies of q, k, v (their copies count as input)."""
    import torch

    q, k, v = (x.detach().requires_grad_() for x in (q, k, v))
    return torch.autograd.grad(fn(q, k, v, False), (q, k, v), do)


def run_memory(out_dir, ns=(4096, 8192, 16384, 32768, 65536), batch=1, heads=8, d=64, log=print):
    """Extra memory of one forward (and forward + backward) vs N: naive vs this kernel."""
    import torch

    os.makedirs(out_dir, exist_ok=True)
    env = environment()
    rows = []
    for n in ns:
        q, k, v, do = (
            torch.randn(batch, heads, n, d, device="cuda", dtype=torch.float16) for _ in range(4)
        )
        for p in ("naive", "sdpa-flash", "flash"):
            fn = provider_fn(p)
            row = {
                "provider": p,
                "N": n,
                "batch": batch,
                "heads": heads,
                "d": d,
                "dtype": "float16",
            }
            try:
                fn(q, k, v, False)  # compile / autotune outside the measurement
                row["fwd_extra_mib"] = _peak_extra_mib(partial(fn, q, k, v, False))
                _fwd_bwd(fn, q, k, v, do)
                row["fwd_bwd_extra_mib"] = _peak_extra_mib(partial(_fwd_bwd, fn, q, k, v, do))
            except torch.OutOfMemoryError:
                row["error"] = "out of memory"
            torch.cuda.empty_cache()
            log(json.dumps(row))
            rows.append(row)
        q = k = v = do = None
    with open(os.path.join(out_dir, "memory.json"), "w") as f:
        json.dump({"environment": env, "results": rows}, f, indent=1)
    return rows
