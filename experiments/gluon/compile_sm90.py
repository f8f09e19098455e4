"""Compile the Gluon forward for sm_90 on a machine without a GPU: registers, spills, shared memory,
and a hash of each config's PTX instructions (debug line info left out), so that a refactor can be
shown to leave the kernel unchanged without a GPU run.

    pip install --no-deps --target /tmp/t36 triton==3.6.0     # the version the kernel is written for
    PYTHONPATH=/tmp/t36 python experiments/gluon/compile_sm90.py [INDEX ...]

(INDEX: positions in CONFIGS to compile; all of them without. PTX_DIR=folder also writes each
config's instructions there, for a diff before and after a change; SASS=1 prints how many of a
few opcodes the machine code has, session 36's PRMT count.)

Session 5 used it to show that passing the ring and its barriers as one tuple left the PTX
instructions of all eight configs below byte-identical (notes/gluon.md).
"""

import sys
import os
import re
import subprocess
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from triton.experimental.gluon import language as gl
from course_kernels.gluon import forward as F


def _code(ptx):
    """The PTX instructions: the debug sections, .loc/.file lines, comments and the debug-only
    labels ($L__tmpN, which mark inlined calls for the line tables; their numbering shifts when a
    jit helper is split in two) dropped."""
    ptx = ptx.split(".section\t.debug")[0].split(".section .debug")[0]
    return "\n".join(
        ln
        for ln in ptx.splitlines()
        if not ln.strip().startswith(("//", ".loc", ".file"))
        and not re.fullmatch(r"\$L__tmp\d+:", ln.strip())
    )


def sig(dt, BM_TILE, BN, BM, d):
    lay = gl.NVMMASharedLayout.get_default_for(
        [BM_TILE, d], gl.float16 if dt == "fp16" else gl.bfloat16
    )
    kvl = gl.NVMMASharedLayout.get_default_for([BN, d], gl.float16 if dt == "fp16" else gl.bfloat16)
    return {
        "desc_q": f"tensordesc<{dt}[{BM_TILE}, {d}],{lay!r}>",
        "desc_k": f"tensordesc<{dt}[{BN}, {d}],{kvl!r}>",
        "desc_v": f"tensordesc<{dt}[{BN}, {d}],{kvl!r}>",
        "desc_o": f"tensordesc<{dt}[{BM}, {d}],{lay!r}>",
        "o_ptr": f"*{dt}",
        "lse_ptr": "*fp32",
        "sched_ptr": "*i32",
        "N": "i32",
        "H": "i32",
        "G": "i32",
        "qk_scale": "fp32",
        "num_pid_m": "i32",
        "num_tiles": "i32",
        "win_left": "i32",  # session 11's sliding window (left out for older kernels below)
        "doc_start": "*i32",  # session 15's packed documents (likewise)
    }


def build(
    d=128,
    dt="fp16",
    BN=128,
    NC=2,
    STAGES=2,
    QSTAGES=2,
    CAUSAL=False,
    OVERLAP=True,
    REGS=None,
    LPT=None,
    DYNAMIC=False,
    SKIP_DEAD=False,
    ALIGN_END=False,
    SECTION=0,
    ROW_MASK=False,
    O_STAGE=None,
    WINDOW=None,
    PINGPONG=None,
    DOCS=None,
    PACKED=None,
    DEFER=None,
    PACK_P=None,
    LAZY=None,
):
    BM = 64
    s = sig(dt, BM, BN, BM, d)
    for name in ("win_left", "doc_start"):
        if name not in F._attn_fwd_kernel.arg_names:
            del s[name]
    consts = dict(
        BM=BM,
        BN=BN,
        HEAD_DIM=d,
        NUM_CONSUMERS=NC,
        STAGES=STAGES,
        QSTAGES=QSTAGES,
        CAUSAL=CAUSAL,
        OVERLAP=OVERLAP,
        CONSUMER_REGS=REGS
        or __import__("course_kernels.gluon.launch", fromlist=["x"]).CONSUMER_REGS[NC],
        LPT=CAUSAL if LPT is None else LPT,
        DYNAMIC=DYNAMIC,
        SKIP_DEAD=SKIP_DEAD,
        ALIGN_END=ALIGN_END,
        SECTION=SECTION,
        ROW_MASK=ROW_MASK,
    )
    # (constexprs go by position: a later one needs every earlier)
    later = DEFER is not None or PACK_P is not None or LAZY is not None
    if (
        O_STAGE is not None
        or WINDOW is not None
        or PINGPONG is not None
        or DOCS is not None
        or later
    ):
        consts["O_STAGE"] = bool(O_STAGE)  # (given whenever WINDOW is: constexprs go by position)
    if WINDOW is not None or PINGPONG is not None or DOCS is not None or later:  # session 11's
        consts["WINDOW"] = bool(WINDOW)
    if PINGPONG is not None or DOCS is not None or later:
        consts["PINGPONG"] = bool(PINGPONG)
    if DOCS is not None or later:  # session 15's switches
        consts["DOCS"] = bool(DOCS)
        consts["PACKED"] = bool(PACKED)
    if later:  # session 29: a head's lightest tiles last
        consts["DEFER"] = DEFER or 0
    if PACK_P is not None or LAZY is not None:  # session 36: P packed by one cvt a pair
        consts["PACK_P"] = bool(PACK_P)
    if LAZY is not None:  # session 38: the correction of O only when a maximum moved
        consts["LAZY"] = bool(LAZY)
    for kk in consts:
        s[kk] = "constexpr"
    src = GluonASTSource(
        F._attn_fwd_kernel, s, constexprs={(list(s).index(k),): v for k, v in consts.items()}
    )
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    return k


