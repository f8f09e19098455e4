"""The notebooks the Colab buttons open: made by the book build, published with the site.

The repository's address lives in one place, ``course_kernels.colab.REPOSITORY_URL`` (the package
reads it too: the instructor's release stamps it). This extension gives it to the theme
(``repository_url``, the repository button) and:

1. sets ``$COURSE_REPO_URL`` for the notebooks the build executes (the chapters' exercise links);
2. after the build, writes a copy of every chapter, exercise and solution notebook to
   ``_build/html/_colab/`` (so it is published with the site): the setup cell gets the address
   (``course_kernels.colab.stamp_setup_cell``), every ``{glue:text}`` / ``{glue:md}`` /
   ``{glue}`` role becomes the value this build computed (myst-nb's own formatting), a note says
   that re-running recomputes them, and links between chapters open the other chapter's copy;
3. points each page's Colab button at its copy, on the branch the site is served from
   (``course_kernels.colab.COPIES_BRANCH``, ``gh-pages``: ``ghp-import`` pushes ``_build/html``
   there), instead of the committed notebook, which shows raw glue markup outside Jupyter Book.

Committed notebooks carry the setup cell without an address. ``python book/_ext/colab_copies.py
--fix-setup-cells`` writes the template (``course_kernels.colab.SETUP_CELL``) into the first
cell of every notebook of the table of contents (a new chapter, or after the template changed).
The site itself is unchanged. tests/test_colab_copies.py checks the copies against the site.
"""

from __future__ import annotations

import copy
import json
import os
import posixpath
import re
import sys
from pathlib import Path

GLUE = re.compile(r"\{glue(?::(text|md|any))?\}`([^`]+)`")
LINK = re.compile(r"\]\(([^)#\s]+\.ipynb)(#[^)\s]*)?\)")
NOTE = (
    "*About the numbers in this text: the course's book build filled them in from the code "
    "below and the measured data it reads (on a CPU; GPU numbers come from the committed "
    "measurements). Running the notebook recomputes them; timings and random draws can differ "
    "a little on your machine.*"
)
SETUP_TAGS = ["remove-cell", "course-setup"]


class CopyError(Exception):
    """A notebook the build cannot turn into its Colab copy (missing glue value, no setup cell)."""


def glue_values(outputs) -> dict[str, dict]:
    """``{name: mime bundle}`` of the ``glue(...)`` outputs in ``outputs``.

    ``outputs``: myst-nb's ``<page>.glue.json`` (``{name: output}``, next to the executed
    notebook in ``_build/jupyter_execute``) or an executed notebook (a dict with ``cells``).
    """
    if "cells" in outputs:
        outputs = [
            o
            for c in outputs["cells"]
            if c.get("cell_type") == "code"
            for o in c.get("outputs", [])
        ]
    else:
        outputs = list(outputs.values())
    values = {}
    for out in outputs:
        meta = out.get("metadata", {}).get("scrapbook")
        if out.get("output_type") in ("display_data", "execute_result") and meta:
            prefix = meta.get("mime_prefix", "")
            values[meta["name"]] = {
                k.removeprefix(prefix): v for k, v in out.get("data", {}).items()
            }
    return values


def _text(value) -> str:
    return "".join(value) if isinstance(value, list) else value


def render_glue(kind: str | None, content: str, values: dict[str, dict], other=None) -> str:
    """The text a glue role shows on the site, as Markdown. ``other(doc)`` gives another page's values."""
    from myst_nb.core.variables import format_plain_text

    kind = kind or "any"
    if kind == "text":
        key, fmt = content.rsplit(":", 1) if ":" in content.split("::")[-1] else (content, "s")
    elif kind == "md":
        key = content.rsplit(":", 1)[0] if ":" in content.split("::")[-1] else content
        fmt = None
    else:
        key, fmt = content, ""
    if "::" in key:
        doc, key = key.split("::", 1)
        if other is None:
            raise CopyError(f"glue reference {content!r} to another page cannot be resolved here")
        values = other(doc)
    if key not in values:
        raise CopyError(f"no glued value named {key!r} in the executed notebook")
    data = values[key]
    if kind == "md" or (kind == "any" and "text/markdown" in data):
        if "text/markdown" not in data:
            raise CopyError(f"{key!r}: {{glue:md}} needs a text/markdown value")
        return _text(data["text/markdown"]).strip()
    if "text/plain" not in data:
        raise CopyError(f"{key!r}: no text/plain value to paste")
    return format_plain_text(_text(data["text/plain"]), fmt)


