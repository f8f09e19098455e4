"""What the first cell of every chapter calls after installing the package: pick a device.

Chapter: every chapter's first cell (written by scripts/stamp_colab_cell.py from _config.yml).

- With a CUDA GPU (Colab's T4, an A100, an H200): ``device = "cuda"``, full sizes.
- Without one: sets ``TRITON_INTERPRET=1`` (Triton's CPU interpreter; it must be set before the
  first ``@triton.jit`` function is defined, which is why this runs in the first cell) and asks
  the chapters for smaller sizes.

It installs nothing and never touches torch or Triton installs. Outside Colab it prints nothing,
so the built book shows no setup noise.

:func:`glue` is myst-nb's ``glue`` when myst-nb is installed (the book build) and otherwise a
function that only returns the value (Colab, plain Jupyter), so chapter code runs everywhere.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from typing import NamedTuple


class Setup(NamedTuple):
    device: str  # "cuda" or "cpu"
    small: bool  # True: use the smaller sizes (CPU / Triton interpreter)
    on_colab: bool


def has_cuda_gpu() -> bool:
    """True if a CUDA GPU is usable. Cheap when there is no NVIDIA driver (torch not imported)."""
    if shutil.which("nvidia-smi") is None or importlib.util.find_spec("torch") is None:
        return False
    import torch

    return bool(torch.cuda.is_available())


def setup(verbose: bool | None = None) -> Setup:
    """Detect the device; without a GPU select Triton's interpreter. Returns a :class:`Setup`."""
    on_colab = "google.colab" in sys.modules
    if has_cuda_gpu():
        result = Setup("cuda", False, on_colab)
    else:
        os.environ.setdefault("TRITON_INTERPRET", "1")
        result = Setup("cpu", True, on_colab)
    if verbose if verbose is not None else on_colab:
        how = "GPU" if result.device == "cuda" else "no GPU: Triton interpreter, smaller sizes"
        print(f"course_kernels ready ({how})")
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

    The repository URL comes from ``$COURSE_REPO_URL`` (set by each chapter's first cell from
    _config.yml), so it is written in one place. Without notebooks, links the folder.
    """
    from IPython.display import Markdown

    url = os.environ.get("COURSE_REPO_URL", "").rstrip("/")
    if not url:
        return Markdown(f"**Exercises on {topic}:** see `exercises/` in the course repository.")
    repo = url.removeprefix("https://github.com/")
    folder = f"[`exercises/`]({url}/tree/main/exercises)"
    if not notebooks:
        return Markdown(
            f"**Exercises on {topic}:** the notebooks in {folder} of the course repository, each "
            "graded automatically; solutions in `solutions/`."
        )
    items = [
        f"- `{name}.ipynb`: [read on GitHub]({url}/blob/main/exercises/{name}.ipynb) · "
        f"[open in Colab](https://colab.research.google.com/github/{repo}/blob/main/exercises/{name}.ipynb)"
        for name in notebooks
    ]
    return Markdown(f"**Exercises on {topic}** (in {folder}, graded automatically):\n\n" + "\n".join(items))
