"""A practitioner's first GPU calls, from the installed wheel (no repository on the path).

    python scripts/gpu_wheel_check.py --wheel .whl/course_kernels-*.whl --out DIR

Installs the wheel without dependencies into a fresh folder (the machine's torch and Triton are
used, as on Colab or a training box), then, from an empty working directory with only that
folder on ``PYTHONPATH``, calls ``course_kernels.flash_attention`` as a drop-in for SDPA:
forward and backward at d = 64 and 128, causal and not, fp16 (and bf16 at d = 128 causal), at a
size where ``auto`` picks the Gluon kernels on Hopper (B = 2, H x d = 2048, N = 4K). Each call is
held to flash-attn's rule against a float32 reference (its error at most twice SDPA's, plus one
rounding), the CUDA kernels that ran are read from ``torch.profiler``, ``COURSE_KERNELS_FORWARD
=triton`` is checked to give the ``tl`` kernel, and ``torch.compile(fullgraph=True)`` of a call
must equal the eager call. Writes ``DIR/wheel_check.json`` (GPU, versions, date, command, each
case); exits 1 if a check failed, 2 where there is no CUDA GPU (after the install and import).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile

GLUON_FWD, GLUON_BWD, TL_FWD = "_attn_fwd_kernel", "_attn_bwd_kernel", "_attn_fwd"
CASES = [(64, False, "float16"), (64, True, "float16"), (128, False, "float16"),
         (128, True, "float16"), (128, True, "bfloat16")]  # fmt: skip


def _kernels(fn) -> list[str]:
    """Names of the CUDA kernels one call of ``fn`` launched."""
    import torch

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sorted({e.name for e in prof.events() if e.device_type.name == "CUDA"})


def _budget(sdpa, ref, dtype) -> float:  # tests/gpu/fa_rule.py's rule, repeated: no repo here
    r = ref.to(dtype)
    atol = 2 * (r + 0.3 - 0.3 - r).abs().max().item()
    return 2 * (sdpa.float() - ref).abs().max().item() + max(atol, 1e-5)


def _case(ck, torch, d, causal, dtype_name, n=4096, batch=2) -> dict:
    import torch.nn.functional as F

    dtype, heads = getattr(torch, dtype_name), 2048 // d
    gen = torch.Generator(device="cuda").manual_seed(d * 10 + causal)
    q, k, v, do = (torch.randn(batch, heads, n, d, device="cuda", dtype=dtype, generator=gen)
                   for _ in range(4))  # fmt: skip

    def course(a, b, c):
        return ck.flash_attention(a, b, c, causal=causal)

    def sdpa(a, b, c):
        return F.scaled_dot_product_attention(a, b, c, is_causal=causal)

    grads = {}
    for name, fn, cast in (("course", course, dtype), ("sdpa", sdpa, dtype),
                           ("ref", sdpa, torch.float32)):  # fmt: skip
        x = [t.detach().to(cast).requires_grad_() for t in (q, k, v)]
        out = fn(*x)
        out.backward(do.to(cast))
        grads[name] = (out.detach(), *(t.grad for t in x))
    x = [t.detach().requires_grad_() for t in (q, k, v)]
    names = _kernels(lambda: course(*x).backward(do))
    row = {"d": d, "causal": causal, "dtype": dtype_name, "shape": [batch, heads, n, d]}
    for i, what in enumerate(("out", "dq", "dk", "dv")):
        ref = grads["ref"][i]
        err = (grads["course"][i].float() - ref).abs().max().item()
        row[what] = {"err": err, "budget": _budget(grads["sdpa"][i], ref, dtype)}
    row["kernels"] = names
    row["gluon_forward"] = GLUON_FWD in names
    row["gluon_backward"] = GLUON_BWD in names
    row["ok"] = all(row[w]["err"] <= row[w]["budget"] for w in ("out", "dq", "dk", "dv"))
    return row


def inner(out_path: str) -> int:
    import torch

    import course_kernels as ck
    from course_kernels.bench.speed import environment
    from course_kernels.gluon import gluon_available

    site = os.environ["PYTHONPATH"]
    record = {"environment": environment(), "course_kernels_file": ck.__file__,
              "installed_from_wheel": ck.__file__.startswith(os.path.join(site, ""))}  # fmt: skip
    record["environment"]["command"] = " ".join(sys.argv)
    if not torch.cuda.is_available():  # installed and imported; the calls need a GPU
        record.update(ok=False, error="no CUDA GPU here: the calls this script checks need one")
        with open(out_path, "w") as f:
            json.dump(record, f, indent=1)
        print(record["error"], file=sys.stderr)
        return 2
    hopper = torch.cuda.get_device_capability() == (9, 0)
    record.update(gluon_available=gluon_available(), hopper=hopper)
    rows = [_case(ck, torch, *c) for c in CASES]
    # the tl kernel when asked for
    os.environ["COURSE_KERNELS_FORWARD"] = "triton"
    q = torch.randn(2, 16, 4096, 128, device="cuda", dtype=torch.float16)
    forced = _kernels(lambda: ck.flash_attention(q, q, q, causal=True))
    del os.environ["COURSE_KERNELS_FORWARD"]
    record["forced_triton_kernels"] = forced
    compiled = torch.compile(lambda a: ck.flash_attention(a, a, a, causal=True), fullgraph=True)
    diff = (compiled(q).float() - ck.flash_attention(q, q, q, causal=True).float()).abs().max()
    record["compile_max_diff"] = diff.item()
    checks = {
        "installed from the wheel": record["installed_from_wheel"],
        "every case within flash-attn's rule": all(r["ok"] for r in rows),
        "Gluon forward and backward on Hopper": not hopper
        or all(r["gluon_forward"] and r["gluon_backward"] for r in rows),
        "tl forward when forced": TL_FWD in forced and GLUON_FWD not in forced,
        "torch.compile equals eager": record["compile_max_diff"] == 0,
    }
    record.update(rows=rows, checks=checks, ok=all(checks.values()))
    with open(out_path, "w") as f:
        json.dump(record, f, indent=1)
    for name, good in checks.items():
        print(("ok   " if good else "FAIL ") + name)
    for r in rows:
        print(r["d"], r["causal"], r["dtype"], {w: round(r[w]["err"] / r[w]["budget"], 3)
              for w in ("out", "dq", "dk", "dv")}, r["gluon_forward"], r["gluon_backward"])  # fmt: skip
    return 0 if record["ok"] else 1


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--wheel", help="the wheel file (a glob is expanded); required unless --inner")
    p.add_argument("--out", required=True, help="folder for wheel_check.json")
    p.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.inner:
        return inner(args.out)
    wheels = sorted(glob.glob(args.wheel or ""))
    if len(wheels) != 1:
        p.error(f"--wheel must name exactly one wheel file; {args.wheel!r} matched {wheels}")
    os.makedirs(args.out, exist_ok=True)
    site, work = tempfile.mkdtemp(), tempfile.mkdtemp()
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--target"]
    subprocess.run([*pip, site, wheels[0]], check=True)
    env = {**os.environ, "PYTHONPATH": site}
    out = os.path.join(os.path.abspath(args.out), "wheel_check.json")
    script = os.path.abspath(__file__)
    return subprocess.run(
        [sys.executable, script, "--inner", "--out", out], cwd=work, env=env
    ).returncode


if __name__ == "__main__":
    sys.exit(main())
