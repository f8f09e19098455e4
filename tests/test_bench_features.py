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
