"""Session 27: the host time of the packed-documents (varlen) calls, step by step, and where
a call waits for the GPU.

    PYTHONPATH=. python experiments/gluon/host_docs.py --out DIR     # on a GPU, < 60 s

Session 27 timed ``flash_attention_varlen`` on issue 22's documents row (16,384 tokens in
scripts/gpu_features.py's six documents, H * d = 2048, fp16, causal) on an H100: the Python path
of one d = 128 forward (the Gluon kernel) took 0.69 ms without grad and 0.98 ms with it, the
kernel itself ~0.50 ms, while the d = 64 forward (the ``tl`` kernel) took 0.14 ms, and the
dense Gluon forward ~0.1 ms (notes/gluon.md, host cost). A host path longer than its kernel
makes the benchmark time the host (its rounds moved 0.50-0.95 ms). This script says where:

* ``host_us``: microseconds of host time a call, 50 calls back to back (the GPU queue drained
  before; median of 5; ``host_cost._us``), for each step of the d = 128 forward (``_doc_bounds``, the four tensor
  descriptors, ``gluon_varlen_forward``, ``flash_attention_varlen`` without and with grad) and the
  backward (``autograd.grad`` on a retained graph), d = 64 beside;
* ``profile`` (the ``flash_attention_varlen`` rows): cProfile's 15 functions of most own time;
* ``syncs``: each call once more under ``torch.cuda.set_sync_debug_mode("error")``: the first
  operation that makes the host wait for the GPU raises, and its traceback's last frames of this
  package are recorded (an empty list: the call never waits).

Writes ``<--tag>.json``, by default ``host_docs.json`` (environment, command, rows).
"""

from __future__ import annotations

import itertools
import json
import os
import sys
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [ROOT, HERE, os.path.join(ROOT, "scripts")]

from bench_section import base_parser, new_record, save  # noqa: E402


def first_sync(fn):
    """The frames of this package (file:line function) where fn first waits for the GPU, or []."""
    import torch

    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        fn()
        return []
    except RuntimeError as err:
        frames = traceback.extract_tb(err.__traceback__)
        ours = [f for f in frames if "course_kernels" in f.filename]
        return [f"{os.path.relpath(f.filename, ROOT)}:{f.lineno} {f.name}" for f in ours[-4:]] or [
            str(err)[:200]
        ]
    finally:
        torch.cuda.set_sync_debug_mode(0)
        torch.cuda.synchronize()


def profile(fn, calls=50, top=15):
    """cProfile of ``calls`` calls of fn: the ``top`` functions by own time, as
    "file:line function: own us a call (ncalls a call)"."""
    import cProfile
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    rows = sorted(pstats.Stats(prof).stats.items(), key=lambda kv: -kv[1][2])[:top]
    return [
        f"{os.path.basename(f)}:{line} {name}: {tt / calls * 1e6:.1f} us ({nc / calls:g})"
        for (f, line, name), (_cc, nc, tt, _ct, _callers) in rows
    ]


def steps(d, tokens):
    import torch

    from course_kernels import flash_attention_varlen
    from course_kernels.gluon import launch as G
    from gpu_features import doc_lengths

    heads, lengths = 2048 // d, doc_lengths(tokens)
    cu = torch.tensor([0, *itertools.accumulate(lengths)], device="cuda", dtype=torch.int32)
    m = max(lengths)
    q, k, v = (torch.randn(tokens, heads, d, device="cuda", dtype=torch.float16) for _ in "qkv")
    qg, kg, vg = (x.clone().requires_grad_(True) for x in (q, k, v))
    view = q.transpose(0, 1).unsqueeze(0)
    out = flash_attention_varlen(qg, kg, vg, cu, cu, m, m, causal=True)
    grad = torch.randn_like(out)
    return {
        "_doc_bounds": lambda: G._doc_bounds(cu, True, None, view, True, "start"),
        "gluon_varlen_forward": lambda: G.gluon_varlen_forward(q, k, v, cu, None, True),
        "flash_attention_varlen, no grad": lambda: flash_attention_varlen(
            q, k, v, cu, cu, m, m, causal=True
        ),
        "flash_attention_varlen, grad": lambda: flash_attention_varlen(
            qg, kg, vg, cu, cu, m, m, causal=True
        ),
        "backward (autograd.grad)": lambda: torch.autograd.grad(
            out, (qg, kg, vg), grad, retain_graph=True
        ),
    }


def main(argv=None):
    ap = base_parser(__doc__, "host_docs")
    ap.add_argument("--tokens", type=int, default=16384, help="packed tokens of the documents")
    ap.add_argument("--dims", type=int, nargs="+", default=[128, 64], help="head dims")
    args = ap.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        ap.error("needs a CUDA GPU")
    from host_cost import _us

    record = new_record(__file__, argv)
    for d in args.dims:
        for name, fn in steps(d, args.tokens).items():
            if d != 128 and name in ("_doc_bounds", "gluon_varlen_forward"):
                continue  # the d = 64 forward takes the tl kernel
            fn()
            row = dict(d=d, step=name, host_us=round(_us(fn, calls=50), 1), syncs=first_sync(fn))
            if name.startswith("flash_attention_varlen"):
                row["profile"] = profile(fn)
            record["rows"].append(row)
            print(json.dumps(row), flush=True)
    os.makedirs(args.out, exist_ok=True)
    save(record, os.path.join(args.out, f"{args.tag}.json"))


if __name__ == "__main__":
    main()
