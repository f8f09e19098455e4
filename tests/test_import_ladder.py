"""The package's tree is the ladder the course teaches, and the imports follow it (issue 19).

Layers, bottom to top (``LADDER``): the plain helpers at the top level of the package, then
``numpy`` (reference, online softmax, tiling, backward), ``iosim`` (the IO model) and
``hardware`` (GPU tables) and ``gluon`` (FA3's schedule below Triton's ``tl``, which depends on
nothing above NumPy and which the Triton launch dispatches to on Hopper), ``triton`` (the
kernels), ``serving`` (decoding, KV cache), ``distributed`` (ring attention), ``bench``
(measurements), ``apps``, and ``grading`` on top. A module may import (at module level or inside a function) only from
its own subpackage and from layers below it. The NumPy layers import neither torch nor Triton,
checked in a fresh interpreter.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "course_kernels"

# (layer name, rank): equal ranks may not import each other either.
LADDER = {
    "_helpers": 0,  # the package's top-level plain modules (_validate, _compat, datafiles, ...)
    "numpy": 1,
    "iosim": 2,
    "hardware": 2,
    "gluon": 2,  # below Triton's tl: imports nothing above numpy; triton.launch dispatches to it
    "triton": 3,
    "serving": 4,
    "distributed": 5,
    "bench": 6,
    "apps": 7,
    "grading": 8,
}
# top-level modules that sit above a layer (they read the layers' public names)
TOP_LEVEL_ABOVE = {"__init__": 9, "__main__": 9, "device": 3.5, "colab": 0}
# NumPy-only modules outside the numpy layer (the IO model, tables, algorithms without torch)
NUMPY_ONLY = [
    "course_kernels",
    "course_kernels.numpy",
    "course_kernels.iosim",
    "course_kernels.hardware",
    "course_kernels.serving.split_kv",
    "course_kernels.serving.kvcache",
    "course_kernels.serving.pages",
    "course_kernels.serving.varlen",
    "course_kernels.distributed.cost",
    "course_kernels.grading",
    "course_kernels.datafiles",
    "course_kernels.colab",
]


def layer_of(parts: tuple[str, ...]) -> str:
    """('course_kernels', 'triton', 'forward') -> 'triton'; top-level modules -> '_helpers'."""
    if len(parts) >= 3 or (len(parts) == 2 and (PKG / parts[1]).is_dir()):
        return parts[1]
    return "_helpers"


def rank(parts: tuple[str, ...]) -> float:
    if len(parts) == 2 and parts[1] in TOP_LEVEL_ABOVE:
        return TOP_LEVEL_ABOVE[parts[1]]
    return LADDER[layer_of(parts)]


def imports_of(path: Path, pkg_root: Path = PKG) -> set[tuple[str, ...]]:
    """Every course_kernels module a file imports, anywhere in it, as dotted parts."""
    here = ("course_kernels",) + path.relative_to(pkg_root).with_suffix("").parts
    package = here[:-1] if here[-1] != "__init__" else here[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                mod = base + tuple((node.module or "").split(".")) if node.module else base
            else:
                mod = tuple((node.module or "").split("."))
            if mod[0] != "course_kernels":
                continue
            if node.module is None or len(mod) == 1:  # from . import a, b: names may be modules
                found.update(mod + (a.name,) for a in node.names)
            else:
                found.add(mod)
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("course_kernels."):
                    found.add(tuple(a.name.split(".")))
    return found


def ladder_problems(pkg_root: Path = PKG) -> list[str]:
    problems = []
    for path in sorted(pkg_root.rglob("*.py")):
        src = ("course_kernels",) + path.relative_to(pkg_root).with_suffix("").parts
        if src[-1] == "__init__":
            src = src[:-1] if len(src) > 2 else src[:1] + ("__init__",)
        for target in imports_of(path, pkg_root):
            if len(target) == 1 or layer_of(target) == layer_of(src) != "_helpers":
                continue
            if target[1] in ("__init__",):
                continue
            if rank(target[:2] if layer_of(target) == "_helpers" else target) > rank(src) or (
                rank(target) == rank(src) and layer_of(target) != layer_of(src)
            ):
                problems.append(f"{'.'.join(src)} imports {'.'.join(target)} (a higher layer)")
    return problems


def test_every_layer_is_a_real_subpackage():
    for name in LADDER:
        if name != "_helpers":
            assert (PKG / name / "__init__.py").is_file(), name


def test_the_top_level_lists_subpackages_not_modules():
    modules = sorted(p.stem for p in PKG.glob("*.py"))
    assert len(modules) <= 10, f"course_kernels/ has {len(modules)} modules: {modules}"
    for sub in (p for p in PKG.rglob("*") if p.is_dir() and (p / "__init__.py").is_file()):
        if sub == PKG / "grading" / "specs":
            continue  # one module per exercise, by design (specs/__init__.py): a list, not a level
        n = len(list(sub.glob("*.py")))
        assert n <= 11, f"{sub.relative_to(PKG.parent)} has {n} modules (at most ~10 a level)"


def test_imports_follow_the_ladder():
    assert ladder_problems() == []


def test_numpy_layers_import_no_torch_or_triton():
    code = (
        "import sys\n"
        + "".join(f"import {m}\n" for m in NUMPY_ONLY)
        + "print(sorted({'torch', 'triton'} & set(sys.modules)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=PKG.parent, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", f"a NumPy layer pulled in {out.stdout.strip()}"


@pytest.mark.parametrize(
    "source, text",
    [
        ("numpy/tiled.py", "from ..triton import flash\n"),
        (
            "numpy/tiled.py",
            "def f():\n    from course_kernels.serving.decode import flash_decode\n",
        ),
        ("triton/forward.py", "from ..apps import gpt\n"),
        ("iosim/memory.py", "from ..hardware import specs\n"),
    ],
)
def test_the_checker_catches_an_upward_import(tmp_path, source, text):
    """A planted import up the ladder (module level or inside a function) is reported."""
    pkg = tmp_path / "course_kernels"
    for sub in ("numpy", "triton", "apps", "iosim", "hardware", "serving"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / source).write_text(text)
    problems = ladder_problems(pkg)
    assert len(problems) == 1 and "higher layer" in problems[0], problems


def test_the_checker_allows_downward_imports(tmp_path):
    pkg = tmp_path / "course_kernels"
    for sub in ("numpy", "triton"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "_validate.py").write_text("")
    (pkg / "triton" / "forward.py").write_text(
        "from ..numpy.reference import LN2\nfrom .._validate import x\nfrom . import launch\n"
    )
    assert ladder_problems(pkg) == []
