"""The variants benchmark read back: the course kernel against FlexAttention and ``varlen_attn``.

Chapter: "Serving: KV cache, paged attention, chunked prefill" (the section on score and mask
hooks). The records are written on a GPU by ``scripts/gpu_features.py --part bench`` (one JSON:
``environment`` with GPU, versions, date, command and whether autotuning was on; ``args``; one
row per mask, d, N, provider and pass with its TFLOP/s). This module only reads them: plain
Python, no torch.

The speed targets of issue 22 are ratios of TFLOP/s (course / other, the same FLOP count for
both, so the inverse ratio of times): at least :data:`TARGET` against FlexAttention for the causal,
sliding-window and document masks, forward and backward, and at least :data:`TARGET` against
PyTorch's ``varlen_attn``. :func:`verdict` writes what the chapter says about them, every
condition computed from the rows, so the prose cannot contradict the data.
"""

from __future__ import annotations

TARGET = 1.1  # issue 22: course / FlexAttention (and / varlen_attn) TFLOP/s, every row
MASKS = ("causal", "window", "document")
PASSES = ("fwd", "bwd")
OTHERS = ("flex", "varlen_attn")


def comparisons(record: dict, other: str) -> list[dict]:
    """One dict per (mask, d, N, pass) that both the course and ``other`` measured:
    ``{mask, d, n, pass, course, other, ratio}`` (TFLOP/s; ratio = course / other), in the
    order mask (causal, window, document), d, N, pass (fwd, bwd). Skipped rows are left out."""
    tflops = {
        (r["mask"], r["d"], r["n"], r["provider"], r["pass"]): r["tflops"]
        for r in record["rows"]
        if r.get("status") == "ok" and r.get("tflops")
    }
    out = []
    for mask, d, n, provider, pass_ in sorted(tflops, key=_order):
        if provider != "course" or (mask, d, n, other, pass_) not in tflops:
            continue
        course, theirs = tflops[(mask, d, n, provider, pass_)], tflops[(mask, d, n, other, pass_)]
        out.append(
            {"mask": mask, "d": d, "n": n, "pass": pass_, "course": course, "other": theirs}
            | {"ratio": course / theirs}
        )
    return out


def worst_of(records: list[dict], other: str) -> list[dict]:
    """The worst process of each row: :func:`comparisons` of several records of the same set
    (fresh processes), one dict per (mask, d, N, pass) that *every* record measured, taken from
    the record where the course's ratio to ``other`` is lowest, with ``runs``, the number of
    records. A row that some process skipped is left out: it has no worst of all of them."""
    if not records:
        raise ValueError("worst_of needs at least one record")
    per = [{(r["mask"], r["d"], r["n"], r["pass"]): r for r in comparisons(rec, other)}
           for rec in records]  # fmt: skip
    return [
        min((p[key] for p in per), key=lambda r: r["ratio"]) | {"runs": len(records)}
        for key in per[0]
        if all(key in p for p in per)
    ]


def _order(key):
    mask, d, n, provider, pass_ = key
    return (MASKS.index(mask) if mask in MASKS else len(MASKS), d, n, provider, PASSES.index(pass_))


def count_met(rows: list[dict], target: float = TARGET, **where) -> tuple[int, int]:
    """(rows with ratio >= target, rows) among ``rows`` matching ``where`` (e.g. pass_="bwd")."""
    sel = [r for r in rows if all(r[k.rstrip("_")] == v for k, v in where.items())]
    return sum(r["ratio"] >= target for r in sel), len(sel)


def ratio_range(rows: list[dict], **where) -> tuple[float, float] | None:
    """(least, greatest) ratio among the rows matching ``where``; None if there are none."""
    sel = [r["ratio"] for r in rows if all(r[k.rstrip("_")] == v for k, v in where.items())]
    return (min(sel), max(sel)) if sel else None


