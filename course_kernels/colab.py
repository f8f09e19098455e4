"""The first cell of every chapter and exercise (install on Colab, report the device), and helpers.

Chapter: every chapter's first cell, every exercise's setup cell.

:data:`SETUP_CELL` is the one template of that cell. Committed notebooks carry it with no
repository address; the book build (``book/_ext/colab_copies.py``) and the instructor's release
write :data:`REPOSITORY_URL` (the one place it lives) into the copies that the Colab buttons
open and into the released notebooks (:func:`stamp_setup_cell`). What the cell does:

- ``course_kernels`` importable (a checkout, ``pip install``, the book build): installs nothing.
- On Colab without it: ``pip install --no-deps`` from the stamped address (or from
  ``$COURSE_KERNELS_PIP``: a wheel, a fork, a branch), then only the missing light dependencies
  (numpy, tqdm, matplotlib). Colab's torch and Triton are never touched. When pip fails, the
  cell says why and what to do, without a traceback.
- Elsewhere without it: prints the exact ``%pip install`` line, without a traceback.
- Everywhere: :func:`setup` picks the device and reports it.

:func:`setup`: with a CUDA GPU (Colab's T4, an A100, an H200) ``device = "cuda"``, full sizes;
without one it sets ``TRITON_INTERPRET=1`` (Triton's CPU interpreter; it must be set before the
first ``@triton.jit`` function is defined, which is why this runs in the first cell) and asks the
chapters for smaller sizes.

:func:`glue` is myst-nb's ``glue`` when myst-nb is installed (the book build) and otherwise a
function that only returns the value (Colab, plain Jupyter), so chapter code runs everywhere.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from typing import NamedTuple

#: The course's repository: the one place its address is written. The book build (the repository
#: button, the Colab copies), ``scripts/build_notebooks.py`` and the instructor's release (the
#: setup cells of the students' notebooks) all read it from here, in a checkout or an install.
REPOSITORY_URL = "https://github.com/flash-attention-course/flash-attention-course"

#: Where the book build publishes the Colab copies: this folder of the built site, served from
#: this branch (``ghp-import`` pushes ``_build/html`` there; see the README, "Publish your own copy").
COPIES_BRANCH = "gh-pages"
COPIES_DIR = "_colab"

#: The committed line of :data:`SETUP_CELL` that the build replaces by the repository's address.
URL_LINE = (
    'COURSE_REPO_URL = os.environ.get("COURSE_REPO_URL", "")  # the book build writes it here'
)

# No braces in the template: course_kernels/grading/notebooks.py passes it through str.format.
SETUP_CELL = (
    """\
#@title Setup: run me first (installs course_kernels on Colab; reports the device)
import importlib, importlib.util, os, re, subprocess, sys
"""
    + URL_LINE
    + """
if COURSE_REPO_URL:
    os.environ["COURSE_REPO_URL"] = COURSE_REPO_URL  # chapters link their exercises with it


class CourseSetupError(Exception):
    def _render_traceback_(self):  # Jupyter shows this message instead of a traceback
        return [str(self)]


