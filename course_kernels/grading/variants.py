"""Known-wrong versions of the algorithms, computed in float64 to *name* a student's mistake.

If a submission's output matches one of these (to 1e-3), the feedback says which classic mistake
it is, in the words of the algorithm: "the accumulator is not rescaled", "causal is off by one".
Each variant is small and deliberately written out; none of them is ever a reference.
"""

from __future__ import annotations

import math

import numpy as np


def _scale(scale, d):
    return 1.0 / math.sqrt(d) if scale is None else float(scale)


def _mask(nq, nk, kind):
    i = np.arange(nq)[:, None]
    j = np.arange(nk)[None, :]
    return {
        "causal": j <= i,
        "strict": j < i,
        "plus_one": j <= i + 1,
        "bottom_right": j <= i + (nk - nq),
        "none": np.ones((nq, nk), bool),
    }[kind]


def masked_attention(q, k, v, scale, mask, empty="zero"):
    """Dense float64 attention under ``mask``; rows with nothing visible give 0 or NaN."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    s = scale * q @ np.swapaxes(k, -1, -2)
    s = np.where(mask, s, -np.inf)
    with np.errstate(all="ignore"):
        m = s.max(-1, keepdims=True)
        if empty == "zero":
            m = np.where(np.isneginf(m), 0, m)
        p = np.exp(s - m)
        l = p.sum(-1, keepdims=True)
        out = p @ v / (np.where(l == 0, 1, l) if empty == "zero" else l)
        lse = (m + np.log(l))[..., 0]
    return out, lse


def _tiled_bug(q, k, v, causal, scale, bq, bk, bug):
    """Tiled forward (FA2 order) in float64 with one classic bug switched on."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    nq, nk = q.shape[-2], k.shape[-2]
    scale = _scale(scale, q.shape[-1])
    out = np.zeros((*q.shape[:-1], v.shape[-1]))
    for i0 in range(0, nq, bq):
        i1 = min(i0 + bq, nq)
        m = np.full((*q.shape[:-2], i1 - i0), -np.inf)
        l = np.zeros_like(m)
        acc = np.zeros((*q.shape[:-2], i1 - i0, v.shape[-1]))
        n_blocks = 0
        for j0 in range(0, nk, bk):
            j1 = min(j0 + bk, nk)
            s = scale * q[..., i0:i1, :] @ np.swapaxes(k[..., j0:j1, :], -1, -2)
            if causal:
                s = np.where(_mask(nq, nk, "causal")[i0:i1, j0:j1], s, -np.inf)
            with np.errstate(all="ignore"):
                m_new = np.maximum(m, s.max(-1))
                ms = np.where(np.isneginf(m_new), 0, m_new)
                p = np.exp(s - ms[..., None])
                alpha = np.exp(m - ms)
                if bug == "normalize_each_block":
                    rs = p.sum(-1, keepdims=True)
                    if np.all(rs == 0):
                        continue
                    acc = (
                        acc + np.where(rs == 0, 0, p / np.where(rs == 0, 1, rs)) @ v[..., j0:j1, :]
                    )
                    n_blocks += 1
                    l = np.ones_like(l)
                elif bug == "no_rescale":
                    l = l + p.sum(-1)
                    acc = acc + p @ v[..., j0:j1, :]
                elif bug == "l_only":
                    l = alpha * l + p.sum(-1)
                    acc = acc + p @ v[..., j0:j1, :]
                else:  # "no_final_divide" and friends share the right update
                    l = alpha * l + p.sum(-1)
                    acc = alpha[..., None] * acc + p @ v[..., j0:j1, :]
                m = m_new
        if bug == "no_final_divide":
            out[..., i0:i1, :] = acc
        elif bug == "mean_of_blocks":
            out[..., i0:i1, :] = acc / max(n_blocks, 1)
        else:
            out[..., i0:i1, :] = acc / np.where(l == 0, 1, l)[..., None]
    return out


FORWARD_MESSAGES = {
    "no_rescale": "the accumulator is not rescaled: when the running max rises from m_old to "
    "m_new, the old l and O must be multiplied by exp(m_old - m_new) before adding the new block",
    "l_only": "l is rescaled but O is not: the output accumulator needs the same factor "
    "exp(m_old - m_new) as l",
    "normalize_each_block": "each block was normalised on its own (softmax per block): blocks "
    "must share one normaliser; keep O unnormalised, rescale it, and divide by l once at the end",
    "mean_of_blocks": "the per-block softmax results were averaged: blocks must share one "
    "normaliser; keep O unnormalised and divide by l once at the end",
    "no_final_divide": "the output was never divided by l (the softmax denominator)",
}


def _backward_dense(q, k, v, dout, scale, mask, bug=None):
    q, k, v, do = (np.asarray(x, np.float64) for x in (q, k, v, dout))
    s = np.where(mask, scale * q @ np.swapaxes(k, -1, -2), -np.inf)
    with np.errstate(all="ignore"):
        m = s.max(-1, keepdims=True)
        p = np.exp(s - np.where(np.isneginf(m), 0, m))
        p = p / np.where(p.sum(-1, keepdims=True) == 0, 1, p.sum(-1, keepdims=True))
    o = p @ v
    dv = np.swapaxes(p, -1, -2) @ do
    dp = do @ np.swapaxes(v, -1, -2)
    if bug == "no_D":
        ds = p * dp
    elif bug == "D_without_O":
        ds = p * (dp - do.sum(-1, keepdims=True))
    else:
        ds = p * (dp - (do * o).sum(-1, keepdims=True))
    scale = 1.0 if bug == "no_scale" else scale
    return scale * ds @ k, scale * np.swapaxes(ds, -1, -2) @ q, dv


