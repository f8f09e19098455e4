"""Summarise Nsight Compute CSVs (``ncu --csv --page details``) into one JSON record: for each
kernel launch in each file, the numbers the Below Triton chapter reads (duration, elapsed and
SM-active cycles, the SM-active share, issue and eligibility per scheduler, L2 throughput,
registers, block size). ncu's own warnings before the CSV header are skipped.

    python experiments/gluon/ncu_summary.py --out course_kernels/data/gluon/NAME.json \\
        --env RECORD.json --command "what produced the CSVs" ROW=FILE.csv [ROW=FILE.csv ...]

ROW names the launch's shape (e.g. ``128,full,4096``); ``--env`` takes GPU, versions and date
from a JSON record of the same device session (any file with ``gpu`` and ``date`` keys)."""

from __future__ import annotations

import argparse
import csv
import io
import json
from pathlib import Path

# CSV metric name -> key in the summary
METRICS = {
    "Duration": "duration_ns",
    "Elapsed Cycles": "elapsed_cycles",
    "SM Active Cycles": "sm_active_cycles",
    "Compute (SM) Throughput": "sm_throughput_pct",
    "L2 Cache Throughput": "l2_throughput_pct",
    "DRAM Throughput": "dram_throughput_pct",
    "Issued Warp Per Scheduler": "issued_warp_per_scheduler",
    "Eligible Warps Per Scheduler": "eligible_warps_per_scheduler",
    "Warp Cycles Per Issued Instruction": "warp_cycles_per_issued_instruction",
    "Registers Per Thread": "registers_per_thread",
    "Block Size": "block_size",
    "Grid Size": "grid_size",
    "Achieved Active Warps Per SM": "active_warps_per_sm",
    "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active": "tensor_pipe_pct",
    "Executed Instructions": "executed_instructions",  # --section InstructionStats (session 38)
    "No Eligible": "no_eligible_pct",
}


def read_launches(text: str) -> list[dict]:
    """The launches of one ncu CSV, in order: {"kernel": name, metric key: float, ...} with
    ``sm_active_fraction`` = SM active cycles / elapsed cycles. ValueError if there is no CSV
    header or a launch lacks the cycles."""
    start = text.find('"ID"')
    if start < 0:
        raise ValueError('no ncu CSV header ("ID", ...) in the text')
    launches: dict[str, dict] = {}
    for row in csv.DictReader(io.StringIO(text[start:])):
        name = METRICS.get(row.get("Metric Name", ""))
        if name is None:
            continue
        rec = launches.setdefault(row["ID"], {"kernel": row["Kernel Name"]})
        rec[name] = float(row["Metric Value"].replace(",", ""))
    out = []
    for rec in launches.values():
        if "elapsed_cycles" not in rec or "sm_active_cycles" not in rec:
            raise ValueError(f"launch of {rec['kernel']!r} lacks elapsed or SM active cycles")
        rec["sm_active_fraction"] = round(rec["sm_active_cycles"] / rec["elapsed_cycles"], 4)
        out.append(rec)
    return out


def summarise(rows: dict[str, str]) -> list[dict]:
    """{row label: CSV text} -> one entry per launch, labelled with its row."""
    return [dict(row=label, **rec) for label, text in rows.items() for rec in read_launches(text)]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="the JSON file to write")
    ap.add_argument("--env", required=True, help="a JSON record of the same device session")
    ap.add_argument("--command", required=True, help="the command that produced the CSVs")
    ap.add_argument("--date", help="when the CSVs were taken (default: the --env record's date)")
    ap.add_argument("rows", nargs="+", help="ROW=FILE.csv pairs (ROW: the launch's shape)")
    args = ap.parse_args(argv)
    pairs = [r.split("=", 1) for r in args.rows]
    if any(len(p) != 2 for p in pairs):
        ap.error("each row is ROW=FILE.csv")
    env = json.loads(Path(args.env).read_text())
    keys = ("gpu", "capability", "torch", "triton", "cuda", "cudnn", "date")
    meta = {k: env[k] for k in keys if k in env}
    meta.update(command=args.command, files=[f for _, f in pairs])
    if args.date:
        meta["date"] = args.date
    rows = summarise({label: Path(f).read_text() for label, f in pairs})
    with open(args.out, "w") as f:
        json.dump(dict(meta=meta, launches=rows), f, indent=1)
    for r in rows:
        print(f"{r['row']:18s} {r['kernel'][:40]:40s} {r['duration_ns'] / 1e3:9.1f} us  "
              f"SM active {100 * r['sm_active_fraction']:.1f}%")  # fmt: skip
    return rows


if __name__ == "__main__":
    main()
