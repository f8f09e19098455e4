"""Reports of a benchmark run: the ratio table (CSV and Markdown) and the TFLOP/s figure.

Split from :mod:`course_kernels.bench` (which re-exports these names).
"""

from __future__ import annotations

import csv
import math

from .providers import PROVIDERS, PROVIDER_LABELS


def write_ratios(path, env, rows):
    """:func:`ratio_table` as CSV, headed by the run's GPU, versions, date and command."""
    with open(path, "w", newline="") as f:
        f.write(
            f"# flash / sdpa TFLOP/s ratios; {env['gpu']}; torch {env['torch']}; "
            f"triton {env['triton']}; {env['date']}; {env['command']}\n"
        )
        fields = [
            "dtype",
            "d",
            "N",
            "causal",
            "mode",
            "flash",
            "vs_sdpa_flash",
            "vs_sdpa_cudnn",
            "vs_tutorial",
        ]
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(ratio_table(rows))


def ratio_table(rows) -> list[dict]:
    """flash / sdpa-flash and flash / sdpa-cudnn TFLOP/s per shape."""
    by = {}
    for r in rows:
        if r.get("mode") in ("fwd", "bwd"):
            by[(r["dtype"], r["d"], r["N"], r["causal"], r["mode"], r["provider"])] = r["tflops"]
    table = []
    for (dt, d, n, c, mode, p), t in sorted(by.items(), key=lambda kv: kv[0][:5]):
        if p != "flash":
            continue
        fa2 = by.get((dt, d, n, c, mode, "sdpa-flash"))
        cud = by.get((dt, d, n, c, mode, "sdpa-cudnn"))
        tut = by.get((dt, d, n, c, mode, "tutorial"))
        table.append(
            {
                "dtype": dt,
                "d": d,
                "N": n,
                "causal": c,
                "mode": mode,
                "flash": t,
                "vs_sdpa_flash": t / fa2 if fa2 else math.nan,
                "vs_sdpa_cudnn": t / cud if cud else math.nan,
                "vs_tutorial": t / tut if tut else math.nan,
            }
        )
    return table


def format_ratio_table(rows) -> str:
    lines = [
        "| dtype | d | N | causal | mode | flash TFLOP/s | / sdpa-flash | / sdpa-cudnn |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in ratio_table(rows):
        lines.append(
            f"| {r['dtype']} | {r['d']} | {r['N']} | {'yes' if r['causal'] else 'no'} | "
            f"{r['mode']} | {r['flash']:.0f} | {r['vs_sdpa_flash']:.2f} | "
            f"{r['vs_sdpa_cudnn']:.2f} |"
        )
    return "\n".join(lines)


def plot_bench(rows, path, env):
    """TFLOP/s vs N per (dtype, d, causal, mode) panel, saved to ``path``; returns the Figure.

    Uses matplotlib's object API (no pyplot), so it neither needs nor changes the backend of a
    notebook that calls it. Each provider keeps one colour in every panel.
    """
    from matplotlib.figure import Figure

    keys = sorted(
        {
            (r["dtype"], r["d"], r["causal"], r["mode"])
            for r in rows
            if r.get("mode") in ("fwd", "bwd")
        }
    )
    ncol = 4
    nrow = max(1, math.ceil(len(keys) / ncol))
    fig = Figure(figsize=(4.2 * ncol, 3.2 * nrow))
    axes = fig.subplots(nrow, ncol, squeeze=False)
    for ax, key in zip(axes.flat, keys, strict=False):  # the grid may have spare axes
        dt, d, causal, mode = key
        for p in PROVIDERS:
            pts = sorted(
                (r["N"], r["tflops"])
                for r in rows
                if r.get("mode") == mode
                and r["provider"] == p
                and (r["dtype"], r["d"], r["causal"]) == key[:3]
            )
            if pts:
                ax.plot(
                    *zip(*pts, strict=True),
                    marker="o",
                    color=f"C{PROVIDERS.index(p)}",
                    label=PROVIDER_LABELS.get(p, p),
                )
        ax.set_xscale("log", base=2)
        ax.set_title(f"{dt} d={d} {'causal' if causal else 'full'} {mode}", fontsize=9)
        ax.set_xlabel("N")
        ax.set_ylabel("TFLOP/s")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(keys) :]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.suptitle(f"{env['gpu']}, torch {env['torch']}, Triton {env['triton']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return fig
