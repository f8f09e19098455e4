#!/usr/bin/env bash
# The Hopper session of issue 14 in one device call (run from the repo root, $OUT set):
#   GPU tests, the final benchmark with Triton's tutorial, two more N = 1K runs, host overhead,
#   compiled-kernel metadata per config, and the lever A/B (experiments/hopper/hopper_levers.py).
# COURSE_KERNELS_TUTORIAL must name a copy of python/tutorials/06-fused-attention.py (it is not
# part of this repository; see course_kernels.bench.load_tutorial). Step limits keep the whole
# call under 600 s; a step that runs out still leaves its partial JSON. At most 8 files come back
# from $OUT, so the CSV / PNG views of bench.json are regenerated from it afterwards.
set -uo pipefail
OUT="${OUT:-/tmp/hopper_out}"
W=/tmp/hopper_work
mkdir -p "$OUT" "$W"
export PYTHONPATH="${PYTHONPATH:-.}" PYTHONUNBUFFERED=1 MPLBACKEND=Agg
exec > >(tee -a "$OUT/log.txt") 2>&1
step() { echo "== $(date -u +%FT%TZ) $*"; }

step "GPU tests"
OUT="$W" TEST_LIMIT="${TEST_LIMIT:-120}" scripts/gpu_session.sh check tests >/dev/null 2>&1
tail -40 "$W/log.txt"
cp "$W/h200_test_record.json" "$OUT/" 2>/dev/null

step "benchmark (flash, sdpa-flash, sdpa-cudnn, tutorial)"
timeout "${BENCH_LIMIT:-240}" python3 experiments/hopper/hopper_levers.py bench --out "$W/bench" \
  --dtypes float16,bfloat16
echo "bench rc=$?"
cp "$W/bench/bench.json" "$OUT/bench.json"

step "N = 1024, two more runs"
timeout "${N1K_LIMIT:-55}" python3 experiments/hopper/hopper_levers.py n1k --out "$W" --repeats 2 \
  --dtypes float16,bfloat16 >/dev/null
echo "n1k rc=$?"
cp "$W/n1024_repeats.json" "$OUT/" 2>/dev/null || python3 - "$W" "$OUT" <<'PY'
import glob, json, os, sys
runs = [json.load(open(p))["results"] for p in sorted(glob.glob(os.path.join(sys.argv[1], "n1k_run*", "bench.json")))]
json.dump({"partial": True, "runs": runs}, open(os.path.join(sys.argv[2], "n1024_repeats.json"), "w"))
PY

step "host overhead"
timeout "${OVERHEAD_LIMIT:-40}" python3 experiments/hopper/hopper_levers.py overhead --out "$OUT"
echo "overhead rc=$?"

step "config metadata"
timeout "${META_LIMIT:-45}" python3 experiments/hopper/hopper_levers.py meta --out "$OUT" | tail -5
echo "meta rc=$?"

step "levers"
timeout "${LEVERS_LIMIT:-70}" python3 experiments/hopper/hopper_levers.py levers --out "$OUT" --n 8192
echo "levers rc=$?"
step done
ls -la "$OUT"
