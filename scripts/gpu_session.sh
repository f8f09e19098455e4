#!/usr/bin/env bash
# All GPU work of the Triton kernel in one run (one device call). Usage, from the repo root:
#
#   OUT=/some/dir scripts/gpu_session.sh [check] [tests] [bench] [memory] [dram]   (default: all)
#   OUT=/some/dir scripts/gpu_session.sh gluon_bwd     (Hopper: not in the default set)
#   OUT=/some/dir scripts/gpu_session.sh dq_convert d256   (Hopper, session 19's two unrun changes)
#   OUT=/some/dir scripts/gpu_session.sh gqa               (Hopper, the GQA backward against tl)
#   OUT=/some/dir scripts/gpu_session.sh persist           (Hopper, session 21's PERSIST backward)
#   TEST_K="PERSIST or persist" OUT=/some/dir scripts/gpu_session.sh tests persist   (both at once)
#   OUT=/some/dir scripts/gpu_session.sh fwd_vs_cudnn | fwd_lpt | ncu_lpt | bm128_masked | bwd_stages | zero_acc_window (23)
#   OUT=/some/dir scripts/gpu_session.sh masked_stages | docs128 | wg_mask   (24) | pdl (26)
#   OUT=/some/dir scripts/gpu_session.sh host_docs   (27: experiments/gluon/host_docs.py)
#   OUT=/some/dir scripts/gpu_session.sh fwd_defer   (29: DEFER, a head's lightest tiles last)
#   OUT=/some/dir scripts/gpu_session.sh profile_convert   (30: DQ_CONVERT, ZERO_ACC kernel by kernel)
#   OUT=/some/dir scripts/gpu_session.sh keep_acc   (31: KEEP_ACC's GPU tests, then timed, 3 processes)
#   OUT=/some/dir scripts/gpu_session.sh keep_flex  (32: the window d = 128 rows beside Flex, both ways)
#   OUT=/some/dir scripts/gpu_session.sh window_passes  (33: the same with the forward timed too)
#     WP_PASSES="bwd fwd" (34: each backward after the other provider's forward); WP_WARMUP,
#     WP_REP (do_bench ms, default 250 each since 35: each row in its own steady state; 34 used
#     10 and 40); WP_MASKS="window document" (the documents d = 128 row as well; default window);
#     WP_VARIANTS=keep (today's default only; default "keep old"); WP_LIMIT (s a process, 150)
#   OUT=/some/dir scripts/gpu_session.sh features  (34: the whole set, gpu_features.py --part bench
#     --autotune --rounds 3; FEAT_WARMUP, FEAT_REP do_bench ms (250), FEAT_LIMIT s, default 560;
#     FEAT_LIMITS="330 250": one fresh process a limit, features_bench_run{1,2}.json (39))
#   OUT=/some/dir scripts/gpu_session.sh clock_trace  (34: experiments/gluon/clock_trace.py, window
#     d = 128 at CT_NS, then documents unless CT_DOCS=""; CT_LIMIT seconds each, default 200;
#     CT_ARGS: more arguments, e.g. "--follow-ms 1000 --repeats 2")
#   OUT=/some/dir scripts/gpu_session.sh suite_candidate  (37: CANDIDATE_TESTS (the Gluon
#     forward's GPU file; tests/gpu for the whole suite) with CANDIDATE (D:KEY=V ..., default
#     "64:PACK_P=1", the default since session 38) as the causal default, versions and every
#     test's outcome in suite_candidate_log.txt (-v: names survive a cut by TEST_LIMIT, 540 s))
#   OUT=/some/dir DTYPES=float16 scripts/gpu_session.sh pack_steady  (37: PACK_P's GPU tests
#     unless PACK_TESTS=0, then PACK_P, the default and cuDNN on the 24 rows in 250/250 ms rounds
#     (BENCH_WARMUP / BENCH_REP), three processes a dtype of DTYPES; STEADY_LIMIT (s, 130);
#     STEADY_VARIANTS ("0 PACK_P=0 cudnn": the default (PACK_P at d = 64 causal since session 38)
#     beside it off; session 37 ran "0 PACK_P=1 cudnn"); pack_steady_table_{variant}.json)
#   OUT=/some/dir DTYPES=float16 scripts/gpu_session.sh lazy  (38: LAZY's GPU tests unless
#     LAZY_TESTS=0, then LAZY=1 beside the default and cuDNN at LAZY_DIMS (128), causal and full,
#     N = 4K-16K, 250/250 ms rounds, three processes a dtype; LAZY_LIMIT s a process (105))
#   OUT=/some/dir scripts/gpu_session.sh pack_p  (36: PACK_P's GPU tests, then PACK_P beside the
#     forward's default and cuDNN, causal and full, d = 64 and 128, PACK_NS (4096 8192 16384),
#     three processes a dtype; PACK_MASKS, PACK_DIMS, PACK_LIMIT (s a process, 90) narrow it;
#     BENCH_WARMUP / BENCH_REP (ms) time each round longer)
#
# Results land flat in $OUT (copy them into course_kernels/data/ afterwards; more than 8 files are
# packed into $OUT/results.tgz at the end, since the device sends back 8 at most):
#   log.txt                  everything printed
#   h200_test_record.json    GPU suite outcome: GPU, versions, date, command, pass/fail counts
#   bench.json bench.csv bench.png   python -m course_kernels bench
#   memory.json              python -m course_kernels memory
#   dram_bytes.csv ncu_raw.csv       Nsight Compute DRAM bytes: naive, SDPA flash, this kernel
#   gluon_bwd_vs_cudnn_{float16,bfloat16}_run{1,2,3}.json   the Gluon backward and cuDNN's in
#                            interleaved rounds on the same inputs, three fresh processes a dtype
#                            (issue 23's "worst of three"; experiments/gluon/bench_section.py)
#   dq_convert.json          the Gluon backward with DQ_CONVERT beside its default (same inputs)
#   gluon_d256.json          the d = 256 Gluon forward: checks, then beside cuDNN and FA2
#   gluon_d256_tl.json       the same rows in a second process, with the tl kernel as well
#   gqa_backward.json        step gqa: the Gluon GQA backward beside tl and beside repeated K/V
#   persist_run{1,2,3}.json  step persist: PERSIST and DQ_CONVERT beside the default, three processes
#   fwd_sweep_{float16,bfloat16}.json   step fwd_sweep: the forward's schedule switches beside its
#                            default and cuDNN at N = 4K and 16K (experiments/gluon/sweep_forward.py)
#   ncu_fwd_{d}_{mask}_{n}.csv   step ncu_fwd: Nsight Compute on one launch each of the Gluon forward
#                            and cuDNN's at the rows that miss (N = 4K) and one that does not (16K)
#   bwd_masked_{dt}.json, bwd_bm128_on_top_{dt}.json   step bwd_masked: the backward's BM = 128 on window and
#                            documents rows at d = 64, and switches on top of dense d = 64's BM = 128
#   fwd_vs_cudnn_{dt}_run{1,2,3}.json   step fwd_vs_cudnn: the Gluon forward and cuDNN's on the 24
#                            rows (interleaved rounds, the median; three fresh processes a dtype);
#                            fwd_vs_cudnn_table.json (gluon_bwd_table.json for gluon_bwd): the worst
#                            of three per row (experiments/gluon/worst_of_three.py)
#   bm128_masked_{dt}_run{1,2,3}.json   step bm128_masked: the backward's BM = 128 against 64 on
#                            window and documents rows at d = 64, three processes a dtype
#   fwd_lpt_{dt}_run{1,2,3}.json   step fwd_lpt: causal d = 64 in LPT tile orders beside the default
#                            and cuDNN, three processes a dtype (experiments/gluon/tail_model.py)
#   ncu_lpt_{default,lpt16}.csv   step ncu_lpt: Nsight Compute on causal d = 64 4K, the default tile
#                            order and LPT in 16 MiB sections, with the tensor pipe's active share
#   zero_acc_window_{dt}_run{1,2,3}.json   step zero_acc_window: ZERO_ACC on the window d = 128 rows
#                            (issue 22's row), three processes a dtype
#   bwd_stages_{dt}_run{1,2,3}.json   step bwd_stages: STAGES = 3 on causal d = 64 (BM = 128), three
#                            processes a dtype, cuDNN beside
#   masked_stages_{dt}_run{1,2,3}.json   step masked_stages: STAGES = 3 on window / documents, d = 64
#   docs128_{dt}_run{1,2,3}.json   step docs128: SECTION = 4 and STAGES = 3 on documents at d = 128
#   wg_mask_{dt}_run{1,2,3}.json   step wg_mask: its GPU tests (printed), then WG_MASK = 1 and 2
#                            and PERSIST beside the default on window, documents and causal rows,
#                            d = 128 and 64 (WG_MASK_DIMS, _MASKS, _VARIANTS, _LIMIT, _BUDGET narrow it)
#   pdl_{dt}_run{1,2,3}.json   step pdl: its GPU tests (printed), then PDL and PDL with ZERO_ACC
#                            beside the default on the window (N = 4K, 16K) and documents rows at
#                            d = 128 (PDL_DIMS, _MASKS, _NS, _VARIANTS, _LIMIT, _BUDGET widen it)
#   fwd_defer_{dt}_run{1,2,3}.json   step fwd_defer (DEFER_NS and DEFER_VARIANTS change its rows
#                            and variants, e.g. DEFER_VARIANTS="0 DEFER=0 ROW_MASK=1 cudnn"):
#                            causal d = 64 with each head's 0, 2, 4, 6 lightest
#                            tiles deferred to the end (DEFER) beside the default (since session 29
#                            DEFER = 6 up to 22 tiles a head, so at 4K) and cuDNN, three processes a
#                            dtype (experiments/gluon/tail_model.py's prediction)
#   profile_convert.json     step profile_convert: torch.profiler's CUDA time of each kernel of one
#                            backward call, the default beside DQ_CONVERT = 1 and ZERO_ACC = 1, on
#                            the window (4K, 16K) and documents rows at d = 128 (notes, session 30),
#                            and DQ_CONVERT = 1 and 2 with KEEP_ACC = 1 (session 31)
#   keep_acc_{float16,bfloat16}_run{1,2,3}.json   step keep_acc: the default beside DQ_CONVERT =
#                            1 and 2, each with and without KEEP_ACC, window 4K/16K and documents
#                            at d = 128 (session 31)
#   keep_flex_{default,keep}_run{1,2,3}.json   step keep_flex: the window d = 128 backward beside
#                            Flex (scripts/gpu_features.py), the default and DQ_CONVERT = 2 with
#                            KEEP_ACC in alternating fresh processes (session 32)
#   window_passes_{keep,old}_run{1,2,3}.json (+ .clocks.csv: SM clock, power, temperature every
#                            250 ms)   step window_passes: keep_flex's rows with the forward timed
#                            too (WP_PASSES, default "fwd bwd"), today's default beside WINDOW_KEEP=0
#                            (session 33: why the whole-set run put the window backward ~8% slower)
#   host_docs.json           step host_docs: the documents calls' host time a step, and the first
#                            line of this package where each call waits for the GPU (if any)
# Each step has its own time limit so that a slow step still leaves the others' data.
set -uo pipefail
OUT="${OUT:-/tmp/gpu_out}"
mkdir -p "$OUT"
export PYTHONPATH="${PYTHONPATH:-.}" PYTHONUNBUFFERED=1 MPLBACKEND=Agg
PY="${PY:-python3}"
STEPS="${*:-check tests bench memory dram}"
BENCH_ARGS="${BENCH_ARGS:-}"
exec > >(tee -a "$OUT/log.txt") 2>&1
has() { [[ " $STEPS " == *" $1 "* ]]; }
# three_processes LIMIT SCRIPT TAG ARGS...: experiments/gluon/SCRIPT in three fresh processes a
# dtype (fp16, bf16), each under LIMIT seconds, writing $OUT/TAG_{dtype}_run{1,2,3}.json
three_processes() {
  local limit=$1 script=$2 tag=$3; shift 3
  for run in 1 2 3; do
    for dt in ${DTYPES:-float16 bfloat16}; do
      timeout "$limit" "$PY" "experiments/gluon/$script" --out "$OUT" --tag "${tag}_${dt}_run$run" \
        --dtype "$dt" "$@" | grep -v '^{'
    done
  done
}
# bwd_step NAME LIMIT TITLE ARGS...: if NAME was asked for, bench_section.py ARGS in three
# processes a dtype, records NAME_{dt}_run{1,2,3}.json (the one-lever backward steps below)
bwd_step() {
  local name=$1 limit=$2 title=$3; shift 3
  has "$name" || return 0
  echo "== Gluon backward: $title, 3 processes a dtype"
  three_processes "$limit" bench_section.py "$name" "$@"
}
echo "== $(date -u +%FT%TZ) steps: $STEPS"

