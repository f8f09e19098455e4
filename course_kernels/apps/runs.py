"""The Applications chapter's GPU runs: tiny-GPT training, context length, decode steps.

Chapter: "Applications" (book part two). Command line (GPU only; each writes one JSON file that
records GPU, versions, date and the command, and prints one line per result)::

    python -m course_kernels apps train   --out DIR   # gpt_train.json
    python -m course_kernels apps context --out DIR   # gpt_context.json
    python -m course_kernels apps decode  --out DIR   # decode_bench.json
    python -m course_kernels apps paged   --out DIR   # paged_decode_bench.json (apps.paged_runs)

``scripts/gpu_apps.sh`` runs all three with a time limit each. The committed results are in the
package's measured data (``course_kernels.datafiles.load_json("apps/gpt_train.json")`` ...).

- ``train``: the tiny GPT at full size (6 layers, 6 heads, 384 wide, context 256, batch 64),
  300 steps with each attention: flash (this course's kernel), standard (matmul + softmax) and
  sdpa under bf16 autocast, then flash and standard in fp32. Same seed, same batches: the loss
  curves agree to rounding.
- ``context``: tokens/s and peak memory vs context length (256 .. 16384), 12 steps each, batch 4;
  standard attention runs out of memory at long contexts (recorded as ``"OOM"``).
- ``decode``: one decode step at batch 1 against a long KV cache (Llama-3-8B shape: 32 query
  heads, 8 KV heads, d = 128; and Llama-2-7B: 32/32): ``flash_decode`` (split-KV) with the
  default and with one split, the course's forward kernel, and PyTorch's SDPA backends.
"""

from __future__ import annotations

import json
import time
from functools import partial
from pathlib import Path

from .measure import _graphed, _host_us, _require_cuda, decode_bytes

STEPS = ("train", "context", "decode", "paged")
FULL_GPT = dict(n_layer=6, n_head=6, n_embd=384, lr=1e-3)


def save(out_dir, name: str, rows: list, command: str) -> Path:
    """Write ``{environment..., "rows": rows}`` to ``out_dir/name`` and return the path."""
    from ..bench.speed import environment

    env = environment()
    env["command"] = command
    path = Path(out_dir) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**env, "rows": rows}, indent=1), encoding="utf-8")
    return path


def train_runs(steps: int = 300, log=print) -> list[dict]:
    """The training comparison: same model, seed and batches with each attention."""
    _require_cuda("apps train")
    import torch

    from . import gpt

    rows = []
    runs = [(a, torch.bfloat16) for a in ("flash", "standard", "sdpa")]
    runs += [(a, None) for a in ("flash", "standard")]  # fp32: exactness without bf16 rounding
    for attention, amp in runs:
        t = time.time()
        r = gpt.train(
            attention,
            steps=steps,
            batch_size=64,
            context_len=256,
            progress=False,
            device="cuda",
            amp_dtype=amp,
            **FULL_GPT,
        )
        row = r.as_dict()
        row["attention"] = attention
        rows.append(row)
        log(
            f"{attention} ({amp or 'fp32'}): loss {r.losses[0]:.3f} -> {r.losses[-1]:.3f}, "
            f"{r.tokens_per_s:,.0f} tok/s, peak {r.peak_memory_bytes / 2**30:.2f} GiB, "
            f"{time.time() - t:.0f} s"
        )
    return rows


def context_runs(contexts=(256, 512, 1024, 2048, 4096, 8192, 16384), log=print) -> list[dict]:
    """Tokens/s and peak memory vs context length for each attention (OOM recorded)."""
    _require_cuda("apps context")
    import torch

    from . import gpt

    rows = []
    for context in contexts:
        for attention in ("flash", "standard", "sdpa"):
            row = {"attention": attention, "context_len": context, "batch_size": 4}
            try:
                r = gpt.train(
                    attention,
                    steps=12,
                    batch_size=4,
                    context_len=context,
                    progress=False,
                    device="cuda",
                    amp_dtype=torch.bfloat16,
                    **FULL_GPT,
                )
                row.update(
                    tokens_per_s=r.tokens_per_s,
                    peak_memory_bytes=r.peak_memory_bytes,
                    final_loss=r.losses[-1],
                    config=r.config,
                )
            except torch.cuda.OutOfMemoryError:
                row.update(tokens_per_s=None, peak_memory_bytes=None, note="OOM")
            torch.cuda.empty_cache()
            rows.append(row)
            log(
                row.get("note")
                or f"T={context} {attention}: {row['tokens_per_s']:,.0f} tok/s "
                f"{row['peak_memory_bytes'] / 2**30:.2f} GiB"
            )
    return rows


def decode_runs(contexts=(1024, 4096, 16384, 65536, 131072), log=print) -> list[dict]:
    """:func:`decode_benchmark` for the Llama-3-8B and Llama-2-7B decode shapes."""
    _require_cuda("apps decode")
    rows = []
    for heads, kv_heads, model in ((32, 8, "Llama-3-8B shape"), (32, 32, "Llama-2-7B shape")):
        for row in decode_benchmark(
            contexts=contexts, batch=1, heads=heads, kv_heads=kv_heads, head_dim=128
        ):
            row["model"] = model
            rows.append(row)
            ms = (
                "-"
                if row["ms"] is None
                else (
                    f"{row['ms'] * 1e3:8.1f} us {row['gb_per_s']:7.0f} GB/s host {row['host_us']:6.1f} us"
                )
            )
            log(f"{model} N={row['context']:6d} {row['impl']:28s} {ms} {row['note'] or ''}")
    return rows