def colab_copy(
    source: dict, url: str, docname: str | None = None, values=None, other=None, docs=()
) -> dict:
    """The Colab copy of the committed notebook ``source`` (a dict, as nbformat writes it).

    ``values``: the page's glue values (chapters; None for exercises, which glue nothing).
    ``docname``: the page (``"chapters/03_tiling"``), to resolve links to the pages in ``docs``.
    """
    from course_kernels.colab import colab_copy_url, stamp_setup_cell

    nb = copy.deepcopy(source)
    setup = [
        c
        for c in nb["cells"]
        if c["cell_type"] == "code" and "COURSE_REPO_URL = os.environ.get(" in _text(c["source"])
    ]
    if len(setup) != 1:
        raise CopyError(
            f"expected one setup cell (course_kernels.colab.SETUP_CELL), found {len(setup)}"
        )
    try:
        setup[0]["source"] = stamp_setup_cell(_text(setup[0]["source"]), url)
    except ValueError as exc:
        raise CopyError(str(exc)) from None
    glued = False
    for cell in nb["cells"]:
        if cell["cell_type"] != "markdown":
            continue
        text = _text(cell["source"])
        if GLUE.search(text):
            if values is None:
                raise CopyError("glue roles in a notebook the build does not execute")
            text = GLUE.sub(lambda m: render_glue(m.group(1), m.group(2), values, other), text)
            glued = True
        if docname is not None:

            def link(m):
                target = posixpath.normpath(posixpath.join(posixpath.dirname(docname), m.group(1)))
                if target.removesuffix(".ipynb") not in docs:
                    return m.group(0)
                return f"]({colab_copy_url(url, target)}{m.group(2) or ''})"

            text = LINK.sub(link, text)
        cell["source"] = text
    if glued:
        first_md = next(i for i, c in enumerate(nb["cells"]) if c["cell_type"] == "markdown")
        note = {"cell_type": "markdown", "id": "colab-copy-note", "metadata": {}, "source": NOTE}
        nb["cells"].insert(first_md + 1, note)
    return nb


# -- Sphinx ---------------------------------------------------------------------------------
def _repository_url(app=None) -> str:
    from course_kernels.colab import REPOSITORY_URL

    url = REPOSITORY_URL.rstrip("/")
    if not re.fullmatch(r"https://github\.com/[\w.-]+/[\w.-]+", url):
        raise CopyError(
            "course_kernels.colab.REPOSITORY_URL must be https://github.com/OWNER/REPO, "
            f"got {url!r}"
        )
    return url


def _config_inited(app, config):
    # the theme's repository button: the same address as everything else
    options = dict(config.html_theme_options or {})
    options["repository_url"] = _repository_url()
    config.html_theme_options = options


def _notebook_docs(app) -> list[str]:
    return sorted(d for d in app.env.found_docs if str(app.env.doc2path(d)).endswith(".ipynb"))


def _builder_inited(app):
    # The executed chapters build their exercise links from it (course_kernels.colab).
    os.environ["COURSE_REPO_URL"] = _repository_url(app)


def _colab_button(app, pagename, templatename, context, doctree):
    from course_kernels.colab import colab_copy_url

    if pagename not in _notebook_docs(app):
        return
    target = colab_copy_url(_repository_url(app), f"{pagename}.ipynb")
    for group in context.get("header_buttons", []):
        for button in group.get("buttons", []) if isinstance(group, dict) else []:
            if button.get("text") == "Colab":
                button["url"] = target


