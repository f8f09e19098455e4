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


# CI runs the same Hypothesis examples every time (derandomized); locally they vary.
from hypothesis import settings as _hyp_settings  # noqa: E402

_hyp_settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True)
if os.environ.get("CI"):
    _hyp_settings.load_profile("ci")