def run(step: str, out_dir, log=print) -> Path:
    """Run one step (``train``, ``context``, ``decode`` or ``paged``) and save its JSON in
    ``out_dir``."""
    from .paged_runs import paged_decode_benchmark

    if step not in STEPS:
        raise ValueError(f"unknown step {step!r}; choose from {', '.join(STEPS)}")
    fn, name = {
        "train": (train_runs, "gpt_train.json"),
        "context": (context_runs, "gpt_context.json"),
        "decode": (decode_runs, "decode_bench.json"),
        "paged": (paged_decode_benchmark, "paged_decode_bench.json"),
    }[step]
    rows = fn(log=log)
    path = save(out_dir, name, rows, f"python -m course_kernels apps {step} --out {out_dir}")
    log(f"wrote {path}: {len(rows)} rows")
    return path


def decode_benchmark(
    contexts=(4096, 16384, 65536, 131072),
    batch=1,
    heads=32,
    kv_heads=8,
    head_dim=128,
    dtype="float16",
    splits=(None, 1),
):
    """Time one decode step (GPU only): flash_decode vs the course forward kernel and SDPA.

    Returns a list of dicts: milliseconds and achieved GB/s (:func:`decode_bytes` / time) of
    ``flash_decode`` for each ``splits`` value (None = the default), of ``flash_attention``
    (the prefill kernel called with Nq = 1) and of each PyTorch SDPA backend that accepts it;
    ``flash_decode`` and SDPA's flash backend also replayed from a CUDA graph (``*_cudagraph``:
    the device time without the per-call Python and launch cost). ``host_us`` is the host
    (Python + launch) time per call, measured without waiting for the GPU: when it is close to
    ``ms * 1000``, the step is bound by the host, not by memory.
    """
    _require_cuda("decode_benchmark")
    import torch
    import triton
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    from ..serving.decode import default_num_splits, flash_decode
    from ..triton.flash import flash_attention

    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    rows = []
    for n in contexts:
        torch.manual_seed(0)
        q = torch.randn(batch, heads, 1, head_dim, device="cuda", dtype=dtype)
        k = torch.randn(batch, kv_heads, n, head_dim, device="cuda", dtype=dtype)
        v = torch.randn_like(k)
        nbytes = decode_bytes(batch, kv_heads, n, head_dim, heads, 1, q.element_size())
        ref = sdpa(q, k, v, enable_gqa=True)
        runs, host = {}, {}
        for s in splits:
            out = flash_decode(q, k, v, num_splits=s)
            err = (out.float() - ref.float()).abs().max().item()
            name = "flash_decode" + ("" if s is None else f"_splits{s}")
            ms = triton.testing.do_bench(partial(flash_decode, q, k, v, num_splits=s))
            host[name] = _host_us(partial(flash_decode, q, k, v, num_splits=s))
            runs[name] = (ms, err, s or default_num_splits(batch * kv_heads, n))
        replay = _graphed(partial(flash_decode, q, k, v))
        runs["flash_decode_cudagraph"] = (
            triton.testing.do_bench(replay),
            None,
            default_num_splits(batch * kv_heads, n),
        )
        host["flash_decode_cudagraph"] = _host_us(replay)
        runs["flash_attention_fwd"] = (
            triton.testing.do_bench(partial(flash_attention, q, k, v)),
            None,
            None,
        )
        host["flash_attention_fwd"] = _host_us(partial(flash_attention, q, k, v))
        for backend in ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH"):
            try:
                with sdpa_kernel(getattr(SDPBackend, backend)):
                    sdpa(q, k, v, enable_gqa=True)
                    torch.cuda.synchronize()

                    fn = partial(sdpa, q, k, v, enable_gqa=True)

                    runs[f"sdpa_{backend.lower()}"] = (triton.testing.do_bench(fn), None, None)
                    host[f"sdpa_{backend.lower()}"] = _host_us(fn)
                    if backend == "FLASH_ATTENTION":
                        replay = _graphed(fn)
                        runs["sdpa_flash_attention_cudagraph"] = (
                            triton.testing.do_bench(replay),
                            None,
                            None,
                        )
                        host["sdpa_flash_attention_cudagraph"] = _host_us(replay)
            except (RuntimeError, AttributeError) as exc:  # backend refuses this shape
                reason = str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__
                runs[f"sdpa_{backend.lower()}"] = (None, f"not run: {reason}", None)
        for name, (ms, note, num_splits) in runs.items():
            rows.append(
                {
                    "context": n,
                    "batch": batch,
                    "heads": heads,
                    "kv_heads": kv_heads,
                    "head_dim": head_dim,
                    "dtype": str(dtype).replace("torch.", ""),
                    "impl": name,
                    "num_splits": num_splits,
                    "ms": ms,
                    "gb_per_s": None if ms is None else nbytes / (ms * 1e-3) / 1e9,
                    "host_us": host.get(name),
                    "max_abs_err_vs_sdpa": note if isinstance(note, float) else None,
                    "note": note if isinstance(note, str) else None,
                }
            )
    return rows
