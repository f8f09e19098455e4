"""``course_kernels.bench.features``: the variants benchmark (course vs FlexAttention and
``varlen_attn``) read back for the Serving chapter. The chapter's verdict on the speed targets is
computed from the rows; these tests check it on the committed H200 records and on synthetic
records where the answer flips, so the prose cannot contradict the data.
"""

from __future__ import annotations

import copy

import pytest

from course_kernels.bench import features
from course_kernels.datafiles import load_json

MAIN = "bench/h200_features_bench_autotune.json"  # autotuning on, as users run it
UNTUNED = "bench/h200_features_bench.json"  # the same set with autotuning off


@pytest.fixture(scope="module")
def main():
    return load_json(MAIN)


@pytest.fixture(scope="module")
def untuned():
    return load_json(UNTUNED)


def test_records_name_their_provenance(main, untuned):
    for rec in (main, untuned):
        env = rec["environment"]
        assert env["gpu"] and env["torch"] and env["triton"] and env["date"] and env["command"]
        line = features.provenance(rec)
        assert env["gpu"] in line and env["command"] in line and env["date"][:10] in line
    assert main["environment"]["autotune"] is True and untuned["environment"]["autotune"] is False
    assert "autotuning on" in features.provenance(main)
    assert "autotuning off" in features.provenance(untuned)


@pytest.mark.parametrize("other", features.OTHERS)
def test_comparisons_match_the_ratios_the_run_recorded(main, other):
    rows = features.comparisons(main, other)
    recorded = {k: v for k, v in main["course_over_other"].items() if k.endswith(f" vs {other}")}
    assert len(rows) == len(recorded) == 28  # 3 masks x 2 d x (3 N, or 1 for documents) x 2
    for r in rows:
        key = f"{r['mask']} d={r['d']} N={r['n']} {r['pass']} vs {other}"
        assert round(r["ratio"], 3) == pytest.approx(recorded[key], abs=1.5e-3)
        assert r["ratio"] == r["course"] / r["other"]
    order = [(features.MASKS.index(r["mask"]), r["d"], r["n"]) for r in rows]
    assert order == sorted(order)


def test_skipped_rows_are_left_out(main):
    rec = copy.deepcopy(main)
    for r in rec["rows"]:
        if r["provider"] == "flex" and r["mask"] == "window":
            r["status"] = "skipped: past --budget-s 1"
    rows = features.comparisons(rec, "flex")
    assert rows and all(r["mask"] != "window" for r in rows)


def test_count_met_by_brute_force(main):
    rows = features.comparisons(main, "flex")
    for p in features.PASSES:
        sel = [r for r in rows if r["pass"] == p]
        assert features.count_met(rows, pass_=p) == (
            sum(r["ratio"] >= features.TARGET for r in sel),
            len(sel),
        )
    assert features.ratio_range(rows, d=999) is None


def test_verdict_on_the_h200_records_says_not_met(main, untuned):
    text = features.verdict(main)
    flex = features.comparisons(main, "flex")
    fwd_met, fwd_n = features.count_met(flex, pass_="fwd")
    bwd_met, bwd_n = features.count_met(flex, pass_="bwd")
    assert fwd_met < fwd_n and bwd_met < bwd_n  # what the committed data show
    assert f"forward **not met** ({fwd_met} of {fwd_n} rows)" in text
    assert f"backward **not met** ({bwd_met} of {bwd_n} rows)" in text
    assert "autotuning off" not in text  # the main record was tuned
    every_bwd_below = all(r["ratio"] < 1 for r in flex if r["pass"] == "bwd")
    assert ("Every backward row, tuned or not, is below" in text) == every_bwd_below
    assert "autotuning off" in features.verdict(untuned)  # the reason, only where it applies
    # The untuned record as the main one, the tuned one as a rerun of its rows.
    text = features.verdict(untuned, main)
    assert "With autotuning on" in text and "not rerun" not in text


