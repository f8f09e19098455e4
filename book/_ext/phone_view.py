"""The site on a phone, and a console without 404s.

Adds to every page (files in ``book/_ext/phone_view_static/``, copied to ``_static/``):

- ``phone_view.js``: the sidebar buttons open the sidebars on narrow screens. They do nothing
  with pydata-sphinx-theme 0.17.1 + sphinx-book-theme 1.3.0 (pydata/pydata-sphinx-theme#2451,
  open; no released theme fixes it, and sphinx-book-theme 1.3.0 pins pydata 0.17.1 exactly).
- ``phone_view.css``: nothing widens the page past a phone's screen (long inline code and
  headings wrap, wide display math and outputs scroll in their own box).
- ``favicon.svg`` as the site's icon, so browsers do not request a missing ``/favicon.ico``.

Not ``book/_static``: Jupyter Book 1 injects every .js file found there into every page, and
keeping the files next to this extension keeps the phone fixes in one place.
tests/test_site.py checks all of it at 375 px in Chromium.
"""

from pathlib import Path

STATIC = Path(__file__).parent / "phone_view_static"


def _add_static(app, config):
    config.html_static_path = [*config.html_static_path, str(STATIC)]
    if not config.html_favicon:
        config.html_favicon = str(STATIC / "favicon.svg")


def setup(app):
    app.connect("config-inited", _add_static)
    app.add_css_file("phone_view.css")
    app.add_js_file("phone_view.js")
    return {"parallel_read_safe": True, "parallel_write_safe": True}
