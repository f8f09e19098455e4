"""course_kernels.panels: a multi-panel figure shown one panel per image (phone-width pages), and
the book's chapters showing every multi-panel figure that way."""

import ast
import re
import struct
from pathlib import Path

import nbformat
import pytest

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from course_kernels.panels import panel_images, show_panels  # noqa: E402


def _png_size(png: bytes) -> tuple[int, int]:
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", png[16:24])


def _two_panels(sharey=True):
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3), sharey=sharey)
    a.plot([0, 1], [0, 1], label="left")
    b.plot([0, 1], [1, 0], label="right")
    a.set_ylabel("TFLOP/s")
    a.set_title("forward")
    b.set_title("backward")
    fig.suptitle("H200, fp16")
    fig.legend(["x", "y"], loc="lower center")
    return fig


def test_each_panel_and_the_figure_legend_is_its_own_image():
    fig = _two_panels()
    whole_w = fig.get_size_inches()[0] * 110
    title, images = panel_images(fig, dpi=110)
    assert title == "H200, fp16"
    assert len(images) == 3  # two panels + the figure-level legend
    for png in images[:2]:
        w, h = _png_size(png)
        assert 0 < w < 0.7 * whole_w  # a panel, not the whole width
        assert h > 0
    plt.close(fig)


def test_a_figure_legend_is_drawn_in_its_own_image_only():
    # savefig with a box re-anchors a figure legend to that box: without care it lands inside
    # every panel's image. Each panel's image must be the same with and without the legend.
    def panels(with_legend):
        fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3))
        a.plot([0, 1], [0, 1])
        b.plot([0, 1], [1, 0])
        if with_legend:
            fig.legend(["a long legend entry", "another"], loc="lower center", ncol=2)
        _, images = panel_images(fig, dpi=80)
        legend_visible = [lg.get_visible() for lg in fig.legends]
        plt.close(fig)
        return images, legend_visible

    plain, _ = panels(False)
    legend, visible = panels(True)
    assert len(legend) == len(plain) + 1
    assert legend[:2] == plain  # pixel for pixel: no legend inside a panel's image
    assert legend[2] not in plain and visible == [True]  # its own image; left visible after


def test_a_shared_axis_label_is_repeated_on_every_panel():
    fig = _two_panels(sharey=True)
    panel_images(fig)
    assert [ax.get_ylabel() for ax in fig.axes] == ["TFLOP/s", "TFLOP/s"]
    plt.close(fig)


def test_show_panels_displays_title_and_images_and_closes(monkeypatch):
    shown = []
    monkeypatch.setattr("IPython.display.display", lambda obj: shown.append(type(obj).__name__))
    fig = _two_panels()
    show_panels(fig)
    assert shown == ["Markdown", "Image", "Image", "Image"]
    assert not plt.fignum_exists(fig.number)


# -- the book: every multi-panel figure goes through show_panels --------------------------------
BOOK = Path(__file__).resolve().parents[1] / "book"
# plt.subplots(rows, cols, ...) with at least one of the two not the literal 1.
MULTI_PANEL = re.compile(r"\bsubplots\(\s*(?!1\s*,\s*1\b)[\w.]+\s*,\s*[\w.]+")


def _tree(source: str) -> ast.Module:
    """A cell's code as a syntax tree (IPython magics dropped)."""
    return ast.parse(
        "\n".join("" if ln.lstrip().startswith(("%", "!")) else ln for ln in source.splitlines())
    )


def _calls(nodes) -> set[str]:
    """Names of the functions called anywhere in ``nodes``."""
    return {
        n.func.id
        for node in nodes
        for n in ast.walk(node)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
    }


def panel_problems(cells) -> list[str]:
    """What is wrong with a notebook's figure cells: a multi-panel figure not shown with
    show_panels, or panels shown (directly or through a function the notebook defines) in a cell
    that is not tagged "panels"."""
    trees = [_tree(cell.source) for cell in cells]
    helpers = {  # functions of this notebook that call show_panels
        node.name
        for tree in trees
        for node in tree.body
        if isinstance(node, ast.FunctionDef) and "show_panels" in _calls([node])
    }
    bad = []
    for cell, tree in zip(cells, trees, strict=True):
        run = [n for n in tree.body if not isinstance(n, (ast.FunctionDef, ast.ClassDef))]
        if MULTI_PANEL.search(cell.source) and "show_panels(" not in cell.source:
            bad.append(f"cell {cell.get('id')}: a multi-panel figure without show_panels")
        shown = _calls(run) & ({"show_panels"} | helpers)
        if shown and "panels" not in cell.metadata.get("tags", []):
            bad.append(f"cell {cell.get('id')}: {sorted(shown)} in a cell not tagged 'panels'")
    return bad


def _code_cells(path):
    return [c for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]


def test_the_checks_find_multi_panel_figures():
    assert MULTI_PANEL.search("fig, axes = plt.subplots(1, world, figsize=(9, 3))")
    assert MULTI_PANEL.search("fig, axs = plt.subplots(2, 2)")
    assert not MULTI_PANEL.search("fig, ax = plt.subplots(figsize=(7, 3))")
    assert not MULTI_PANEL.search("fig, ax = plt.subplots(1, 1)")
    cell = nbformat.v4.new_code_cell
    assert panel_problems([cell("fig, axes = plt.subplots(1, 4)\nplt.show()")])
    helper = "def draw(n):\n    fig, axes = plt.subplots(1, n)\n    show_panels(fig)"
    assert not panel_problems([cell(helper)])  # defining the helper shows nothing
    assert len(panel_problems([cell(helper), cell("draw(4)")])) == 1  # calling it does
    tags = {"tags": ["panels"]}
    assert not panel_problems([cell(helper), cell("draw(4)", metadata=tags)])
    assert not panel_problems([cell(helper + "\n\ndraw(3)", metadata=tags)])


@pytest.mark.parametrize(
    "path",
    sorted(p for p in BOOK.rglob("*.ipynb") if "_build" not in p.parts),
    ids=lambda p: p.relative_to(BOOK).as_posix(),
)
def test_every_multi_panel_figure_of_the_book_is_shown_one_panel_per_image(path):
    """A figure of several panels side by side is unreadable at a phone's 390 px: the chapters
    show it with show_panels, in a cell tagged "panels" (the stylesheet stacks its images)."""
    problems = panel_problems(_code_cells(path))
    assert not problems, f"{path.relative_to(BOOK)}:\n" + "\n".join(problems)


# -- from a mutation audit ------------------------------------------------------------------------
def test_colorbars_insets_and_switched_off_axes_are_not_panels():
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(12, 3))
    fig.colorbar(a.imshow([[0, 1], [1, 0]]), ax=a)
    b.inset_axes([0.6, 0.6, 0.3, 0.3]).plot([0, 1])
    c.axis("off")
    title, images = panel_images(fig)
    assert title == "" and len(images) == 2  # a and b only
    plt.close(fig)


def test_panels_hide_the_suptitle_and_show_every_panels_tick_labels():
    fig = _two_panels(sharey=True)
    right = fig.axes[1]
    assert not right.yaxis.get_tick_params()["labelleft"]  # hidden by sharey
    panel_images(fig)
    assert right.yaxis.get_tick_params()["labelleft"]
    assert not fig._suptitle.get_visible()  # shown as text above the images instead
    plt.close(fig)
