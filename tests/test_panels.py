"""course_kernels.panels: a multi-panel figure shown one panel per image (phone-width pages)."""

import struct

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
