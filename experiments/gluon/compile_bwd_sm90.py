"""Compile the Gluon backward for sm_90a on a machine without a GPU: registers, spills and
shared memory of each config (ptxas of Triton 3.6), plus the small preprocess / dq kernels.

    pip install --no-deps --target /tmp/t36 triton==3.6.0
    PYTHONPATH=/tmp/t36:. python experiments/gluon/compile_bwd_sm90.py [--ptx-dir DIR] [--no-hints]

Pointer arguments carry the 16-byte divisibility hint that a launch with torch tensors gives
them, and N, N_PAD the one a launch at N = 4K/8K/16K gives (multiples of 16); without the
pointer hint Triton cannot prove the dQ atomics' alignment and emits scalar fp32 atomics instead
of the .v2 that the H200 runs (--no-hints: the session 8 record's compile). Each line ends with
the fp32 atomics in the PTX (``atom.global...add[.vN].f32``: ptxas makes them REDs).

Reuses compile_sm90.py's PTX normaliser (`_code`); the backward is in
course_kernels/gluon/backward.py, its design in notes/gluon_backward.md.
"""

import argparse
import collections
import hashlib
import itertools
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

import triton  # noqa: E402
from compile_sm90 import _code  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import make_backend  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402
from triton.experimental.gluon._runtime import GluonASTSource  # noqa: E402

from course_kernels.gluon import backward as B  # noqa: E402
from course_kernels.gluon.backward_launch import (  # noqa: E402
    BACKWARD_CONFIG,
    BACKWARD_CONSUMER_REGS,
)

SMEM_LIMIT = 227 * 1024  # per-block opt-in maximum on sm_90
TARGET = GPUTarget("cuda", 90, 32)
HINTS = True  # the launch's divisibility hints (main's --no-hints turns them off)


def _desc(dt, rows, d):
    gdt = gl.float16 if dt == "fp16" else gl.bfloat16
    lay = gl.NVMMASharedLayout.get_default_for([rows, d], gdt)
    return f"tensordesc<{dt}[{rows}, {d}],{lay!r}>"


def _rows(BM):
    """A 1-D fp32 descriptor of BM rows (the padded L log2 e and D)."""
    lay = gl.NVMMASharedLayout.get_default_for([BM], gl.float32)
    return f"tensordesc<fp32[{BM}],{lay!r}>"


def _compile(fn, sig, consts, num_warps=4):
    consts = dict(consts)
    for param in fn.params:  # switches with a default (DQ_VEC, DQ_SHARED): as launched
        if param.has_default and param.name not in consts:
            consts[param.name] = param.default
    for name in fn.arg_names:  # the constexprs in the kernel's parameter order
        if name in consts:
            sig[name] = "constexpr"
    hinted = [i for i, n in enumerate(sig) if sig[n].startswith("*") or n in ("N", "N_PAD")]
    attrs = {(i,): make_backend(TARGET).parse_attr("D") for i in hinted} if HINTS else {}
    constexprs = {(list(sig).index(k),): v for k, v in consts.items()}
    src = GluonASTSource(fn, sig, constexprs=constexprs, attrs=attrs)
    return triton.compile(src, target=TARGET, options={"num_warps": num_warps})


def atomics(ptx):
    """The fp32 atomic adds in the PTX, e.g. {'atom.global.gpu.relaxed.add.v2.f32': 128}."""
    return dict(collections.Counter(re.findall(r"\batom\.global\.[\w.]*add[\w.]*\.f32\b", ptx)))


