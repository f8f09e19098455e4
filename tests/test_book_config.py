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

from course_kernels import colab

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location(
    "colab_copies", ROOT / "book" / "_ext" / "colab_copies.py"
)
copies = importlib.util.module_from_spec(spec)
spec.loader.exec_module(copies)

CONFIG = yaml.safe_load((ROOT / "_config.yml").read_text())
NOTEBOOKS = [
    ROOT / "book" / f"{f}.ipynb"
    for f in [yaml.safe_load((ROOT / "_toc.yml").read_text())["root"]]
    + [
        c["file"]
        for part in yaml.safe_load((ROOT / "_toc.yml").read_text())["parts"]
        for c in part["chapters"]
    ]
]
EXERCISES = sorted((ROOT / "exercises").glob("*.ipynb")) + sorted(
    (ROOT / "solutions").glob("*.ipynb")
)
URL = colab.REPOSITORY_URL

# Issue 4's chapters (and the introduction) must each be an .ipynb page of the TOC.
REQUIRED = [
    "intro",
    "chapters/01_memory_hierarchy",
    "chapters/02_standard_attention",
    "chapters/03_tiling",
    "chapters/04_online_softmax",
    "chapters/05_io_complexity",
    "chapters/06_misconceptions",
    "chapters/07_interview_questions",
    "chapters/animation",
    "appendix/errata",
]
PART_TWO = [
    "from_numpy_to_triton",
    "backward_and_recomputation",
    "engineering",
    "tuning",
    "hopper",
    "below_triton",
    "performance",
    "applications",
]


def toc_files():
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = [toc["root"]]
    for part in toc["parts"]:
        files += [c["file"] for c in part["chapters"]]
    return files


def test_book_toc_symlink_points_to_root_toc():
    link = ROOT / "book" / "_toc.yml"
    assert link.is_symlink(), (
        "book/_toc.yml must be a symlink to ../_toc.yml (JB1 looks for it in book/)"
    )
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
    assert not (ROOT / "book" / "_static").exists(), (
        "JB1 injects every .js under book/_static into every page"
    )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_book_first_cell_is_the_setup_cell_template(path):
    nb = nbformat.read(path, as_version=4)
    first = nb.cells[0]
    assert first.cell_type == "code"
    assert first.source == colab.SETUP_CELL, (
        f"{path.name}: first cell is not course_kernels.colab.SETUP_CELL; run "
        "python book/_ext/colab_copies.py --fix-setup-cells"
    )
    assert first.metadata.get("tags") == ["remove-cell", "course-setup"]
    assert first.metadata.get("cellView") == "form" and first.source.startswith("#@title")
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), (
        f"{path.name}: commit notebooks without outputs (the build executes them)"
    )


