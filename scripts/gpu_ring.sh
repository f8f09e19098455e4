#!/usr/bin/env bash
# Ring attention on two GPUs of one host (NCCL), in one command. Usage, from the repo root:
#
#   OUT=/some/dir scripts/gpu_ring.sh [check] [bench] [cp]        (default: all three)
#
#   check  ring_attention vs single-GPU flash_attention and an fp32 SDPA reference, forward and
#          backward, both layouts, causal and not, N = 16384 and 17001 (uneven shards), GQA (16 query
#          heads, 4 K/V heads), d = 128, bf16 and fp16                 -> $OUT/ring_check.json
#   bench  the link's bandwidth (NCCL send/recv), then per N (4K, 16K, 64K): time per call and
#          per ring step of each rank, bytes each rank sends, peak memory per rank, causal
#          contiguous vs zigzag (busy time per rank), single-GPU flash_attention at the same N
#                                                                      -> $OUT/ring_bench.json
#   cp     PyTorch's context parallelism (torch.distributed.tensor.experimental.context_parallel)
#          on the same inputs: outputs and gradients vs ours, and times -> $OUT/ring_torch_cp.json
#
# Every JSON records GPU, versions, date and the command; everything printed goes to
# $OUT/log.txt. Copy the JSON files into course_kernels/data/ring/ for the book. Each step has its own time
# limit (CHECK_LIMIT, BENCH_LIMIT, CP_LIMIT seconds) so a slow step leaves the others' data;
# NCCL gives up on a collective after COLLECTIVE_TIMEOUT seconds instead of hanging.
# On a CPU-only machine, BACKEND=gloo NPROC=2 runs the same steps at tiny sizes (gloo).
set -uo pipefail
OUT="${OUT:-/tmp/gpu_ring_out}"
mkdir -p "$OUT"
# The machine requires NVLink multicast off (NVLS in NCCL, multicast in symmetric memory).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
export PYTHONPATH="${PYTHONPATH:-.}" PYTHONUNBUFFERED=1 MPLBACKEND=Agg OMP_NUM_THREADS=1
PY="${PY:-python3}"
NPROC="${NPROC:-2}"
BACKEND="${BACKEND:-}"
STEPS="${*:-check bench cp}"
exec > >(tee -a "$OUT/log.txt") 2>&1
echo "== $(date -u +%FT%TZ) scripts/gpu_ring.sh $STEPS (NCCL_NVLS_ENABLE=$NCCL_NVLS_ENABLE" \
     "TORCH_SYMM_MEM_DISABLE_MULTICAST=$TORCH_SYMM_MEM_DISABLE_MULTICAST)"
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv
  nvidia-smi topo -m || true
fi
status=0
for step in $STEPS; do
  case "$step" in
    check) limit="${CHECK_LIMIT:-300}"; tune="${CHECK_AUTOTUNE:-0}" ;;  # correctness: no tuning
    bench) limit="${BENCH_LIMIT:-420}"; tune="${BENCH_AUTOTUNE:-1}" ;;
    cp)    limit="${CP_LIMIT:-240}";    tune="${CP_AUTOTUNE:-1}" ;;
    *) echo "unknown step '$step': use check, bench, cp"; exit 2 ;;
  esac
  echo "== $step (time limit ${limit} s, COURSE_KERNELS_AUTOTUNE=$tune)"
  t0=$(date +%s)
  COURSE_KERNELS_AUTOTUNE="$tune" timeout --kill-after=20 "$limit" \
    "$PY" -m torch.distributed.run --standalone --nproc_per_node "$NPROC" \
    -m course_kernels.distributed.bench "$step" --out "$OUT" ${BACKEND:+--backend "$BACKEND"} \
    --timeout "${COLLECTIVE_TIMEOUT:-180}"
  rc=$?
  echo "== $step rc=$rc in $(( $(date +%s) - t0 )) s"
  [ "$rc" -ne 0 ] && status=1
done
ls -l "$OUT"
exit $status
