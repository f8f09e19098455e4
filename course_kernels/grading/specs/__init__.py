"""The exercises, one spec module each: everything about an exercise in one place.

Each module holds the notebook's prose, each function's points and text, its solution (real
code, which the lint sees and the solution notebook runs), the visible and hidden test
parameters, the test builders (inputs from a seed, float64 references) and the mistakes the
feedback names. ``course_kernels.grading.notebooks`` builds the notebooks from the modules and
``scripts/build_notebooks.py`` writes the hidden tests' JSON from them.
"""

from __future__ import annotations

import ast
import inspect
import textwrap


def source_of(functions, name: str) -> str:
    """The source of the function called ``name`` among ``functions`` (a solution cell)."""
    return inspect.getsource({f.__name__: f for f in functions}[name]).rstrip() + "\n"


def nested_source(define, name: str) -> str:
    """The solution cell of a Triton exercise: the functions ``define`` defines (a kernel and its
    wrapper; it imports torch and Triton when called, never at import), from the first
    decorator to the end of the last function, dedented."""
    text = textwrap.dedent(inspect.getsource(define))
    body = ast.parse(text).body[0].body
    defs = [n for n in body if isinstance(n, ast.FunctionDef)]
    if name not in {n.name for n in defs}:
        raise KeyError(f"{define.__name__} defines no {name!r}")
    start = (
        min(n.lineno for n in defs[0].decorator_list) if defs[0].decorator_list else defs[0].lineno
    )
    lines = text.splitlines()[start - 1 : defs[-1].end_lineno]
    return textwrap.dedent("\n".join(lines)).rstrip() + "\n"