if importlib.util.find_spec("course_kernels") is None:
    SOURCE = os.environ.get("COURSE_KERNELS_PIP") or COURSE_REPO_URL and "git+" + COURSE_REPO_URL
    if "google.colab" not in sys.modules:
        raise CourseSetupError(
            "course_kernels is not installed in this Python (" + sys.executable + "). Install "
            "it into this kernel, then run this cell again:\\n\\n    %pip install "
            + ('"' + SOURCE + '"' if SOURCE else "-e /path/to/your/checkout/of/the/course")
            + "\\n\\n(it installs numpy and tqdm if missing; the Triton chapters also need torch "
            "and, on Linux, Triton: see https://pytorch.org)")
    if not SOURCE:
        raise CourseSetupError(
            "This copy of the notebook does not say where the course lives (only the copies "
            "behind the course site's Colab buttons do). Open it from the site's Colab button, "
            "or set COURSE_REPO_URL above to the course's GitHub address and run this cell again.")
    print("Installing course_kernels from", SOURCE, "(Colab's torch and Triton stay as they are)")
    PIP_NOISE = ("See above for output", "exit code:", "did not run successfully", "hint:",
                 "subprocess-exited-with-error", "error originates from a subprocess",
                 "lines of output]", "[end of output]")
    for args in (["--no-deps", SOURCE],
                 [p for p in ("numpy", "tqdm", "matplotlib") if importlib.util.find_spec(p) is None]):
        if not args:
            continue
        done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-color", *args],
                              capture_output=True, text=True, env=dict(os.environ, NO_COLOR="1"))
        if done.returncode != 0:  # keep pip's reason, drop its boxes, hints and colour codes
            said = []
            for line in (done.stderr + "\\n" + done.stdout).splitlines():
                line = re.sub("\\x1b\\\\[[0-9;?]*[A-Za-z]", "", line)  # colour codes
                line = line.strip(" \\t\\u00d7\\u2502\\u2570\\u2500>")  # pip's error box
                if line and line not in said and not any(n in line for n in PIP_NOISE):
                    said.append(line)
            said = said[-6:] or ["(no message; exit status " + str(done.returncode) + ")"]
            raise CourseSetupError(
                "Installing " + " ".join(args) + " failed. pip said:\\n    "
                + "\\n    ".join(said) + "\\nWhat to do: check that the runtime is connected "
                "to the internet and that " + SOURCE + " opens in your browser (a private or "
                "renamed repository fails here), then run this cell again. Or upload a wheel "
                "(pip wheel --no-deps <checkout>) and set COURSE_KERNELS_PIP to its path.")
    importlib.invalidate_caches()
