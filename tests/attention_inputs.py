"""Random attention inputs shared by the NumPy-layer tests (imported as a plain module)."""

import numpy as np


def make_qkv(rng, lead=(2, 3), n_q=17, n_k=None, d=8, dv=None, dtype=np.float64, scale=1.0):
    """q (*lead, Nq, d), k (*lead, Nk, d), v (*lead, Nk, dv) of standard normals."""
    n_k = n_q if n_k is None else n_k
    dv = d if dv is None else dv
    q = (scale * rng.standard_normal((*lead, n_q, d))).astype(dtype)
    k = (scale * rng.standard_normal((*lead, n_k, d))).astype(dtype)
    v = rng.standard_normal((*lead, n_k, dv)).astype(dtype)
    return q, k, v
