"""The lint of a solution cell: why a cell may not be graded, found by reading it (not running it).

The same :func:`forbidden_use` runs in the notebook's check cell and in the instructor's grader,
so a student sees a refusal before grading. Split from :mod:`.runner`, which re-exports these
names. It only names mistakes early; the sandbox is the wall (notes/grading.md).
"""

from __future__ import annotations

import ast

from .exercises import FORBIDDEN_ALWAYS, FORBIDDEN_NUMPY, FORBIDDEN_NUMPY_ATTRS, FORBIDDEN_TORCH


def _strip_magics(src: str) -> str:
    """IPython magics and shell escapes are not Python: comment them out, as IPython reads them,
    only where a logical line starts (not inside brackets, a string, or after a backslash), so
    that a black-formatted ``!= x`` or ``% n`` continuation line stays code. Cells longer than
    MAX_CELL_CHARS are returned as they are (the lint refuses them unread)."""
    if len(src) > MAX_CELL_CHARS:
        return src
    out = []
    depth = 0  # open brackets
    quote = None  # the open string's delimiter (a triple-quoted string spans lines)
    continued = False  # the previous line ended with a backslash
    for line in src.splitlines():
        starts = depth == 0 and quote is None and not continued
        if starts and line.lstrip().startswith(("%", "!")):
            out.append("# " + line)
            continue
        out.append(line)
        depth, quote, continued = _scan(line, depth, quote)
    return "\n".join(out)


def _scan(line: str, depth: int, quote):
    """(bracket depth, open string delimiter, ends with a backslash) after ``line``."""
    i, n = 0, len(line)
    while i < n:
        c = line[i]
        if quote is not None:
            if c == "\\":
                i += 2
                continue
            if line.startswith(quote, i):
                i += len(quote)
                quote = None
                continue
            i += 1
            continue
        if c == "#":
            break
        if c in "\"'":
            q = line[i : i + 3] if line[i : i + 3] in ('"""', "'''") else c
            quote = q
            i += len(q)
            continue
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth = max(0, depth - 1)
        i += 1
    if quote is not None and len(quote) == 1:
        # an unterminated one-line string: Python's error; a backslash continues it
        continued = line.endswith("\\")
        return depth, (quote if continued else None), continued
    return depth, quote, quote is None and line.endswith("\\")


MAX_CELL_CHARS = 100_000  # a solution cell larger than this is not parsed, run or graded


SYS_ALLOWED = {"float_info", "maxsize", "version_info", "byteorder", "float_repr_style"}


def forbidden_use(source: str, torch_rules: bool) -> str | None:
    """Why a solution cell may not be graded (by reading it), or None.

    The same function runs in the notebook's check cell, so a student sees it before grading.
    ``torch_rules``: a Triton exercise (torch's matmul/softmax/attention allowed only inside a
    ``@triton.jit`` kernel); otherwise a NumPy exercise, where torch (and every library softmax,
    logsumexp or attention) is refused.
    """
    if len(source) > MAX_CELL_CHARS:
        return f"is {len(source)} characters long (more than {MAX_CELL_CHARS}; not read)"
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None  # reported when it runs
    jit_lines, allowed_sys = _jit_lines_and_harmless_sys(tree)
    for node in ast.walk(tree):
        names, why = _names_used(node, torch_rules, allowed_sys, jit_lines)
        if why:
            return why
        for n in names:
            if n in FORBIDDEN_ALWAYS:
                return f"{FORBIDDEN_ALWAYS[n]} (`{n}`, line {node.lineno})"
            if not torch_rules and n in FORBIDDEN_NUMPY:
                return f"{FORBIDDEN_NUMPY[n]} (`{n}`, line {node.lineno})"
            if torch_rules and n in FORBIDDEN_TORCH and node.lineno not in jit_lines:
                return f"{FORBIDDEN_TORCH[n]} (`{n}`, line {node.lineno})"
    return None


def _jit_lines_and_harmless_sys(tree):
    """The lines inside ``@...jit`` functions, and the ids of the ``sys`` names used only as
    ``sys.<allowed attribute>`` (e.g. ``sys.float_info``)."""
    jit_lines = set()
    allowed_sys = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and any(
            "jit" in ast.unparse(dec) for dec in node.decorator_list
        ):
            jit_lines.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "sys"
            and node.attr in SYS_ALLOWED
        ):
            allowed_sys.add(id(node.value))
    return jit_lines, allowed_sys


def _names_used(node, torch_rules, allowed_sys, jit_lines):
    """(names this node uses, or a reason to refuse it outright)."""
    names = []
    if isinstance(node, ast.Name):
        if id(node) not in allowed_sys:
            names = [node.id]
    elif isinstance(node, ast.Attribute):
        names = [node.attr]
        if not torch_rules and node.attr in FORBIDDEN_NUMPY_ATTRS:
            return names, f"{FORBIDDEN_NUMPY_ATTRS[node.attr]} (`.{node.attr}`, line {node.lineno})"
    elif isinstance(node, ast.Import):
        for alias in node.names:
            if alias.name == "sys" and alias.asname in (None, "sys"):
                continue  # `import sys` alone is harmless; its uses are checked
            names += alias.name.split(".")
    elif isinstance(node, ast.ImportFrom):
        names = (node.module or "").split(".")
        if node.module == "sys" and all(a.name in SYS_ALLOWED for a in node.names):
            names = []
        names += [a.name for a in node.names if node.module != "sys"]
    elif (
        torch_rules
        and isinstance(node, ast.BinOp)
        and isinstance(node.op, ast.MatMult)
        and node.lineno not in jit_lines
    ):
        return names, f"multiplies matrices with @ outside a Triton kernel (line {node.lineno})"
    return names, None
