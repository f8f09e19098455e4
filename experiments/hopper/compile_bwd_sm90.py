"""The backward kernels compiled for sm_90a (H100/H200) on a machine without a GPU: registers,
spills, shared memory, tensor-core instructions and layout conversions, per config and variant.

    pip install --no-deps --target /tmp/t36 triton==3.6.0    # the GPU machine's Triton
    PYTHONPATH=/tmp/t36:. TRITON_INTERPRET=0 python experiments/hopper/compile_bwd_sm90.py

Session 8 (notes/kernel.md) compares the dK/dV and dQ kernels with FlexAttention's backward
without a GPU. How it compiles: ``triton.compile`` of an ``ASTSource`` for ``GPUTarget("cuda",
90, 128)``, arguments specialized as a launch would (as ``tests/test_sm75_compile.py`` and
``experiments/gluon/compile_sm90.py`` do); ptxas from the Triton wheel reports registers and
spills (``-v``), ``cuobjdump -sass`` gives the machine code. Per compiled kernel it prints:
registers, spill bytes (stores), shared memory, ``wgmma.mma_async`` in the PTX, and in the
TTGIR ``ttg.convert_layout`` / ``ttg.local_alloc`` / ``ttg.local_load`` counts, and in the SASS
the instruction count, local loads/stores (spill traffic) and ``ISETP`` (integer compares:
bounds masks and loop tests).

``--variants``: ``default`` (three dK/dV loops, every load masked: session 8), ``even``
(``EVEN_BLOCKS``), ``one_loop`` (the package's launch), ``even_one_loop``, ``peel`` (``PEEL``: four
dK/dV loops, the tail last) and ``one_loop_peel`` (the single loop, the tail after it as
straight-line code); both peeled variants peel the dQ kernel's loops too. Session 9, notes/kernel.md.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # aot_source: the launch's ASTSource, shared with a test
os.environ.setdefault("TRITON_INTERPRET", "0")  # compile the real JIT functions

POINTERS = {"Q", "K", "V", "DO", "Out", "DK", "DV"}
FP32_POINTERS = {"LSE", "Delta", "ALIBI_R", "DQ_ACC"}
I32_POINTERS = {"CU_Q", "CU_K"}

# (kernel, case, d, config, extra constexprs): the H200 autotuner's choices at d = 128 and 64
# (experiments/data/bench/h200_bwd_configs.json: dK/dV (64, 128, 8 warps, 3 stages; 2 stages won
# on the documents when forced), dQ (64 keys, 128 rows, 8 warps, 3 stages)).
DKDV_CFGS = [(64, 128, 8, 3), (64, 128, 8, 2)]
DQ_CFGS = [(64, 128, 8, 3)]
CASES = ("causal", "window", "doc")


def _values(case: str, d: int):
    """Integer/float arguments as a launch passes them: B = 4, H * d = 2048, N = 8192 (dense,
    (B, H, N, d) contiguous) or 6 packed documents of 16,384 tokens ((T, H, d), varlen)."""
    H = 2048 // d
    if case == "doc":
        T, N = 16384, 5120  # max_seqlen of the 6 documents
        strides = {"z": 0, "h": d, "m": H * d, "n": H * d, "k": 1}
        lz, lh = 0, T
    else:
        N = 8192
        strides = {"z": H * N * d, "h": N * d, "m": d, "n": d, "k": 1}
        lz, lh = H * N, N
    win_lo = -1023 if case == "window" else -(1 << 30)
    vals = {"scale": d**-0.5, "qk_mul": 1.0, "c2": d**-0.5 * 1.4426950408889634}
    vals.update(H_Q=H, KV_HEADS=H, GROUP_SIZE=1, N_CTX_Q=N, N_CTX_K=N, win_lo=win_lo, win_hi=0)
    vals.update(stride_lz=lz, stride_lh=lh, stride_az=0)
    return vals, strides


def source(fn, case: str, d: int, cfg: dict, extra: dict, backend):
    """The ASTSource of one launch: pointers 16-byte aligned, ints == 1 constexpr, ints % 16 == 0
    with the divisibility hint (what JITFunction.run specializes on)."""
    from aot_source import launch_source

    vals, strides = _values(case, d)
    constexprs = dict(
        HEAD_DIM=d,
        HEAD_DIM_PADDED=d,
        WINDOWED=True,
        BOTTOM_RIGHT=False,
        SOFTCAP=False,
        ALIBI=False,
        VARLEN=case == "doc",
        DOT_PRECISION="tf32",
        **cfg,
        **extra,
    )

    def pointer_type(name):
        if name not in POINTERS | FP32_POINTERS | I32_POINTERS | {"DQ"}:
            return None
        fp32 = name in FP32_POINTERS or (name == "DQ" and "ATOMIC_DQ" in fn.arg_names)
        return "*i32" if name in I32_POINTERS else ("*fp32" if fp32 else "*fp16")

    values = {n: strides[n[-1]] if n.startswith("stride_") and n not in vals else vals.get(n)
              for n in fn.arg_names}  # fmt: skip
    return launch_source(fn, constexprs, values, pointer_type, backend)


def _code(ptx: str) -> str:
    """The PTX instructions without debug sections, .loc/.file lines and comments."""
    ptx = ptx.split(".section\t.debug")[0].split(".section .debug")[0]
    return "\n".join(
        ln for ln in ptx.splitlines() if not ln.strip().startswith(("//", ".loc", ".file"))
    )


def _sass(cubin: bytes, tool: str) -> str:
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
    try:
        return subprocess.run([tool, "-sass", f.name], capture_output=True, text=True).stdout
    finally:
        os.unlink(f.name)


def loop_counts(sass: str) -> list[dict]:
    """Per loop that holds tensor-core instructions (a backward branch): its SASS instructions,
    HGMMA and ISETP counts (one iteration, in program order: masked edge, middle, masked edge)."""
    ins = [
        (int(m.group(1), 16), m.group(2))
        for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass)
    ]
    loops = []
    for addr, text in ins:
        target = re.search(r"BRA\b.*?0x([0-9a-f]+)", text)
        if target and int(target.group(1), 16) < addr:
            body = [t for a, t in ins if int(target.group(1), 16) <= a <= addr]
            hgmma = sum("HGMMA" in t for t in body)
            if hgmma:
                isetp = sum("ISETP" in t for t in body)
                loops.append({"instrs": len(body), "HGMMA": hgmma, "ISETP": isetp})
    return loops


def compile_one(kernel: str, case: str, d: int, tile, extra=None) -> dict:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend

    from course_kernels.triton import backward as B

    fn = (B._attn_bwd_dkdv if kernel == "dkdv" else B._attn_bwd_dq).fn
    a, b, w, s = tile
    names = ("BLOCK_M1", "BLOCK_N1") if kernel == "dkdv" else ("BLOCK_N2", "BLOCK_M2")
    cfg = {names[0]: a, names[1]: b}
    target = GPUTarget("cuda", 90, 128)
    backend = make_backend(target)
    src = source(fn, case, d, cfg, extra or {}, backend)
    ck = triton.compile(src, target=target, options=dict(num_warps=w, num_stages=s))
    ptx, ttgir = ck.asm["ptx"], ck.asm["ttgir"]
    bindir = Path(triton.__file__).parent / "backends/nvidia/bin"
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(ptx)
    r = subprocess.run(
        [str(bindir / "ptxas"), "--gpu-name", "sm_90a", "-v", f.name, "-o", "/dev/null"],
        capture_output=True,
        text=True,
    )
    os.unlink(f.name)
    regs = re.search(r"Used (\d+) registers", r.stderr)
    spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", r.stderr)
    sass = _sass(ck.asm["cubin"], str(bindir / "cuobjdump"))
    instrs = re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", sass)
    return {
        "kernel": kernel,
        "case": case,
        "d": d,
        "tile": list(tile),
        "switches": extra or {},
        "regs": int(regs.group(1)) if regs else None,
        "spill_store_B": int(spill.group(1)) if spill else None,
        "spill_load_B": int(spill.group(2)) if spill else None,
        "wgmma_serialized": "C7515" in r.stderr,  # ptxas: one wait per wgmma (session 9)
        "shared": ck.metadata.shared,
        "ptx_sha": hashlib.sha256(_code(ptx).encode()).hexdigest()[:12],
        "wgmma": len(re.findall(r"wgmma\.mma_async", ptx)),
        "convert_layout": ttgir.count("ttg.convert_layout"),
        "local_alloc": ttgir.count("ttg.local_alloc"),
        "local_load": ttgir.count("ttg.local_load"),
        "memdesc_trans": ttgir.count("ttg.memdesc_trans"),
        "sass": len(instrs),
        "sass_LDL_STL": sum(i.startswith(("LDL", "STL")) for i in instrs),
        "sass_ISETP": sum(i.startswith("ISETP") for i in instrs),
        "sass_LDGSTS": sum(i.startswith("LDGSTS") for i in instrs),
        "sass_HGMMA": sum(i.startswith("HGMMA") for i in instrs),
        "loops": loop_counts(sass),
    }


# The switches (notes/kernel.md): name -> (kernel, constexprs)
VARIANTS = {
    "default": {"dkdv": {"ONE_LOOP": False}, "dq": {}},  # session 8's kernels
    "even": {"dkdv": {"EVEN_BLOCKS": True, "ONE_LOOP": False}, "dq": {"EVEN_BLOCKS": True}},
    "one_loop": {"dkdv": {"ONE_LOOP": True}},  # the package's launch
    "even_one_loop": {"dkdv": {"EVEN_BLOCKS": True, "ONE_LOOP": True}, "dq": {"EVEN_BLOCKS": True}},
    "peel": {"dkdv": {"PEEL": True, "ONE_LOOP": False}, "dq": {"PEEL": True}},  # four loops
    "one_loop_peel": {"dkdv": {"PEEL": True, "ONE_LOOP": True}, "dq": {"PEEL": True}},
}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--d", type=int, nargs="+", default=[128, 64])
    p.add_argument("--cases", nargs="+", default=list(CASES))
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    p.add_argument("--kernels", nargs="+", default=["dkdv", "dq"])
    p.add_argument("--out", help="also write the rows to this JSON file")
    args = p.parse_args(argv)
    rows = []
    for d in args.d:
        for case in args.cases:
            for kernel in args.kernels:
                for tile in DKDV_CFGS if kernel == "dkdv" else DQ_CFGS:
                    for name in args.variants:
                        extra = VARIANTS[name].get(kernel)
                        if extra is None:
                            continue
                        try:
                            row = compile_one(kernel, case, d, tile, extra)
                        except Exception as e:  # noqa: BLE001 - report and go on
                            row = {"kernel": kernel, "case": case, "d": d, "error": repr(e)[-1500:]}
                        row["variant"] = name
                        rows.append(row)
                        print(json.dumps(row), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