def build(d=128, dt="fp16", CAUSAL=False, **overrides):
    """Compile the backward kernel for one config: BACKWARD_CONFIG[d] with ``overrides`` (BM,
    NUM_CONSUMERS, STAGES, DQ_SPLIT, CONSUMER_REGS, DQ_VEC, DQ_SHARED, OVERLAP_DQ)."""
    cfg = {**BACKWARD_CONFIG[d], **overrides}
    cfg.setdefault("CONSUMER_REGS", BACKWARD_CONSUMER_REGS[cfg["NUM_CONSUMERS"]])
    BM = cfg["BM"]
    sig = {
        "desc_q": _desc(dt, BM, d), "desc_k": _desc(dt, 64, d), "desc_v": _desc(dt, 64, d),
        "desc_do": _desc(dt, BM, d), "desc_lse": _rows(BM), "desc_d": _rows(BM),
        "dq_ptr": "*fp32", "dk_ptr": f"*{dt}", "dv_ptr": f"*{dt}", "N": "i32", "N_PAD": "i32",
        "qk_scale": "fp32", "sm_scale": "fp32", "win_left": "i32", "kend_ptr": "*i32",
        "dq_acc_ptr": "*fp32",  # session 18: DQ_CONVERT's dQ_acc, dq and counters
        "dq_final_ptr": f"*{dt}", "count_ptr": "*i32",
        "n_heads": "i32",  # session 21: B x H (PERSIST's tile count is n_heads x key blocks)
    }  # fmt: skip
    if cfg.get("DQ_TMA"):  # session 12: dQ_acc through a TMA descriptor of fp32 chunk blocks
        cols = d // cfg["NUM_CONSUMERS"] // cfg["DQ_SPLIT"]
        lay = gl.NVMMASharedLayout.get_default_for([BM, cols], gl.float32)
        sig["dq_ptr"] = f"tensordesc<fp32[{BM}, {cols}],{lay!r}>"
    consts = dict(HEAD_DIM=d, CAUSAL=CAUSAL, **cfg)
    return _compile(B._attn_bwd_kernel, sig, consts)


def ptxas_info(ptx):
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/ptxas")
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(ptx)
    r = subprocess.run(
        [ptxas, "-arch=sm_90a", "-v", f.name, "-o", "/dev/null"], capture_output=True, text=True
    )
    os.unlink(f.name)
    return (
        " | ".join(
            ln.strip().split("info    : ")[-1]
            for ln in r.stderr.splitlines()
            if "registers" in ln or "spill" in ln
        )
        or r.stderr[-500:]
    )


def _masked_last(d, dt, causal, masked_last=True, overlap=None, **extra):
    """A config of session 13's schedule (DQ_SHARED, DQ_TMA, OVERLAP_DQ at d = 64 unless
    ``overlap`` says otherwise, MASKED_LAST) with ``extra`` switches, its keys in the order the
    notes' ``--only`` substrings were written against."""
    cfg = dict(d=d) if dt is None else dict(d=d, dt=dt)
    overlap = d == 64 if overlap is None else overlap
    cfg.update(CAUSAL=causal, DQ_SHARED=True, OVERLAP_DQ=overlap, DQ_TMA=True)
    return dict(cfg, MASKED_LAST=masked_last, **extra)


