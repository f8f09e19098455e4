"""Tests of the Triton and tuning exercises (notebooks 07-09).

The student's kernels run on a GPU or, without one, in Triton's interpreter (TRITON_INTERPRET=1),
which is exact in fp32. Inputs are float32 CPU arrays made here from a seed and turned into torch
tensors on the student's side; outputs come back as arrays and are checked here.
"""

from __future__ import annotations

import math

import numpy as np

from ..reference import attention_naive, attention_reference
from .feedback import Case, Fail, as_array, compare, unpack
from .numpy_exercises import _as_int
from .variants import _mask, masked_attention

TF32_HINT = (
    "your result is right only to about 1e-3, the precision of TF32: on a GPU, tl.dot rounds fp32 "
    "inputs to TF32 (10-bit mantissa) by default, and comparing that with an exact fp32/fp64 "
    "reference fails. Pass input_precision='ieee' to tl.dot for an exact fp32 product (or judge a "
    "TF32 kernel against a TF32 budget)"
)


def _bhnd(params, heads_kv=None):
    rng = np.random.default_rng(int(params.get("seed", 0)))
    b, h, n, d = (int(params.get(x, dflt)) for x, dflt in
                  (("batch", 1), ("heads", 2), ("n", 32), ("d", 16)))
    hk = int(params.get("heads_kv", h)) if heads_kv is None else heads_kv
    q = rng.standard_normal((b, h, n, d)).astype(np.float32)
    k = rng.standard_normal((b, hk, n, d)).astype(np.float32)
    v = rng.standard_normal((b, hk, n, d)).astype(np.float32)
    return q, k, v


def _tf32_or(err_fail: Fail, y, ref) -> Fail:
    err = float(np.abs(np.asarray(y, np.float64) - ref).max())
    if np.isfinite(err) and err <= 3e-3 * (1 + np.abs(ref).max()):
        return Fail(str(err_fail) + ". " + TF32_HINT)
    return err_fail


def build_attention_triton(params) -> Case:
    q, k, v = _bhnd(params)
    what = params.get("check", "out")

    def judge(out, outcome):
        if outcome is not None and getattr(outcome, "launches", 1) == 0:
            raise Fail("no Triton kernel was launched: the exercise is to write one (@triton.jit)")
        o, lse = unpack(out, 2, "(out, lse)")
        o = as_array(o, "out", q.shape)
        lse = as_array(lse, "lse", q.shape[:-1])
        ref, ref_lse = attention_reference(q, k, v)
        naive = attention_naive(q, k, v)
        try:
            msg = compare(o, ref, naive, "out", _triton_variants(q, k, v, False),
                          hint="check the masks on loads past N and the online-softmax update")
        except Fail as e:
            raise _tf32_or(e, o, ref) from None
        if what == "lse":
            compare(lse, ref_lse, None, "lse", budget=4e-6 * (1 + np.abs(ref_lse).max()),
                    hint="save L = m_i + log(l_i) (natural log; if you work with exp2, convert)")
            msg += "; lse right"
        return msg

    return Case("attention_triton", params.get("name", what), float(params.get("points", 1)),
                "attention_triton", (q, k, v), {}, judge, torch=True,
                timeout=params.get("timeout"))


def _gqa_expand(k, h):
    group = h // k.shape[1]
    return np.repeat(k, group, axis=1)


