#!/usr/bin/env bash
# The "Applications" chapter's GPU runs, in one script. Usage, from the repository root:
#
#   OUT=/some/dir scripts/gpu_apps.sh [train] [context] [decode] [paged]   (default: all four)
#
# Each step is `python -m course_kernels apps STEP --out $OUT` (course_kernels/apps/runs.py says what
# each measures) under its own time limit. Results (JSON, each with GPU, versions, date and
# command): $OUT/gpt_train.json, $OUT/gpt_context.json, $OUT/decode_bench.json, $OUT/paged_decode_bench.json and
# $OUT/log.txt; copy the JSON files into course_kernels/data/apps/ for the book. Expected
# runtime on one H200: ~1-2 min train, ~3-5 min context (the flash kernel autotunes once per new
# length), ~1 min decode, ~2 min paged.
set -uo pipefail
OUT="${OUT:-course_kernels/data/apps}"
mkdir -p "$OUT"
export PYTHONPATH="${PYTHONPATH:-.}" PYTHONUNBUFFERED=1 MPLBACKEND=Agg
PY="${PY:-python3}"
STEPS="${*:-train context decode paged}"
exec > >(tee -a "$OUT/log.txt") 2>&1
echo "== $(date -u +%FT%TZ) scripts/gpu_apps.sh $STEPS"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true

for step in $STEPS; do
  echo "== $step"
  timeout "${STEP_LIMIT:-540}" "$PY" -m course_kernels apps "$step" --out "$OUT"
  echo "$step rc=$?"
done
