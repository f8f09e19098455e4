"""Write the same first cell into every chapter notebook, from the repository URL in _config.yml.

    python scripts/stamp_colab_cell.py          # rewrite the first cell where it differs
    python scripts/stamp_colab_cell.py --check  # exit 1 if any notebook is out of date

The cell is tagged ``remove-cell`` (the static site needs no setup, so the book leaves it out),
``course-setup`` (so tests find it), and carries Colab's ``cellView: form`` with an ``#@title``
line, so Colab shows it collapsed to its title. What it does:
on Colab it installs ``course_kernels`` from the repository with ``pip --no-deps`` (Colab's torch
and Triton are never reinstalled) plus only the missing light dependencies; everywhere it calls
``course_kernels.colab.setup()``, which picks the GPU or Triton's CPU interpreter. Outside Colab
it installs nothing. tests/test_book_config.py checks every notebook against this.
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat
import yaml

ROOT = Path(__file__).resolve().parents[1]
TAGS = ["remove-cell", "course-setup"]
METADATA = {"cellView": "form", "tags": TAGS}

TEMPLATE = '''\
#@title Setup: run me first (installs course_kernels on Colab; elsewhere only picks the device)
# On Colab, install course_kernels from the course repository (torch/Triton untouched);
# everywhere, use the GPU if there is one, else Triton's CPU interpreter and smaller sizes.
import importlib.util, os, subprocess, sys
COURSE_REPO_URL = "{url}"
os.environ.setdefault("COURSE_REPO_URL", COURSE_REPO_URL)
if "google.colab" in sys.modules and importlib.util.find_spec("course_kernels") is None:
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                    f"git+{{COURSE_REPO_URL}}"], check=True)
    missing = [p for p in ("numpy", "tqdm", "matplotlib") if importlib.util.find_spec(p) is None]
    if missing:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", *missing], check=True)
from course_kernels.colab import setup
DEVICE, SMALL, ON_COLAB = setup()'''


def repository_url() -> str:
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    return config["repository"]["url"].rstrip("/")


def setup_source() -> str:
    return TEMPLATE.format(url=repository_url())


def toc_notebooks() -> list[Path]:
    """Every .ipynb page of the table of contents (paths relative to book/)."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = [toc["root"]]

    def walk(entries):
        for entry in entries:
            if "file" in entry:
                files.append(entry["file"])
            walk(entry.get("chapters", []) + entry.get("sections", []))

    for part in toc.get("parts", []):
        walk(part.get("chapters", []))
    out = []
    for f in files:
        path = ROOT / "book" / f"{f}.ipynb"
        if path.is_file():
            out.append(path)
    return out


def is_setup_cell(cell) -> bool:
    return cell.cell_type == "code" and "course-setup" in cell.get("metadata", {}).get("tags", [])


def stamp(path: Path, check: bool = False) -> bool:
    """Make the notebook's first cell the setup cell. Returns True if it was (or would be) changed."""
    nb = nbformat.read(path, as_version=4)
    cell = nbformat.v4.new_code_cell(setup_source(), metadata={"cellView": "form", "tags": list(TAGS)})
    if nb.cells and is_setup_cell(nb.cells[0]):
        old = nb.cells[0]
        if old.source == cell.source and dict(old.metadata) == METADATA:
            return False
        cell["id"] = old.get("id", cell["id"])
        nb.cells[0] = cell
    else:
        nb.cells.insert(0, cell)
    if not check:
        nbformat.write(nb, path)
    return True


def main(argv: list[str]) -> int:
    check = "--check" in argv
    changed = [p for p in toc_notebooks() if stamp(p, check)]
    for p in changed:
        print(("out of date: " if check else "stamped: ") + str(p.relative_to(ROOT)))
    return 1 if (check and changed) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