if has check; then
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
  timeout 120 "$PY" -m course_kernels gpu-check
fi

if has tests; then
  echo "== GPU test suite (one config per kernel)"
  t0=$(date +%s)
  # xdist: compiling is CPU-bound and the suite compiles ~100 kernel variants.
  # TEST_K: a pytest -k expression (e.g. "PERSIST or persist"), to run part of the suite;
  # TEST_LIMIT: seconds (the whole suite: 131 s in session 24, over 240 s in 26, 403 s in 27)
  COURSE_KERNELS_AUTOTUNE=0 timeout "${TEST_LIMIT:-540}" "$PY" -m pytest tests/gpu -q -p no:cacheprovider \
    -n "${TEST_WORKERS:-8}" --junitxml=/tmp/junit_gpu.xml --maxfail=20 --durations=12 ${TEST_K:+-k "$TEST_K"} 2>&1 | tail -75
  echo "pytest rc=$? in $(( $(date +%s) - t0 )) s"
  "$PY" - "$OUT/h200_test_record.json" <<'EOF'
import json, os, sys, xml.etree.ElementTree as ET
from course_kernels.bench import environment
env = environment()
env["command"] = ("COURSE_KERNELS_AUTOTUNE=0 python3 -m pytest tests/gpu -q -n "
                  + os.environ.get("TEST_WORKERS", "8")
                  + (f" -k '{os.environ['TEST_K']}'" if os.environ.get("TEST_K") else "")
                  + " (scripts/gpu_session.sh tests)")
