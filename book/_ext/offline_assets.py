"""Drop sphinx-thebe's assets from every page: this book does not use Thebe.

Jupyter Book 1 always enables ``sphinx_thebe``. With Sphinx 7 its inline configuration script
(``const THEBE_JS_URL = "https://unpkg.com/..."``) is emitted twice per page, which raises
"Identifier 'THEBE_JS_URL' has already been declared" in the browser (caught by
tests/test_site.py), and it names a CDN the offline site must not depend on. Launch buttons
(Colab) do not need it.
"""


def _is_thebe(asset) -> bool:
    name = getattr(asset, "filename", asset) or ""
    body = getattr(asset, "attributes", {}).get("body", "") if hasattr(asset, "attributes") else ""
    return "thebe" in str(name) or "THEBE_JS_URL" in str(body)


def _drop_thebe(app, pagename, templatename, context, doctree):
    for key in ("script_files", "css_files"):
        if key in context:
            context[key] = [a for a in context[key] if not _is_thebe(a)]


def setup(app):
    app.connect("html-page-context", _drop_thebe, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
