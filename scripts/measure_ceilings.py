"""Measure the roofline ceilings (device copy bandwidth, fp16 matmul FLOP/s) and write them as JSON.

    python scripts/measure_ceilings.py --out course_kernels/data/hardware/h200_ceilings.json   # on the GPU

This is how ``course_kernels.hardware.H200_MEASURED`` is (re)measured: the JSON records the GPU,
software versions, date and this command next to the two numbers, and
``hardware.ceilings_from_record`` reads it back. ``--device cpu --small`` runs the same code on a
CPU at tiny sizes (for testing the script; the numbers mean nothing).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", required=True, help="JSON file to write")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--matmul-n", type=int, default=8192)
    ap.add_argument("--copy-mib", type=int, default=1024)
    ap.add_argument("--small", action="store_true", help="tiny sizes (testing on a CPU)")
    args = ap.parse_args(argv)
    from course_kernels import hardware
    from course_kernels.bench import environment

    n, copy_bytes = (64, 2**16) if args.small else (args.matmul_n, args.copy_mib * 2**20)
    ceilings = hardware.measure_ceilings(args.device, matmul_n=n, copy_bytes=copy_bytes)
    env = environment()
    env["command"] = " ".join(
        ["python", "scripts/measure_ceilings.py", *(argv if argv is not None else sys.argv[1:])]
    )
    record = {"environment": env, "ceilings": ceilings}
    hardware.ceilings_from_record(record)  # the file must read back
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(
        f"copy {ceilings['copy_bandwidth'] / 1e12:.3f} TB/s, fp16 matmul "
        f"{ceilings['fp16_matmul_flops'] / 1e12:.1f} TFLOP/s ({env['gpu']}) -> {out}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
