"""The notebooks the Colab buttons open show the site's numbers, and the buttons open them.

The book build (book/_ext/colab_copies.py) writes ``_build/html/_colab/``: a copy of every
chapter with each ``{glue:...}`` role replaced by the value the build computed, and of every
exercise and solution, each with the repository URL (``course_kernels.colab.REPOSITORY_URL``) in its setup cell. Here the
copies are read back and compared with the built site's HTML, independently of the code that
wrote them: the glued numbers of each page (``<span class="pasted-text">``) must be, in order,
the numbers in the copy's text. Needs the built book (``./dev book``; ``./dev test`` builds it
first): without it the test fails and says so.
"""

from __future__ import annotations

import html as htmllib
import importlib.util
import json
import os
import re
from pathlib import Path

import pytest
import yaml

from course_kernels.colab import (
    COPIES_BRANCH,
    COPIES_DIR,
    REPOSITORY_URL,
    URL_LINE,
    colab_copy_url,
)

ROOT = Path(__file__).resolve().parents[1]
HTML = Path(os.environ.get("BOOK_HTML", ROOT / "_build" / "html"))
COPIES = HTML / COPIES_DIR
URL = REPOSITORY_URL.rstrip("/")
GLUE = re.compile(r"\{glue(?::(text|md|any))?\}`([^`]+)`")
LINK = re.compile(r"\]\([^)\s]+\.ipynb(?:#[^)\s]*)?\)")

spec = importlib.util.spec_from_file_location(
    "colab_copies", ROOT / "book" / "_ext" / "colab_copies.py"
)
copies_ext = importlib.util.module_from_spec(spec)
spec.loader.exec_module(copies_ext)


def toc_docs() -> list[str]:
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    return [toc["root"]] + [c["file"] for part in toc["parts"] for c in part["chapters"]]


DOCS = toc_docs()


@pytest.fixture(scope="module")
def built():
    if not (COPIES / f"{DOCS[0]}.ipynb").is_file():
        pytest.fail(
            f"no Colab copies in {COPIES}: build the book first (./dev book; ./dev test does "
            "it), which writes them"
        )
    return COPIES


def _cells(path: Path) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def _src(cell) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def _literal_pattern(text: str) -> str:
    """``text`` as a regex; links to notebooks may point elsewhere in the copy (Colab)."""
    out, last = [], 0
    for m in LINK.finditer(text):
        out += [re.escape(text[last : m.start()]), r"\]\([^)]*\)"]
        last = m.end()
    return "".join(out + [re.escape(text[last:])])


def check_copy_against_site(source_cells, copy_cells, site: list[str]) -> list[str]:
    """Check that the copy is the committed text with each ``{glue:text}`` role replaced by the
    site's number (in page order) and each other role by some text; return those other texts."""
    by_id = {c.get("id"): c for c in copy_cells}
    site = list(site)
    n_text = sum(
        1
        for c in source_cells
        if c["cell_type"] == "markdown"
        for m in GLUE.finditer(_src(c))
        if m.group(1) == "text"
    )
    assert n_text == len(site), (
        f"{n_text} {{glue:text}} roles, {len(site)} pasted numbers on the site"
    )
    others = []
    for cell in source_cells:
        if cell["cell_type"] != "markdown":
            continue
        text, pattern, last = _src(cell), [], 0
        for m in GLUE.finditer(text):
            pattern.append(_literal_pattern(text[last : m.start()]))
            pattern.append(re.escape(site.pop(0)) if m.group(1) == "text" else "(.*?)")
            last = m.end()
        pattern.append(_literal_pattern(text[last:]))
        match = re.fullmatch("".join(pattern), _src(by_id[cell["id"]]), flags=re.S)
        assert match, (
            f"cell {cell['id']}: the copy is not the committed text with the site's "
            f"numbers in place of the glue roles:\n{_src(by_id[cell['id']])}"
        )
        others += list(match.groups())
    return others


SMART_QUOTES = (("\u2019", "'"), ("\u2018", "'"), ("\u201c", '"'), ("\u201d", '"'))


def _straight_quotes(text: str) -> str:
    for curly, straight in SMART_QUOTES:
        text = text.replace(curly, straight)  # Sphinx's smart quotes (the copy keeps the value)
    return text


def site_values(page: Path) -> list[str]:
    return [
        _straight_quotes(htmllib.unescape(re.sub(r"<[^>]+>", "", s)))
        for s in re.findall(
            r'<span class="pasted-text">(.*?)</span>', page.read_text(encoding="utf-8"), re.S
        )
    ]


def visible_text(page: Path) -> str:
    body = re.sub(
        r"<script.*?</script>|<style.*?</style>", "", page.read_text(encoding="utf-8"), flags=re.S
    )
    text = htmllib.unescape(re.sub(r"<[^>]+>", "", body))
    text = (
        text.replace("\\(", "").replace("\\)", "").replace("$", "")
    )  # inline math, typeset or not
    return re.sub(r"\s+", " ", _straight_quotes(text))


