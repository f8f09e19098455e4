"""What is installed is what is tested (issue 19): the wheel holds exactly the package's tracked
files, every data file the package or a chapter reads, no experiment history, and an installed
grader finds its hidden tests.

The wheel is built from this checkout (``colab_env.build_wheel``), installed with ``--no-deps``
into a fresh virtual environment in an empty folder that has only what Colab preinstalls, and run
from there: no ``PYTHONPATH``, no checkout on the path.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import colab_env  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "course_kernels" / "data"
# A data file is named in code as "folder/name.ext" (data_path / load_json / a table of names).
_FOLDERS = "|".join(sorted(p.name for p in DATA.iterdir() if p.is_dir()))
DATA_NAME = re.compile(rf"(?<!data/)\b((?:{_FOLDERS})/[\w.\-]+)")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    return colab_env.build_wheel(tmp_path_factory.mktemp("wheel"))


def tracked(prefix: str) -> set[str]:
    out = subprocess.run(
        ["git", "ls-files", prefix], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    return set(out.split())


def readers_text() -> str:
    """The text of everything that reads data at run time: the package's modules and the
    chapters' and exercises' notebooks."""
    paths = list((ROOT / "course_kernels").rglob("*.py")) + list((ROOT / "book").rglob("*.ipynb"))
    paths += list((ROOT / "exercises").glob("*.ipynb")) + list((ROOT / "solutions").glob("*.ipynb"))
    return "\n".join(p.read_text() for p in paths if "_build" not in p.parts)


def named_data_files(text: str) -> set[str]:
    return {m for m in DATA_NAME.findall(text) if (DATA / m).is_file()}


def test_the_wheel_holds_exactly_the_tracked_package(wheel):
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    names = {
        n for n in zipfile.ZipFile(wheel).namelist() if not n.split("/")[0].endswith(".dist-info")
    }
    package = {p for p in tracked("course_kernels") if "__pycache__" not in p}
    assert names - package == set(), "the wheel holds files the checkout does not track"
    assert package - names == set(), "tracked package files missing from the wheel"
    assert not any(n.startswith(("experiments/", "tests/", "scripts/", "book/")) for n in names)
    assert "course_kernels/grading/hidden_tests/01_stable_softmax.json" in names
    assert "course_kernels/grading/instructor/gradescope/setup.sh" in names


def test_every_data_file_read_is_shipped_and_every_shipped_one_is_read():
    text = readers_text()
    read = named_data_files(text)
    shipped = {
        p.relative_to(DATA).as_posix()
        for p in DATA.rglob("*")
        if p.is_file() and p.name != "README.md"
    }
    # every name that looks like a data file and is spelled in code must exist (a typo or a moved
    # file would otherwise only fail on a GPU machine or in a chapter)
    spelled = {m for m in DATA_NAME.findall(text) if Path(m).suffix in (".json", ".csv", ".txt")}
    missing = {m for m in spelled if not (DATA / m).is_file()}
    assert missing == set(), f"named in code but not in course_kernels/data/: {sorted(missing)}"
    # a chapter may also name a file by its base name inside a helper (measured("ring_bench.json"))
    read |= {f for f in shipped if f'"{Path(f).name}"' in text or f"'{Path(f).name}'" in text}
    unread = shipped - read
    assert unread == set(), (
        f"shipped but read by no chapter or module (move to experiments/data/): {sorted(unread)}"
    )


def test_the_data_check_can_fail(tmp_path):
    assert named_data_files('load_json("bench/h200_bench.json")') == {"bench/h200_bench.json"}
    assert named_data_files('load_json("bench/no_such_file.json")') == set()


def test_installed_package_finds_its_data_and_hidden_tests(wheel, tmp_path):
    site = colab_env.colab_like_site(tmp_path / "colab_site")
    python = colab_env.fresh_venv(tmp_path / "venv", site)
    target = tmp_path / "installed"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-index",
            "--target",
            str(target),
            str(wheel),
        ],
        check=True,
    )
    empty = tmp_path / "empty"
    empty.mkdir()
    code = (
        "import json, course_kernels, course_kernels.grading.exercises as ex\n"
        "from course_kernels.datafiles import load_json\n"
        "print(json.dumps({'pkg': course_kernels.__file__, 'hidden': str(ex.DEFAULT_HIDDEN),\n"
        " 'n_hidden': len(list(ex.DEFAULT_HIDDEN.glob('*.json'))),\n"
        " 'bench': len(load_json('bench/h200_bench.json')) > 0}))\n"
    )
    out = subprocess.run(
        [str(python), "-c", code],
        cwd=empty,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(target), "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got["pkg"].startswith(str(target)), got  # the installed copy, not the checkout
    assert (
        got["hidden"].startswith(str(target))
        and got["n_hidden"]
        == len(list((ROOT / "course_kernels" / "grading" / "hidden_tests").glob("*.json")))
        >= 10
    )
    assert got["bench"]
