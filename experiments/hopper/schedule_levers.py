"""Issue 14's last levers, each timed against the package's kernel in the same process.

    python experiments/hopper/schedule_levers.py check              # the variants vs flash_attention (CPU or GPU)
    python experiments/hopper/schedule_levers.py persistent --out DIR  # persistent causal forward
    python experiments/hopper/schedule_levers.py atomic --out DIR   # backward with atomic dQ vs the default
    python experiments/hopper/schedule_levers.py graphs --out DIR   # N = 1024 under torch.compile's CUDA graphs

* **Persistent forward** (a kernel defined here): one program per SM (or two), each claiming
  tiles from an atomic counter, the last (longest) query blocks of each head first (a dynamic
  tile scheduler, FA3's idea), running the package's loop helper ``_attn_fwd_mask_inner`` on
  each tile. (A heavy-first *grid* order, measured at commit 2c59a2f: noise; notes/kernel.md.)
* **Atomic dQ** (``ATOMIC_DQ``, a switch of the package's dK/dV kernel): FA2 Algorithm 2 as the
  paper writes it, dQ_i += dS K_j added in fp32 atomics from the dK/dV kernel, so S and dP are
  computed once per block pair (5 matmuls instead of 7) but dQ's summation order varies.
* **N = 1024 spread**: moved to ``experiments/hopper/n1k_runs.py``.

Every JSON holds the environment (GPU, versions, date, command) next to its rows.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from functools import partial

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from course_kernels.triton import _env as _triton_env  # noqa: E402,F401  (TRITON_INTERPRET before @jit)

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from course_kernels.triton import flash, launch as flash_launch  # noqa: E402
from course_kernels.triton.launch import _cdiv, _dot_precision, head_dim_padded  # noqa: E402
from course_kernels.triton.backward import _attn_bwd_dkdv, _attn_bwd_preprocess  # noqa: E402
from course_kernels.triton.forward import _attn_fwd, _attn_fwd_mask_inner, _load_tile  # noqa: E402
from course_kernels.triton.masks import BIG as _BIG, PLAIN  # noqa: E402

DEVICE = _triton_env.device_kind()
BIG = tl.constexpr(_BIG)  # masks.BIG, as a constexpr for the kernel
KERNEL_NAMES = {"_attn_fwd": _attn_fwd, "_attn_bwd_dkdv": _attn_bwd_dkdv}


def _env():
    from course_kernels.bench import environment

    env = environment()
    env["command"] = "python3 " + " ".join(sys.argv)
    return env


@triton.jit
def _attn_fwd_persistent(
    Q, K, V, qk_mul, c2, LSE, Out, Counter,
    stride_qz, stride_qh, stride_qm, stride_qk, stride_kz, stride_kh, stride_kn, stride_kk,
    stride_vz, stride_vh, stride_vn, stride_vk, stride_oz, stride_oh, stride_om, stride_ok,
    H_Q, GROUP_SIZE, N_CTX_Q, N_CTX_K, NUM_M_BLOCKS, NUM_TILES,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PADDED: tl.constexpr, CAUSAL: tl.constexpr,
    DOT_PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """_attn_fwd's tile body in a loop over tiles claimed from an atomic counter, the last query
    block of each (batch, head) first (one head at a time keeps its K, V hot in L2); LSE: base 2."""
    offs_d = tl.arange(0, HEAD_DIM_PADDED)
    d_ok = offs_d[None, :] < HEAD_DIM
    tile = tl.atomic_add(Counter, 1)
    while tile < NUM_TILES:
        off_hz = tile // NUM_M_BLOCKS
        start_m = (NUM_M_BLOCKS - 1 - tile % NUM_M_BLOCKS) * BLOCK_M
        off_z = (off_hz // H_Q).to(tl.int64)
        off_h = (off_hz % H_Q).to(tl.int64)
        off_kvh = off_h // GROUP_SIZE
        k_base = K + off_z * stride_kz + off_kvh * stride_kh
        v_base = V + off_z * stride_vz + off_kvh * stride_vh
        offs_m = start_m + tl.arange(0, BLOCK_M)
        m_ok = offs_m[:, None] < N_CTX_Q
        q_ptrs = Q + off_z * stride_qz + off_h * stride_qh
        q_ptrs += offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qk
        q = _load_tile(q_ptrs, m_ok, d_ok, True, HEAD_DIM != HEAD_DIM_PADDED)
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM_PADDED], dtype=tl.float32)
        if CAUSAL:  # top-left: row i sees keys [i - BIG, i + 0] (diag_lo, diag_hi below)
            hi = tl.minimum(start_m + BLOCK_M, N_CTX_K)
            hi_full = (tl.minimum(start_m, N_CTX_K) // BLOCK_N) * BLOCK_N
        else:
            hi = N_CTX_K
            hi_full = (N_CTX_K // BLOCK_N) * BLOCK_N
        strides = (stride_kn, stride_kk, stride_vn, stride_vk)  # unmasked blocks, then masked
        acc, l_i, m_i = _attn_fwd_mask_inner(acc, l_i, m_i, q, k_base, v_base, *strides, offs_m,
            0, hi_full, N_CTX_K, qk_mul, c2, 0.0, 0, -BIG, 0, BLOCK_N, HEAD_DIM, HEAD_DIM_PADDED,
            False, CAUSAL, False, False, DOT_PRECISION)  # fmt: skip
        acc, l_i, m_i = _attn_fwd_mask_inner(acc, l_i, m_i, q, k_base, v_base, *strides, offs_m,
            hi_full, hi, N_CTX_K, qk_mul, c2, 0.0, 0, -BIG, 0, BLOCK_N, HEAD_DIM, HEAD_DIM_PADDED,
            True, CAUSAL, False, False, DOT_PRECISION)  # fmt: skip
        l_safe = tl.where(l_i == 0.0, 1.0, l_i)
        acc = acc / l_safe[:, None]
        tl.store(LSE + off_hz.to(tl.int64) * N_CTX_Q + offs_m, m_i * c2 + tl.math.log2(l_safe),
                 mask=offs_m < N_CTX_Q)  # fmt: skip
        o_ptrs = Out + off_z * stride_oz + off_h * stride_oh
        o_ptrs += offs_m[:, None] * stride_om + offs_d[None, :] * stride_ok
        tl.store(o_ptrs, acc.to(Out.dtype.element_ty), mask=m_ok & d_ok)
        tile = tl.atomic_add(Counter, 1)


def _fwd_args(q, k, v, o, lse2, scale):
    B, Hq, Nq, _ = q.shape
    qk_mul, _, c2 = PLAIN.units(scale)  # the kernel's scores are in units of c (masks.py)
    return (q, k, v, qk_mul, c2, lse2, o, *q.stride(), *k.stride(), *v.stride(), *o.stride(),
            Hq, Hq // k.shape[1], Nq, k.shape[2])  # fmt: skip


def _tuned(kernel):
    """The config the package's autotuner chose for the last shape it launched."""
    return kernel.best_config.all_kwargs()


