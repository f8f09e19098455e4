# notebook: 03_tiled_forward
# exercise: flash_forward
# attack: the full score matrix built block_q rows at a time (row chunks, full Nk): right answers, not tiled
def flash_forward(q, k, v, causal=False, scale=None, block_q=64, block_k=64):
    d = q.shape[-1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    nq, nk = q.shape[-2], k.shape[-2]
    out = np.zeros((*q.shape[:-1], v.shape[-1]), dtype=q.dtype)
    lse = np.zeros(q.shape[:-1], dtype=q.dtype)
    for i in range(0, nq, block_q):
        s = scale * (q[..., i:i + block_q, :] @ np.swapaxes(k, -1, -2))
        if causal:
            rows = np.arange(i, min(i + block_q, nq))[:, None]
            s = np.where(np.arange(nk)[None, :] <= rows, s, -np.inf)
        m = s.max(axis=-1, keepdims=True)
        p = np.exp(s - m)
        l = p.sum(axis=-1, keepdims=True)
        out[..., i:i + block_q, :] = (p @ v) / l
        lse[..., i:i + block_q] = (m + np.log(l))[..., 0]
    return out, lse