def _scaled(record, factor, provider="course", pass_=None):
    rec = copy.deepcopy(record)
    for r in rec["rows"]:
        if r["provider"] == provider and (pass_ is None or r["pass"] == pass_):
            r["tflops"] *= factor
    return rec


def test_verdict_says_met_when_every_row_reaches_the_target(main):
    fast = _scaled(main, 10.0)
    fast["environment"] = {**fast["environment"], "autotune": True}
    text = features.verdict(fast)
    assert "not met" not in text and text.count("**met**") == 4
    assert "autotuning off" not in text and "below FlexAttention" not in text
    assert "Rows that reach it" not in text  # all of them do


def test_verdict_follows_the_backward(main):
    """A backward at or above Flex drops the 'backward behind' reason; a slow forward alone keeps
    the target unmet."""
    text = features.verdict(_scaled(main, 4.0, pass_="bwd"))
    assert "Every backward row" not in text and "backward **met**" in text
    assert "forward **not met**" in text


# -- from a mutation audit: synthetic records whose verdict is known by hand ----------------------
def _rec(ratios, autotune=True, other="flex", d=64, n=1024):
    """A record with course TFLOP/s = ratio x 10 against ``other`` at 10, per (mask, pass)."""
    rows = []
    for (mask, pass_), ratio in ratios.items():
        for provider, t in (("course", 10.0 * ratio), (other, 10.0)):
            rows.append({"mask": mask, "d": d, "n": n, "provider": provider, "pass": pass_,
                         "tflops": t, "status": "ok"})  # fmt: skip
    env = {"gpu": "G", "torch": "t", "triton": "tr", "dtype": "float16", "date": "2026-02-03T04",
           "command": "c", "autotune": autotune}  # fmt: skip
    return {"environment": env, "rows": rows}


def test_target_is_issue_22s_and_named_in_the_verdict():
    assert features.TARGET == 1.1
    text = features.verdict(_rec({("causal", "fwd"): 2.0}))
    assert text.startswith(
        "- **At least 1.1x FlexAttention** (causal, window, document masks, d = 64)"
    )


def test_comparisons_put_forward_before_backward():
    rows = features.comparisons(_rec({("causal", "bwd"): 1.0, ("causal", "fwd"): 2.0}), "flex")
    assert [r["pass"] for r in rows] == ["fwd", "bwd"]


def test_a_ratio_exactly_at_the_target_meets_it():
    rows = features.comparisons(_rec({("causal", "fwd"): 1.1}), "flex")
    assert rows[0]["ratio"] == 1.1 and features.count_met(rows) == (1, 1)
    assert "forward **met**" in features.verdict(_rec({("causal", "fwd"): 1.1}))


def test_ratio_range_is_least_to_greatest():
    rows = features.comparisons(_rec({("causal", "fwd"): 1.5, ("window", "fwd"): 0.5}), "flex")
    assert features.ratio_range(rows) == (0.5, 1.5)


def test_provenance_without_an_autotune_key_says_off():
    rec = _rec({})
    del rec["environment"]["autotune"]
    assert features.provenance(rec) == (
        "G, torch t, Triton tr, float16, 2026-02-03, autotuning off; command: c"
    )


def test_verdict_clauses_on_a_synthetic_record():
    ratios = {
        ("causal", "fwd"): 1.2,
        ("causal", "bwd"): 0.5,
        ("window", "fwd"): 0.9,
        ("window", "bwd"): 0.55,
    }
    text = features.verdict(_rec(ratios, autotune=False))
    assert "forward **not met** (1 of 2 rows); backward **not met** (0 of 2 rows)." in text
    assert "Rows that reach it: causal d = 64 N = 1,024 forward." in text
    # no varlen_attn rows at all: nothing measured, nothing met
    assert "(document rows): not measured; over every mask: not measured." in text
    assert "The main record ran with autotuning off" in text
    assert "Backward over FlexAttention's backward: 0.50x to 0.55x at d = 64." in text
    assert "Every backward row, tuned or not, is below" in text