def forward_persistent(q, k, v, causal, scale, cfg, programs):
    """The persistent forward with ``programs`` programs (cfg: the package kernel's config)."""
    o, lse2 = torch.empty_like(q), q.new_empty(q.shape[:3], dtype=torch.float32)
    counter = torch.zeros(1, device=q.device, dtype=torch.int32)
    B, Hq, Nq, d = q.shape
    n_m = _cdiv(Nq, cfg["BLOCK_M"])
    tiles = n_m * B * Hq
    _attn_fwd_persistent[(min(programs, tiles),)](
        *_fwd_args(q, k, v, o, lse2, scale)[:7], counter, *_fwd_args(q, k, v, o, lse2, scale)[7:],
        n_m, tiles, HEAD_DIM=d, HEAD_DIM_PADDED=head_dim_padded(d), CAUSAL=causal,
        DOT_PRECISION=_dot_precision(q.dtype), **cfg,
    )  # fmt: skip
    return o, lse2


def backward_atomic_dq(do, q, k, v, o, lse2, causal, scale):
    """D = rowsum(dO * O) first, then the dK/dV kernel adding dQ with fp32 atomics.

    The autotuner times each config by running the kernel, and each run adds into dQ: call once
    to tune before trusting dQ (``check`` does).
    """
    (B, Hq, Nq, d), (kv_heads, Nk) = q.shape, k.shape[1:3]
    delta, rows = torch.empty_like(lse2), B * Hq * Nq
    dpad = head_dim_padded(d)
    _attn_bwd_preprocess[(_cdiv(rows, 64),)](
        o, do, delta, rows, HEAD_DIM=d, HEAD_DIM_PADDED=dpad, BLOCK_M=64
    )
    dq32 = torch.zeros(q.shape, device=q.device, dtype=torch.float32)
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    variant = flash_launch.as_variant(causal)  # the kernels read the statistic in units of c
    lse_c = flash_launch.lse_from_base2(lse2, variant, scale).contiguous()
    common, consts = flash_launch.bwd_variant_args(q, k, lse_c, variant, scale)
    _attn_bwd_dkdv[lambda meta: (_cdiv(Nk, meta["BLOCK_N1"]), B * kv_heads)](
        q, k, v, do, lse_c, delta, dk, dv, dq32, *common, kv_heads, Hq // kv_heads, Nq, Nk,
        **consts, ATOMIC_DQ=True,
    )  # fmt: skip
    return (dq32 * scale).to(q.dtype), dk, dv