CONFIGS = (
    [  # the defaults (BACKWARD_CONFIG) first, then variants
        dict(d=d, dt=dt, CAUSAL=c)
        for d in (64, 128)
        for dt in ("fp16", "bf16")
        for c in (False, True)
    ]
    + [
        dict(d=128, DQ_SPLIT=1),
        dict(d=128, DQ_SPLIT=4),
        dict(d=128, NUM_CONSUMERS=1),
        dict(d=128, STAGES=3),
        dict(d=64, STAGES=3),
        dict(d=64, DQ_SPLIT=2),
        dict(d=64, BM=128),
        dict(d=64, BM=128, DQ_SPLIT=2),
    ]
    + [  # session 9: cheaper dQ (notes/gluon_backward.md)
        dict(d=d, CAUSAL=c, **sw)
        for sw in (dict(DQ_VEC=4), dict(DQ_SHARED=True), dict(DQ_SHARED=True, DQ_VEC=4))
        for d in (64, 128)
        for c in (False, True)
    ]
    + [
        dict(d=128, DQ_SHARED=True, DQ_SPLIT=1),
        dict(d=128, DQ_SHARED=True, DQ_SPLIT=1, DQ_VEC=4),
        dict(d=64, DQ_SHARED=True, DQ_SPLIT=2, DQ_VEC=4),
        dict(d=64, BM=128, DQ_VEC=4),
        dict(d=64, BM=128, DQ_SHARED=True, DQ_VEC=4),
    ]
    + [  # session 9, lever (b): the last dQ chunk in flight across the step
        dict(d=d, dt=dt, CAUSAL=c, DQ_SHARED=True, OVERLAP_DQ=True)
        for d in (64, 128)
        for dt in ("fp16", "bf16")
        for c in (False, True)
    ]
    + [
        dict(d=128, DQ_SHARED=True, OVERLAP_DQ=True, DQ_SPLIT=1),
        dict(d=64, DQ_SHARED=True, OVERLAP_DQ=True, DQ_VEC=4),
        dict(d=128, DQ_SHARED=True, OVERLAP_DQ=True, DQ_VEC=4),
        dict(d=128, DQ_SHARED=True, OVERLAP_DQ=True, STAGES=1),
    ]
    + [  # session 12: dQ through shared memory and a TMA reduce-add (DQ_TMA)
        dict(d=d, dt=dt, CAUSAL=c, DQ_SHARED=True, OVERLAP_DQ=o, DQ_TMA=True)
        for d in (64, 128)
        for o in (False, True)
        for dt in ("fp16", "bf16")
        for c in (False, True)
    ]
    + [  # session 13: the unmasked query blocks first (MASKED_LAST)
        _masked_last(d, dt, c) for d in (64, 128) for dt in ("fp16", "bf16") for c in (False, True)
    ]
    + [  # session 13: dV issued before the wait for dP^T (DV_EARLY), alone and with MASKED_LAST
        dict(
            d=d,
            CAUSAL=c,
            DQ_SHARED=True,
            OVERLAP_DQ=False,
            DQ_TMA=True,
            DV_EARLY=True,
            MASKED_LAST=m,
        )
        for d in (64, 128)
        for m in (False, True)
        for c in (False, True)
    ]
    + [  # session 13: ROTATE (the unmasked run started at the key block's own query block)
        _masked_last(d, "fp16", c, ROTATE=True) for d in (64, 128) for c in (False, True)
    ]
    + [  # session 13: MASKED_LAST with OVERLAP_DQ at d = 128 (spills moved out of the hot loop?)
        _masked_last(128, None, c, overlap=True) for c in (False, True)
    ]
    + [  # session 14: the causal sliding window (WINDOW), unmasked middle first or in block order
        _masked_last(d, dt, True, masked_last=m, WINDOW=True)
        for d in (64, 128)
        for dt in ("fp16", "bf16")
        for m in (True, False)
    ]
    + [  # session 14: causal documents (DOCS), unmasked middle first; PACKED: (total, H, d) in place
        _masked_last(d, None, True, DOCS=True, PACKED=p) for d in (64, 128) for p in (False, True)
    ]
    + [  # session 17: the CTAs in sections of heads (SECTION), dense causal and PACKED documents
        _masked_last(d, None, True, SECTION=4) for d in (64, 128)
    ]
    + [_masked_last(d, None, True, DOCS=True, PACKED=True, SECTION=8) for d in (64, 128)]
    + [_masked_last(d, None, True, DOCS=True, PACKED=True, TAIL=8) for d in (64, 128)]
    + [  # session 18: a third (Q, dO) stage for the window and causal backward at d = 128
        _masked_last(128, None, True, STAGES=3, **w) for w in (dict(WINDOW=True), {})
    ]
    + [  # session 18: dq converted in the kernel by each head's last consumer (DQ_CONVERT)
        _masked_last(d, None, c, DQ_CONVERT=True) for d in (64, 128) for c in (False, True)
    ]
    + [_masked_last(128, None, True, WINDOW=True, DQ_CONVERT=True)]
    + [
        _masked_last(d, None, True, DOCS=True, PACKED=True, SECTION=8, DQ_CONVERT=True)
        for d in (64, 128)
    ]  # fmt: skip
    + [  # session 19: GQA (K/V from head hz // GROUP), dense plain / causal / window, packed docs
        _masked_last(d, None, c, GROUP=g) for d in (64, 128) for c in (False, True) for g in (2, 8)
    ]
    + [_masked_last(128, None, True, WINDOW=True, GROUP=4)]
    + [_masked_last(d, None, True, DOCS=True, PACKED=True, SECTION=8, GROUP=4) for d in (64, 128)]
    + [  # session 21: persistent CTAs (PERSIST), dense plain and causal, and GQA
        _masked_last(d, None, c, PERSIST=True) for d in (64, 128) for c in (False, True)
    ]
    + [_masked_last(128, None, False, PERSIST=True, GROUP=4)]
    + [  # session 22: 128 query rows a block (BM = 128), dense d = 64's default since; masked
        _masked_last(d, None, c, BM=128, **m)  # forms and d = 128 for the next measurement
        for d in (64, 128)
        for c, m in ((False, {}), (True, {}), (True, dict(WINDOW=True)), (True, dict(DOCS=True)))
    ]
    + [_masked_last(64, None, c, overlap=False, BM=128) for c in (False, True)]
    + [_masked_last(128, None, True, WINDOW=True, DQ_SPLIT=k) for k in (1, 4)]  # issue 22's row
    + [
        _masked_last(64, None, c, BM=128, STAGES=3) for c in (False, True)
    ]  # session 23's bwd_stages
    + [  # session 24: WG_MASK, masked steps per consumer (d = 128: BM = 64, one per consumer)
        _masked_last(128, None, True, WG_MASK=True, **m)
        for m in ({}, dict(WINDOW=True), dict(DOCS=True, PACKED=True, SECTION=4))
    ]
    + [  # session 25: WG_MASK = 2, the masked runs cut per warpgroup (scheduler._wg_cuts)
        _masked_last(128, None, True, WG_MASK=2, **m)
        for m in ({}, dict(WINDOW=True), dict(DOCS=True, PACKED=True))
    ]
    + [_masked_last(64, None, True, overlap=False, WG_MASK=2, BM=128, WINDOW=True)]
    + [  # session 25: PERSIST on issue 22's masked rows at d = 128 (the window, packed documents)
        _masked_last(128, None, True, PERSIST=True, **m)
        for m in (dict(WINDOW=True), dict(DOCS=True, PACKED=True))
    ]
    + [  # session 31: KEEP_ACC, and DQ_CONVERT = 2 (each query block converted by its last CTA)
        _masked_last(d, None, c, DQ_CONVERT=v, KEEP_ACC=k, **m)
        for d, c, m in (
            (128, True, dict(WINDOW=True)),
            (128, True, dict(DOCS=True, PACKED=True)),
            (128, False, {}),
            (64, True, {}),
        )
        for v in (1, 2)
        for k in (0, 1)
    ]  # fmt: skip
)


