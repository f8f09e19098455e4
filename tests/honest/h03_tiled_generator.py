# notebook: 03_tiled_forward
# exercise: flash_forward
# honest: a tiled forward written differently from the solution (query blocks outer, helper inside the cell)
def _block(q_i, k, v, i0, causal, scale, block_k):
    n_k = k.shape[-2]
    m = np.full(q_i.shape[:-1], -np.inf)
    l = np.zeros(q_i.shape[:-1])
    acc = np.zeros((*q_i.shape[:-1], v.shape[-1]))
    rows = np.arange(i0, i0 + q_i.shape[-2])[:, None]
    for j0 in range(0, n_k, block_k):
        s = scale * (q_i @ np.swapaxes(k[..., j0:j0 + block_k, :], -1, -2)).astype(np.float64)
        if causal:
            s = np.where(np.arange(j0, min(j0 + block_k, n_k))[None, :] <= rows, s, -np.inf)
        m_new = np.maximum(m, s.max(-1))
        safe = np.where(np.isneginf(m_new), 0.0, m_new)
        p = np.exp(s - safe[..., None])
        a = np.exp(m - safe)
        l = a * l + p.sum(-1)
        acc = a[..., None] * acc + p @ v[..., j0:j0 + block_k, :]
        m = m_new
    return acc / l[..., None], m + np.log(l)


def flash_forward(q, k, v, causal=False, scale=None, block_q=64, block_k=64):
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    out = np.empty((*q.shape[:-1], v.shape[-1]), q.dtype)
    lse = np.empty(q.shape[:-1], q.dtype)
    for i0 in range(0, q.shape[-2], block_q):
        o, s = _block(q[..., i0:i0 + block_q, :], k, v, i0, causal, scale, block_k)
        out[..., i0:i0 + block_q, :], lse[..., i0:i0 + block_q] = o, s
    return out, lse