def _triton_variants(q, k, v, causal, gqa=False):
    n, sc = q.shape[-2], 1 / math.sqrt(q.shape[-1])
    kind = "causal" if causal else "none"
    out = []
    if gqa:
        h = q.shape[1]
        kk, vv = np.tile(k, (1, h // k.shape[1], 1, 1)), np.tile(v, (1, h // v.shape[1], 1, 1))
        out.append((lambda: masked_attention(q, kk, vv, sc, _mask(n, n, kind))[0],
                    "query head h must use kv head h // (H / H_kv) (groups of consecutive query "
                    "heads share one kv head), not h % H_kv"))
        k, v = _gqa_expand(k, h), _gqa_expand(v, h)
    if causal:
        out += [
            (lambda: masked_attention(q, k, v, sc, _mask(n, n, "strict"))[0],
             "causal is off by one: query i sees keys j <= i (offs_m[:, None] >= offs_n[None, :])"),
            (lambda: masked_attention(q, k, v, sc, _mask(n, n, "strict"), "nan")[0],
             "causal is off by one: query i sees keys j <= i (offs_m[:, None] >= offs_n[None, :])"),
            (lambda: masked_attention(q, k, v, sc, _mask(n, n, "none"))[0],
             "causal=True was ignored: mask scores where the key index is above the query index"),
        ]
    else:
        out.append((lambda: masked_attention(q, k, v, sc, _mask(n, n, "causal"))[0],
                    "a causal mask was applied although causal=False"))
    out.append((lambda: masked_attention(q, k, v, 1.0, _mask(n, n, kind))[0],
                "the scores were not scaled by 1/sqrt(d)"))
    return out


def build_attention_triton_gqa(params) -> Case:
    q, k, v = _bhnd(params)
    causal = bool(params.get("causal", False))

    def judge(out, outcome):
        if outcome is not None and getattr(outcome, "launches", 1) == 0:
            raise Fail("no Triton kernel was launched: the exercise is to write one (@triton.jit)")
        o = as_array(out, "out", q.shape)
        kk, vv = _gqa_expand(k, q.shape[1]), _gqa_expand(v, q.shape[1])
        ref, _ = attention_reference(q, kk, vv, causal)
        naive = attention_naive(q, kk, vv, causal)
        try:
            return compare(o, ref, naive, "out", _triton_variants(q, k, v, causal, gqa=True))
        except Fail as e:
            raise _tf32_or(e, o, ref) from None

    return Case("attention_triton_gqa", params.get("name", "out"), float(params.get("points", 1)),
                "attention_triton_gqa", (q, k, v), {"causal": causal}, judge, torch=True,
                timeout=params.get("timeout"))


# -- 09 tuning (graded without a GPU; the measurement itself is practice) ---------------------
BLOCKS = (32, 64, 128)
STAGES = (1, 2, 3)


def smem_bytes(block_m, block_n, head_dim, num_stages, dtype_bytes=2):
    """The exercise's model: Q tile once, K and V tiles once per pipeline stage."""
    return (block_m * head_dim + num_stages * 2 * block_n * head_dim) * dtype_bytes


def build_smem_bytes(params) -> Case:
    args = tuple(int(params[x]) for x in ("block_m", "block_n", "head_dim", "num_stages",
                                          "dtype_bytes"))

    def judge(out, outcome):
        out = _as_int(out, "smem_bytes")
        want = smem_bytes(*args)
        if out == want:
            return f"{want} bytes"
        if out == smem_bytes(*args[:3], 1, args[4]):
            raise Fail("every pipeline stage holds its own K and V tiles: multiply them by "
                       "num_stages")
        if out == want // args[4]:
            raise Fail("that is elements; multiply by dtype_bytes for bytes")
        raise Fail(f"got {out}; the model gives (BLOCK_M d + stages 2 BLOCK_N d) bytes = {want}")

    return Case("smem_bytes", params.get("name", str(args)), float(params.get("points", 1)),
                "smem_bytes", args, {}, judge)


def build_configs_that_fit(params) -> Case:
    d, limit = int(params["head_dim"]), int(params["smem_limit"])

    def judge(out, outcome):
        if not isinstance(out, tuple):
            raise Fail(f"should return a list of (BLOCK_M, BLOCK_N, num_stages); got "
                       f"{type(out).__name__}")
        got = sorted(tuple(int(x) for x in c) for c in out)
        want = sorted((m, n, s) for m in BLOCKS for n in BLOCKS for s in STAGES
                      if smem_bytes(m, n, d, s) <= limit)
        if got == want:
            return f"{len(want)} configs fit in {limit} bytes"
        over = [c for c in got if smem_bytes(*c[:2], d, c[2]) > limit]
        if over:
            raise Fail(f"{over[0]} needs {smem_bytes(*over[0][:2], d, over[0][2])} bytes > "
                       f"{limit}: a launch with it fails ('out of resource: shared memory')")
        raise Fail(f"{len(set(want) - set(got))} configs that fit are missing (<= is allowed)")

    return Case("configs_that_fit", params.get("name", f"d={d}, {limit} B"),
                float(params.get("points", 1)), "configs_that_fit", (d, limit), {}, judge)


def build_pick_fastest(params) -> Case:
    rng = np.random.default_rng(int(params.get("seed", 0)))
    configs = [[m, n, s] for m in BLOCKS for n in BLOCKS for s in STAGES][: params.get("k", 12)]
    times = [round(float(t), 3) for t in rng.uniform(0.1, 2.0, len(configs))]
    if params.get("tie"):
        times[3] = times[7] = min(times) - 0.01

    def judge(out, outcome):
        if not isinstance(out, tuple) or len(out) != 3:
            raise Fail("should return one config (BLOCK_M, BLOCK_N, num_stages)")
        best = min(range(len(times)), key=lambda i: (times[i], i))
        if [int(x) for x in out] == configs[best]:
            return f"{tuple(configs[best])} at {times[best]} ms"
        worst = max(range(len(times)), key=lambda i: times[i])
        if [int(x) for x in out] == configs[worst]:
            raise Fail("that is the slowest config: pick the smallest time")
        raise Fail(f"the fastest is {tuple(configs[best])} ({times[best]} ms); on a tie keep the "
                   "first one")

    return Case("pick_fastest", params.get("name", "fastest"), float(params.get("points", 1)),
                "pick_fastest", (configs, times), {}, judge)


BUILDERS = {
    "attention_triton": build_attention_triton,
    "attention_triton_gqa": build_attention_triton_gqa,
    "smem_bytes": build_smem_bytes,
    "configs_that_fit": build_configs_that_fit,
    "pick_fastest": build_pick_fastest,
}
