"""The book's chapters and the exercise notebooks (and their solutions) use the package's
public names only: no ``import`` of a private module
or name, no ``module._private`` attribute, no ``mock.patch`` of package internals. The setup
cell (the one template in course_kernels.colab) is the package's own code and is skipped.

Private means a name with a leading underscore (dunders excepted). Strings are not code: a
kernel name such as "_attn_fwd" read from a data file is a value, not a private reference.
"""

from __future__ import annotations

import ast
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted(p for p in (ROOT / "book").rglob("*.ipynb") if "_build" not in p.parts)
CHAPTERS += sorted((ROOT / "exercises").glob("*.ipynb")) + sorted(
    (ROOT / "solutions").glob("*.ipynb")
)


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_uses(source: str) -> list[str]:
    """The private names a cell's code imports or reaches for (IPython magics dropped)."""
    code = "\n".join("" if ln.lstrip().startswith(("%", "!")) else ln for ln in source.splitlines())
    found = []
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.ImportFrom):
            parts = (node.module or "").split(".")
            if any(_private(p) for p in parts) or any(_private(a.name) for a in node.names):
                found.append(f"from {node.module} import {', '.join(a.name for a in node.names)}")
        elif isinstance(node, ast.Import):
            found += [
                f"import {a.name}" for a in node.names if any(map(_private, a.name.split(".")))
            ]
        elif isinstance(node, ast.Attribute) and _private(node.attr):
            found.append(f"attribute .{node.attr}")
        elif (
            isinstance(node, ast.Attribute)
            and node.attr in ("patch", "object")
            and (isinstance(node.value, ast.Name) and node.value.id == "mock")
        ):
            found.append("mock.patch")
    return found


def _code_cells(path):
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code" and "course-setup" not in cell.metadata.get("tags", []):
            yield cell


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_chapter_uses_public_names_only(path):
    bad = [(cell.id, use) for cell in _code_cells(path) for use in private_uses(cell.source)]
    assert not bad, f"{path.name} uses private names (cell id, use): {bad}"


@pytest.mark.parametrize(
    "source",
    [
        "from course_kernels import _triton_env",
        "from course_kernels.numpy.online_softmax import update, _safe",
        "import course_kernels.triton._env",
        "show(tiled._forward_fa2)",
        "with mock.patch.object(m, 'pick_configs', f):\n    pass",
    ],
)
def test_the_check_catches_private_uses(source):
    assert private_uses(source)


def test_the_check_allows_public_code_and_strings():
    assert private_uses('from course_kernels import flash\nx = r["kernel"] == "_attn_fwd"\n') == []
    assert private_uses("%matplotlib inline\nx.__class__") == []
