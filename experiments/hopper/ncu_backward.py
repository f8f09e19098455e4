"""One backward each of the course's `tl` kernels, FlexAttention's, cuDNN's and the Gluon one, for
ncu (issue 22: why the `tl` backward trails Flex at d = 128; issue 23: where the Gluon backward
loses to cuDNN). Warm-up calls (autotuning, torch.compile) run before ``cudaProfilerStart``, so
with ``--profile-from-start off`` ncu sees one timed backward of each provider only:

    ncu --clock-control none --profile-from-start off --section SpeedOfLight \\
        --section WarpStateStats --section LaunchStats --section Occupancy \\
        --metrics sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active \\
        python experiments/hopper/ncu_backward.py --d 128 --n 8192 --mask causal > ncu.txt

The kernels are told apart by their names (`_attn_bwd_*`: the course's; `triton_tem_*`: Flex's;
`cudnn_*`; `_attn_bwd_kernel`, `_bwd_*`: Gluon's); stdout prints the providers in run order.
Shapes as the features benchmark: B = 4, H x d = 2048, fp16. Masks: causal (all four
providers) or window (1K, the tl kernel and Flex only). ``--gluon-config`` passes schedule
overrides to the Gluon backward as JSON (e.g. '{"STAGES": 3}').
"""

from __future__ import annotations

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [ROOT, os.path.join(ROOT, "scripts")]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--d", type=int, default=128, help="head dim (H = 2048 // d)")
    p.add_argument("--n", type=int, default=8192, help="sequence length")
    p.add_argument("--mask", choices=("causal", "window"), default="causal")
    p.add_argument("--providers", default="course,flex,cudnn,gluon", help="comma list")
    p.add_argument("--gluon-config", default="{}", help="JSON overrides of the Gluon backward")
    a = p.parse_args(argv)

    import torch
    import torch.nn.functional as F
    from gpu_features import make_fn
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from course_kernels.gluon.backward_launch import gluon_attention_backward
    from course_kernels.gluon.launch import gluon_attention_forward

    B, H, N, d = 4, 2048 // a.d, a.n, a.d
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (
        torch.randn(B, H, N, d, device="cuda", dtype=torch.float16, generator=g) for _ in range(4)
    )
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    args = argparse.Namespace(window=1024)
    row = {"mask": a.mask, "n": N}
    gluon_cfg = json.loads(a.gluon_config)
    calls = {}
    for prov in a.providers.split(","):
        if prov in ("course", "flex"):
            out = make_fn({**row, "provider": prov}, args, q, k, v)()
            calls[prov] = lambda out=out: out.backward(do, retain_graph=True)
        elif prov == "cudnn" and a.mask == "causal":
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            calls[prov] = lambda out=out: out.backward(do, retain_graph=True)
        elif prov == "gluon" and a.mask == "causal":
            with torch.no_grad():
                o, lse = gluon_attention_forward(q, k, v, causal=True)
            calls[prov] = lambda o=o, lse=lse: gluon_attention_backward(
                do, q.detach(), k.detach(), v.detach(), o, lse, causal=True, **gluon_cfg
            )
    for fn in calls.values():  # warm-up: autotuning, compiles
        for _ in range(3):
            fn()
    torch.cuda.synchronize()
    order = []
    torch.cuda.cudart().cudaProfilerStart()
    for name, fn in calls.items():
        fn()
        order.append(name)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    print("ORDER " + json.dumps({"providers": order, "B": B, "H": H, "N": N, "d": d,
                                 "mask": a.mask, "gluon_config": gluon_cfg}))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
