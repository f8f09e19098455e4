"""The book's configuration: one repository URL, the same first cell everywhere, the TOC complete.

Fast (no build). The built site itself is checked by tests/test_site.py.
"""

import importlib.util
import os
import subprocess
import sys
import types
from pathlib import Path

import nbformat
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("stamp_colab_cell", ROOT / "scripts" / "stamp_colab_cell.py")
stamp = importlib.util.module_from_spec(spec)
spec.loader.exec_module(stamp)

CONFIG = yaml.safe_load((ROOT / "_config.yml").read_text())
NOTEBOOKS = stamp.toc_notebooks()
URL = CONFIG["repository"]["url"]

# Issue 4's chapters (and the introduction) must each be an .ipynb page of the TOC.
REQUIRED = [
    "intro", "chapters/01_memory_hierarchy", "chapters/02_standard_attention", "chapters/03_tiling",
    "chapters/04_online_softmax", "chapters/05_io_complexity", "chapters/06_misconceptions",
    "chapters/07_interview_questions", "chapters/animation", "appendix/errata",
]
PART_TWO = ["from_numpy_to_triton", "backward_and_recomputation", "engineering", "tuning",
            "performance", "applications"]


def toc_files():
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = [toc["root"]]
    for part in toc["parts"]:
        files += [c["file"] for c in part["chapters"]]
    return files


def test_book_toc_symlink_points_to_root_toc():
    link = ROOT / "book" / "_toc.yml"
    assert link.is_symlink(), "book/_toc.yml must be a symlink to ../_toc.yml (JB1 looks for it in book/)"
    assert os.readlink(link) == "../_toc.yml"


def test_book_toc_lists_every_chapter_and_part_two_placeholders():
    files = toc_files()
    for f in REQUIRED:
        assert f in files, f"{f} missing from _toc.yml"
        assert (ROOT / "book" / f"{f}.ipynb").is_file(), f"{f} must be a notebook (Colab button)"
    for f in PART_TWO:
        assert f"part2/{f}" in files
    for f in files:
        assert any((ROOT / "book" / f"{f}{ext}").is_file() for ext in (".ipynb", ".md")), f


def test_book_config_colab_and_repository_in_one_place():
    assert URL.startswith("https://github.com/") and not URL.endswith("/")
    assert CONFIG["launch_buttons"]["colab_url"] == "https://colab.research.google.com"
    assert CONFIG["execute"]["execute_notebooks"] == "cache"
    assert CONFIG["sphinx"]["config"]["mathjax_path"] == "mathjax/tex-mml-chtml.js"
    assert "_static" not in CONFIG["sphinx"]["config"]["html_static_path"]
    assert not (ROOT / "book" / "_static").exists(), "JB1 injects every .js under book/_static into every page"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_book_first_cell_is_the_stamped_setup_cell(path):
    nb = nbformat.read(path, as_version=4)
    first = nb.cells[0]
    assert first.cell_type == "code"
    assert first.source == stamp.setup_source(), (
        f"{path.name}: first cell differs from _config.yml's URL; run python scripts/stamp_colab_cell.py"
    )
    assert first.metadata.get("tags") == ["remove-cell", "course-setup"]
    assert first.metadata.get("cellView") == "form" and first.source.startswith("#@title")
    # The URL lives in the first cell only; everything else reads $COURSE_REPO_URL.
    for cell in nb.cells[1:]:
        assert URL not in cell.source, f"{path.name}: repository URL typed outside the first cell"
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), (
        f"{path.name}: commit notebooks without outputs (the build executes them)"
    )


def test_book_every_toc_notebook_is_stamped():
    assert {p.relative_to(ROOT / "book").with_suffix("").as_posix() for p in NOTEBOOKS} >= set(REQUIRED)
    assert stamp.main(["--check"]) == 0


def test_book_setup_cell_outside_colab_installs_nothing_and_picks_a_device():
    code = stamp.setup_source() + "\nimport os; print(DEVICE, SMALL, ON_COLAB, os.environ.get('TRITON_INTERPRET'))"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PATH"] = ""  # no nvidia-smi, no pip on PATH: the cell must not need them here
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["cpu", "True", "False", "1"]
    assert out.stderr == ""


def test_book_setup_cell_on_colab_installs_the_package_without_deps(monkeypatch):
    calls = []
    monkeypatch.setitem(sys.modules, "google", types.ModuleType("google"))
    monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in ("course_kernels", "tqdm") else real_find_spec(name, *a))
    monkeypatch.setattr(subprocess, "run", lambda cmd, **kw: calls.append(cmd))
    for var in ("COURSE_REPO_URL", "TRITON_INTERPRET"):  # restored after the test
        monkeypatch.setenv(var, "unset")
        monkeypatch.delenv(var)
    namespace = {}
    exec(stamp.setup_source(), namespace)  # noqa: S102 (the cell under test)
    assert calls[0][-3:] == ["-q", "--no-deps", f"git+{URL}"]
    assert calls[1][-1] == "tqdm" and len(calls) == 2  # only what is missing
    assert not any(p in ("torch", "triton") for cmd in calls for p in cmd)
    assert os.environ["COURSE_REPO_URL"] == URL
    assert namespace["ON_COLAB"] is True


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_book_exercise_links_name_existing_notebooks(path):
    import re

    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        for call in re.findall(r"exercises_link\(([^)]*)\)", cell.source):
            for name in re.findall(r"\"(\d\d_\w+)\"", call):
                assert (ROOT / "exercises" / f"{name}.ipynb").is_file(), f"{path.name}: no exercises/{name}.ipynb"
