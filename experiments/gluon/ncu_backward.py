"""Two launches of the Gluon backward (the first compiles and warms, ncu profiles the second),
rows of experiments/gluon/bench_section.py (session 17):

    ncu --clock-control none -k regex:_attn_bwd_kernel --launch-skip 1 -c 1 --section ... \
        python experiments/gluon/ncu_backward.py --mask documents --d 128
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402
from bench_section import make_call  # noqa: E402

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("--mask", choices=("causal", "documents"), default="documents", help="row kind")
ap.add_argument("--d", type=int, default=128, help="head dim (H = 2048 // d)")
ap.add_argument("--n", type=int, default=16384, help="tokens (documents) or N (causal, B = 4)")
ap.add_argument("--section", type=int, default=0, help="the backward's SECTION")
a = ap.parse_args()
call = make_call(dict(mask=a.mask, d=a.d, n=a.n), a.section)
for _ in range(2):
    call()
torch.cuda.synchronize()
