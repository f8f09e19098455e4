"""The measured data travels with the package: one loader, package data, no repository paths."""

import json
import re
from pathlib import Path

import pytest

import course_kernels
from course_kernels import datafiles

ROOT = Path(__file__).resolve().parents[1]
PKG_DATA = Path(course_kernels.__file__).resolve().parent / "data"


def test_datafiles_finds_package_data_inside_the_package():
    path = datafiles.data_path("bench/h200_bench.json")
    assert path == PKG_DATA / "bench" / "h200_bench.json"
    assert datafiles.load_json("bench/h200_bench.json") == json.loads(path.read_text())


def test_datafiles_has_no_checkout_fallback():
    assert not (ROOT / "data").exists(), "measured data lives in course_kernels/data/ only"
    with pytest.raises(
        FileNotFoundError, match=r"'bench/nope.json' is not in .*data.*bench/h200_bench.json"
    ):
        datafiles.data_path("bench/nope.json")


@pytest.mark.parametrize("bad", ["", "/etc/passwd", "../pyproject.toml", "bench/../../x", 3, None])
def test_datafiles_rejects_names_outside_the_data_folder(bad):
    with pytest.raises(ValueError, match="relative path inside data/"):
        datafiles.data_path(bad)


def test_datafiles_is_declared_package_data():
    text = (ROOT / "pyproject.toml").read_text()
    assert re.search(
        r'\[tool\.setuptools\.package-data\]\s*\n\s*course_kernels\s*=\s*\[[^]]*"data/', text
    )


def _sources(folder):
    for nb in sorted((ROOT / folder).rglob("*.ipynb")):
        if "_build" not in nb.parts and ".ipynb_checkpoints" not in nb.parts:
            yield nb


@pytest.mark.parametrize(
    "nb", [*_sources("book"), *_sources("exercises"), *_sources("solutions")], ids=lambda p: p.stem
)
def test_no_notebook_reads_a_path_relative_to_the_repository(nb):
    cells = json.loads(nb.read_text())["cells"]
    code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    for pattern in (
        r"parents\[\d\]",
        r"\.\./\.\./data",
        r"ROOT\s*/",
        r"urlopen",
        r"raw\.githubusercontent",
        r"load_measurements\(\s*\"data/",
        r"Path\(\s*\"(\.\./)*data/",
    ):
        assert not re.search(pattern, code), (
            f"{nb.name}: reads the repository or the web ({pattern})"
        )


# -- from a mutation audit ------------------------------------------------------------------------
def test_datafiles_rejects_a_windows_absolute_name():
    with pytest.raises(ValueError, match="relative path inside data/"):
        datafiles.data_path("\\bench\\h200_bench.json")


def test_datafiles_missing_file_lists_data_but_not_caches(monkeypatch, tmp_path):
    (tmp_path / "bench" / "__pycache__").mkdir(parents=True)
    (tmp_path / "bench" / "__pycache__" / "x.pyc").write_bytes(b"")
    (tmp_path / "bench" / "a.json").write_text("{}")
    monkeypatch.setattr(datafiles, "_data_dir", lambda: tmp_path)
    with pytest.raises(FileNotFoundError) as exc:
        datafiles.data_path("b.json")
    assert str(exc.value).endswith("it has: bench/a.json")
    monkeypatch.setattr(datafiles, "_data_dir", lambda: tmp_path / "none")
    with pytest.raises(FileNotFoundError, match=r"it has: nothing \(an install without package"):
        datafiles.data_path("b.json")
