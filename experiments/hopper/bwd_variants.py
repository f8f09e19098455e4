"""Tail peeling in the single-loop dK/dV kernel against its siblings and Flex (one GPU run).

notes/kernel.md, "Session 9": the dK/dV and dQ kernels can put bounds masks only on the block
that can cross a sequence's end (``PEEL``, a constexpr of ``_attn_bwd_dkdv`` and ``_attn_bwd_dq``,
off in the package's launch until this run). ``ONE_LOOP`` (dK/dV kernel, on in the package's
launch) runs one loop with the mask decided per block instead of three loops, whose hand-over of
the dK/dV accumulators made ptxas serialise every wgmma (warning C7515); with ``PEEL`` that loop
stops before the block crossing Nq, which runs after it as straight-line code. Variants: "masked"
(three loops, every load masked: session 8, the bitwise reference), "one_loop" (the package's
dK/dV kernel today), "even_one_loop" (``EVEN_BLOCKS``, divisible lengths only) and
"one_loop_peel" (both kernels peeled). The script forces each config (no autotuning), launches
both backward kernels directly, checks the gradients against "masked" bit for bit, and reads
each kernel's GPU time from ``torch.profiler``
(``varlen_diag.kernel_times``); FlexAttention's compiled backward on the same mask, in the same
process (built as ``scripts/gpu_features.py`` builds it), gives the ratio.

Rows (fp16, H x d = 2048), at d = 128 and 64: ``doc`` 6 causal documents in 16,384 tokens
(varlen, the features benchmark's split: every length a multiple of 1024), ``window`` a 1K
causal window and ``causal`` dense causal at B = 4, N = 8192, ``docr`` 6 documents whose lengths
are not multiples of 16 (the same split moved by a few tokens; Flex gets the same documents).

    python experiments/hopper/bwd_variants.py --out $OUT/bwd_variants.json     # H200, < 150 s
    python experiments/hopper/bwd_variants.py --cpu-smoke --out /tmp/v.json    # interpreter
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("COURSE_KERNELS_AUTOTUNE", "0")  # configs are forced here

CASES = ("doc128", "doc64", "docr128", "causal128", "window128", "docr64", "causal64", "window64")
RAGGED = (-37, 61, -5, 29, -77, 29)  # docr: the documents' lengths moved (the total kept)
# (BLOCK_M1, BLOCK_N1, warps, stages) per case: the H200 autotuner's choice, and the 2-stage tile
# that won on the documents when forced (lever 16, h200_bwd_configs.json).
DKDV_TILES = {
    "doc128": [(64, 128, 8, 2), (64, 128, 8, 3)],
    "window128": [(64, 128, 8, 3)],
    "causal128": [(64, 128, 8, 3)],
    "doc64": [(64, 128, 8, 3)],
    "window64": [(64, 128, 8, 3)],
    "causal64": [(64, 128, 8, 3)],
    "docr128": [(64, 128, 8, 3)],
    "docr64": [(64, 128, 8, 3)],
}
DQ_TILE = (64, 128, 8, 3)  # (BLOCK_N2, BLOCK_M2, warps, stages), chosen on every row
CPU_DKDV, CPU_DQ = (16, 32, 4, 1), (16, 32, 4, 1)  # the interpreter's tiles (configs.py)
SWITCHES = {  # over OFF; the first is the bitwise reference; EVEN_BLOCKS only where it holds
    "masked": {},
    "one_loop": {"ONE_LOOP": True},
    "even_one_loop": {"EVEN_BLOCKS": True, "ONE_LOOP": True},
    "one_loop_peel": {"ONE_LOOP": True, "PEEL": True},
}


def _lengths(case: str, smoke: bool) -> list[int]:
    """Sequence lengths of one row: the 6 documents, or B = 4 dense sequences."""
    if smoke:
        if case.startswith("docr"):
            return [37, 16, 61, 14]  # the tails of both loops and of programs' own blocks
        return [64, 32, 96] if case.startswith("doc") else [64]
    if case.startswith("doc"):
        from varlen_diag import _features

        lengths = _features().doc_lengths()
        if case.startswith("docr"):
            lengths = [n + r for n, r in zip(lengths, RAGGED, strict=True)]
        return lengths
    return [8192] * 4


def make_case(case: str, smoke: bool, device: str, dtype, seed: int = 0):
    """(q, k, v, do, variant, varlen) in the layout the kernels take: packed (T, H, d) with
    cu_seqlens for the documents, (B, H, N, d) otherwise."""
    import torch

    from course_kernels.triton.masks import Variant

    d = 16 if smoke else int("".join(ch for ch in case if ch.isdigit()))
    heads = 2 if smoke else 2048 // d
    lengths = _lengths(case, smoke)
    g = torch.Generator().manual_seed(seed)
    if case.startswith("doc"):
        shape = (sum(lengths), heads, d)
        cu = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32, device=device)
        varlen = (cu, cu, max(lengths), max(lengths))
    else:
        shape, varlen = (len(lengths), heads, lengths[0], d), None
    q, k, v, do = (torch.randn(shape, generator=g).to(device, dtype) for _ in range(4))
    window = (15 if smoke else 1023, 0) if case.startswith("window") else (-1, -1)
    return q, k, v, do, Variant(causal=True, window=window), varlen


def divisible(case_tensors, tiles) -> bool:
    """Every sequence's length is a multiple of every block of the tiles (no tail step runs:
    what EVEN_BLOCKS promises the kernels; recorded in the rows)."""
    q, _k, _v, _do, _variant, varlen = case_tensors
    lengths = [q.shape[2]] if varlen is None else (varlen[0][1:] - varlen[0][:-1]).tolist()
    blocks = {b for tile in tiles for b in tile[:2]}
    return all(n % b == 0 for n in lengths for b in blocks)


def prepare(case_tensors):
    """The forward (package kernels) and the backward's launch plans: what ``_backward_c`` has
    before it launches."""
    from course_kernels.triton import launch

    q, k, v, do, variant, varlen = case_tensors
    scale = q.shape[-1] ** -0.5
    o, lse_c = launch._forward_c(q, k, v, variant, scale, None, varlen)
    _c, dq_plan, dkdv_plan = launch._bwd_plans(q, k, lse_c, variant, scale, None, varlen)
    return o, lse_c, dq_plan, dkdv_plan


OFF = {"EVEN_BLOCKS": False, "ONE_LOOP": False, "PEEL": False}  # here every switch is asked


def backward(case_tensors, prep, dkdv_tile, dq_tile, switches: dict):
    """dq, dk, dv from the two kernels with forced tiles and the given switches (the launch
    ``_backward_c`` makes, minus the autotuner; ``{}``: three loops, all masked)."""
    import torch

    q, k, v, do, _variant, varlen = case_tensors
    o, lse_c, dq_plan, dkdv_plan = prep
    delta, dq = torch.empty_like(lse_c), torch.empty_like(q)
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    cu = (lse_c, lse_c) if varlen is None else varlen[:2]
    m1, n1, w1, s1 = dkdv_tile
    n2, m2, w2, s2 = dq_tile
    cfg2 = {"BLOCK_N2": n2, "BLOCK_M2": m2}
    cfg1 = {"BLOCK_M1": m1, "BLOCK_N1": n1}

    def flags(plan):  # the plan's constexprs, then OFF and the switches this kernel takes
        names = plan.kernel.fn.arg_names
        return {k: v for k, v in {**plan.constexprs, **OFF, **switches}.items() if k in names}

    dq_plan.kernel.fn[dq_plan.grid_fn(cfg2)](
        q, k, v, do, o, lse_c, delta, dq, *cu, lse_c, *dq_plan.scalars,
        **flags(dq_plan), **cfg2, num_warps=w2, num_stages=s2,
    )  # fmt: skip
    dkdv_plan.kernel.fn[dkdv_plan.grid_fn(cfg1)](
        q, k, v, do, lse_c, delta, dk, dv, dq, *cu, lse_c, *dkdv_plan.scalars,
        **flags(dkdv_plan), **cfg1, num_warps=w1, num_stages=s1,
    )  # fmt: skip
    return dq, dk, dv


def max_diffs(got, want) -> dict:
    return {
        name: float((a.float() - b.float()).abs().max())
        for name, a, b in zip(("dq", "dk", "dv"), got, want, strict=True)
    }


def flex_backward(case: str, case_tensors):
    """FlexAttention's compiled backward on the row's mask (``scripts/gpu_features.py``'s
    ``make_fn``): a function running one backward, grads reset (no accumulation kernels)."""
    from varlen_diag import _features

    q, k, v, do, _variant, varlen = case_tensors
    feat = _features()
    if varlen is not None:  # packed (T, H, d) -> (1, H, T, d), as the features benchmark does
        lengths = (varlen[0][1:] - varlen[0][:-1]).tolist()
        feat.doc_lengths = lambda *_a: lengths  # make_fn's documents: this row's (docr)
        q, k, v, do = (x.transpose(0, 1).unsqueeze(0).contiguous() for x in (q, k, v, do))
    mask = "document" if case.startswith("doc") else case.rstrip("0123456789")
    n = q.shape[2]
    row = {"mask": mask, "provider": "flex", "n": n}
    q, k, v = (x.detach().requires_grad_() for x in (q, k, v))
    out = feat.make_fn(row, argparse.Namespace(window=1024), q, k, v)()

    def run():
        q.grad = k.grad = v.grad = None
        out.backward(do, retain_graph=True)

    return run


def course_rows(case, case_tensors, smoke, add):
    """Every variant per tile; times (GPU, per kernel) and diffs against "masked"."""
    from varlen_diag import kernel_times

    prep = prepare(case_tensors)
    tiles = [CPU_DKDV] if smoke else DKDV_TILES[case]
    dq_tile = CPU_DQ if smoke else DQ_TILE
    even = divisible(case_tensors, [*tiles, dq_tile])
    ref_name, ref_sw = next(iter(SWITCHES.items()))
    for tile in tiles:
        want = backward(case_tensors, prep, tile, dq_tile, ref_sw)
        for name, sw in SWITCHES.items():
            if sw.get("EVEN_BLOCKS") and not even:
                continue  # its promise does not hold: it would read past the sequences
            got = want if name == ref_name else backward(case_tensors, prep, tile, dq_tile, sw)
            row = dict(case=case, variant=name, dkdv_tile=tile, dq_tile=dq_tile, divisible=even)
            row[f"max_abs_diff_vs_{ref_name}"] = max_diffs(got, want)
            row["bitwise_equal"] = all(bool((a == b).all()) for a, b in zip(got, want, strict=True))
            if not smoke:
                us = kernel_times(lambda t=tile, s=sw: backward(case_tensors, prep, t, dq_tile, s))
                row["us"] = us
                if isinstance(us, dict) and "error" not in us:
                    for kern in ("dkdv", "dq"):
                        row[f"{kern}_us"] = sum(
                            t for k, t in us.items() if k.startswith(f"_attn_bwd_{kern}")
                        )
                    row["bwd_kernels_us"] = row["dkdv_us"] + row["dq_us"]
            add(**row)


def summary(rows) -> list[dict]:
    """Per case and tile: each variant's kernel times over "masked", "one_loop_peel" over
    "one_loop" (the launch's today), and FlexAttention over each."""
    flex = {r["case"]: r.get("bwd_kernels_us") for r in rows if r.get("variant") == "flex"}
    by = {(r["case"], tuple(r["dkdv_tile"]), r["variant"]): r for r in rows if "dkdv_us" in r}
    out = []
    for (case, tile, variant), r in by.items():
        masked, one = by.get((case, tile, "masked")), by.get((case, tile, "one_loop"))
        if variant == "masked" or masked is None:
            continue
        row = {"case": case, "dkdv_tile": list(tile), "variant": variant}
        row["bitwise_equal"] = r["bitwise_equal"]
        for k in ("dkdv_us", "dq_us", "bwd_kernels_us"):
            row[f"{k[:-3]}_over_masked"] = round(r[k] / masked[k], 3)
            if variant == "one_loop_peel" and one is not None:
                row[f"{k[:-3]}_over_one_loop"] = round(r[k] / one[k], 3)
        if flex.get(case):
            row["flex_over_this"] = round(flex[case] / r["bwd_kernels_us"], 3)
        out.append(row)
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="bwd_variants.json", help="JSON file to write")
    p.add_argument("--cases", nargs="+", default=list(CASES), choices=CASES)
    p.add_argument("--cpu-smoke", action="store_true", help="tiny shapes in the interpreter")
    p.add_argument("--no-flex", action="store_true", help="skip FlexAttention")
    p.add_argument("--budget-s", type=float, default=150.0, help="start no row after this")
    args = p.parse_args(argv)

    import torch

    from course_kernels.bench import environment

    smoke = args.cpu_smoke
    device = "cpu" if smoke else "cuda"
    dtype = torch.float32 if smoke else torch.float16
    env = environment()
    env["command"] = " ".join([os.path.basename(sys.executable), *sys.argv])
    record = {"environment": env, "switches": SWITCHES, "rows": []}
    t0 = time.time()

    def add(**row):
        row["t_s"] = round(time.time() - t0, 1)
        record["rows"].append(row)
        print(json.dumps(row), flush=True)
        Path(args.out).write_text(json.dumps(record, indent=1))

    for case in args.cases:
        if time.time() - t0 > args.budget_s:
            add(case=case, status=f"skipped: past --budget-s {args.budget_s}")
            continue
        tensors = make_case(case, smoke, device, dtype)
        try:
            course_rows(case, tensors, smoke, add)
        except Exception as e:  # noqa: BLE001 - out of resources etc.: record it, go on
            add(case=case, status=f"error: {e!r}"[:400])
            if smoke:
                raise
        if smoke or args.no_flex:
            continue
        if time.time() - t0 > args.budget_s:
            add(case=case, variant="flex", status=f"skipped: past --budget-s {args.budget_s}")
            continue
        try:
            from varlen_diag import kernel_times

            us = kernel_times(flex_backward(case, tensors))
            total = sum(us.values()) if "error" not in us else None
            add(case=case, variant="flex", us=us, bwd_kernels_us=total)
        except Exception as e:  # noqa: BLE001
            add(case=case, variant="flex", status=f"error: {e!r}"[:400])
    record["summary"] = summary(record["rows"])
    Path(args.out).write_text(json.dumps(record, indent=1))
    for row in record["summary"]:
        print(json.dumps(row), flush=True)
    return record


if __name__ == "__main__":
    main()
