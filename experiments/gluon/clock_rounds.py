"""The card's clock during each timed round: reads a ``scripts/gpu_features.py`` record (its rows'
``rounds_at``, each round's wall-clock start and end) beside the ``nvidia-smi`` log written next
to it (``NAME.clocks.csv``: timestamp, SM clock, power, temperature every 250 ms; step
``window_passes`` of ``scripts/gpu_session.sh``) and prints, for each row, its median round and
the median SM clock, power and temperature of the samples inside its rounds (session 33: is the
course's backward slower after its forward because the clock drops?):

    python experiments/gluon/clock_rounds.py OUT/window_passes_*_run*.json --out clocks.json

nvidia-smi writes the machine's local time; ``--offset-s`` is added to it (0 when the machine
runs in UTC, as the lent ones do). A row none of whose rounds holds a sample is reported as
such, not given a clock."""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import statistics
from pathlib import Path


def read_clocks(path: Path, offset_s: float = 0.0) -> list[tuple[float, float, float, float]]:
    """(epoch seconds, SM MHz, watts, degrees C) for each sample of an ``nvidia-smi --format=csv``
    log; lines that are not samples (the header, a unit-less error line) are skipped."""
    out = []
    with path.open(newline="") as fh:
        for rec in csv.reader(fh):
            try:
                stamp = datetime.datetime.strptime(rec[0].strip(), "%Y/%m/%d %H:%M:%S.%f")
                mhz, watts, temp = (float(x.strip().split()[0]) for x in rec[1:4])
            except (ValueError, IndexError):
                continue
            t = stamp.replace(tzinfo=datetime.timezone.utc).timestamp() + offset_s
            out.append((t, mhz, watts, temp))
    return out


def row_clocks(record: dict, samples: list[tuple[float, float, float, float]]) -> list[dict]:
    """For each timed row of ``record``: provider, pass, mask, d, n, its ms, and the median SM
    clock, power and temperature of the samples inside any of its rounds (None if none)."""
    out = []
    for row in record["rows"]:
        spans = row.get("rounds_at")
        if row.get("status") != "ok" or not spans:
            continue
        inside = [s for s in samples if any(a <= s[0] <= b for a, b in spans)]
        meds = [round(statistics.median(s[i] for s in inside), 1) if inside else None
                for i in (1, 2, 3)]  # fmt: skip
        out.append({
            **{k: row[k] for k in ("provider", "pass", "mask", "d", "n", "ms")},
            "samples": len(inside), **dict(zip(("sm_mhz", "watts", "temp_c"), meds, strict=True)),
        })  # fmt: skip
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("records", nargs="+", type=Path, help="gpu_features.py JSON files")
    ap.add_argument("--offset-s", type=float, default=0.0, help="added to nvidia-smi's times")
    ap.add_argument("--out", type=Path, help="write every file's rows here as JSON")
    args = ap.parse_args(argv)
    result = {}
    for path in args.records:
        record = json.loads(path.read_text())
        log = path.with_suffix(".clocks.csv")
        if not log.exists():
            raise SystemExit(f"{path}: no clock log beside it ({log.name})")
        rows = row_clocks(record, read_clocks(log, args.offset_s))
        result[path.name] = {"command": record["environment"]["command"], "rows": rows}
        print(path.name)
        for r in rows:
            clock = "no sample"
            if r["sm_mhz"] is not None:
                clock = f"{r['sm_mhz']:.0f} MHz {r['watts']:.0f} W {r['temp_c']:.0f} C"
            print(f"  {r['provider']:>6} {r['pass']} {r['mask']} d={r['d']} N={r['n']}: "
                  f"{r['ms']:.4f} ms, {clock}")  # fmt: skip
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
