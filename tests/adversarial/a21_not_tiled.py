# notebook: 03_tiled_forward
# exercise: flash_forward
# attack: right answers from the full N x N score matrix: not tiled at all
def flash_forward(q, k, v, causal=False, scale=None, block_q=64, block_k=64):
    d = q.shape[-1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    s = scale * (q @ np.swapaxes(k, -1, -2))
    if causal:
        s = np.where(np.arange(k.shape[-2])[None, :] <= np.arange(q.shape[-2])[:, None], s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    p = np.exp(s - m)
    l = p.sum(axis=-1, keepdims=True)
    return (p @ v) / l, (m + np.log(l))[..., 0]
