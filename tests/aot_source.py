"""What a launch of one of the course's Triton kernels compiles, built without a GPU.

``launch_source`` returns the ``ASTSource`` that ``JITFunction.run`` would compile for given
argument values: pointers (torch tensors are 16-byte aligned) carry the divisibility hint,
integers equal to 1 become constexprs, other integers that are multiples of 16 carry the hint,
floats are fp32; the dK/dV kernel's ``ATOMIC_DQ`` is off, its ``ONE_LOOP`` and ``PEEL`` on, and
every other switch with a default (``EVEN_BLOCKS``, the dQ kernel's ``PEEL``) takes it, as the
package launches them.
``triton.compile(source, target=GPUTarget(...))`` then lowers it for any GPU. Used by ``tests/test_sm75_compile.py`` (the
T4) and ``experiments/hopper/compile_bwd_sm90.py`` (the H200).
"""

from __future__ import annotations


def launch_source(fn, constexprs: dict, values: dict, pointer_type, backend):
    """fn: a JITFunction; constexprs: the launch's constexprs; values: every int/float argument by
    name; pointer_type(name): the pointer's type ("*fp16", "*fp32", "*i32"...) or None for a
    non-pointer; backend: ``triton.compiler.make_backend(target)`` (parses the hint)."""
    from triton.compiler import ASTSource

    constexprs = dict(constexprs)
    if "ATOMIC_DQ" in fn.arg_names:  # the dK/dV kernel's atomic-dQ variant: off, as launched
        constexprs["ATOMIC_DQ"] = False
    if "ONE_LOOP" in fn.arg_names:  # the dK/dV kernel's single loop: on, as launched (session 9)
        constexprs.setdefault("ONE_LOOP", True)
        constexprs.setdefault("PEEL", True)  # and its tail peeled (session 10)
    for param in fn.params:  # switches with a default (EVEN_BLOCKS, PEEL): as launched
        if param.has_default and param.name not in constexprs:
            constexprs[param.name] = param.default
    signature, attrs = {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in constexprs:
            signature[name] = "constexpr"
        elif (kind := pointer_type(name)) is not None:
            signature[name] = kind
            attrs[(i,)] = backend.parse_attr("D")
        elif isinstance(values[name], float):
            signature[name] = "fp32"
        elif values[name] == 1:
            signature[name], constexprs[name] = "constexpr", 1
        else:
            signature[name] = "i32"
            if values[name] % 16 == 0:
                attrs[(i,)] = backend.parse_attr("D")
    return ASTSource(fn, signature, constexprs, attrs)