def provenance(record: dict) -> str:
    """GPU, versions, date, autotuning and the command of a record, in one line."""
    env = record["environment"]
    tune = "on" if env.get("autotune") else "off"
    return (
        f"{env['gpu']}, torch {env['torch']}, Triton {env['triton']}, {env['dtype']}, "
        f"{env['date'][:10]}, autotuning {tune}; command: {env['command']}"
    )


def _span(rng) -> str:
    lo, hi = rng
    return f"{lo:.2f}x" if f"{lo:.2f}" == f"{hi:.2f}" else f"{lo:.2f}x to {hi:.2f}x"


def _met(met: int, total: int) -> str:
    if total == 0:
        return "not measured"
    return "**met**" if met == total else f"**not met** ({met} of {total} rows)"


def _case(r: dict) -> str:
    return (
        f"{r['mask']} d = {r['d']} N = {r['n']:,} {'forward' if r['pass'] == 'fwd' else 'backward'}"
    )


def verdict(main: dict, tuned: dict | None = None, target: float = TARGET) -> str:
    """What the chapter says about issue 22's speed targets, from the records (Markdown bullets).

    ``main``: the record of every mask at d = 64 and 128; ``tuned``: an optional rerun of some
    rows with autotuning on. Every clause is conditioned on the numbers: a target is called met
    only if every measured row reaches it, and each reason is stated only where the data show it
    (autotuning off, the d = 128 backward, the backward below FlexAttention).
    """
    flex, var = comparisons(main, "flex"), comparisons(main, "varlen_attn")
    ds = " and ".join(str(d) for d in sorted({r["d"] for r in flex}))
    parts = [
        f"{name} {_met(*count_met(flex, target, pass_=p))}"
        for p, name in (("fwd", "forward"), ("bwd", "backward"))
    ]
    out = [
        f"- **At least {target:g}x FlexAttention** ({', '.join(MASKS)} masks, d = {ds}): "
        + "; ".join(parts)
        + "."
    ]
    reached = [_case(r) for r in flex if r["ratio"] >= target]
    if reached and len(reached) < len(flex):
        out.append(f"  Rows that reach it: {', '.join(reached)}.")
    doc = [r for r in var if r["mask"] == "document"]
    out.append(
        f"- **At least {target:g}x `varlen_attn`** on the packed batches (document rows): "
        f"{_met(*count_met(doc, target))}; over every mask: {_met(*count_met(var, target))}."
    )
    why = []
    if not main["environment"].get("autotune"):
        why.append(
            "The main record ran with autotuning off: one default configuration per kernel at "
            "every head dim (the backward's default tile spills registers at d = 128, "
            "`course_kernels/triton/configs.py`)."
        )
    spans = [
        f"{_span(rng)} at d = {d}"
        for d in sorted({r["d"] for r in flex})
        if (rng := ratio_range(flex, d=d, pass_="bwd"))
    ]
    if spans:
        why.append(f"Backward over FlexAttention's backward: {', '.join(spans)}.")
    t = comparisons(tuned, "flex") if tuned is not None else []
    if t:
        shape = ", ".join(sorted({f"d = {r['d']}, N = {r['n']:,}" for r in t}))
        cases = ", ".join(
            f"{r['mask']} {'forward' if r['pass'] == 'fwd' else 'backward'} {r['ratio']:.2f}x"
            for r in t
        )
        met, total = count_met(t, target)
        why.append(
            f"With autotuning on ({shape}): {cases} of FlexAttention; {met} of {total} rows "
            f"reach {target:g}x."
        )
        rerun = {r["mask"] for r in t}
        missing = [m for m in MASKS if m not in rerun]
        if missing:
            why.append(f"The {' and '.join(missing)} rows were not rerun with autotuning.")
    bwd = [r for r in flex + t if r["pass"] == "bwd"]
    if bwd and all(r["ratio"] < 1 for r in bwd):
        why.append(
            "Every backward row, tuned or not, is below FlexAttention's backward: the backward "
            "kernels, not only their configuration, are behind."
        )
    if why:
        out.append("- **Why:**")
        out += [f"  - {w}" for w in why]
    return "\n".join(out)
