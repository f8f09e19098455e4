"""Issue 23's measure from interleaved records: for each row, the kernel's ratio to cuDNN in each
fresh process (cuDNN's median round over the kernel's) and the worst of them, from the JSON files
of ``sweep_forward.py`` (forward) or ``bench_section.py`` (backward) run with a ``cudnn``
variant, one file a process (``scripts/gpu_session.sh fwd_vs_cudnn`` / ``gluon_bwd``). Prints
the table and writes it as JSON with the records' GPU, versions, dates and commands:

    python experiments/gluon/worst_of_three.py --goal 1.0 --out table.json RUN1.json RUN2.json ...

``--variant KEY=V`` reads another timed variant of the same records as the kernel (session 37:
``PACK_P=1`` beside the default and cuDNN in the same rounds). A row missing from a process
(skipped or failed there) is reported as incomplete, not dropped
from the count; records from different GPUs are refused."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def ratios(
    records: list[dict], baseline: str = "0", variant: str = "0"
) -> dict[tuple, list[float]]:
    """(dtype, mask, d, n) -> the kernel (``variant``; the baseline by default) over cuDNN in
    each record that timed the row: a speedup is baseline time / that variant's time, so the
    ratio is speedup[variant] / speedup[cudnn] (median rounds). ValueError if the records come
    from different GPUs, or a row lacks a cuDNN variant or ``variant``."""
    gpus = {r.get("gpu") for r in records}
    if len(gpus) != 1:
        raise ValueError(f"records from more than one GPU: {sorted(map(str, gpus))}")
    out: dict[tuple, list[float]] = {}
    for rec in records:
        for row in rec["rows"]:
            if row.get("status") != "ok":
                continue
            speed = row["speedup"]
            if "cudnn" not in speed or speed.get(baseline) != 1.0:
                raise ValueError(f"row {row.get('mask')} d={row.get('d')} has no cudnn variant")
            if variant not in speed:
                raise ValueError(f"row {row.get('mask')} d={row.get('d')} has no {variant} variant")
            key = (row["dtype"], row["mask"], row["d"], row["n"])
            out.setdefault(key, []).append(speed[variant] / speed["cudnn"])
    return out


def table(records: list[dict], goal: float, variant: str = "0") -> dict:
    """Per row: each process's ratio, the worst, whether it reaches ``goal`` and whether every
    record timed it; and the count of rows at the goal among the complete ones."""
    per = ratios(records, variant=variant)
    rows = []
    for key in sorted(per, key=lambda k: (k[2], k[1] != "full", k[3], k[0])):
        xs = per[key]
        dt, mask, d, n = key
        rows.append(dict(dtype=dt, mask=mask, d=d, n=n, ratios=[round(x, 4) for x in xs],
                         worst=round(min(xs), 4), at_goal=min(xs) >= goal,
                         complete=len(xs) == len(records)))  # fmt: skip
    done = [r for r in rows if r["complete"]]
    return dict(goal=goal, processes=len(records), rows=rows,
                at_goal=sum(r["at_goal"] for r in done), complete_rows=len(done))  # fmt: skip


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", help="one JSON record a process (and dtype)")
    ap.add_argument("--goal", type=float, default=1.0, help="the target ratio to cuDNN")
    ap.add_argument("--out", help="write the table here as JSON")
    ap.add_argument("--variant", default="0", help="the timed variant read as the kernel ('0': "
                    "the default schedule; e.g. PACK_P=1)")  # fmt: skip
    args = ap.parse_args(argv)
    records = [json.loads(Path(f).read_text()) for f in args.files]
    by_dtype: dict[str, list] = {}
    for rec, f in zip(records, args.files, strict=True):
        dtypes = {row["dtype"] for row in rec["rows"]}
        if len(dtypes) != 1:
            raise SystemExit(f"{f}: one dtype a record expected, found {sorted(dtypes)}")
        by_dtype.setdefault(dtypes.pop(), []).append(rec)
    # each process timed one dtype: the worst of three is over the records of that dtype
    result = dict(sources=[dict(file=f, gpu=r.get("gpu"), date=r.get("date"), triton=r.get("triton"),
                                torch=r.get("torch"), cudnn=r.get("cudnn"), command=r.get("command"))
                           for f, r in zip(args.files, records, strict=True)],  # fmt: skip
                  variant=args.variant,
                  tables={dt: table(recs, args.goal, args.variant)
                          for dt, recs in by_dtype.items()})  # fmt: skip
    for dt, t in result["tables"].items():
        print(f"{dt}: {t['at_goal']} of {t['complete_rows']} complete rows >= {t['goal']}x cuDNN "
              f"in the worst of {t['processes']}")  # fmt: skip
        for r in t["rows"]:
            flag = "" if r["complete"] else "  (incomplete)"
            print(
                f"  {r['mask']:7s} d={r['d']:<4} N={r['n']:<6} worst {r['worst']:.3f}  "
                + " / ".join(f"{x:.3f}" for x in r["ratios"])
                + flag
            )
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
