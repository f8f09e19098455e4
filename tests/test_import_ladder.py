"""The import graph reads as the ladder the course teaches (issue 12).

* The NumPy rungs (reference -> online softmax -> tiling -> backward -> IO simulator, the
  split-KV algorithm, the hardware tables) import neither torch nor Triton, so they run anywhere
  NumPy does, checked in a fresh interpreter.
* At module level, a NumPy rung imports only NumPy rungs and the package's plain helpers.
* Nothing below the applications (``gpt``, ``decode``, ``apps``, ``distributed`` and the ring
  modules, the benchmarks) imports them at module level: applications sit on top.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "course_kernels"

NUMPY_RUNGS = {
    "reference",
    "online_softmax",
    "blocks",
    "tiled",
    "tiled_backward",
    "iosim",
    "two_level_memory",
    "split_kv",
    "hardware",
    "gpu_specs",
    "ceilings",
    "kvcache",
    "ring_cost",
}
PLAIN_HELPERS = {"_validate", "_compat", "datafiles"}
APPLICATIONS = {"gpt", "decode", "apps", "distributed", "ring_bench", "ring_check", "ring_measure"}
APPLICATIONS |= {"ring_torch_cp", "bench", "bench_sweep", "bench_memory", "bench_dram"}


def _module_level_imports(name: str) -> set[str]:
    """course_kernels modules imported by top-level statements of course_kernels/<name>.py."""
    tree = ast.parse((PKG / f"{name}.py").read_text())
    found = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                found.add(node.module.split(".")[0])
            else:  # from . import x, y
                found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("course_kernels."):
            found.add(node.module.split(".")[1])
    return found


def test_the_rung_lists_name_real_modules():
    for name in NUMPY_RUNGS | PLAIN_HELPERS | APPLICATIONS:
        assert (PKG / f"{name}.py").is_file(), name


def test_numpy_rungs_import_no_torch_or_triton():
    code = (
        "import sys\n"
        + "".join(f"import course_kernels.{m}\n" for m in sorted(NUMPY_RUNGS))
        + "print(sorted({'torch', 'triton'} & set(sys.modules)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=PKG.parent, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", f"a NumPy rung pulled in {out.stdout.strip()}"


@pytest.mark.parametrize("name", sorted(NUMPY_RUNGS))
def test_numpy_rungs_import_only_numpy_rungs(name):
    extra = _module_level_imports(name) - NUMPY_RUNGS - PLAIN_HELPERS
    assert not extra, f"course_kernels/{name}.py imports {sorted(extra)} at module level"


def test_applications_sit_on_top():
    lower = {p.stem for p in PKG.glob("*.py")} - APPLICATIONS - {"__main__"}
    for name in sorted(lower):
        used = _module_level_imports(name) & APPLICATIONS
        assert not used, f"course_kernels/{name}.py (below the applications) imports {sorted(used)}"


def test_the_checker_sees_imports(tmp_path, monkeypatch):
    """The AST walk finds both spellings of a package-relative import (so the tests above can fail)."""
    (tmp_path / "probe.py").write_text("from . import gpt\nfrom .decode import flash_decode\n")
    monkeypatch.setattr(sys.modules[__name__], "PKG", tmp_path)
    assert _module_level_imports("probe") == {"gpt", "decode"}