env["autotune"] = False
try:
    root = ET.parse("/tmp/junit_gpu.xml").getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    n, f, e, s = (int(suite.get(a, 0)) for a in ("tests", "failures", "errors", "skipped"))
    failed = [c.get("name") for c in suite.iter("testcase")
              if c.find("failure") is not None or c.find("error") is not None]
    rec = {**env, "tests": n, "passed": n - f - e - s, "failed": f, "errors": e, "skipped": s,
           "failed_tests": failed, "time_s": float(suite.get("time", 0))}
except Exception as exc:  # pytest timed out before writing the report
    rec = {**env, "error": f"no junit report: {exc!r}"}
json.dump(rec, open(sys.argv[1], "w"), indent=1)
print(json.dumps(rec))
EOF
fi

if has bench; then
  echo "== benchmark"
  # shellcheck disable=SC2086
  timeout "${BENCH_LIMIT:-330}" "$PY" -m course_kernels bench --out "$OUT" $BENCH_ARGS
  echo "bench rc=$?"
fi

if has memory; then
  echo "== memory"
  timeout "${MEMORY_LIMIT:-120}" "$PY" -m course_kernels memory --out "$OUT"
fi

if has dram; then
  echo "== DRAM bytes (Nsight Compute)"
  NCU="$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)"
  # One config per kernel (no autotuning under the profiler): the default (BLOCK_M, BLOCK_N) =
  # (128, 64), the config the autotuner picks for most d = 64 shapes.
  export COURSE_KERNELS_AUTOTUNE=0
  CMD="$NCU --clock-control none --profile-from-start off --metrics dram__bytes_read.sum,dram__bytes_write.sum --csv --page raw --print-units base --log-file $OUT/ncu_raw.csv $PY -m course_kernels dram run"
  echo "$CMD"
  timeout "${DRAM_LIMIT:-150}" $CMD > /tmp/dram_cases.txt
  echo "ncu rc=$?"
  unset COURSE_KERNELS_AUTOTUNE
  tail -2 /tmp/dram_cases.txt
  "$PY" -m course_kernels dram parse --ncu-csv "$OUT/ncu_raw.csv" --cases /tmp/dram_cases.txt \
    --out "$OUT/dram_bytes.csv" --command "${CMD//$OUT\//}"