PRE_SHAPES = ((64, False), (128, False), (64, True), (128, True))  # (HEAD_DIM, PACKED)
PRE_SIG = dict(lse_ptr="*fp32", delta_ptr="*fp32", lse2_ptr="*fp32", N="i32", N_PAD="i32",
               acc_ptr="*fp32", cnt_ptr="*i32", ACC_ROWS="i32", win_left="i32",
               kend_ptr="*i32")  # fmt: skip


def loops(ptx):
    """The consumer loops of the compiled kernel, in code order: for each backward branch that
    closes a loop holding wgmmas (one such loop per run of ``_bwd_step`` and consumer), its
    counts of SASS instructions, local loads (``LDL``) and stores (``STL``: spills), ``HGMMA``
    and ``FSEL`` (the mask's selects: 0 in an unmasked step). ptxas + cuobjdump of the wheel."""
    bin_dir = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin")
    with tempfile.TemporaryDirectory() as tmp:
        src, cubin = os.path.join(tmp, "k.ptx"), os.path.join(tmp, "k.cubin")
        with open(src, "w") as f:
            f.write(ptx)
        subprocess.run(
            [os.path.join(bin_dir, "ptxas"), "-arch=sm_90a", src, "-o", cubin], check=True
        )
        sass = subprocess.run([os.path.join(bin_dir, "cuobjdump"), "-sass", cubin],
                              capture_output=True, text=True, check=True).stdout  # fmt: skip
    ins = [(int(a, 16), t) for a, t in re.findall(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass)]
    out = []
    for addr, text in ins:
        m = re.search(r"\bBRA (0x[0-9a-f]+)", text)
        if not m or not 0x400 < addr - int(m.group(1), 16) < 0x4000:
            continue
        body = [t for a, t in ins if int(m.group(1), 16) <= a <= addr]
        count = {k: sum(k in t for t in body) for k in ("LDL", "STL", "HGMMA", "FSEL")}
        exits = any(t.split()[-1] in ("EXIT", "RET.REL.NODEC") or "EXIT" in t for t in body)
        if count["HGMMA"] >= 16 and not exits:  # a step loop, not a barrier's out-of-line retry
            out.append(dict(instructions=len(body), **count))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ptx-dir", help="write each config's PTX here")
    ap.add_argument("--no-hints", action="store_true", help="no divisibility hints (session 8)")
    ap.add_argument("--only", help="substring of the config's printed dict to select configs")
    ap.add_argument("--loops-json", help="write each selected config's consumer loops (loops())")
    args = ap.parse_args()
    table = []
    global HINTS
    HINTS = not args.no_hints
    for cfg in CONFIGS:
        if args.only and args.only not in str(cfg):
            continue
        try:
            k = build(**cfg)
            ptx = k.asm["ptx"]
            h = hashlib.sha256(_code(ptx).encode()).hexdigest()[:16]
            smem = k.metadata.shared
            fits = "fits" if smem <= SMEM_LIMIT else "TOO BIG"
            print(cfg, "PTX", h, f"shared {smem} B ({fits} 227 KB)", ptxas_info(ptx), atomics(ptx))
            if args.loops_json:
                table.append(dict(config=cfg, spills=ptxas_info(ptx), loops=loops(ptx)))
                print("  loops:", table[-1]["loops"])
            if args.ptx_dir:
                os.makedirs(args.ptx_dir, exist_ok=True)
                name = "_".join(f"{a}{b}" for a, b in cfg.items())
                with open(os.path.join(args.ptx_dir, name + ".ptx"), "w") as f:
                    f.write(ptx)
        except Exception as e:
            while e.__cause__ is not None:  # the innermost error says what is wrong
                e = e.__cause__
            print(cfg, "FAIL", type(e).__name__, str(e)[-3000:])
    if args.loops_json:  # the selected configs only, with what made them
        import datetime
        import json

        meta = dict(
            triton=triton.__version__, target="sm_90a (ptxas of the Triton wheel, no GPU)",
            date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            command="PYTHONPATH=/tmp/t36:. python experiments/gluon/" + " ".join(
                [os.path.basename(sys.argv[0])] + [repr(a) if " " in a else a for a in sys.argv[1:]]
            ),
        )  # fmt: skip
        with open(args.loops_json, "w") as f:
            json.dump(dict(meta=meta, configs=table), f, indent=1)
        return
    for dt in ("fp16", "bf16"):
        for (d, packed), zero in itertools.product(PRE_SHAPES, (False, True)):  # zero: ZERO_ACC
            k = _compile(
                B._bwd_preprocess,
                {"o_ptr": f"*{dt}", "do_ptr": f"*{dt}", **PRE_SIG},  # fmt: skip
                dict(HEAD_DIM=d, PACKED=packed, ZERO_ACC=zero),
                num_warps=8,
            )
            what = "PACKED" * packed + " ZERO_ACC" * zero
            print("preprocess", dt, d, what, ptxas_info(k.asm["ptx"]))
        for bm, mask in itertools.product((64, 128), ("full", "causal", "window", "documents")):
            flags = dict(CAUSAL=mask != "full", WINDOW=mask == "window", DOCS=mask == "documents")
            sig = {"o_ptr": f"*{dt}", "do_ptr": f"*{dt}", **PRE_SIG}  # session 31: DQ_CONVERT=2
            k = _compile(B._bwd_preprocess, sig, dict(HEAD_DIM=128, COUNT_BM=bm, **flags), 8)
            print("preprocess", dt, 128, "COUNT_BM", bm, mask, ptxas_info(k.asm["ptx"]))
        k = _compile(
            B._bwd_dq_epilogue,
            {"dq_acc_ptr": "*fp32", "dq_ptr": f"*{dt}", "n_elems": "i32", "scale": "fp32"},
            {},
        )
        print("dq epilogue", dt, ptxas_info(k.asm["ptx"]))
        for d, packed in PRE_SHAPES:
            k = _compile(
                B._bwd_dq_epilogue_rows,
                {
                    "dq_acc_ptr": "*fp32",
                    "dq_ptr": f"*{dt}",
                    "N": "i32",
                    "N_PAD": "i32",
                    "scale": "fp32",
                },  # fmt: skip
                dict(HEAD_DIM=d, PACKED=packed),
                num_warps=8,
            )
            print("dq epilogue (rows)", dt, d, "PACKED" * packed, ptxas_info(k.asm["ptx"]))


if __name__ == "__main__":
    main()
