"""scripts/run_notebooks_plain.py: runs code cells without Jupyter and reports failures."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "run_notebooks_plain.py"


def notebook(path, *cells):
    nb = {
        "cells": [{"cell_type": "markdown", "metadata": {}, "source": ["# title"]}]
        + [
            {
                "cell_type": "code",
                "metadata": {},
                "outputs": [],
                "execution_count": None,
                "source": [c],
            }
            for c in cells
        ],
        "metadata": {},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    path.write_text(json.dumps(nb))
    return path


def test_runner_passes_good_and_reports_bad_notebooks(tmp_path):
    good = notebook(
        tmp_path / "good.ipynb",
        "import os\nx = len(os.listdir('.'))",
        "from IPython.display import Markdown\ndisplay(Markdown('hi'))\nassert x >= 2",
    )
    bad = notebook(tmp_path / "bad.ipynb", "y = 1", "raise ValueError('cell two broke')")
    slow = notebook(tmp_path / "slow.ipynb", "import time\ntime.sleep(30)")
    out = tmp_path / "run.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            str(good),
            str(bad),
            str(slow),
            "--out",
            str(out),
            "--limit-s",
            "8",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    rec = json.loads(out.read_text())
    status = {Path(r["notebook"]).name: r for r in rec["results"]}
    assert status["good.ipynb"]["status"] == "ok"
    assert status["bad.ipynb"]["status"].startswith("failed")
    assert "cell two broke" in status["bad.ipynb"]["tail"]
    assert status["slow.ipynb"]["status"].startswith("timed out")
    assert "1/3 notebooks ran without error" in proc.stdout


def test_runner_without_ipython_runs_plots_and_triton_jit(tmp_path):
    """The GPU machine has no IPython: the stand-in must satisfy matplotlib, and a @triton.jit
    function defined in a cell must find its source (as it does in Jupyter)."""
    import os

    import pytest

    pytest.importorskip("triton")
    nb = notebook(
        tmp_path / "plot_jit.ipynb",
        "import matplotlib.pyplot as plt\nfig, ax = plt.subplots()\nax.plot([1, 2])\nplt.show()",
        "import triton\nimport triton.language as tl\n\n\n@triton.jit\n"
        "def double(x_ptr, n: tl.constexpr):\n"
        "    offs = tl.arange(0, n)\n"
        "    tl.store(x_ptr + offs, 2 * tl.load(x_ptr + offs))\n",
        "from IPython.display import Markdown\ndisplay(Markdown('done'))",
    )
    out = tmp_path / "run.json"
    env = {**os.environ, "RUN_NOTEBOOKS_STUB_IPYTHON": "1", "TRITON_INTERPRET": "1"}
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), str(nb), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(out.read_text())["results"][0]["status"] == "ok"