fi
if has gluon_bwd; then
  echo "== Gluon backward against cuDNN, interleaved, three processes a dtype"
  three_processes "${GLUON_BWD_LIMIT:-90}" bench_section.py gluon_bwd_vs_cudnn --masks full causal \
    --dims 64 128 --sections 0 cudnn --rounds "${GLUON_BWD_ROUNDS:-5}" --budget-s 70
  "$PY" experiments/gluon/worst_of_three.py "$OUT"/gluon_bwd_vs_cudnn_*_run*.json --goal 0.9 \
    --out "$OUT/gluon_bwd_table.json"
fi
# dq_convert and d256 time session 19's unrun changes; run the "tests" step (their GPU tests) first.
if has dq_convert; then
  echo "== Gluon backward: DQ_CONVERT beside the default (checked on the same inputs, then timed)"
  timeout "${DQC_BENCH_LIMIT:-200}" "$PY" experiments/gluon/bench_section.py --out "$OUT" \
    --tag dq_convert --masks window causal full --dims 128 64 --ns 4096 16384 \
    --sections 0 DQ_CONVERT=1 --rounds 5 --budget-s 170 | grep -v '^{'
fi
if has d256; then
  echo "== Gluon forward at d = 256: float64 checks, then beside cuDNN, FA2 and the tl kernel"
  timeout "${D256_BENCH_LIMIT:-200}" "$PY" experiments/gluon/bench_forward.py --out "$OUT" \
    --tag gluon_d256 --skip-levers --quick-check --check-dims 256 --dims 256
  # a second process with the tl kernel as well (autotuned at d = 256: its own limit, its own file)
  timeout "${D256_TL_LIMIT:-240}" "$PY" experiments/gluon/bench_forward.py --out "$OUT" \
    --tag gluon_d256_tl --skip-levers --skip-check --dims 256 --with-tl
fi
if has gqa; then
  echo "== Gluon backward with GQA beside the tl backward and the repeated-K/V Gluon call"
  timeout "${GQA_BENCH_LIMIT:-240}" "$PY" experiments/gluon/bench_gqa.py --out "$OUT" \
    --tag gqa_backward --groups 4 --rounds 5 --budget-s 200
fi
# persist: run its GPU tests first (pytest tests/gpu -k "PERSIST or persist").
if has persist; then
  echo "== Gluon backward: PERSIST and DQ_CONVERT beside the default, three fresh processes"
  for run in 1 2 3; do
    timeout "${PERSIST_BENCH_LIMIT:-150}" "$PY" experiments/gluon/bench_section.py --out "$OUT" \
      --tag "persist_run$run" --masks full causal --dims 64 128 --ns 4096 8192 16384 \
      --sections 0 PERSIST=1 DQ_CONVERT=1 --rounds 5 --budget-s 130 | grep -v '^{'
  done
