"""Gluon's language, imported once for the kernel modules of this rung, or not at all.

Everything Gluon-related is optional: on a CPU-only machine or another Triton version the
imports fail, ``HAVE_GLUON`` is False, the kernel modules define nothing, and
:func:`course_kernels.gluon.launch.gluon_available` says why.
"""

from __future__ import annotations

IMPORT_ERROR = None
try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.language.core import _aggregate as aggregate  # Gluon's own examples use it
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        mbarrier,
        tma,
        warpgroup_mma,
        warpgroup_mma_wait,
    )

    HAVE_GLUON = True
except Exception as e:  # pragma: no cover - depends on the installed Triton
    HAVE_GLUON = False
    IMPORT_ERROR = e

__all__ = [
    "HAVE_GLUON",
    "IMPORT_ERROR",
    "aggregate",
    "fence_async_shared",
    "gl",
    "gluon",
    "mbarrier",
    "tma",
    "warpgroup_mma",
    "warpgroup_mma_wait",
]