def write_copies(
    root: Path, outdir: Path, url: str, docs: list[str], executed_dir: Path
) -> list[Path]:
    """Write every chapter's copy (from ``root/book``) and every exercise and solution's copy."""
    dest = outdir / "_colab"
    cache: dict[str, dict] = {}

    def values_of(doc: str) -> dict:
        if doc not in cache:
            glued = executed_dir / f"{doc}.glue.json"  # myst-nb: the page's glued values
            path = glued if glued.is_file() else executed_dir / f"{doc}.ipynb"
            if not path.is_file():
                raise CopyError(f"no executed notebook {path} (myst-nb writes one per page)")
            cache[doc] = glue_values(json.loads(path.read_text(encoding="utf-8")))
        return cache[doc]

    written = []
    jobs = [(root / "book" / f"{d}.ipynb", f"{d}.ipynb", d) for d in docs]
    for folder in ("exercises", "solutions"):
        jobs += [(p, f"{folder}/{p.name}", None) for p in sorted((root / folder).glob("*.ipynb"))]
    for src, rel, doc in jobs:
        source = json.loads(src.read_text(encoding="utf-8"))
        try:
            nb = colab_copy(source, url, doc, values_of(doc) if doc else None, values_of, docs)
        except CopyError as exc:
            raise CopyError(f"{src.relative_to(root)}: {exc}") from None
        out = dest / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        written.append(out)
    return written


def _build_finished(app, exception):
    if exception is not None or app.builder.format != "html":
        return
    from sphinx.util import logging

    root = Path(app.srcdir).parent
    try:
        written = write_copies(
            root,
            Path(app.outdir),
            _repository_url(app),
            _notebook_docs(app),
            Path(app.outdir).parent / "jupyter_execute",
        )
    except CopyError as exc:
        logging.getLogger(__name__).warning(f"Colab copies: {exc}")  # -W: the build fails
        return
    logging.getLogger(__name__).info(f"Colab copies: {len(written)} notebooks in _colab/")


def setup(app):
    app.connect("config-inited", _config_inited)
    app.connect("builder-inited", _builder_inited)
    app.connect("html-page-context", _colab_button, priority=600)  # after the theme's buttons
    app.connect("build-finished", _build_finished)
    return {"parallel_read_safe": True, "parallel_write_safe": True}


# -- committed notebooks: the template without an address -----------------------------------
def fix_setup_cells(root: Path, check: bool = False) -> list[Path]:
    """Make the first cell of every notebook of the TOC the setup-cell template. Returns the changed."""
    import nbformat
    import yaml

    from course_kernels.colab import SETUP_CELL

    toc = yaml.safe_load((root / "_toc.yml").read_text())
    files = [toc["root"]]

    def walk(entries):
        for entry in entries:
            if "file" in entry:
                files.append(entry["file"])
            walk(entry.get("chapters", []) + entry.get("sections", []))

    for part in toc.get("parts", []):
        walk(part.get("chapters", []))
    changed = []
    for f in files:
        path = root / "book" / f"{f}.ipynb"
        if not path.is_file():
            continue
        nb = nbformat.read(path, as_version=4)
        cell = nbformat.v4.new_code_cell(
            SETUP_CELL, metadata={"cellView": "form", "tags": list(SETUP_TAGS)}
        )
        first = nb.cells[0] if nb.cells else None
        if first is not None and "course-setup" in first.get("metadata", {}).get("tags", []):
            if first.source == SETUP_CELL and dict(first.metadata) == dict(cell.metadata):
                continue
            cell["id"] = first.get("id", cell["id"])
            nb.cells[0] = cell
        else:
            nb.cells.insert(0, cell)
        changed.append(path)
        if not check:
            nbformat.write(nb, path)
    return changed


if __name__ == "__main__":
    root = Path(__file__).resolve().parents[2]
    sys.path.insert(0, str(root))
    if sys.argv[1:] not in (["--fix-setup-cells"], ["--check-setup-cells"]):
        sys.exit("usage: python book/_ext/colab_copies.py --fix-setup-cells | --check-setup-cells")
    changed = fix_setup_cells(root, check=sys.argv[1] == "--check-setup-cells")
    for p in changed:
        print(("out of date: " if "check" in sys.argv[1] else "wrote: ") + str(p.relative_to(root)))
    sys.exit(1 if changed and "check" in sys.argv[1] else 0)
