"""Compile the backward's PDL switch (programmatic dependent launch, session 26) for sm_90a on a
machine without a GPU, beside the default, and record what changed.

    pip install --no-deps --target /tmp/t36 triton==3.6.0
    PYTHONPATH=/tmp/t36:. python experiments/gluon/compile_pdl_sm90.py --out FILE.json

For each kernel of the backward call (the preprocessing, the main kernel at the issue-22 rows, the
two dq conversions): the PTX hash (normalised as compile_sm90.py does) and the
``griddepcontrol`` instructions with PDL off and on, registers and spills from ptxas, and the
main kernel's consumer loops (compile_bwd_sm90.loops). What PDL must do: nothing with it off
(the default's PTX hash unchanged, no griddepcontrol), one ``launch_dependents`` in the
preprocessing, a ``launch_dependents`` then a ``wait`` in the main kernel before its roles
start, a ``wait`` in each dq conversion before its first load, and the same consumer loops.
"""

import argparse
import datetime
import hashlib
import json
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import triton  # noqa: E402
from compile_bwd_sm90 import _compile, _masked_last, build, loops, ptxas_info  # noqa: E402
from compile_sm90 import _code  # noqa: E402

from course_kernels.gluon import backward as B  # noqa: E402

MAIN = {  # issue 22's d = 128 rows and the plain causal one, as the launcher builds them
    "causal": _masked_last(128, None, True),
    "window": _masked_last(128, None, True, WINDOW=True),
    "documents": _masked_last(128, None, True, DOCS=True, PACKED=True, SECTION=4),
}
SMALL = {  # kernel, signature, constexprs, warps
    "preprocess": (B._bwd_preprocess, dict(o_ptr="*fp16", do_ptr="*fp16", lse_ptr="*fp32",
                   delta_ptr="*fp32", lse2_ptr="*fp32", N="i32", N_PAD="i32", acc_ptr="*fp32",
                   cnt_ptr="*fp32", ACC_ROWS="i32"), dict(HEAD_DIM=128), 8),
    "dq_epilogue": (B._bwd_dq_epilogue, dict(dq_acc_ptr="*fp32", dq_ptr="*fp16", n_elems="i32",
                    scale="fp32"), {}, 4),
    "dq_epilogue_rows": (B._bwd_dq_epilogue_rows, dict(dq_acc_ptr="*fp32", dq_ptr="*fp16",
                         N="i32", N_PAD="i32", scale="fp32"), dict(HEAD_DIM=128), 8),
}  # fmt: skip


def describe(ptx, with_loops=False):
    """Hash, griddepcontrol instructions in order, ptxas's registers and spills (and loops)."""
    out = dict(
        ptx_hash=hashlib.sha256(_code(ptx).encode()).hexdigest()[:16],
        griddepcontrol=re.findall(r"griddepcontrol\.(\w+)", ptx),
        ptxas=ptxas_info(ptx),
    )
    if with_loops:
        out["loops"] = loops(ptx)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="JSON file to write")
    args = ap.parse_args()
    rows = []
    for name, cfg in MAIN.items():
        for pdl in (False, True):
            extra = {"PDL": True} if pdl else {}
            ptx = build(**cfg, **extra).asm["ptx"]
            rows.append(dict(kernel="main " + name, PDL=pdl, **describe(ptx, with_loops=True)))
            print(rows[-1]["kernel"], pdl, {k: v for k, v in rows[-1].items() if k != "loops"})
    for name, (fn, sig, consts, warps) in SMALL.items():
        for pdl in (False, True):
            k = _compile(fn, dict(sig), dict(consts, PDL=pdl), num_warps=warps)
            rows.append(dict(kernel=name, PDL=pdl, **describe(k.asm["ptx"])))
            print(name, pdl, rows[-1])
    meta = dict(
        triton=triton.__version__, target="sm_90a (ptxas of the Triton wheel, no GPU)",
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        command="PYTHONPATH=/tmp/t36:. python experiments/gluon/compile_pdl_sm90.py --out FILE",
    )  # fmt: skip
    with open(args.out, "w") as f:
        json.dump(dict(meta=meta, kernels=rows), f, indent=1)
    print("wrote", args.out)


if __name__ == "__main__":
    main()