def _inputs(dtype, d, n, batch=4, hidden=2048, seed=0):
    torch.manual_seed(seed + n + d)
    heads = hidden // d if DEVICE == "cuda" else 2
    return [torch.randn(batch, heads, n, d, device=DEVICE, dtype=dtype) for _ in range(4)]


def cmd_check(args):
    """Each variant against the package on small shapes (the interpreter on CPU)."""
    shapes = [(torch.float16 if DEVICE == "cuda" else torch.float32, d, n, c)
              for d in (16, 64) for n in (48, 200) for c in (False, True)]  # fmt: skip
    worst = 0.0
    for dtype, d, n, causal in shapes:
        q, k, v, do = _inputs(dtype, d, n, batch=2, hidden=4 * d)
        scale = d**-0.5
        o, lse2 = flash._forward(q, k, v, causal, scale)
        ref = flash._backward(do, q, k, v, o, lse2, causal, scale)
        cfg = _tuned(_attn_fwd)
        outs = {"persistent": forward_persistent(q, k, v, causal, scale, cfg, 3)}
        for name, (o2, l2) in outs.items():
            err = max((o2 - o).abs().max().item(), (l2 - lse2).abs().max().item())
            worst = max(worst, err)
            print(f"{name} d={d} N={n} causal={causal}: max |diff| vs package {err:.2e}")
        backward_atomic_dq(do, q, k, v, o, lse2, causal, scale)  # tunes (adds into a scratch dQ)
        grads = backward_atomic_dq(do, q, k, v, o, lse2, causal, scale)
        err = max(
            (a.float() - b.float()).abs().max().item() for a, b in zip(grads, ref, strict=True)
        )
        worst = max(worst, err)
        print(f"atomic dQ d={d} N={n} causal={causal}: max |diff| vs package {err:.2e}")
    tol = 2e-2 if DEVICE == "cuda" else 1e-4
    print(f"worst {worst:.2e} (tolerance {tol:g})")
    return 0 if worst <= tol else 1


def _ms(fn):
    return triton.testing.do_bench(fn, warmup=10, rep=60, return_mode="median")


def _shapes(args):
    return [(dt, d, n) for dt in args.dtypes.split(",") for d in (64, 128)
            for n in (1024, 4096, 16384)]  # fmt: skip


def _write(args, name, rows):
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, name), "w") as f:
        json.dump({"environment": _env(), "rows": rows}, f, indent=1)


def cmd_persistent(args):
    """Causal forward: the package's grid launch vs the persistent kernel at 1 and 2 per SM."""
    from course_kernels.bench import attention_flops

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for dt, d, n in _shapes(args):
        q, k, v, do = _inputs(getattr(torch, dt), d, n)
        scale = d**-0.5
        flash._forward(q, k, v, True, scale)  # tunes the package kernel
        cfg = _tuned(_attn_fwd)
        qkv = (q, k, v, True, scale)
        variants = {
            "package": partial(flash._forward, *qkv),
            "persistent_1_per_sm": partial(forward_persistent, *qkv, cfg, sms),
            "persistent_2_per_sm": partial(forward_persistent, *qkv, cfg, 2 * sms),
        }
        flops = attention_flops(q.shape[0], q.shape[1], n, d, True, "fwd")
        row = {"dtype": dt, "d": d, "N": n, "causal": True, "mode": "fwd", "config": cfg}
        for name, fn in variants.items():
            fn()
            ms = _ms(fn)
            row[name] = {"ms": ms, "tflops": flops / ms * 1e-9}
        print(json.dumps(row))
        rows.append(row)
        _write(args, "schedule_persistent.json", rows)
    return 0