fi
# fwd_sweep, bwd_masked (session 22): one process a dtype each; predictions in notes/ first.
if has fwd_sweep; then
  echo "== Gluon forward: schedule switches beside the default and cuDNN (sweep_forward.py)"
  for dt in float16 bfloat16; do
    timeout "${FWD_SWEEP_LIMIT:-260}" "$PY" experiments/gluon/sweep_forward.py --out "$OUT" \
      --tag "fwd_sweep_$dt" --dtype "$dt" --masks causal full --dims 64 128 --ns 4096 16384 \
      --variants 0 cudnn NUM_CONSUMERS=2 NUM_CONSUMERS=3 STAGES=2 STAGES=3 QSTAGES=1 \
      STAGES=3+QSTAGES=1 BN=64 DYNAMIC=0 CONSUMER_REGS=216 --rounds 5 --budget-s 230 | grep -v '^{'
  done
fi
if has bwd_masked; then
  echo "== Gluon backward: BM = 128 (d = 64) and ZERO_ACC on window and documents rows; switches"
  echo "   on top of dense d = 64's BM = 128 (at d = 128 BM = 128 spills: 0.47-0.53x in session 23)"
  for dt in float16 bfloat16; do
    timeout "${BWD_MASKED_LIMIT:-150}" "$PY" experiments/gluon/bench_section.py --out "$OUT" \
      --tag "bwd_masked_$dt" --dtype "$dt" --masks window documents --dims 64 128 \
      --sections 0 BM=128 ZERO_ACC=1 ZERO_ACC=1+DQ_CONVERT=1 --rounds 5 --budget-s 120 | grep -v '^{'
    timeout "${BWD_MASKED_LIMIT:-120}" "$PY" experiments/gluon/bench_section.py --out "$OUT" \
      --tag "bwd_bm128_on_top_$dt" --dtype "$dt" --masks full causal --dims 64 --ns 4096 16384 \
      --sections 0 OVERLAP_DQ=0 DQ_VEC=4 STAGES=3 DQ_CONVERT=1 ZERO_ACC=1 cudnn --rounds 5 \
      --budget-s 90 \
      | grep -v '^{'
  done
fi
if has ncu_fwd; then
  echo "== Nsight Compute: the Gluon forward and cuDNN's, one launch each (fp16)"
  NCU="$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)"
  for row in "128 full 4096" "64 causal 4096" "128 full 16384"; do
    set -- $row
    flag=""; [ "$2" = causal ] && flag="--causal"
    timeout "${NCU_FWD_LIMIT:-90}" "$NCU" --clock-control none -k regex:'attn_fwd|fprop' \
      --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
      --section LaunchStats --section Occupancy --csv --page details \
      "$PY" experiments/gluon/ncu_forward.py --d "$1" --N "$3" $flag > "$OUT/ncu_fwd_$1_$2_$3.csv"
    echo "ncu d=$1 $2 N=$3 rc=$?"
  done
fi
# Session 23: the forward compared the way the backward is (interleaved rounds, 3 processes)
if has fwd_vs_cudnn; then
  echo "== Gluon forward against cuDNN, interleaved, three processes a dtype (24 rows)"
  three_processes "${FWD_VS_LIMIT:-90}" sweep_forward.py fwd_vs_cudnn --masks causal full \
    --dims 64 128 --ns 4096 8192 16384 --variants 0 cudnn --rounds 5 --budget-s "${FWD_VS_BUDGET:-70}"
  "$PY" experiments/gluon/worst_of_three.py "$OUT"/fwd_vs_cudnn_*_run*.json --goal 1.0 \
    --out "$OUT/fwd_vs_cudnn_table.json"
fi
if has pack_p; then  # session 36: P packed by one cvt a pair (notes/gluon.md)
  echo "== PACK_P: GPU tests, then beside the default and cuDNN, 3 processes a dtype"
  COURSE_KERNELS_AUTOTUNE=0 timeout "${TEST_LIMIT:-240}" "$PY" -m pytest tests/gpu/test_gpu_gluon.py \
    -q -p no:cacheprovider -n "${TEST_WORKERS:-15}" -k packed_p 2>&1 | tail -5
  three_processes "${PACK_LIMIT:-90}" sweep_forward.py pack_p --masks ${PACK_MASKS:-causal full} \
    --dims ${PACK_DIMS:-64 128} --ns ${PACK_NS:-4096 8192 16384} --variants 0 PACK_P=1 cudnn \
    --rounds 5 --budget-s $(( ${PACK_LIMIT:-90} - 20 ))
  "$PY" experiments/gluon/worst_of_three.py "$OUT"/pack_p_*_run*.json --goal 1.0 \
    --out "$OUT/pack_p_table.json"
