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

    from triton._C.libtriton import ir as _ir
    from triton.experimental.gluon.language._core import builtin as _builtin

    @_builtin
    def tma_reduce_add(tensor_desc, coord, src, _semantic=None):
        """dst[coord:coord + block] += src (a shared-memory tile) by one TMA bulk reduction
        (``cp.reduce.async.bulk.tensor ... .add``), asynchronous like ``tma.async_copy_shared_
        to_global``: ``tma.store_wait`` says when src may be overwritten. Triton 3.6's Gluon
        builder has the op (``create_async_tma_reduce``) without a Python wrapper; this is the
        wrapper, written as ``async_copy_shared_to_global`` is in ``gluon/.../hopper/tma.py``."""
        coord = _semantic._convert_to_ir_values(coord, require_i64=False)
        _semantic.builder.create_async_tma_reduce(
            _ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle, coord, src.handle
        )

    @gluon.constexpr_function
    def set_fields(obj, names, values) -> None:
        """The body of an ``aggregate``'s ``constexpr_function`` ``__init__(self, *values)``: the
        fields ``names`` (the class's annotations, made from the same tuple) set to ``values`` in
        that order, each a ``gl.constexpr``. A ``constexpr_function`` itself (Triton's scan
        refuses plain functions called from one), so its arguments arrive wrapped in constexpr."""
        obj, names, values = (x.value if isinstance(x, gl.constexpr) else x
                              for x in (obj, names, values))  # fmt: skip
        if len(values) != len(names):
            raise TypeError(
                f"{type(obj).__name__} takes {len(names)} values {names}, got {len(values)}"
            )
        for name, value in zip(names, values, strict=True):
            setattr(obj, name, gl.constexpr(value))

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
    "set_fields",
    "tma",
    "tma_reduce_add",
    "warpgroup_mma",
    "warpgroup_mma_wait",
]