def cmd_atomic(args):
    """The backward (both kernels) deterministic vs atomic dQ, causal and not."""
    from course_kernels.bench import attention_flops

    rows = []
    for dt, d, n in _shapes(args):
        for causal in (False, True):
            q, k, v, do = _inputs(getattr(torch, dt), d, n)
            scale = d**-0.5
            o, lse2 = flash._forward(q, k, v, causal, scale)
            flops = attention_flops(q.shape[0], q.shape[1], n, d, causal, "bwd")
            row = {"dtype": dt, "d": d, "N": n, "causal": causal, "mode": "bwd"}
            inputs = (do, q, k, v, o, lse2, causal, scale)
            for name, fn in {
                "deterministic": partial(flash._backward, *inputs),
                "atomic_dq": partial(backward_atomic_dq, *inputs),
            }.items():
                fn()
                ms = _ms(fn)
                row[name] = {"ms": ms, "tflops": flops / ms * 1e-9}
            row["atomic_config"] = _tuned(_attn_bwd_dkdv)
            print(json.dumps(row))
            rows.append(row)
            _write(args, "atomic_dq.json", rows)
    return 0


def cmd_graphs(args):
    """N = 1024 causal fp16 forward + backward: eager vs ``torch.compile(mode="reduce-overhead")``
    (CUDA-graph replays: no Python launch path per call); SDPA's flash backend eager."""
    from course_kernels import flash_attention
    from course_kernels.bench import provider_fn

    sdpa, rows = provider_fn("sdpa-flash"), []
    for d in (64, 128):
        q, k, v, do = _inputs(torch.float16, d, 1024)
        q, k, v = (x.requires_grad_(True) for x in (q, k, v))
        ours = partial(flash_attention, causal=True)
        compiled = torch.compile(ours, mode="reduce-overhead", fullgraph=True)

        def step(fn, mark=False, q=q, k=k, v=v, do=do):
            if mark:
                torch.compiler.cudagraph_mark_step_begin()
            return torch.autograd.grad(fn(q, k, v), (q, k, v), do)

        row = {"dtype": "float16", "d": d, "N": 1024, "causal": True, "mode": "fwd+bwd"}
        try:  # the point is whether this path works at all: an error is recorded
            want = step(ours)
            for _ in range(3):  # compile, record the graphs, replay
                got = step(compiled, mark=True)
            diffs = [(a - b).abs().max().item() for a, b in zip(got, want, strict=True)]
            row["max_abs_diff_compiled_vs_eager"] = max(diffs)
            row["compiled_ms"] = _ms(partial(step, compiled, True))
        except Exception as exc:
            row["compiled_error"] = repr(exc)[:500]
        row["eager_ms"] = _ms(partial(step, ours))
        row["sdpa_flash_eager_ms"] = _ms(partial(step, partial(sdpa, causal=True)))
        print(json.dumps(row), flush=True)
        rows.append(row)
        _write(args, "n1024_reduce_overhead.json", rows)
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("what", choices=["check", "persistent", "atomic", "graphs"],
                    help="which measurement (see above)")  # fmt: skip
    ap.add_argument("--out", default="/tmp/schedule_levers", help="folder for the JSON files")
    ap.add_argument("--dtypes", default="float16", help="comma-separated torch dtypes")
    args = ap.parse_args(argv)
    if args.what not in ("check",) and DEVICE != "cuda":
        ap.error(f"'{args.what}' times kernels and needs a CUDA GPU; 'check' runs on CPU too")
    cmds = {"check": cmd_check, "persistent": cmd_persistent, "atomic": cmd_atomic,
            "graphs": cmd_graphs}  # fmt: skip
    return cmds[args.what](args)


if __name__ == "__main__":
    sys.exit(main())
