"""Shared fixtures. Random inputs are drawn fresh from a seeded generator per test."""

import os
import zlib

import numpy as np
import pytest

# Kernels run in Triton's interpreter when there is no GPU; the package decides, but make the
# choice explicit for the whole test session before anything imports triton.
os.environ.setdefault("MPLBACKEND", "Agg")


@pytest.fixture
def rng(request):
    seed = zlib.crc32(request.node.nodeid.encode())
    return np.random.default_rng(seed)


def make_qkv(rng, lead=(2, 3), n_q=17, n_k=None, d=8, dv=None, dtype=np.float64, scale=1.0):
    """q (*lead, Nq, d), k (*lead, Nk, d), v (*lead, Nk, dv) of standard normals."""
    n_k = n_q if n_k is None else n_k
    dv = d if dv is None else dv
    q = (scale * rng.standard_normal((*lead, n_q, d))).astype(dtype)
    k = (scale * rng.standard_normal((*lead, n_k, d))).astype(dtype)
    v = rng.standard_normal((*lead, n_k, dv)).astype(dtype)
    return q, k, v


# CI runs the same Hypothesis examples every time (derandomized); locally they vary.
from hypothesis import settings as _hyp_settings  # noqa: E402

_hyp_settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True)
if os.environ.get("CI"):
    _hyp_settings.load_profile("ci")