@pytest.mark.parametrize("doc", DOCS)
def test_colab_copy_shows_the_sites_numbers(built, doc):
    source = _cells(ROOT / "book" / f"{doc}.ipynb")
    copied = _cells(built / f"{doc}.ipynb")
    assert not any("{glue" in _src(c) for c in copied), f"{doc}: glue markup left in the Colab copy"
    page = HTML / f"{doc}.html"
    markdown_values = check_copy_against_site(source, copied, site_values(page))
    shown = visible_text(page)
    for value in markdown_values:  # glued Markdown: the site renders it; compare the words
        words = re.sub(r"\s+", " ", re.sub(r"[`*$]", "", value)).strip()
        assert words in shown, f"{doc}: glued Markdown {value!r} not on the site"
    n_roles = sum(len(GLUE.findall(_src(c))) for c in source if c["cell_type"] == "markdown")
    if n_roles:
        assert any(
            "re-running" in _src(c).lower() or "recomputes" in _src(c)
            for c in copied
            if c["cell_type"] == "markdown"
        ), f"{doc}: no note that running recomputes the numbers"


@pytest.mark.parametrize("doc", DOCS)
def test_colab_button_opens_the_copy(built, doc):
    page = (HTML / f"{doc}.html").read_text(encoding="utf-8")
    launch = re.search(
        r'<ul class="dropdown-menu">(.*?)</ul>',
        page[page.index('aria-label="Launch interactive content"') :],
        re.S,
    )
    assert launch, f"{doc}: no launch-button menu on the page"
    colab = re.findall(r'href="(https://colab\.research\.google\.com/[^"]+)"', launch.group(1))
    target = colab_copy_url(URL, f"{doc}.ipynb")
    assert colab == [target]
    assert target.endswith(f"/blob/{COPIES_BRANCH}/{COPIES_DIR}/{doc}.ipynb")
    assert (built / f"{doc}.ipynb").is_file()


@pytest.mark.parametrize(
    "path",
    sorted((ROOT / "exercises").glob("*.ipynb")) + sorted((ROOT / "solutions").glob("*.ipynb")),
    ids=lambda p: f"{p.parent.name}/{p.stem}",
)
def test_colab_copy_of_exercise_differs_only_by_the_address(built, path):
    source = _cells(path)
    copied = _cells(built / path.parent.name / path.name)
    assert len(source) == len(copied)

    def norm(cell):
        return {**cell, "source": _src(cell)}

    changed = [(a, b) for a, b in zip(source, copied, strict=True) if norm(a) != norm(b)]
    assert len(changed) == 1
    a, b = changed[0]
    assert _src(a).replace(
        URL_LINE, f'COURSE_REPO_URL = "{URL}"  # written by the book build'
    ) == _src(b)


def test_colab_copies_carry_the_address_from_config_yml(built):
    copies = sorted(built.rglob("*.ipynb"))
    assert len(copies) == len(DOCS) + 2 * len(list((ROOT / "exercises").glob("*.ipynb")))
    for path in copies:
        setup = [
            c for c in _cells(path) if c["cell_type"] == "code" and "COURSE_REPO_URL = " in _src(c)
        ]
        assert len(setup) == 1, path
        assert f'COURSE_REPO_URL = "{URL}"' in _src(setup[0]) and URL_LINE not in _src(setup[0]), (
            path
        )


def test_chapter_links_in_copies_open_other_copies(built):
    targets = []
    for doc in DOCS:
        for cell in _cells(built / f"{doc}.ipynb"):
            if cell["cell_type"] == "markdown":
                assert not re.search(r"\]\((?!https?://)[^)\s]+\.ipynb", _src(cell)), (
                    f"{doc}: relative notebook link"
                )
                targets += re.findall(
                    r"\]\((https://colab\.research\.google\.com/[^)\s]+)\)", _src(cell)
                )
    assert targets
    for t in targets:
        rel = t.split(f"/blob/{COPIES_BRANCH}/{COPIES_DIR}/", 1)[1].split("#")[0]
        assert (built / rel).is_file(), t


def test_copy_generator_refuses_a_missing_glue_value():
    nb = {
        "cells": [
            {
                "cell_type": "code",
                "id": "s",
                "metadata": {},
                "outputs": [],
                "execution_count": None,
                "source": "import os\n" + URL_LINE + "\n",
            },
            {
                "cell_type": "markdown",
                "id": "m",
                "metadata": {},
                "source": "x is {glue:text}`x:.1f`",
            },
        ]
    }
    with pytest.raises(copies_ext.CopyError, match="no glued value named 'x'"):
        copies_ext.colab_copy(nb, URL, "chapters/x", values={})
    values = {"x": {"text/plain": "3.14159"}}
    out = copies_ext.colab_copy(nb, URL, "chapters/x", values=values)
    assert [c["source"] for c in out["cells"] if c["id"] == "m"] == ["x is 3.1"]
    assert "recomputes" in out["cells"][2]["source"]  # the note follows the first Markdown cell
    assert f'COURSE_REPO_URL = "{URL}"' in out["cells"][0]["source"]