fi
# steady_step TAG TESTS_K LIMIT DIMS VARIANTS: the GPU tests matching TESTS_K (none if empty),
# then the forward's VARIANTS (0 first; cudnn) on causal and full rows at DIMS, N = 4K-16K, in
# 250/250 ms rounds (each kernel at its steady clock), three processes a dtype of DTYPES, and a
# worst-of-three table against cuDNN for each variant but cudnn (TAG_table_{variant}.json)
steady_step() {
  local tag=$1 tests=$2 limit=$3 dims=$4 variants=$5
  [ -n "$tests" ] && COURSE_KERNELS_AUTOTUNE=0 timeout "${TEST_LIMIT:-240}" "$PY" -m pytest \
    tests/gpu/test_gpu_gluon.py -q -p no:cacheprovider -n "${TEST_WORKERS:-15}" -k "$tests" \
    2>&1 | tail -5
  ( export BENCH_WARMUP="${BENCH_WARMUP:-250}" BENCH_REP="${BENCH_REP:-250}"
    three_processes "$limit" sweep_forward.py "$tag" --masks causal full --dims $dims \
      --ns 4096 8192 16384 --variants $variants --rounds 3 --budget-s $(( limit - 15 )) )
  for v in $variants; do
    [ "$v" = cudnn ] || "$PY" experiments/gluon/worst_of_three.py "$OUT/${tag}"_*_run*.json \
      --goal 1.0 --variant "$v" --out "$OUT/${tag}_table_${v//[=+]/_}.json"
  done
}
if has pack_steady; then  # session 37: PACK_P, the default and cuDNN in 250/250 ms rounds
  echo "== PACK_P beside the default and cuDNN, steady clocks, the 24 rows, 3 processes a dtype"
  steady_step pack_steady "$([ "${PACK_TESTS:-1}" = 1 ] && echo packed_p)" \
    "${STEADY_LIMIT:-130}" "64 128" "${STEADY_VARIANTS:-0 PACK_P=0 cudnn}"
fi
if has lazy; then  # session 38: FA4's conditional rescaling (LAZY) beside the default and cuDNN
  echo "== LAZY: GPU tests, then beside the default and cuDNN, steady clocks, 3 processes a dtype"
  steady_step lazy "$([ "${LAZY_TESTS:-1}" = 1 ] && echo lazy)" "${LAZY_LIMIT:-105}" \
    "${LAZY_DIMS:-128}" "0 LAZY=1 cudnn"
fi
if has suite_candidate; then  # session 37: a timed lever as the causal default under the GPU tests
  echo "== GPU tests with the Gluon causal default candidate(s) ${CANDIDATE:-64:PACK_P=1}"
  cand=(); for c in ${CANDIDATE:-64:PACK_P=1}; do cand+=(--gluon-causal-default "$c"); done
  "$PY" -c "import torch, triton; print(torch.cuda.get_device_name(), 'torch', torch.__version__,
    'triton', triton.__version__, 'cudnn', torch.backends.cudnn.version())" \
    > "$OUT/suite_candidate_log.txt" 2>&1
  COURSE_KERNELS_AUTOTUNE=0 timeout "${TEST_LIMIT:-540}" "$PY" -m pytest \
    ${CANDIDATE_TESTS:-tests/gpu/test_gpu_gluon.py} -v -rfE -p no:cacheprovider \
    -n "${TEST_WORKERS:-15}" "${cand[@]}" >> "$OUT/suite_candidate_log.txt" 2>&1
  echo "exit $? (124: cut by TEST_LIMIT; every finished test is named in suite_candidate_log.txt)"
  grep -E "^(FAILED|ERROR)|candidates|[0-9]+ (passed|failed)|^NVIDIA" "$OUT/suite_candidate_log.txt" \
    | tail -40
fi
if has fwd_lpt; then
  echo "== Gluon forward, causal d = 64: LPT tile orders against the head-major default, 3 processes"
  three_processes 90 sweep_forward.py fwd_lpt --masks causal --dims 64 --ns 4096 8192 16384 \
    --variants 0 LPT=1+LPT_SECTION_MB=8 LPT=1+LPT_SECTION_MB=16 LPT=1 cudnn --rounds 5 --budget-s 70
fi
if has fwd_defer; then
  echo "== Gluon forward, causal d = 64: each head's lightest tiles last (DEFER), 3 processes"
  three_processes "${DEFER_LIMIT:-90}" sweep_forward.py fwd_defer --masks causal --dims 64 \
    --ns ${DEFER_NS:-4096 8192 16384} --variants ${DEFER_VARIANTS:-0 DEFER=0 DEFER=2 DEFER=4 \
    DEFER=6 cudnn} --rounds 5 --budget-s 70
  "$PY" experiments/gluon/worst_of_three.py "$OUT"/fwd_defer_*_run*.json --goal 1.0 \
    --out "$OUT/fwd_defer_table.json"
fi
bwd_step bm128_masked 75 "BM = 128 against 64 on window and documents rows (d = 64)" \
  --masks window documents --dims 64 --sections 0 BM=128 --rounds 5 --budget-s 55
if has ncu_lpt; then
  echo "== Nsight Compute: causal d = 64 4K, the default tile order and LPT (16 MiB sections)"
  NCU="$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)"
  for v in default:'{}' lpt16:'{"LPT": true, "LPT_SECTION_MB": 16}'; do
    timeout 90 "$NCU" --clock-control none -k regex:'attn_fwd|fprop' --section SpeedOfLight \
      --section WarpStateStats --section SchedulerStats --section LaunchStats --section Occupancy \
      --metrics sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active \
      --csv --page details "$PY" experiments/gluon/ncu_forward.py --d 64 --N 4096 --causal \
      --config "${v#*:}" > "$OUT/ncu_lpt_${v%%:*}.csv"
    echo "ncu ${v%%:*} rc=$?"
  done