@pytest.mark.parametrize("path", EXERCISES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_exercise_setup_cell_starts_with_the_same_template(path):
    nb = nbformat.read(path, as_version=4)
    setup = [c for c in nb.cells if c.metadata.get("course_kernels", {}).get("role") == "setup"]
    assert len(setup) == 1 and setup[0].source.startswith(colab.SETUP_CELL), (
        f"{path}: regenerate with python scripts/build_notebooks.py"
    )


def test_repository_url_is_written_only_in_the_package():
    # Nothing is stamped by hand: no committed notebook, module or page carries the address.
    files = [
        p
        for p in ROOT.rglob("*")
        if p.is_file()
        and p.suffix in (".ipynb", ".py", ".md", ".yml", ".cfg", ".toml", ".sh")
        and not {"_build", ".venv", ".git", "node_modules", ".hypothesis"} & set(p.parts)
    ]
    assert len(files) > 50
    holders = [
        p.relative_to(ROOT).as_posix() for p in files if URL in p.read_text(errors="replace")
    ]
    # the package holds it; Jupyter Book's config needs a copy before any extension runs
    assert holders == ["_config.yml", "course_kernels/colab.py"]
    assert CONFIG["repository"]["url"] == URL


def test_book_every_toc_notebook_has_the_template():
    assert {p.relative_to(ROOT / "book").with_suffix("").as_posix() for p in NOTEBOOKS} >= set(
        REQUIRED
    )
    assert copies.fix_setup_cells(ROOT, check=True) == []


def _run_cell(source, env_extra=None, colab_module=False, cwd=None):
    """Run a setup cell in a fresh IPython shell (as Jupyter would) in a subprocess."""
    prelude = "import sys, types\n"
    if colab_module:
        prelude += "sys.modules['google'] = types.ModuleType('google'); sys.modules['google.colab'] = types.ModuleType('google.colab')\n"
    driver = prelude + (
        "from IPython.core.interactiveshell import InteractiveShell\n"
        "shell = InteractiveShell.instance()\n"
        f"result = shell.run_cell({source!r})\n"
        "print('OK' if result.success else 'FAILED')\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "COURSE_REPO_URL")}
    env.update(env_extra or {})
    return subprocess.run(
        [sys.executable, "-c", driver],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        cwd=cwd,
    )


def test_setup_cell_with_the_package_installs_nothing_and_reports_the_device():
    code = (
        colab.SETUP_CELL
        + "\nimport os; print(DEVICE, SMALL, ON_COLAB, os.environ.get('TRITON_INTERPRET'))"
    )
    out = _run_cell(
        code, {"PATH": ""}
    )  # no nvidia-smi, no pip on PATH: the cell must not need them
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[-1] == "OK"
    assert "ready (no GPU: Triton interpreter, smaller sizes)" in lines[0], lines
    assert lines[1].split() == ["cpu", "True", "False", "1"]
    assert "Installing" not in out.stdout


def test_setup_cell_outside_colab_without_the_package_prints_the_pip_line(tmp_path):
    # A Python where course_kernels cannot be imported: the cell's own check sees it missing.
    hide = "import importlib.util as u; f = u.find_spec; u.find_spec = lambda n, *a: None if n == 'course_kernels' else f(n, *a)\n"
    cell = colab.stamp_setup_cell(colab.SETUP_CELL, "https://github.com/someone/course")
    out = _run_cell(hide + cell, cwd=tmp_path)
    assert out.stdout.splitlines()[-1] == "FAILED"
    assert '%pip install "git+https://github.com/someone/course"' in out.stdout
    assert "Traceback" not in out.stdout + out.stderr and "CourseSetupError" not in out.stdout
    # The committed (unstamped) cell says how to install from a checkout instead.
    out = _run_cell(hide + colab.SETUP_CELL, cwd=tmp_path)
    assert "%pip install -e /path/to/your/checkout" in out.stdout and "Traceback" not in out.stdout


def _exec_on_fake_colab(monkeypatch, source, pip_result):
    calls = []
    monkeypatch.setitem(sys.modules, "google", types.ModuleType("google"))
    monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name in ("course_kernels", "tqdm") else real_find_spec(name, *a),
    )

    def run(cmd, **kw):
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, *pip_result)

    monkeypatch.setattr(subprocess, "run", run)
    for var in (
        "COURSE_REPO_URL",
        "TRITON_INTERPRET",
        "COURSE_KERNELS_PIP",
    ):  # restored after the test
        monkeypatch.setenv(var, "unset")
        monkeypatch.delenv(var)
    namespace = {}
    exec(source, namespace)  # noqa: S102 (the cell under test)
    return calls, namespace


def test_setup_cell_on_colab_installs_the_package_without_deps(monkeypatch, capsys):
    source = colab.stamp_setup_cell(colab.SETUP_CELL, URL)
    calls, namespace = _exec_on_fake_colab(monkeypatch, source, (0, "", ""))
    assert calls[0][-4:] == ["-q", "--no-color", "--no-deps", f"git+{URL}"]
    assert calls[1][-1] == "tqdm" and len(calls) == 2  # only what is missing
    assert not any(p in ("torch", "triton") for cmd in calls for p in cmd)
    assert os.environ["COURSE_REPO_URL"] == URL
    assert namespace["ON_COLAB"] is True
    assert "ready (" in capsys.readouterr().out


