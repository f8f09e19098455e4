"""Every instructor path from an installed wheel, in an empty folder, with no checkout in sight:
``release``, ``grade`` with a roster, and the Gradescope bundle as Gradescope runs it (its own
``setup.sh`` builds a fresh venv from a bare Python into a fresh root standing in for
/autograder, offline: the bundled wheel with ``pip --no-index``, its dependencies from a
Colab-like folder of installed packages; then ``run_autograder`` on an honest, a wrong and a
multi-notebook upload)."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import colab_env  # noqa: E402

from course_kernels.colab import REPOSITORY_URL  # noqa: E402
from course_kernels.grading.sandbox import isolation  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(not isolation()["sandbox"], reason="needs bubblewrap")


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("installed")
    wheel = colab_env.build_wheel(tmp)
    site = colab_env.colab_like_site(tmp / "site")
    python = colab_env.fresh_venv(tmp / "venv", site)
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-index"]
        + ["--no-deps", str(wheel)],
        check=True,
    )
    empty = tmp / "empty"
    empty.mkdir()
    return python, site, empty


def _grade(python, cwd, *args, check=True):
    r = subprocess.run(
        [str(python), "-m", "course_kernels.grading", *args],
        cwd=cwd,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    if check:
        assert r.returncode == 0, r.stderr[-3000:]
    return r


def test_release_from_the_wheel_is_stamped_and_has_no_solutions(installed):
    python, _, cwd = installed
    _grade(python, cwd, "release", "--out", "rel")
    notebooks = sorted((cwd / "rel").glob("*.ipynb"))
    assert len(notebooks) == 10
    for p in notebooks:
        nb = json.loads(p.read_text())
        setup = [
            c for c in nb["cells"] if c["metadata"].get("course_kernels", {}).get("role") == "setup"
        ]
        assert f'COURSE_REPO_URL = "{REPOSITORY_URL}"' in "".join(setup[0]["source"])
    solved = json.loads((ROOT / "solutions/01_stable_softmax.ipynb").read_text())
    body = "".join(
        next(
            c["source"]
            for c in solved["cells"]
            if c["metadata"].get("course_kernels", {}).get("role") == "solution"
        )
    )
    assert body.strip() not in (cwd / "rel/01_stable_softmax.ipynb").read_text()


def test_roster_grading_from_the_wheel_uses_the_shipped_hidden_tests(installed, tmp_path):
    python, _, cwd = installed
    subs = tmp_path / "subs"
    (subs / "alice").mkdir(parents=True)
    shutil.copy(ROOT / "solutions/01_stable_softmax.ipynb", subs / "alice/01_stable_softmax.ipynb")
    roster = tmp_path / "roster.csv"
    roster.write_text("id,name\nalice,A\nbob,B\n")
    out = tmp_path / "out"
    _grade(
        python,
        cwd,
        "grade",
        str(subs),
        "--roster",
        str(roster),
        "--out",
        str(out),
        "--workers",
        "1",
        "--no-progress",
        "--expect",
        "01",
    )
    res = json.loads((out / "results/alice/01_stable_softmax.json").read_text())
    assert any(t["visibility"] == "after_published" for t in res["tests"])  # hidden tests ran
    assert res["score"] == sum(t["max_score"] for t in res["tests"]) > 0
    rows = {r["id"]: r for r in csv.DictReader((out / "roster.csv").open())}
    assert float(rows["alice"]["total"]) == float(rows["alice"]["max_total"])
    assert rows["bob"]["missing"] == "01_stable_softmax"


def _autograder(python, site, tmp_path, exercise="01"):
    bundle = tmp_path / "ag.zip"
    _grade(python, tmp_path, "gradescope", "--exercise", exercise, "--out", str(bundle))
    root = tmp_path / "autograder"
    with zipfile.ZipFile(bundle) as z:
        names = z.namelist()
        z.extractall(root / "source")
    assert any(n.startswith("wheels/course_kernels-") for n in names), names
    for name in ("setup.sh", "run_autograder"):
        (root / "source" / name).chmod(0o755)
    r = subprocess.run(
        ["bash", str(root / "source/setup.sh")],
        env=_env(AUTOGRADER_ROOT=str(root), PYTHON3=str(python), AUTOGRADER_SITE=str(site)),
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert (root / "venv/bin/python").exists()
    return root


def _upload(root, files):
    sub = root / "submission"
    shutil.rmtree(sub, ignore_errors=True)
    sub.mkdir()
    for name, src in files.items():
        (sub / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(src, sub / name)
    r = subprocess.run(
        ["bash", str(root / "source/run_autograder")],
        env=_env(AUTOGRADER_ROOT=str(root)),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads((root / "results/results.json").read_text())


def test_gradescope_bundle_from_the_wheel_as_gradescope_runs_it(installed, tmp_path):
    python, site, _ = installed
    root = _autograder(python, site, tmp_path)
    solved = ROOT / "solutions/01_stable_softmax.ipynb"
    full = sum(t["max_score"] for t in _upload(root, {"x.ipynb": solved})["tests"])
    honest = _upload(root, {"my_work.ipynb": solved})
    assert honest["score"] == full == honest["extra_data"]["max_score"] > 0, honest
    assert honest["extra_data"]["sandbox"] == "bubblewrap"
    assert any(t["visibility"] == "after_published" for t in honest["tests"])
    assert "sandbox failed" not in json.dumps(honest)
    wrong = _upload(root, {"01_stable_softmax.ipynb": ROOT / "exercises/01_stable_softmax.ipynb"})
    assert wrong["score"] == 0 and wrong["tests"]
    three = _upload(root, {"a.ipynb": solved, "b.ipynb": solved, "c/d.ipynb": solved})
    assert three["score"] == full, three["score"]  # not 3x
    assert "b.ipynb" in three["output"] and "c/d.ipynb" in three["output"]
    none = _upload(root, {})
    assert none["score"] == 0 and "no notebook" in none["output"]