fi
bwd_step zero_acc_window 75 "ZERO_ACC on the window (1K) rows at d = 128" \
  --masks window --dims 128 --sections 0 ZERO_ACC=1 --rounds 7 --budget-s 55
bwd_step bwd_stages 75 "STAGES = 3 on causal d = 64 (BM = 128), cuDNN beside" \
  --masks causal --dims 64 --sections 0 STAGES=3 cudnn --rounds 5 --budget-s 55
bwd_step masked_stages 60 "STAGES = 3 on window and documents rows at d = 64 (BM = 128)" \
  --masks window documents --dims 64 --sections 0 STAGES=3 --rounds 5 --budget-s 45
bwd_step docs128 60 "SECTION = 4 and STAGES = 3 on the documents row at d = 128" \
  --masks documents --dims 128 --sections 0 SECTION=4 STAGES=3 SECTION=4+STAGES=3 --rounds 7 \
  --budget-s 45
if has wg_mask; then
  echo "== Gluon backward: WG_MASK (masked steps per consumer warpgroup): GPU tests, then timed"
  timeout 240 "$PY" -m pytest tests/gpu/test_gpu_gluon_backward.py -q -p no:cacheprovider \
    -n "${TEST_WORKERS:-8}" -k "wg_mask" 2>&1 | tail -15
  three_processes "${WG_MASK_LIMIT:-70}" bench_section.py wg_mask --masks ${WG_MASK_MASKS:-window documents causal} \
    --dims ${WG_MASK_DIMS:-128 64} --sections ${WG_MASK_VARIANTS:-0 WG_MASK=1 WG_MASK=2 PERSIST=1} \
    --rounds 5 --budget-s "${WG_MASK_BUDGET:-55}"
fi
if has pdl; then  # session 26: programmatic dependent launch of the backward's kernels
  echo "== Gluon backward: PDL (each kernel launched while the one before it runs): tests, timed"
  timeout 240 "$PY" -m pytest tests/gpu/test_gpu_gluon_backward.py -q -p no:cacheprovider \
    -n "${TEST_WORKERS:-8}" -k "PDL or pdl" 2>&1 | tail -15
  three_processes "${PDL_LIMIT:-70}" bench_section.py pdl --masks ${PDL_MASKS:-window documents} \
    --dims ${PDL_DIMS:-128} --ns ${PDL_NS:-4096 16384} \
    --sections ${PDL_VARIANTS:-0 PDL=1 PDL=1+ZERO_ACC=1} --rounds 7 --budget-s "${PDL_BUDGET:-55}"
fi
if has keep_acc; then  # session 31: KEEP_ACC (no fill) and DQ_CONVERT = 2 (conversion by blocks)
  echo "== Gluon backward: KEEP_ACC and DQ_CONVERT = 2: GPU tests, then timed"
  timeout 300 "$PY" -m pytest tests/gpu/test_gpu_gluon_backward.py -q -p no:cacheprovider \
    -n "${TEST_WORKERS:-8}" -k "keep_acc or KEEP_ACC or DQ_CONVERT or dq_convert" 2>&1 | tail -15
  three_processes "${KEEP_LIMIT:-70}" bench_section.py keep_acc --masks ${KEEP_MASKS:-window documents} \
    --dims 128 --ns ${KEEP_NS:-4096 16384} --sections ${KEEP_VARIANTS:-0 DQ_CONVERT=1 \
    DQ_CONVERT=1+KEEP_ACC=1 DQ_CONVERT=2 DQ_CONVERT=2+KEEP_ACC=1} --rounds 7 \
    --budget-s "${KEEP_BUDGET:-55}"
fi
if has keep_flex; then  # session 32: window d = 128 beside Flex, the default and 2 + KEEP_ACC
  echo "== window d = 128 backward beside Flex: the default, then DQ_CONVERT = 2 with KEEP_ACC"
  for run in 1 2 3; do
    for v in default keep; do
      extra=()
      [ "$v" = keep ] && extra=(--gluon-backward-defaults DQ_CONVERT=2 KEEP_ACC=1)
      timeout "${KEEP_FLEX_LIMIT:-100}" "$PY" scripts/gpu_features.py --part bench --autotune \
        --masks window --d 128 --providers course flex --passes bwd --rounds 5 --budget-s 80 \
        "${extra[@]}" --out "$OUT/keep_flex_${v}_run$run.json" 2>&1 | tail -1
      "$PY" -c "import json, sys; print(sys.argv[1][-20:], json.load(open(sys.argv[1]))[
        'course_over_other'])" "$OUT/keep_flex_${v}_run$run.json"
    done
  done
