#!/usr/bin/env bash
# The "Applications" chapter's GPU runs, in one script. Usage, from the repository root:
#
#   OUT=/some/dir scripts/gpu_apps.sh [train] [context] [decode]     (default: all three)
#
#   train    the tiny GPT at full size (6 layers, 6 heads, 384 wide, context 256, batch 64),
#            300 steps with each attention: flash (this course's kernel), standard (matmul +
#            softmax), sdpa, under bf16 autocast; then flash and standard in fp32. Same seed,
#            same batches -> the loss curves should agree (to rounding).
#   context  tokens/s and peak memory vs context length (256 .. 16384), 12 steps each, batch 4;
#            standard attention runs out of memory at long contexts (recorded as "OOM").
#   decode   one decode step at batch 1 against a long KV cache (Llama-3-8B shape: 32 query
#            heads, 8 KV heads, d = 128; and Llama-2-7B: 32/32): flash_decode (split-KV) with the
#            default and with one split, the course's forward kernel, and PyTorch SDPA backends.
#
# Results (JSON, each with GPU, versions, date and command): $OUT/gpt_train.json,
# $OUT/gpt_context.json, $OUT/decode_bench.json, and $OUT/log.txt. Copy the JSON files into
# course_kernels/data/apps/ for the book. Expected runtime on one H200: ~1-2 min train, ~3-5 min context (the
# flash kernel autotunes once per new length), ~1 min decode. Each step has its own time limit.
set -uo pipefail
OUT="${OUT:-course_kernels/data/apps}"
mkdir -p "$OUT"
export PYTHONPATH="${PYTHONPATH:-.}" PYTHONUNBUFFERED=1 MPLBACKEND=Agg
PY="${PY:-python3}"
STEPS="${*:-train context decode}"
exec > >(tee -a "$OUT/log.txt") 2>&1
echo "== $(date -u +%FT%TZ) scripts/gpu_apps.sh $STEPS"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true

for step in $STEPS; do
  echo "== $step"
  timeout "${STEP_LIMIT:-540}" "$PY" - "$OUT" "$step" <<'EOF'
import json, sys, time
import torch
from course_kernels.bench import environment

out_dir, step = sys.argv[1], sys.argv[2]
env = environment()
env["command"] = f"OUT={out_dir} scripts/gpu_apps.sh {step}"
FULL = dict(n_layer=6, n_head=6, n_embd=384, lr=1e-3, amp_dtype=torch.bfloat16, device="cuda")


def save(name, rows):
    with open(f"{out_dir}/{name}", "w") as f:
        json.dump({**env, "rows": rows}, f, indent=1)
    print(f"wrote {out_dir}/{name}: {len(rows)} rows")


if step == "train":
    from course_kernels import gpt
    rows = []
    runs = [(a, torch.bfloat16) for a in ("flash", "standard", "sdpa")]
    runs += [(a, None) for a in ("flash", "standard")]  # fp32: exactness without bf16 rounding
    for attention, amp in runs:
        t = time.time()
        r = gpt.train(attention, steps=300, batch_size=64, block_size=256, progress=False,
                      **{**FULL, "amp_dtype": amp})
        row = r.as_dict()
        row["attention"] = attention
        rows.append(row)
        print(f"{attention} ({amp or 'fp32'}): loss {r.losses[0]:.3f} -> {r.losses[-1]:.3f}, "
              f"{r.tokens_per_s:,.0f} tok/s, peak {r.peak_memory_bytes / 2**30:.2f} GiB, "
              f"{time.time() - t:.0f} s")
    save("gpt_train.json", rows)

elif step == "context":
    from course_kernels import gpt
    rows = []
    for block_size in (256, 512, 1024, 2048, 4096, 8192, 16384):
        for attention in ("flash", "standard", "sdpa"):
            row = {"attention": attention, "block_size": block_size, "batch_size": 4}
            try:
                r = gpt.train(attention, steps=12, batch_size=4, block_size=block_size,
                              progress=False, **FULL)
                row.update(tokens_per_s=r.tokens_per_s, peak_memory_bytes=r.peak_memory_bytes,
                           final_loss=r.losses[-1], config=r.config)
            except torch.cuda.OutOfMemoryError:
                row.update(tokens_per_s=None, peak_memory_bytes=None, note="OOM")
            torch.cuda.empty_cache()
            rows.append(row)
            print(row.get("note") or f"T={block_size} {attention}: {row['tokens_per_s']:,.0f} tok/s "
                  f"{row['peak_memory_bytes'] / 2**30:.2f} GiB")
    save("gpt_context.json", rows)

elif step == "decode":
    from course_kernels import decode
    rows = []
    for heads, kv_heads, model in ((32, 8, "Llama-3-8B shape"), (32, 32, "Llama-2-7B shape")):
        for row in decode.benchmark(contexts=(1024, 4096, 16384, 65536, 131072), batch=1,
                                    heads=heads, kv_heads=kv_heads, head_dim=128):
            row["model"] = model
            rows.append(row)
            ms = "-" if row["ms"] is None else (f"{row['ms'] * 1e3:8.1f} us {row['gb_per_s']:7.0f} GB/s"
                                                f" host {row['host_us']:6.1f} us")
            print(f"{model} N={row['context']:6d} {row['impl']:28s} {ms} {row['note'] or ''}")
    save("decode_bench.json", rows)
else:
    sys.exit(f"unknown step {step!r}: use train, context, decode")
EOF
  echo "$step rc=$?"
done
