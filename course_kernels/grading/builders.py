"""Helpers the spec modules' test builders share (course_kernels/grading/specs/).

Inputs made from a seed, the tiling check's limit and message, the int check, and the Triton
exercises' inputs, TF32 sentence and named mistakes. Everything particular to one exercise lives
in its spec module.
"""

from __future__ import annotations

import math

import numpy as np

from .feedback import Fail
from .variants import _mask, masked_attention


def seeded(params):
    return np.random.default_rng(int(params.get("seed", 0)))


def name_of(params, default):
    return params.get("name", default)


def qkv_inputs(params):
    rng = seeded(params)
    lead = tuple(params.get("lead", (2,)))
    nq, nk = params.get("nq", 64), params.get("nk", params.get("nq", 64))
    d, dv = params.get("d", 16), params.get("dv", params.get("d", 16))
    dt = np.dtype(params.get("dtype", "float32"))
    q = rng.standard_normal((*lead, nq, d)).astype(dt)
    k = rng.standard_normal((*lead, nk, d)).astype(dt)
    v = rng.standard_normal((*lead, nk, dv)).astype(dt)
    if params.get("spread"):  # a growing max along the keys: rescaling matters
        k = (k * np.linspace(0.5, params["spread"], nk)[:, None]).astype(dt)
    return q, k, v


def fwd_kwargs(params):
    kw = {
        "causal": bool(params.get("causal", False)),
        "block_q": int(params.get("block_q", 16)),
        "block_k": int(params.get("block_k", 16)),
    }
    if params.get("scale") is not None:
        kw["scale"] = float(params["scale"])
    return kw


TILING_SLACK = 8 << 20  # bytes: interpreter and NumPy noise allowed on top of the tiles


def tiling_limit(nq, nk, d, dv, block_q, block_k) -> int:
    """Extra memory a tiled forward/backward may use: a few (block_q x block_k) and (block x d)
    tiles plus a fixed slack, and never more than half the Nq x Nk float64 matrix. The cap does
    not grow with Nk, so a score matrix built in row chunks is caught once Nk is long."""
    tiles = 16 * 8 * (block_q * block_k + (block_q + block_k) * max(d, dv))
    return min(nq * nk * 8 // 2, TILING_SLACK + tiles)


def structure_message(outcome, q, k, v, kw) -> str:
    """Judge the memory measurement attached by the runner (the peak of the whole process tree,
    measured by the kernel) or by the notebook's check cell (tracemalloc)."""
    nq, nk = q.shape[-2], k.shape[-2]
    limit = tiling_limit(
        nq, nk, q.shape[-1], v.shape[-1], kw.get("block_q", 64), kw.get("block_k", 64)
    )
    extra = getattr(outcome, "memory", None)
    if extra is None:  # a memory test whose measurement failed earns nothing (fail closed)
        raise Fail(
            getattr(outcome, "memory_note", "")
            or "the memory of this run could not be measured, so 'really tiled' is not "
            "established; grade it again (if it persists, tell the instructor)"
        )
    peak, how = extra[0], extra[-1]
    if peak > limit:
        raise Fail(
            f"not tiled: it used {peak / 2**20:.0f} MiB of extra memory at Nq={nq}, Nk={nk} "
            f"(limit {limit / 2**20:.1f} MiB, measured {how}); a {nq} x {nk} float64 matrix is "
            f"{nq * nk * 8 / 2**20:.0f} MiB. Never form the full score matrix, not even in row "
            "chunks: work on (block_q x block_k) tiles"
        )
    return f"; tiled (extra memory {peak / 2**20:.1f} MiB)"


def as_int(x, what):
    if isinstance(x, bool) or not (
        isinstance(x, int) or (isinstance(x, np.ndarray) and x.ndim == 0 and x.dtype.kind in "iu")
    ):
        raise Fail(f"{what} should be an int; got {type(x).__name__}")
    return int(x)


TF32_HINT = (
    "your result is right only to about 1e-3, the precision of TF32: on a GPU, tl.dot rounds fp32 "
    "inputs to TF32 (10-bit mantissa) by default, and comparing that with an exact fp32/fp64 "
    "reference fails. Pass input_precision='ieee' to tl.dot for an exact fp32 product (or judge a "
    "TF32 kernel against a TF32 budget)"
)


def bhnd_inputs(params, kv_heads=None):
    rng = np.random.default_rng(int(params.get("seed", 0)))
    b, h, n, d = (
        int(params.get(x, dflt)) for x, dflt in (("batch", 1), ("heads", 2), ("n", 32), ("d", 16))
    )
    hk = int(params.get("kv_heads", h)) if kv_heads is None else kv_heads
    q = rng.standard_normal((b, h, n, d)).astype(np.float32)
    k = rng.standard_normal((b, hk, n, d)).astype(np.float32)
    v = rng.standard_normal((b, hk, n, d)).astype(np.float32)
    return q, k, v


def tf32_or(err_fail: Fail, y, ref) -> Fail:
    err = float(np.abs(np.asarray(y, np.float64) - ref).max())
    if np.isfinite(err) and err <= 3e-3 * (1 + np.abs(ref).max()):
        return Fail(str(err_fail) + ". " + TF32_HINT)
    return err_fail


def gqa_expand(k, h):
    group = h // k.shape[1]
    return np.repeat(k, group, axis=1)


def triton_variants(q, k, v, causal, gqa=False):
    n, scale = q.shape[-2], 1 / math.sqrt(q.shape[-1])
    kind = "causal" if causal else "none"
    out = []
    if gqa:
        h = q.shape[1]
        kk, vv = np.tile(k, (1, h // k.shape[1], 1, 1)), np.tile(v, (1, h // v.shape[1], 1, 1))
        out.append(
            (
                lambda: masked_attention(q, kk, vv, scale, _mask(n, n, kind))[0],
                "query head h must use kv head h // (Hq / kv_heads) (groups of consecutive "
                "query heads share one kv head), not h % kv_heads",
            )
        )
        k, v = gqa_expand(k, h), gqa_expand(v, h)
    if causal:
        out += [
            (
                lambda: masked_attention(q, k, v, scale, _mask(n, n, "strict"))[0],
                "causal is off by one: query i sees keys j <= i (offs_m[:, None] >= offs_n[None, :])",
            ),
            (
                lambda: masked_attention(q, k, v, scale, _mask(n, n, "strict"), "nan")[0],
                "causal is off by one: query i sees keys j <= i (offs_m[:, None] >= offs_n[None, :])",
            ),
            (
                lambda: masked_attention(q, k, v, scale, _mask(n, n, "none"))[0],
                "causal=True was ignored: mask scores where the key index is above the query index",
            ),
        ]
    else:
        out.append(
            (
                lambda: masked_attention(q, k, v, scale, _mask(n, n, "causal"))[0],
                "a causal mask was applied although causal=False",
            )
        )
    out.append(
        (
            lambda: masked_attention(q, k, v, 1.0, _mask(n, n, kind))[0],
            "the scores were not scaled by 1/sqrt(d)",
        )
    )
    return out
