# notebook: 05_count_io
# exercise: fa2_forward_io
# honest: FA2 that frees K_j as soon as S is computed and V_j after, so tiles are freed out of order
def fa2_forward_io(mem, block_q, block_k):
    n, d = mem.hbm["Q"].shape
    n_k, dv = mem.hbm["V"].shape
    scale = 1.0 / math.sqrt(d)
    for i0 in range(0, n, block_q):
        i1 = min(i0 + block_q, n)
        q_i = mem.load("Q", slice(i0, i1))
        acc = mem.alloc((i1 - i0, dv))
        m = np.full(i1 - i0, -np.inf)
        l = np.zeros(i1 - i0)
        for j0 in range(0, n_k, block_k):
            j1 = min(j0 + block_k, n_k)
            k_j = mem.load("K", slice(j0, j1))
            v_j = mem.load("V", slice(j0, j1))
            s = scale * (q_i @ k_j.T)
            mem.free(k_j)
            m_new = np.maximum(m, s.max(axis=-1))
            p = np.exp(s - m_new[:, None])
            alpha = np.exp(m - m_new)
            l = alpha * l + p.sum(axis=-1)
            acc *= alpha[:, None]
            acc += p @ v_j
            m = m_new
            mem.free(v_j)
        mem.store("O", slice(i0, i1), acc / l[:, None])
        mem.store("L", slice(i0, i1), m + np.log(l))
        mem.free(acc, q_i)