from course_kernels.colab import setup
DEVICE, SMALL, ON_COLAB = setup()"""
)


def stamp_setup_cell(source: str, url: str) -> str:
    """``source`` (a notebook's setup cell, containing :data:`SETUP_CELL`) with ``url`` written in.

    Raises ValueError when the cell does not contain the template's address line or the URL is
    not a GitHub repository address.
    """
    url = url.rstrip("/") if isinstance(url, str) else url
    if (
        not isinstance(url, str)
        or not url.startswith("https://github.com/")
        or len(url.removeprefix("https://github.com/").split("/")) != 2
        or any(c in url for c in "\"'\\ \n")
    ):
        raise ValueError(
            f"url must be a GitHub repository address https://github.com/OWNER/REPO, got {url!r}"
        )
    if source.count(URL_LINE) != 1:
        raise ValueError(
            "the setup cell does not contain the template's address line exactly once "
            f"({URL_LINE!r}); regenerate it from course_kernels.colab.SETUP_CELL"
        )
    return source.replace(URL_LINE, f'COURSE_REPO_URL = "{url}"  # written by the book build')


def colab_copy_url(url: str, path: str) -> str:
    """Colab's address of the book build's copy of ``path`` (e.g. ``"exercises/01_x.ipynb"``)."""
    repo = url.rstrip("/").removeprefix("https://github.com/")
    return (
        f"https://colab.research.google.com/github/{repo}/blob/{COPIES_BRANCH}/{COPIES_DIR}/{path}"
    )


class Setup(NamedTuple):
    device: str  # "cuda" or "cpu"
    small: bool  # True: use the smaller sizes (CPU / Triton interpreter)
    on_colab: bool


def has_cuda_gpu() -> bool:
    """True if a CUDA GPU is usable. Cheap when there is no NVIDIA driver (torch not imported)."""
    if shutil.which("nvidia-smi") is None or importlib.util.find_spec("torch") is None:
        return False
    from ._probe import cuda_available

    return cuda_available()


def describe(result: Setup) -> str:
    """One line: the package version and the device (the GPU's name, or the interpreter)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        ver = version("course_kernels")
    except PackageNotFoundError:  # a checkout on sys.path without an install
        ver = "from a checkout"
    if result.device == "cuda":
        import torch

        how = f"GPU: {torch.cuda.get_device_name(0)}"
    else:
        how = "no GPU: Triton interpreter, smaller sizes"
    line = f"course_kernels {ver} ready ({how})"
    if importlib.util.find_spec("torch") is None:
        line += "; torch is not installed: the Triton chapters need it (https://pytorch.org)"
    return line


def setup(verbose: bool = True) -> Setup:
    """Detect the device; without a GPU select Triton's interpreter; print it (``verbose``).

    Returns a :class:`Setup`.
    """
    on_colab = "google.colab" in sys.modules
    if has_cuda_gpu():
        result = Setup("cuda", False, on_colab)
    else:
        os.environ.setdefault("TRITON_INTERPRET", "1")
        result = Setup("cpu", True, on_colab)
    if verbose:
        print(describe(result))
    return result


def glue(name: str, value, display: bool = False) -> None:
    """myst-nb's glue (numbers in the prose come from code) or, without myst-nb, a no-op.

    Returns None, so a cell ending in ``glue(...)`` shows nothing.
    """
    if getattr(value, "shape", None) == () and hasattr(value, "item"):
        value = value.item()  # numpy scalars print as np.float64(...), which glue cannot format
    if importlib.util.find_spec("myst_nb") is not None:
        from myst_nb import glue as _glue

        _glue(name, value, display=display)


def md_table(headers, rows, align=None):
    """A Markdown table (IPython ``Markdown``) from ``headers`` and ``rows`` of cells (str() each)."""
    from IPython.display import Markdown

    align = align or ["---"] * len(headers)
    lines = ["| " + " | ".join(map(str, headers)) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(map(str, r)) + " |" for r in rows]
    return Markdown("\n".join(lines))


def exercises_link(topic: str, *notebooks: str):
    """Markdown linking a chapter's exercises (``exercises/<name>.ipynb``) on GitHub and in Colab.

    The repository URL comes from ``$COURSE_REPO_URL`` (set by the book build from _config.yml,
    and by the first cell of the Colab copies), so it is written in one place. The Colab link
    opens the build's copy (:func:`colab_copy_url`). Without notebooks, links the folder.
    """
    from IPython.display import Markdown

    url = os.environ.get("COURSE_REPO_URL", "").rstrip("/")
    if not url:
        return Markdown(f"**Exercises on {topic}:** see `exercises/` in the course repository.")
    folder = f"[`exercises/`]({url}/tree/main/exercises)"
    if not notebooks:
        return Markdown(
            f"**Exercises on {topic}:** the notebooks in {folder} of the course repository, each "
            "graded automatically; solutions in `solutions/`."
        )
    items = [
        f"- `{name}.ipynb`: [read on GitHub]({url}/blob/main/exercises/{name}.ipynb) · "
        f"[open in Colab]({colab_copy_url(url, f'exercises/{name}.ipynb')})"
        for name in notebooks
    ]
    return Markdown(
        f"**Exercises on {topic}** (in {folder}, graded automatically):\n\n" + "\n".join(items)
    )


# The package code the chapters print as listings: public names for private functions, so a
# chapter shows the code the package runs without reaching into a private name.
LISTINGS = {
    "tiled.forward_fa2": ("course_kernels.numpy.tiled", "_forward_fa2"),
    "tiled.forward_fa1": ("course_kernels.numpy.tiled", "_forward_fa1"),
    "triton_forward.attn_fwd": ("course_kernels.triton.forward", "_attn_fwd"),
    "triton_forward.attn_fwd_mask_inner": ("course_kernels.triton.forward", "_attn_fwd_mask_inner"),
    "triton_launch.use_gluon": ("course_kernels.triton.launch", "_use_gluon"),
    "triton_launch.gluon_pays": ("course_kernels.triton.launch", "_gluon_pays"),
    # The Gluon rung (course_kernels.gluon): its kernels exist only where Gluon imports, so
    # their listings are read from the module's file when the function is not defined.
    "gluon.mma_layout": ("course_kernels.gluon.producer", "_mma_layout"),
    "gluon.a_operand_layout": ("course_kernels.gluon.producer", "_a_operand_layout"),
    "gluon.tile_coords": ("course_kernels.gluon.scheduler", "_tile_coords"),
    "gluon.draw_tile": ("course_kernels.gluon.scheduler", "_draw_tile"),
    "gluon.publish_tile": ("course_kernels.gluon.scheduler", "_publish_tile"),
    "gluon.publish_stop": ("course_kernels.gluon.scheduler", "_publish_stop"),
    "gluon.read_tile": ("course_kernels.gluon.scheduler", "_read_tile"),
    "gluon.retire_scheduler": ("course_kernels.gluon.scheduler", "_retire_scheduler"),
    "gluon.producer": ("course_kernels.gluon.producer", "_producer"),
    "gluon.load_tile": ("course_kernels.gluon.producer", "_load_tile"),
    "gluon.softmax": ("course_kernels.gluon.steps", "_softmax"),
    "gluon.qk": ("course_kernels.gluon.steps", "_qk"),
    "gluon.pv": ("course_kernels.gluon.steps", "_pv"),
    "gluon.step_serial": ("course_kernels.gluon.steps", "_step_serial"),
    "gluon.step_overlap": ("course_kernels.gluon.steps", "_step_overlap"),
    "gluon.epilogue": ("course_kernels.gluon.consumer", "_epilogue"),
    "gluon.consumer": ("course_kernels.gluon.consumer", "_consumer"),
    "gluon.consumer_tile": ("course_kernels.gluon.consumer", "_consumer_tile"),
    "gluon.attn_fwd_kernel": ("course_kernels.gluon.forward", "_attn_fwd_kernel"),
    "gluon.bwd_step": ("course_kernels.gluon.backward_steps", "_bwd_step"),
    "gluon.bwd_dq": ("course_kernels.gluon.backward_steps", "_bwd_dq"),
    "gluon.bwd_dq_tma": ("course_kernels.gluon.backward_steps", "_bwd_dq_tma"),
    "gluon.bwd_runs": ("course_kernels.gluon.scheduler", "_bwd_runs"),
    "gluon.keep_seen": ("course_kernels.gluon.backward_steps", "_keep_seen"),
    "gluon.bwd_tile": ("course_kernels.gluon.scheduler", "_bwd_tile"),
    # the course's wrapper of an op Gluon 3.6 has no Python function for (a public name of a
    # private module: the chapter shows it, never imports it)
    "gluon.tma_reduce_add": ("course_kernels.gluon._lang", "tma_reduce_add"),
}


def _source_from_file(module: str, attr: str) -> str:
    """The text of function ``attr`` (decorators included) as written in ``module``'s file,
    wherever it is defined there (inside an ``if`` too), found with :mod:`ast`."""
    import ast
    import importlib.util

    path = importlib.util.find_spec(module).origin
    with open(path, encoding="utf-8") as f:
        text = f.read()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == attr:
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            return "\n".join(text.splitlines()[first - 1 : node.end_lineno]) + "\n"
    raise ValueError(f"{module} defines no function {attr!r}")


def listing(name: str) -> str:
    """The source text of a package function named in :data:`LISTINGS` (Triton's
    ``@autotune``/``@jit`` wrappers unwrapped), read from the module (never a pasted copy),
    dedented (the Gluon kernels are defined inside ``if HAVE_GLUON:``)."""
    import importlib
    import inspect
    import textwrap

    if name not in LISTINGS:
        raise ValueError(f"no listing named {name!r}; the listings are {sorted(LISTINGS)}")
    module, attr = LISTINGS[name]
    obj = getattr(importlib.import_module(module), attr, None)
    if obj is None:  # a Gluon kernel where Gluon does not import: read the file
        return textwrap.dedent(_source_from_file(module, attr))
    while not inspect.isfunction(obj) and hasattr(obj, "fn"):
        obj = obj.fn
    return textwrap.dedent(inspect.getsource(obj))
