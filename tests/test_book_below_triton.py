"""The chapter "Below Triton" (book/part2/below_triton.ipynb) states a few verdicts in words
around its glued numbers: the lever ladder's rungs 1 and 2 ran an unverified kernel, a static
persistent grid was slower, the dynamic scheduler (rung 5) won and is the default, the Gluon
forward does not reach cuDNN in every row. These tests hold each verdict
to the committed data (course_kernels/data/gluon/), so new measurements that change a verdict
fail here instead of leaving a stale sentence in the book."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import nbformat

from course_kernels.datafiles import data_path, load_json

ROOT = Path(__file__).resolve().parents[1]
CHAPTER = ROOT / "book" / "part2" / "below_triton.ipynb"


def _prose() -> str:
    nb = nbformat.read(CHAPTER, as_version=4)
    return "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")


def _main():
    rows = {}
    for r in load_json("gluon/h200_gluon_forward.json")["main"]:
        rows.setdefault((r["dtype"], r["d"], r["N"], r["causal"]), {})[r["provider"]] = r
    return rows


def test_main_table_is_complete_and_its_ratios_agree():
    rows = _main()
    assert len(rows) == 24
    for key, by in rows.items():
        assert set(by) == {"gluon-fa3", "sdpa-cudnn", "sdpa-flash"}, key
        g, c = by["gluon-fa3"], by["sdpa-cudnn"]
        assert abs(g["tflops"] / c["tflops"] - g["ratio_vs_cudnn"]) < 1e-9


def test_the_chapter_says_the_goal_is_missed_while_a_row_is_below_cudnn():
    ratios = [by["gluon-fa3"]["ratio_vs_cudnn"] for by in _main().values()]
    assert min(ratios) < 1.0
    assert "is not reached" in _prose()


def test_every_check_behind_the_table_passed():
    checks = load_json("gluon/h200_gluon_forward.json")["checks"]
    assert checks and all(c["ok"] for c in checks)
    assert all(c["cfg"] == "{}" for c in checks)  # the default configurations the table times


def test_persistence_was_slower_with_the_causal_mask():
    lev = {
        (r["provider"], r["d"], r["causal"]): r["tflops"]
        for r in load_json("gluon/h200_gluon_levers.json")["levers"]
    }
    for d in (64, 128):
        assert lev[("L4 + persistent", d, True)] < lev[("L3 + intra-WG overlap", d, True)]
    assert "persistence, measured slower" in _prose()


def test_rungs_one_and_two_ran_the_serial_step_and_the_chapter_says_so():
    # experiments/gluon/bench_forward.py's LEVERS: (name, overrides, description)
    tree = ast.parse((ROOT / "experiments" / "gluon" / "bench_forward.py").read_text())
    node = next(
        n
        for n in tree.body
        if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "LEVERS"
    )
    overlap = {}
    for item in node.value.elts:
        name = ast.literal_eval(item.elts[0])
        kw = {k.arg: ast.literal_eval(k.value) for k in item.elts[1].keywords}
        overlap[name] = kw["OVERLAP"]
    assert overlap == {
        "L1 ws 1 consumer": False,
        "L2 ws 2 consumers": False,
        "L3 + intra-WG overlap": True,
        "L4 + persistent": True,
    }
    assert "unverified" in _prose() and "The open bug" in _prose()


def test_the_profile_has_both_kernels_tensor_pipe():
    text = data_path("gluon/h200_gluon_ncu.txt").read_text()
    pct = re.findall(r"sm__pipe_tensor_op_hmma_cycles_active\S*\s+%\s+([\d.]+)", text)
    assert len(pct) == 2 and "cudnn" in text


# ---------------------------------------------- rung 5: the dynamic persistent scheduler
def _session7():
    return load_json("gluon/h200_session7_levers.json")


def _code() -> str:
    nb = nbformat.read(CHAPTER, as_version=4)
    return "\n".join(c.source for c in nb.cells if c.cell_type == "code")


def test_the_dynamic_scheduler_is_the_default_and_the_chapter_says_so():
    from course_kernels.gluon import launch

    assert all(cfg["DYNAMIC"] for cfg in launch.DEFAULT_CONFIG.values())
    prose = _prose()
    assert "Rung 5: a dynamic scheduler, now the default" in prose
    for stale in ("persistence is off", "kept off", "off in every default"):
        assert stale not in prose, stale


def test_the_dynamic_scheduler_won_in_its_run_and_every_check_passed():
    run = _session7()
    assert run["checks"] and all(c["ok"] for c in run["checks"])
    assert {c["variant"] for c in run["checks"]} == {"dynamic", "lpt_grid", "dynamic_lpt"}
    rows = run["rows"]
    wins = sum(r["tflops"]["dynamic"] >= r["tflops"]["default"] for r in rows)
    assert wins > len(rows) / 2  # "it won", the reason it is the default
    # its "default" variant is the configuration before the change: one CTA per tile
    assert not any(
        cfg["DYNAMIC"] or cfg["persistent"] for cfg in run["meta"]["default_config"].values()
    )
    # some rows stay below cuDNN with it: the chapter must not claim the goal is reached
    assert min(r["ratio_vs_cudnn"]["dynamic"] for r in rows) < 1.0
    assert "is not reached" in _prose()


def test_the_dynamic_table_is_computed_from_the_file():
    run = _session7()
    for r in run["rows"]:
        for v, t in r["tflops"].items():
            if v != "cudnn":
                assert abs(t / r["tflops"]["cudnn"] - r["ratio_vs_cudnn"][v]) < 1e-9
        assert {"default", "dynamic"} <= set(r["ratio_vs_cudnn"])
        assert r["causal"] or "lpt_grid" not in r["ratio_vs_cudnn"]
    code = _code()
    assert 'load_json("gluon/h200_session7_levers.json")' in code
    assert re.search(r"md_table\(\[\"shape\", \*VARIANTS\.values\(\)\],\s+\[\[row_name\(r\)", code)
    assert "for r in rows7])" in code and 'rows7 = s7["rows"]' in code


def test_the_main_table_is_labelled_as_the_one_cta_per_tile_kernel():
    meta = load_json("gluon/h200_gluon_forward.json")["meta"]
    assert not any(
        cfg.get("DYNAMIC") or cfg["persistent"] for cfg in meta["default_config"].values()
    )
    assert "its Gluon forward is the one-CTA-per-tile kernel" in _prose()


def test_the_scheduler_listings_show_package_code():
    from course_kernels import colab

    code = _code()
    for name in (
        "gluon.producer",
        "gluon.publish_tile",
        "gluon.read_tile",
        "gluon.retire_scheduler",
    ):
        assert f'show("{name}")' in code, name
        assert colab.LISTINGS[name][0].startswith("course_kernels.gluon.")
    assert "gl.atomic_xchg(sched_ptr, 0)" in colab.listing("gluon.retire_scheduler")


# ---------------------------------------------- ping-pong turns (PINGPONG), session 12
def test_pingpong_is_the_default_where_it_won_and_the_chapter_says_so():
    from course_kernels.gluon import launch

    def gains(rows):
        return [r["ms"]["default"] / r["ms"]["pingpong"] - 1 for r in rows]

    full = load_json("gluon/h200_pingpong_full.json")["rows"]
    causal = load_json("gluon/h200_pingpong_causal.json")["rows"]
    rep = [r for w in load_json("gluon/h200_pingpong_full64.json")["runs"] for r in w["rows"]]
    assert len(rep) == 18 and all(r["d"] == 64 for r in rep)
    assert min(gains(rep)) > 0 and min(gains([r for r in full if r["d"] == 64])) > 0
    assert max(gains([r for r in full + causal if r["d"] == 128])) < 0
    assert max(gains([r for r in causal if r["d"] == 64])) < 0
    assert launch.NONCAUSAL_CONFIG[64].get("PINGPONG") is True
    assert not launch.NONCAUSAL_CONFIG[128].get("PINGPONG")
    assert not any(c.get("PINGPONG") for c in launch.CAUSAL_CONFIG.values())
    prose = _prose()
    assert "## Ping-pong: the consumers take turns" in prose
    assert "unmeasured" not in prose and "not yet run on a GPU" not in prose


# ---------------------------------------------- the backward's dQ by a TMA reduce-add (DQ_TMA)
def test_dq_tma_won_in_every_row_is_the_default_and_the_chapter_says_so():
    from course_kernels.gluon import backward_launch as GB
    from course_kernels.triton import launch

    run = load_json("gluon/h200_gluon_backward_session12_dqtma.json")
    assert run["checks"] and all(c["ok"] for c in run["checks"])
    t = {(r["provider"], r["d"], r["causal"]): r for r in run["times"]}
    rows = [(d, c) for d in (64, 128) for c in (False, True)]
    for d, c in rows:  # DQ_TMA faster than the atomics in every row
        assert t[("gluon dq_tma", d, c)]["tflops"] > t[("gluon default", d, c)]["tflops"]
    for c in (False, True):  # with OVERLAP_DQ it lost at d = 128
        assert t[("gluon dq_tma_overlap", 128, c)]["tflops"] < t[("gluon dq_tma", 128, c)]["tflops"]
    for d in (64, 128):  # the default wherever it applies: both head dims
        assert GB._check_config(d, {})["DQ_TMA"] is True
    assert GB.BACKWARD_OVERLAP_DQ == {64: True, 128: False}
    assert launch.GLUON_BACKWARD_AUTO == (64, 128)
    # still below the 0.9x cuDNN goal in some row: the chapter must say it is not met
    assert min(t[("gluon dq_tma", d, c)]["ratio_vs_cudnn"] for d, c in rows) < 0.9
    prose = _prose()
    assert "### $dQ$ through a TMA reduce-add (`DQ_TMA`)" in prose
    assert "**The backward at cuDNN's speed.**" in prose
    assert "dedicated $dQ$ writer warp are not written" in prose
    # GQA (session 19, timed in session 20): the chapter says auto takes it exactly when it does
    assert "### Grouped-query attention in the backward" in prose
    said = "so `auto` now takes it for GQA calls" in prose
    assert said is (launch.GLUON_BACKWARD_GQA is True)
    gqa = load_json("gluon/h100_gqa_backward_session20.json")
    assert all(r["gluon_over_tl"] >= 1.03 for r in gqa["rows"]) is launch.GLUON_BACKWARD_GQA
    assert "has not run on a GPU, so `auto` keeps the `tl` backward" not in prose
    for stale in ("does not offer\non Hopper", "the `tl` backward was faster)", "only at $d$ ="):
        assert stale not in prose, stale
    code = _code()
    assert 'load_json("gluon/h200_gluon_backward_session12_dqtma.json")' in code
    assert 'show("gluon.tma_reduce_add")' in code and 'show("gluon.bwd_dq_tma")' in code


# ---------------------------------------------- the backward's hot loop first (MASKED_LAST)
def test_masked_last_won_in_every_row_is_the_default_and_the_chapter_says_so():
    from course_kernels.gluon import backward_launch as GB

    spills = load_json("gluon/sm90_backward_loop_spills.json")["configs"]
    hot = {}  # (causal, masked_last) -> local loads of the unmasked loops (no mask selects)
    for c in spills:
        cfg = c["config"]
        if cfg["d"] == 128 and cfg.get("dt") == "fp16" and not cfg["OVERLAP_DQ"]:
            key = (cfg["CAUSAL"], cfg.get("MASKED_LAST", False))
            hot[key] = [L["LDL"] for L in c["loops"] if L["FSEL"] == 0]
    assert all(min(hot[(c, False)]) > 0 and max(hot[(c, True)]) == 0 for c in (False, True))
    gains = []
    for name in ("h200_gluon_backward_session13.json", "h200_gluon_backward_session13_repeat.json"):
        run = load_json("gluon/" + name)
        assert run["checks"] and all(c["ok"] for c in run["checks"])
        t = {(r["provider"], r["d"], r["N"], r["causal"]): r["ms"] for r in run["times"]}
        gains += [t[("gluon default",) + k[1:]] / ms - 1 for k, ms in t.items()
                  if k[0] == "gluon masked_last"]  # fmt: skip
    assert len(gains) == 16 and min(gains) > 0
    for d in (64, 128):
        assert GB._check_config(d, {})["MASKED_LAST"] is True
        assert GB._check_config(d, {})["DV_EARLY"] is False
    prose = _prose()
    assert "### The hot loop first (`MASKED_LAST`)" in prose
    assert "*Decision.* `MASKED_LAST` is the default at both head dimensions" in prose
    code = _code()
    assert 'show("gluon.bwd_runs")' in code
    assert 'load_json("gluon/h200_gluon_backward_session13_repeat.json")' in code
