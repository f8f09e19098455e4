"""One launch each of the Gluon forward (default config) and SDPA-cuDNN, for ncu:

ncu --clock-control none -k regex:'attn_fwd|fprop|sdpa' --metrics ... python experiments/gluon/ncu_forward.py --d 128

``--config '{"LPT": true, "LPT_SECTION_MB": 16}'``: switches added to the call's default schedule
(``launch.schedule_config`` at the call's N kept, as experiments/gluon/sweep_forward.py does).
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from course_kernels.gluon import launch as G

ap = argparse.ArgumentParser(description=__doc__)
ap.add_argument("--d", type=int, default=128, help="head dim (H = 2048 // d)")
ap.add_argument("--N", type=int, default=8192, help="sequence length")
ap.add_argument("--causal", action="store_true", help="causal masking")
ap.add_argument("--config", default="{}", help="JSON: switches added to the default schedule")
a = ap.parse_args()
cfg = {**G.schedule_config(a.d, a.causal, a.N), **json.loads(a.config)}
q = torch.randn(4, 2048 // a.d, a.N, a.d, device="cuda", dtype=torch.float16)
k, v = torch.randn_like(q), torch.randn_like(q)
G.gluon_attention_forward(q, k, v, causal=a.causal, **cfg)
with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
    F.scaled_dot_product_attention(q, k, v, is_causal=a.causal)
torch.cuda.synchronize()