def test_setup_cell_on_colab_installs_from_course_kernels_pip(monkeypatch):
    monkeypatch.setenv("COURSE_KERNELS_PIP", "/content/course_kernels-0.1.0-py3-none-any.whl")
    source = colab.stamp_setup_cell(colab.SETUP_CELL, URL)
    calls = []
    monkeypatch.setitem(sys.modules, "google", types.ModuleType("google"))
    monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "course_kernels" else real_find_spec(name, *a),
    )
    monkeypatch.setattr(
        subprocess,
        "run",
        lambda cmd, **kw: calls.append(cmd) or subprocess.CompletedProcess(cmd, 0, "", ""),
    )
    exec(source, {})  # noqa: S102
    assert calls == [
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-color",
            "--no-deps",
            "/content/course_kernels-0.1.0-py3-none-any.whl",
        ]
    ]


def test_setup_cell_on_colab_when_pip_fails_says_why_and_what_to_do(monkeypatch):
    source = colab.stamp_setup_cell(colab.SETUP_CELL, URL)
    # What pip prints when git cannot clone: the reason first, then pip's boxes and hints (the
    # last lines say only "See above for output"), here with colour codes as a terminal gets them.
    stderr = (
        "  error: subprocess-exited-with-error\n\n"
        "  \u00d7 git clone --filter=blob:none --quiet https://github.com/o/r /tmp/x did not run"
        " successfully.\n  \u2502 exit code: 128\n  \u2570\u2500> [1 lines of output]\n"
        "      fatal: could not read Username for 'https://github.com': No such device or address\n"
        "      [end of output]\n\n"
        "  \x1b[1;35mnote\x1b[0m: This error originates from a subprocess, and is likely not a"
        " problem with pip.\n\x1b[1;31merror\x1b[0m: subprocess-exited-with-error\n\n"
        "\u00d7 git clone did not run successfully.\n\u2502 exit code: 128\n"
        "\u2570\u2500> See above for output.\n\n"
        "\x1b[1;35mnote\x1b[0m: This error originates from a subprocess, and is likely not a"
        " problem with pip.\n"
    )
    with pytest.raises(Exception) as info:
        _exec_on_fake_colab(monkeypatch, source, (1, "", stderr))
    err = info.value
    assert type(err).__name__ == "CourseSetupError" and not isinstance(
        err, subprocess.CalledProcessError
    )
    message = err._render_traceback_()
    assert len(message) == 1
    said = message[0].split("pip said:")[1].split("What to do:")[0]
    assert said.strip() == (
        "fatal: could not read Username for 'https://github.com': No such device or address"
    ), said  # the reason, and none of the boxes, hints or colour codes around it
    assert "internet" in message[0] and URL in message[0] and "COURSE_KERNELS_PIP" in message[0]


def test_setup_cell_on_colab_without_an_address_says_where_to_open_it(monkeypatch):
    with pytest.raises(Exception, match="Colab button") as info:
        _exec_on_fake_colab(monkeypatch, colab.SETUP_CELL, (0, "", ""))
    assert type(info.value).__name__ == "CourseSetupError"


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "http://github.com/a/b",
        "https://gitlab.com/a/b",
        "https://github.com/a",
        'https://github.com/a/b"; import os',
        None,
    ],
)
def test_stamp_setup_cell_rejects_what_is_not_a_github_repository(bad):
    with pytest.raises(ValueError, match="github.com/OWNER/REPO"):
        colab.stamp_setup_cell(colab.SETUP_CELL, bad)


def test_stamp_setup_cell_needs_the_template_line():
    with pytest.raises(ValueError, match="address line"):
        colab.stamp_setup_cell("print(1)", URL)
    stamped = colab.stamp_setup_cell(colab.SETUP_CELL, URL + "/")
    assert f'COURSE_REPO_URL = "{URL}"' in stamped and colab.URL_LINE not in stamped


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_book_exercise_links_name_existing_notebooks(path):
    import re

    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        for call in re.findall(r"exercises_link\(([^)]*)\)", cell.source):
            for name in re.findall(r"\"(\d\d_\w+)\"", call):
                assert (ROOT / "exercises" / f"{name}.ipynb").is_file(), (
                    f"{path.name}: no exercises/{name}.ipynb"
                )