fi
if has window_passes; then  # session 33: the window d = 128 rows with the forward timed as well
  echo "== ${WP_MASKS:-window} d = 128 beside Flex, --passes ${WP_PASSES:-fwd bwd}," \
    "warm-up ${WP_WARMUP:-250} ms: the default, then WINDOW_KEEP=0"
  for run in 1 2 3; do
    for v in ${WP_VARIANTS:-keep old}; do
      extra=()
      [ "$v" = old ] && extra=(--gluon-backward-defaults WINDOW_KEEP=0)
      f="$OUT/window_passes_${v}_run$run"
      nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv \
        -lms 250 > "$f.clocks.csv" 2>/dev/null & smi=$!
      timeout "${WP_LIMIT:-150}" "$PY" scripts/gpu_features.py --part bench --autotune \
        --masks ${WP_MASKS:-window} --d 128 --providers course flex --passes ${WP_PASSES:-fwd bwd} --rounds 5 \
        --budget-s $(( ${WP_LIMIT:-150} - 20 )) --warmup "${WP_WARMUP:-250}" --rep "${WP_REP:-250}" "${extra[@]}" \
        --out "$f.json" 2>&1 | tail -1
      kill "$smi" 2>/dev/null
      "$PY" -c "import json, sys; print(sys.argv[1][-24:], json.load(open(sys.argv[1]))[
        'course_over_other'])" "$f.json"
    done
  done
  "$PY" experiments/gluon/clock_rounds.py "$OUT"/window_passes_*_run?.json \
    --out "$OUT/window_passes_clocks.json"  # each row's rounds beside the clock log
fi
if has features; then  # issue 22's whole set (README's table), every round's predecessor recorded
  # one fresh process a limit of FEAT_LIMITS (s; one process of FEAT_LIMIT, 560, by default): the
  # first compiles (about 300 s on an H100), the next reuse its caches (150-200 s)
  limits=(${FEAT_LIMITS:-${FEAT_LIMIT:-560}}); run=0
  for limit in "${limits[@]}"; do
    run=$(( run + 1 )); f="$OUT/features_bench"; [ ${#limits[@]} -gt 1 ] && f+="_run$run"
    echo "== the whole set: course, Flex, varlen_attn; warm-up ${FEAT_WARMUP:-250} ms, rep" \
      "${FEAT_REP:-250} ms; process $run of ${#limits[@]}, ${limit} s"
    nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv -lms 250 \
      > "$f.clocks.csv" 2>/dev/null & smi=$!
    timeout "$limit" "$PY" scripts/gpu_features.py --part bench --autotune --rounds 3 \
      --warmup "${FEAT_WARMUP:-250}" --rep "${FEAT_REP:-250}" --budget-s $(( limit - 40 )) \
      --out "$f.json" 2>&1 | tail -3
    kill "$smi" 2>/dev/null
    "$PY" experiments/gluon/clock_rounds.py "$f.json" \
      --out "${f}_clocks.json" > /dev/null  # each row's rounds beside the clock log
  done
fi
if has clock_trace; then  # session 34: how long a backward stays slow after the course's forward
  echo "== clock trace: idle / course fwd / Flex fwd, then each backward, SM clock through NVML"
  timeout "${CT_LIMIT:-200}" "$PY" experiments/gluon/clock_trace.py --autotune --mask window \
    --d 128 --n ${CT_NS:-4096 8192 16384} ${CT_ARGS:-} --out "$OUT/clock_trace_window.json" | tail -8
  [ -n "${CT_DOCS-1}" ] && timeout "${CT_LIMIT:-200}" "$PY" experiments/gluon/clock_trace.py \
    --autotune --mask document --d 128 --n 16384 ${CT_ARGS:-} --out "$OUT/clock_trace_document.json" \
    | tail -4
fi
if has host_docs; then  # session 27: the packed-documents calls' host path, and where they wait
  echo "== host time of the documents calls, step by step (experiments/gluon/host_docs.py)"
  timeout 120 "$PY" experiments/gluon/host_docs.py --out "$OUT"
fi
if has profile_convert; then  # session 30: what the in-kernel conversion costs the main kernel
  echo "== Gluon backward kernel by kernel (torch.profiler): DQ_CONVERT, ZERO_ACC beside the default"
  timeout "${PROFILE_LIMIT:-150}" "$PY" experiments/gluon/profile_backward.py --out "$OUT" \
    --tag profile_convert --rows window:128:4096 window:128:16384 documents:128:16384 \
    --variants ZERO_ACC=0 DQ_CONVERT=1 DQ_CONVERT=1+KEEP_ACC=1 DQ_CONVERT=2 DQ_CONVERT=2+KEEP_ACC=1 \
    ZERO_ACC=1
fi
echo "== done $(date -u +%FT%TZ)"
# The device sends back at most 8 files from $OUT (session 24 lost ncu_lpt's and zero_acc_window's
# records to that): past 8, everything is packed into one results.tgz (tar xzf it here).
if [ "$(find "$OUT" -maxdepth 1 -type f | wc -l)" -gt 8 ]; then
  (cd "$OUT" && find . -maxdepth 1 -type f ! -name results.tgz -printf '%P\n' | sort \
    | tar czf results.tgz -T - --remove-files) && echo "packed $OUT into results.tgz (more than 8 files)"
fi
