"""Every notebook runs as a student gets it: from a wheel, on a Colab-like Python, offline, on CPU.

The chain under test is the one a Colab button starts. The book build writes the notebooks the
buttons open (``_build/html/_colab/``: every chapter, exercise and solution, the repository URL
written in, glue roles replaced by numbers). This test builds a wheel of the project, and for
each of those notebooks:

- makes a fresh virtual environment that sees only what Colab preinstalls (torch, Triton, NumPy,
  matplotlib, tqdm, pip, Jupyter: ``tests/colab_env.py``), never the repository or its install;
- pretends to be Colab (``google.colab`` imported at kernel start, as Colab does) and points the
  setup cell's install step at the wheel (``$COURSE_KERNELS_PIP``, instead of ``git+URL``);
- runs the notebook top to bottom in a Jupyter kernel (nbclient), from an empty temporary folder,
  with no network (its own network namespace: ``unshare``), on the CPU.

So every notebook really installs the package from the wheel (``pip install --no-deps``) and
reads its measured data from the installed package. Needs the built book (``./dev book``; ``./dev
test`` builds it first): without it the test fails and says so. Two notebooks at a time
(``COLAB_TEST_WORKERS``); the time taken is printed (``-s``) and recorded in
``test-artifacts/colab_wheel.json``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import colab_env  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
HTML = Path(os.environ.get("BOOK_HTML", ROOT / "_build" / "html"))
COPIES = HTML / "_colab"
WORKERS = int(os.environ.get("COLAB_TEST_WORKERS", "2"))
# What a chapter prints when a committed measurement is not in the install (it always should be).
MISSING_DATA = ("in this install yet", "No committed sweep")
WHEEL_LIMIT = 5 * 2**20  # bytes: the package with its measured data is ~1 MB

# The one notebook runner, kernel mode; stdlib-only at import, so it runs in the fresh venv.
RUNNER = ROOT / "scripts" / "run_notebook.py"


LO_UP_THEN_EXEC = """
import fcntl, os, socket, struct, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
flags = struct.unpack("16sH", fcntl.ioctl(s, 0x8913, struct.pack("16sH", b"lo", 0)))[1]  # SIOCGIFFLAGS
fcntl.ioctl(s, 0x8914, struct.pack("16sH", b"lo", flags | 1))  # SIOCSIFFLAGS: IFF_UP
os.execv(sys.argv[1], sys.argv[1:])
"""


def _offline(python: str, cmd: list[str]) -> list[str]:
    """``cmd`` in its own network namespace: loopback only (the kernel talks to nbclient over it)."""
    if shutil.which("unshare") is None:
        pytest.fail(
            "the Colab wheel test runs notebooks without network through `unshare` "
            "(util-linux): install it"
        )
    probe = subprocess.run(["unshare", "-rn", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.fail(
            f"cannot make a network namespace (unshare -rn: {probe.stderr.strip()}); run as "
            "root or enable unprivileged user namespaces"
        )
    return ["unshare", "-rn", python, "-c", LO_UP_THEN_EXEC, *cmd]


def colab_notebooks() -> list[Path]:
    return sorted(COPIES.rglob("*.ipynb")) if COPIES.is_dir() else []


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    return colab_env.build_wheel(tmp_path_factory.mktemp("wheel"))


def test_wheel_carries_the_measured_data_and_stays_small(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    data = [n for n in names if n.startswith("course_kernels/data/")]
    committed = [p for p in (ROOT / "course_kernels" / "data").rglob("*") if p.is_file()]
    assert len(data) == len(committed) > 20
    assert "course_kernels/data/bench/h200_bench.json" in names
    assert "course_kernels/data/text/tiny_corpus.txt" in names
    assert wheel.stat().st_size < WHEEL_LIMIT, f"wheel is {wheel.stat().st_size / 2**20:.1f} MiB"


def test_every_colab_notebook_runs_from_the_wheel_offline(wheel, tmp_path):
    notebooks = colab_notebooks()
    if not notebooks:
        pytest.fail(
            f"no Colab copies in {COPIES}: build the book first (./dev book; ./dev test "
            "does it), which writes them"
        )
    expected = {p.name for p in (ROOT / "exercises").glob("*.ipynb")}
    assert {p.name for p in (COPIES / "exercises").glob("*.ipynb")} == expected
    assert {p.name for p in (COPIES / "solutions").glob("*.ipynb")} == expected

    site = colab_env.colab_like_site(tmp_path / "colab-site")
    fake = tmp_path / "fake-colab"  # `import google.colab` succeeds, as on Colab
    (fake / "google" / "colab").mkdir(parents=True)
    (fake / "google" / "colab" / "__init__.py").write_text('"""Stands in for Colab\'s module."""\n')
    ipython = tmp_path / "ipython"
    (ipython / "profile_default" / "startup").mkdir(parents=True)
    (ipython / "profile_default" / "startup" / "00-colab.py").write_text("import google.colab\n")
    (tmp_path / "home").mkdir()
    (tmp_path / "jupyter").mkdir()

    def env_for(venv: Path) -> dict:
        return {
            "PATH": f"{venv / 'bin'}:/usr/local/bin:/usr/bin:/bin",
            "HOME": str(tmp_path / "home"),
            "LANG": "C.UTF-8",
            "PYTHONPATH": str(fake),
            "IPYTHONDIR": str(ipython),
            "JUPYTER_PATH": str(tmp_path / "jupyter"),
            "JUPYTER_CONFIG_DIR": str(tmp_path / "jupyter"),
            "COURSE_KERNELS_PIP": str(wheel),
            "PIP_NO_INDEX": "1",
            "PIP_CONFIG_FILE": os.devnull,
            "PIP_DISABLE_PIP_VERSION_CHECK": "1",
            "TRITON_CACHE_DIR": str(venv / "triton-cache"),
        }

    # The fresh environment cannot import the course before the notebook installs it.
    probe_venv = colab_env.fresh_venv(tmp_path / "probe-venv", site)
    probe = subprocess.run(
        [
            str(probe_venv),
            "-c",
            "import importlib.util as u; "
            "print([m for m in ('course_kernels', 'myst_nb', 'pytest') if u.find_spec(m)])",
        ],
        capture_output=True,
        text=True,
        env=env_for(tmp_path / "probe-venv"),
        cwd=tmp_path,
    )
    assert probe.stdout.strip() == "[]", probe.stdout + probe.stderr

    def run(nb: Path) -> dict:
        rel = nb.relative_to(COPIES).as_posix()
        slug = rel.replace("/", "__").removesuffix(".ipynb")
        venv = tmp_path / "venvs" / slug
        python = colab_env.fresh_venv(venv, site)
        workdir = tmp_path / "work" / slug
        workdir.mkdir(parents=True)
        out = tmp_path / "executed" / f"{slug}.ipynb"
        out.parent.mkdir(exist_ok=True)
        t0 = time.time()
        done = subprocess.run(
            _offline(
                str(python), [str(python), str(RUNNER), "kernel", str(nb), str(workdir), str(out)]
            ),
            capture_output=True,
            text=True,
            env=env_for(venv),
            cwd=workdir,
            timeout=1800,
        )
        result = {"notebook": rel, "wall_s": round(time.time() - t0, 1), "rc": done.returncode}
        try:
            result.update(json.loads(done.stdout.strip().splitlines()[-1]))
        except (IndexError, json.JSONDecodeError):
            result["error"] = (done.stdout + done.stderr)[-3000:]
        if result.get("error") is None and out.is_file():
            setup = json.loads(out.read_text())["cells"]
            setup_out = "".join(
                "".join(o.get("text", ""))
                for c in setup
                if c["cell_type"] == "code" and "COURSE_REPO_URL = " in "".join(c["source"])
                for o in c.get("outputs", [])
            )
            result["installed"] = f"Installing course_kernels from {wheel}" in setup_out
            result["device"] = (
                "ready (no GPU: Triton interpreter, smaller sizes)" in setup_out
                or "ready (GPU: " in setup_out
            )
            shown = json.dumps(
                [o for c in setup if c["cell_type"] == "code" for o in c.get("outputs", [])]
            )
            result["data_found"] = not any(m in shown for m in MISSING_DATA)
            where = subprocess.run(
                [str(python), "-c", "import course_kernels; print(course_kernels.__file__)"],
                capture_output=True,
                text=True,
                env=env_for(venv),
                cwd=workdir,
            )
            result["from_venv"] = where.stdout.strip().startswith(str(venv))
        shutil.rmtree(venv / "triton-cache", ignore_errors=True)
        return result

    t0 = time.time()
    with ThreadPoolExecutor(WORKERS) as pool:
        results = list(pool.map(run, notebooks))
    total = round(time.time() - t0, 1)
    artifacts = ROOT / "test-artifacts"
    artifacts.mkdir(exist_ok=True)
    (artifacts / "colab_wheel.json").write_text(
        json.dumps(
            {
                "workers": WORKERS,
                "total_s": total,
                "wheel_bytes": wheel.stat().st_size,
                "results": results,
            },
            indent=1,
        )
    )
    print(f"\n{len(results)} Colab notebooks from the wheel, {WORKERS} at a time: {total} s")
    for r in sorted(results, key=lambda r: -r["wall_s"]):
        print(f"  {r['wall_s']:7.1f} s  {r['notebook']}")
    failed = [r for r in results if r.get("error") or r["rc"] != 0]
    assert not failed, "\n\n".join(f"{r['notebook']}:\n{r.get('error')}" for r in failed)
    for r in results:
        assert r["installed"], f"{r['notebook']}: the setup cell did not install the wheel"
        assert r["device"], f"{r['notebook']}: the setup cell did not report the device"
        assert r["from_venv"], (
            f"{r['notebook']}: course_kernels was not imported from the fresh venv"
        )
        assert r["data_found"], (
            f"{r['notebook']}: says committed measurements are missing from the install"
        )
    assert len(results) == len(colab_notebooks()) >= 16 + 2 * len(expected)