# Each config's arguments of build(); the runs of the same session share a base.
S7 = dict(d=64, NC=3, STAGES=3, DYNAMIC=True)  # session 7: the dynamic persistent scheduler
S8 = dict(S7, CAUSAL=True, LPT=False, SKIP_DEAD=True, ALIGN_END=True)  # session 8: causal switches
S10 = dict(d=128, CAUSAL=True, LPT=True, DYNAMIC=True, SKIP_DEAD=True, SECTION=8, ROW_MASK=True)
S19 = dict(d=256, BN=64, NC=2, STAGES=2, QSTAGES=1, DYNAMIC=True)  # session 19: d = 256
CONFIGS = [
    dict(d=128),
    dict(d=128, CAUSAL=True),
    dict(d=64, STAGES=3),
    dict(d=128, OVERLAP=False),
    dict(d=64, NC=3, STAGES=3),
    dict(d=128, dt="bf16", CAUSAL=True),
    dict(d=128, NC=1),
    dict(d=64, NC=3, STAGES=3, CAUSAL=True, OVERLAP=False),
    # session 7: the dynamic persistent scheduler (DYNAMIC), head-major and LPT order
    dict(S7, CAUSAL=True, LPT=False),
    dict(S7, CAUSAL=False),
    dict(d=128, CAUSAL=True, LPT=False, DYNAMIC=True),
    dict(d=128, dt="bf16", CAUSAL=True, LPT=True, DYNAMIC=True),
    dict(S7, OVERLAP=False),
    # session 8: the d = 64 causal variants (experiments/gluon/session8_levers.py)
    dict(S8, ALIGN_END=False),
    S8,
    dict(S8, CAUSAL=False, LPT=None),
    dict(S8, dt="bf16"),
    dict(S8, STAGES=4),
    dict(S8, STAGES=4, CAUSAL=False, LPT=None),
    dict(S7, NC=2, CAUSAL=True, LPT=False),
    dict(S7, NC=2, CAUSAL=False),
    dict(d=128, CAUSAL=True, LPT=False, DYNAMIC=True, SKIP_DEAD=True, ALIGN_END=True),
    dict(S8, LPT=None, OVERLAP=False),
    # session 9 (experiments/gluon/session9_forward.py): sectioned LPT order, block 0's one-compare mask
    dict(S8, LPT=True, SECTION=8),
    dict(S8, ROW_MASK=True),
    dict(S8, LPT=True, SECTION=8, ROW_MASK=True),
    dict(S8, LPT=True, SECTION=4, ROW_MASK=True, dt="bf16"),
    dict(S7, CAUSAL=False, ROW_MASK=True),
    dict(d=128, CAUSAL=True, LPT=True, DYNAMIC=True, SKIP_DEAD=True, SECTION=4, ROW_MASK=True),
    dict(d=128, DYNAMIC=True, ROW_MASK=True),
    # session 10: today's four defaults (d = 128 causal with session 9's levers), then each with
    # its own O staging tile per consumer (O_STAGE)
    dict(S7, CAUSAL=False),
    dict(d=128, DYNAMIC=True),
    S8,
    S10,  # (session 10: d = 128 causal)
    dict(S7, CAUSAL=False, O_STAGE=True),
    dict(d=128, DYNAMIC=True, O_STAGE=True),
    dict(S8, O_STAGE=True),
    dict(S10, O_STAGE=True),
    dict(d=128, dt="bf16", CAUSAL=True, DYNAMIC=True, SKIP_DEAD=True, O_STAGE=True),
    dict(d=128, NC=1, O_STAGE=True),
    # session 11: the causal sliding window (WINDOW) on each causal default, the serial consumer
    dict(S8, WINDOW=True, BN=64),  # 40: the d = 64 window default (WINDOW_CONFIG)
    dict(S10, ROW_MASK=False, WINDOW=True),
    dict(S8, WINDOW=True, dt="bf16"),
    dict(d=128, CAUSAL=True, DYNAMIC=True, SKIP_DEAD=True, WINDOW=True, OVERLAP=False),
    # session 11: FA3's ping-pong of the consumers' GEMM issue (PINGPONG) on the four defaults, 44
    dict(S7, CAUSAL=False, PINGPONG=True),
    dict(d=128, DYNAMIC=True, PINGPONG=True),
    dict(S8, PINGPONG=True),
    dict(S10, PINGPONG=True),
    dict(S8, WINDOW=True, BN=64, PINGPONG=True),
    # session 15: causal documents packed into one sequence (DOCS), in place (PACKED), 49
    dict(S8, ALIGN_END=False, DOCS=True),  # d = 64: the causal switches but ALIGN_END
    dict(S8, ALIGN_END=False, DOCS=True, PACKED=True),
    dict(S10, ROW_MASK=False, DOCS=True),  # d = 128
    dict(S10, ROW_MASK=False, DOCS=True, PACKED=True),
    dict(S10, ROW_MASK=False, DOCS=True, PACKED=True, dt="bf16"),
    dict(S8, ALIGN_END=False, DOCS=True, PACKED=True, OVERLAP=False),
    # session 19: d = 256 (launch.DEFAULT_CONFIG[256]: BN = 64, one Q stage), 55
    S19,
    dict(S19, CAUSAL=True, LPT=True, SKIP_DEAD=True, SECTION=8, ROW_MASK=True),  # its causal
    dict(S19, CAUSAL=True, LPT=True, SKIP_DEAD=True, SECTION=8, ROW_MASK=True, dt="bf16"),
    dict(S19, CAUSAL=True, LPT=True, SKIP_DEAD=True, SECTION=8, WINDOW=True),
    dict(S19, CAUSAL=True, LPT=True, SKIP_DEAD=True, SECTION=8, DOCS=True, PACKED=True),
    # session 29: the d = 64 causal default with each head's 4 lightest tiles last (DEFER), 60
    dict(S8, DEFER=4),
    dict(S8, DEFER=4, dt="bf16"),
    dict(S8, DEFER=6),
    # session 32: ROW_MASK on top of it (the H200's one row below cuDNN), 63
    dict(S8, DEFER=6, ROW_MASK=True),
    # session 36: P packed into PV's operand by one cvt a pair (PACK_P) on the defaults, 64
    dict(S8, DEFER=6, PACK_P=True),
    dict(S8, DEFER=6, PACK_P=True, dt="bf16"),
    dict(S10, PACK_P=True),  # d = 128 causal
    dict(S7, CAUSAL=False, PINGPONG=True, PACK_P=True),  # d = 64 non-causal
    dict(d=128, DYNAMIC=True, PACK_P=True),  # d = 128 non-causal
    dict(S8, DEFER=6, dt="bf16"),  # (64-68's baselines: 62, this, 33, 44, 31)
    # session 38: LAZY (the correction only when a row's maximum grew by more than 2**8), 70
    dict(d=128, DYNAMIC=True, LAZY=True),  # d = 128 non-causal (baseline 31)
    dict(S8, DEFER=6, PACK_P=True, LAZY=True),  # d = 64 causal default (baseline 64)
    dict(S10, LAZY=True),  # d = 128 causal default (baseline 33)
    dict(S7, CAUSAL=False, PINGPONG=True, LAZY=True),  # d = 64 non-causal default (baseline 44)
]


