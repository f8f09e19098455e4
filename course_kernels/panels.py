"""Show a multi-panel matplotlib figure one panel per image, so it reads on a phone.

Chapter: every chapter with a figure of several panels. A figure of two (or sixteen) panels side
by side, shrunk to a phone's 360 px, has unreadable labels. :func:`show_panels` crops each
panel (its tight box: title, tick labels, axis labels, legend) out of the drawn figure and
displays it as its own image, the figure-level title as text above and a figure-level legend
as an image of its own. The book's stylesheet (book/_ext/phone_view_static/phone_view.css) lays
the images of one cell out side by side on a wide screen and one under another on a phone.
"""

from __future__ import annotations

import io


def panel_images(fig, dpi: int = 110) -> tuple[str, list[bytes]]:
    """(figure title, PNG bytes of each visible panel and of each figure-level legend)."""
    from matplotlib.transforms import Bbox

    panels = [a for a in fig.axes if a.get_visible() and a.axison and a.get_label() != "<colorbar>"]
    panels = [a for a in panels if not any(a in p.child_axes for p in fig.axes)]  # no insets
    for ax in panels:  # shared axes hide inner tick labels; alone, each panel needs its own
        ax.tick_params(labelleft=True, labelbottom=True)
        if not ax.get_ylabel():
            shared = ax.get_shared_y_axes().get_siblings(ax)
            label = next((a.get_ylabel() for a in shared if a.get_ylabel()), "")
            ax.set_ylabel(label)
    title = fig._suptitle.get_text() if fig._suptitle is not None else ""
    if fig._suptitle is not None:
        fig._suptitle.set_visible(False)
    if not hasattr(fig.canvas, "get_renderer"):  # a Figure made without pyplot
        from matplotlib.backends.backend_agg import FigureCanvasAgg

        FigureCanvasAgg(fig)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    boxes = [a.get_tightbbox(renderer) for a in panels] + [
        lg.get_window_extent(renderer) for lg in fig.legends
    ]
    images = []
    shown = [lg.get_visible() for lg in fig.legends]
    for i, box in enumerate(boxes):
        # savefig with a box re-anchors figure-level artists to that box, so a figure legend
        # would be drawn inside every panel's image: each image shows only its own legend
        for j, lg in enumerate(fig.legends):
            lg.set_visible(shown[j] and i == len(panels) + j)
        inches = Bbox(box.transformed(fig.dpi_scale_trans.inverted()).get_points())
        inches = inches.expanded(1.02, 1.04) if i < len(panels) else inches.padded(0.08)
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=dpi, bbox_inches=inches)
        images.append(buf.getvalue())
    for lg, was in zip(fig.legends, shown, strict=True):
        lg.set_visible(was)
    return title, images


def show_panels(fig, dpi: int = 110) -> None:
    """Display ``fig`` one panel per image (see the module docstring) and close it."""
    from IPython.display import Image, Markdown, display

    title, images = panel_images(fig, dpi)
    if title:
        display(Markdown(f"**{title}**"))
    for png in images:
        display(Image(png))
    try:
        import matplotlib.pyplot as plt

        plt.close(fig)  # a pyplot figure would otherwise be shown a second time, whole
    except Exception:  # noqa: BLE001 (a Figure made without pyplot is not registered there)
        pass