def test_verdict_on_varlen_counts_document_rows_apart():
    ratios = {("document", "fwd"): 1.5, ("causal", "fwd"): 0.5, ("window", "fwd"): 0.5}
    var = _rec(ratios, other="varlen_attn")
    flex = _rec({("causal", "fwd"): 2.0})
    rec = {"environment": flex["environment"], "rows": flex["rows"] + var["rows"]}
    text = features.verdict(rec)
    assert "(document rows): **met**; over every mask: **not met** (1 of 3 rows)." in text


def test_verdict_span_of_two_close_ratios_is_a_range():
    text = features.verdict(_rec({("causal", "bwd"): 1.23, ("window", "bwd"): 1.25}))
    assert "1.23x to 1.25x at d = 64" in text


def test_verdict_with_a_tuned_rerun():
    main = _rec({("causal", "fwd"): 1.0, ("causal", "bwd"): 0.5}, autotune=False)
    tuned = _rec({("causal", "fwd"): 1.234, ("causal", "bwd"): 1.3})
    text = features.verdict(main, tuned, target=1.25)
    assert "At least 1.25x FlexAttention" in text
    assert (
        "With autotuning on (d = 64, N = 1,024): causal forward 1.23x, causal backward 1.30x of "
        "FlexAttention; 1 of 2 rows reach 1.25x." in text
    )
    assert "The window and document rows were not rerun with autotuning." in text
    assert "Every backward row" not in text  # the tuned backward is above FlexAttention's


def test_worst_of_takes_each_rows_lowest_ratio_from_its_own_process():
    a = _rec({("causal", "fwd"): 1.3, ("causal", "bwd"): 1.05, ("window", "fwd"): 1.2})
    b = _rec({("causal", "fwd"): 1.15, ("causal", "bwd"): 1.4, ("window", "fwd"): 1.25})
    rows = features.worst_of([a, b], "flex")
    got = {(r["mask"], r["pass"]): r["ratio"] for r in rows}
    assert got == pytest.approx({("causal", "fwd"): 1.15, ("causal", "bwd"): 1.05,
                                 ("window", "fwd"): 1.2})  # fmt: skip
    assert all(r["runs"] == 2 for r in rows)
    # each row keeps the TFLOP/s of the process it came from, not a mix of processes
    causal_fwd = next(r for r in rows if (r["mask"], r["pass"]) == ("causal", "fwd"))
    assert causal_fwd["course"] == pytest.approx(11.5) and causal_fwd["other"] == 10.0
    # the order is comparisons' order, and a record alone is its own worst
    assert [(r["mask"], r["pass"]) for r in rows] == [("causal", "fwd"), ("causal", "bwd"),
                                                      ("window", "fwd")]  # fmt: skip
    assert [r["ratio"] for r in features.worst_of([a], "flex")] == [
        r["ratio"] for r in features.comparisons(a, "flex")]  # fmt: skip


def test_worst_of_leaves_out_a_row_some_process_skipped_and_refuses_no_records():
    a = _rec({("causal", "fwd"): 1.3, ("window", "bwd"): 1.2})
    b = _rec({("causal", "fwd"): 1.4})
    assert [(r["mask"], r["pass"]) for r in features.worst_of([a, b], "flex")] == [
        ("causal", "fwd")]  # fmt: skip
    with pytest.raises(ValueError, match="at least one record"):
        features.worst_of([], "flex")


def test_worst_of_on_the_h100_steady_state_processes():
    recs = [load_json(f"bench/h100_features_bench_session35_steady_run{r}.json") for r in (1, 2, 3)]
    rows = features.worst_of(recs, "flex")
    assert len(rows) == 28  # the whole set: 3 masks, d = 64 and 128, fwd and bwd
    each = [{(r["mask"], r["d"], r["n"], r["pass"]): r["ratio"] for r in features.comparisons(
        rec, "flex")} for rec in recs]  # fmt: skip
    for r in rows:
        assert r["ratio"] == min(e[(r["mask"], r["d"], r["n"], r["pass"])] for e in each)