def sass_counts(cubin: bytes, ops=("PRMT", "F2FP", "MUFU", "FFMA", "FMNMX", "HGMMA")) -> str:
    """SASS=1: how many of each opcode the kernel's machine code has (cuobjdump -sass)."""
    tool = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
    sass = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True).stdout
    found = re.findall(r"^\s+/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+ )?([A-Z0-9_]+)", sass, re.M)
    return " ".join(f"{op} {found.count(op)}" for op in ops) + f" (of {len(found)})"


if __name__ == "__main__":
    import re

    chosen = [CONFIGS[int(i)] for i in sys.argv[1:]] or CONFIGS
    for args in chosen:
        try:
            t0 = time.time()
            k = build(**args)
            t_compile = time.time() - t0
            ptx = k.asm["ptx"]
            with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
                f.write(ptx)
            ptxas = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/ptxas")
            r = subprocess.run(
                [ptxas, "-arch=sm_90a", "-v", f.name, "-o", "/dev/null"],
                capture_output=True,
                text=True,
            )
            info = " | ".join(
                l.strip() for l in r.stderr.splitlines() if "registers" in l or "spill" in l
            )
            import hashlib

            if os.environ.get("PTX_DIR"):  # the instructions, for a diff (PTX_DIR=folder)
                name = "_".join(f"{k}={v}" for k, v in sorted(args.items()))
                with open(os.path.join(os.environ["PTX_DIR"], name + ".ptx"), "w") as f:
                    f.write(_code(ptx))

            print(
                args,
                "PTX",
                hashlib.sha256(_code(ptx).encode()).hexdigest()[:16],
                "shared",
                k.metadata.shared,
                info[:120],
                f"compile {t_compile:.1f}s",
            )
            if os.environ.get("SASS"):
                print("  SASS:", sass_counts(k.asm["cubin"]))
            print(
                "  setmaxnreg:",
                sorted(set(re.findall(r"setmaxnreg\.\w+\.sync\.aligned\.u32\s+\d+", ptx))),
            )
        except Exception as e:
            print(args, "FAIL", type(e).__name__, str(e)[:3000])