def tiled_variants(q, k, v, causal=False, scale=None, block_q=16, block_k=16, dout=None):
    """(variant output, message) pairs for the forward (or, with ``dout``, the backward)."""
    nq, nk = q.shape[-2], k.shape[-2]
    default_scale = scale is None
    scale = _scale(scale, q.shape[-1])  # _tiled_bug resolves None the same way
    mask_kind = "causal" if causal else "none"
    out = []
    if dout is not None:  # each variant is a function returning (dq, dk, dv), computed once
        mask = _mask(nq, nk, mask_kind)

        def lazy(mask, bug=None):
            memo = []

            def get():
                if not memo:
                    memo.append(_backward_dense(q, k, v, dout, scale, mask, bug))
                return memo[0]

            return get

        out.append(
            (
                lazy(mask, "no_D"),
                "the -D term is missing: dS = P * (dP - D) with D = rowsum(dO * O)",
            )
        )
        out.append(
            (
                lazy(mask, "D_without_O"),
                "D = rowsum(dO * O) (elementwise product with O), not rowsum(dO)",
            )
        )
        out.append(
            (
                lazy(mask, "no_scale"),
                "dQ and dK need the softmax scale: dQ = scale dS K, dK = scale dS^T Q",
            )
        )
        if causal:
            for kind, msg in _causal_messages():
                out.append((lazy(_mask(nq, nk, kind)), msg))
        else:
            out.append(
                (lazy(_mask(nq, nk, "causal")), "a causal mask was applied although causal=False")
            )
        return out
    for bug, msg in FORWARD_MESSAGES.items():
        out.append((lambda bug=bug: _tiled_bug(q, k, v, causal, scale, block_q, block_k, bug), msg))
    if causal:
        for kind, msg in _causal_messages():
            for empty in ("zero", "nan"):
                out.append(
                    (
                        lambda kind=kind, empty=empty: masked_attention(
                            q, k, v, scale, _mask(nq, nk, kind), empty
                        )[0],
                        msg,
                    )
                )
        out.append(
            (
                lambda: masked_attention(q, k, v, scale, _mask(nq, nk, "none"))[0],
                "causal=True was ignored: query i may only see keys j <= i",
            )
        )
    else:
        out.append(
            (
                lambda: masked_attention(q, k, v, scale, _mask(nq, nk, "causal"))[0],
                "a causal mask was applied although causal=False",
            )
        )
    if default_scale:
        out.append(
            (
                lambda: masked_attention(q, k, v, 1.0, _mask(nq, nk, mask_kind))[0],
                "the scores were not scaled: S = Q K^T / sqrt(d) when scale is None",
            )
        )
    else:
        out.append(
            (
                lambda: masked_attention(
                    q, k, v, 1 / math.sqrt(q.shape[-1]), _mask(nq, nk, mask_kind)
                )[0],
                "the scale argument was ignored (1/sqrt(d) used instead)",
            )
        )
    return out


def _causal_messages():
    return [
        (
            "strict",
            "causal is off by one: query i sees keys j <= i (the diagonal included), not j < i",
        ),
        ("plus_one", "causal is off by one: query i sees keys j <= i, not j <= i + 1"),
        (
            "bottom_right",
            "causal is aligned to the bottom-right corner; this course uses PyTorch's "
            "is_causal (top-left): query i sees keys j <= i",
        ),
    ]


def lse_variants(q, k, causal, scale):
    """Wrong logsumexps a forward pass might save for the backward pass."""
    nq, nk = q.shape[-2], k.shape[-2]
    scale = _scale(scale, q.shape[-1])
    s = scale * np.asarray(q, np.float64) @ np.swapaxes(np.asarray(k, np.float64), -1, -2)
    if causal:
        s = np.where(_mask(nq, nk, "causal"), s, -np.inf)
    m = s.max(-1)
    lse = m + np.log(np.exp(s - m[..., None]).sum(-1))
    return [
        (m, "that is the row max m, not the logsumexp: save L = m + log(l)"),
        (lse - m, "that is log(l) without the max: save L = m + log(l)"),
        (np.exp(lse - m), "that is l (the row sum), not its log: save L = m + log(l)"),
        (
            lse / math.log(2),
            "that is a base-2 logsumexp: the backward pass here uses exp, so save L = m + ln(l)",
        ),
    ]


def naive_backward(q, k, v, dout, causal, scale):
    """Standard attention's gradients computed in the inputs' dtype: the 3x budget's yardstick."""
    dt = q.dtype.type
    scale = dt(_scale(scale, q.shape[-1]))
    s = (q @ np.swapaxes(k, -1, -2)) * scale
    if causal:
        s = np.where(_mask(q.shape[-2], k.shape[-2], "causal"), s, dt(-np.inf))
    p = np.exp(s - s.max(-1, keepdims=True))
    p = p / p.sum(-1, keepdims=True)
    o = p @ v
    dv = np.swapaxes(p, -1, -2) @ dout
    dp = dout @ np.swapaxes(v, -1, -2)
    ds = p * (dp - (dout * o).sum(-1, keepdims=True))
    return (ds @ k) * scale, (np.swapaxes(ds, -1, -2) @ q) * scale, dv
