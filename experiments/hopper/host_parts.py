"""Where the backward's host time goes at N = 1K (issue 22, "N = 1K robust"; notes/kernel.md
session 15): the parts of one ``autograd.grad`` call through ``flash_attention``, each timed
alone on the GPU's own host.

    python experiments/hopper/host_parts.py --out DIR     # on a GPU, < 60 s

B = 4, H * d = 2048, N = 1024, fp16, causal, d = 64 and 128. Per part, host microseconds per
call (100 calls back to back, median of 5 repeats; the GPU queue never full, so the Python and
driver path alone): ``full`` (``autograd.grad`` on a retained graph, as the benchmark times
it), ``sdpa-flash`` (the same for PyTorch's FlashAttention-2), ``engine`` (``autograd.grad``
through an ``autograd.Function`` whose backward launches nothing: the engine and its device
thread; ``engine_like_ours``: with five saved tensors and three gradients), ``backward_c`` (``launch._backward_c`` called directly: Python, allocations, two
launches), ``python`` (the same with both launches stubbed out), ``launch_dq`` and
``launch_dkdv`` (one launch plan each, outputs allocated once), ``empty4`` (the four
``empty_like`` calls). Writes ``host_parts.json`` (environment, rows).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _host_us(call) -> float:
    """Host microseconds per call: host_path.py's measure (100 calls, median of 5 repeats)."""
    from host_path import _times  # this folder's script (sys.path[0] when run as a script)

    return _times(call)[0]


class _Nothing:
    """autograd.Functions whose backward launches nothing: the engine's cost alone (``make``),
    and with our node's bookkeeping (``make_like_ours``: five tensors saved and unpacked, three
    gradients returned, as ``_FlashAttention`` does)."""

    @staticmethod
    def make():
        import torch

        class Nothing(torch.autograd.Function):
            @staticmethod
            def forward(ctx, q, k, v):
                return q.view_as(q)

            @staticmethod
            def backward(ctx, do):
                return do, None, None

        return Nothing

    @staticmethod
    def make_like_ours():
        import torch

        class LikeOurs(torch.autograd.Function):
            @staticmethod
            def forward(ctx, q, k, v, o, lse):
                ctx.save_for_backward(q, k, v, o, lse)
                return o.view_as(o)

            @staticmethod
            def backward(ctx, do):
                q, k, v, o, lse = ctx.saved_tensors
                return do, do, do, None, None

        return LikeOurs


def parts(d: int) -> dict:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from course_kernels.triton import configs, launch
    from course_kernels.triton.flash import flash_attention
    from course_kernels.triton.masks import CAUSAL

    h = 2048 // d
    q, k, v, do = (torch.randn(4, h, 1024, d, device="cuda", dtype=torch.float16) for _ in range(4))
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    out = flash_attention(q, k, v, causal=True)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    nothing = _Nothing.make().apply(q, k, v)
    like_ours = _Nothing.make_like_ours().apply(q, k, v, out.detach(), out.detach()[..., 0].float())
    scale = d**-0.5
    o, lse_c = launch._forward_c(q.detach(), k.detach(), v.detach(), CAUSAL, scale)
    qd, kd, vd = q.detach(), k.detach(), v.detach()
    launch._backward_c(do, qd, kd, vd, o, lse_c, CAUSAL, scale)
    plan = next(p for key, p in launch._PLANS.items() if key[0] == "bwd" and key[1] == q.shape)
    _, dq_plan, dkdv_plan = plan
    delta, dq, dk, dv = (torch.empty_like(x) for x in (lse_c, q, k, v))
    dq_args = (qd, kd, vd, do, o, lse_c, delta, dq, lse_c, lse_c, lse_c)
    dkdv_args = (qd, kd, vd, do, lse_c, delta, dk, dv, dq, lse_c, lse_c, lse_c)
    calls = {
        "full": lambda: torch.autograd.grad(out, (q, k, v), do, retain_graph=True),
        "sdpa-flash": lambda: torch.autograd.grad(ref, (q, k, v), do, retain_graph=True),
        "engine": lambda: torch.autograd.grad(nothing, (q,), do, retain_graph=True),
        "engine_like_ours": lambda: torch.autograd.grad(
            like_ours, (q, k, v), do, retain_graph=True
        ),
        "backward_c": lambda: launch._backward_c(do, qd, kd, vd, o, lse_c, CAUSAL, scale),
        "launch_dq": lambda: dq_plan.launch(dq_args),
        "launch_dkdv": lambda: dkdv_plan.launch(dkdv_args),
        "empty4": lambda: [torch.empty_like(x) for x in (lse_c, q, k, v)],
    }
    row = {}
    for name, call in calls.items():
        for _ in range(3):
            call()
        row[name] = _host_us(call)
    real = configs.KernelPlan.launch
    configs.KernelPlan.launch = lambda self, tensors: None
    try:
        row["python"] = _host_us(
            lambda: launch._backward_c(do, qd, kd, vd, o, lse_c, CAUSAL, scale)
        )
    finally:
        configs.KernelPlan.launch = real
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="/tmp/host_parts", help="folder for host_parts.json")
    args = ap.parse_args(argv)
    sys.path.insert(0, ROOT)
    os.environ.setdefault("COURSE_KERNELS_AUTOTUNE", "0")
    import torch

    if not torch.cuda.is_available():
        print("needs a CUDA GPU")
        return 2
    from course_kernels.bench import environment

    env = environment()
    env["command"] = "python " + " ".join(sys.argv)
    rows = []
    for d in (64, 128):
        row = {"d": d, "causal": True, "N": 1024, "B": 4, "H": 2048 // d, **parts(d)}
        rows.append(row)
        print(
            " ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items())
        )
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "host_parts.json")
    with open(path, "w") as f:
        json.dump({"environment": env, "rows": rows}, f, indent=1)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
