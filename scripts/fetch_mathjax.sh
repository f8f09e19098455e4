#!/usr/bin/env bash
# Put a local MathJax 3 into book/_mathjax/mathjax/ so the site typesets math with no network.
#
# The book's _config.yml points Sphinx at it (html_static_path: [_mathjax],
# mathjax_path: mathjax/tex-mml-chtml.js), so it lands in _build/html/_static/mathjax/.
# It is deliberately not book/_static: Jupyter Book 1 injects every .js file found under
# book/_static into every page (jupyter_book/config.py), which would load MathJax's 100+
# extension files on each page.
#
# Source: the npm package mathjax@3.2.2 (npm pack, no node_modules) where npm exists; otherwise
# the same MathJax 3.2.2 files from PyPI's django-static-mathjax==3.2.2.1 wheel (so a machine with
# only Python and the package registries can build the book). Copied: the combined
# tex-mml-chtml.js, the CHTML woff-v2 fonts, the TeX extensions it autoloads, and the
# accessibility components its menu loads when a reader turns on the explorer or speech
# (a11y/*.js and the speech rule engine's sre/mathmaps/*.json; without them those readers get
# 404s in the console and no speech). ~6.5 MB.
# Idempotent: does nothing if the pinned version and file set are already there.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
VERSION="3.2.2"
STAMP="$VERSION a11y"  # bump the suffix when the copied file set changes
DEST="book/_mathjax/mathjax"
if [ -f "$DEST/VERSION" ] && [ "$(cat "$DEST/VERSION")" = "$STAMP" ]; then
  exit 0
fi
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
if command -v npm >/dev/null 2>&1; then
  (cd "$TMP" && npm pack --silent "mathjax@$VERSION" >/dev/null && tar xzf "mathjax-$VERSION.tgz")
  ES5="$TMP/package/es5"
  LICENSE_FILE="$TMP/package/LICENSE"
else
  PY="${PYTHON:-python3}"
  "$PY" -m pip download -q --no-deps --dest "$TMP" "django-static-mathjax==$VERSION.1"
  "$PY" -m zipfile -e "$TMP"/django_static_mathjax-*.whl "$TMP/whl"
  ES5="$TMP/whl/mathjax/static/mathjax/es5"
  LICENSE_FILE="$(find "$TMP/whl" -name 'LICENSE*' | head -n 1)"
fi
rm -rf "$DEST"
mkdir -p "$DEST/output/chtml/fonts" "$DEST/input/tex"
cp "$ES5/tex-mml-chtml.js" "$DEST/"
cp -r "$ES5/output/chtml/fonts/woff-v2" "$DEST/output/chtml/fonts/"
cp -r "$ES5/input/tex/extensions" "$DEST/input/tex/"
cp -r "$ES5/a11y" "$DEST/"
mkdir -p "$DEST/sre"
cp -r "$ES5/sre/mathmaps" "$DEST/sre/"
if [ -n "$LICENSE_FILE" ]; then cp "$LICENSE_FILE" "$DEST/LICENSE"; fi
echo "$STAMP" > "$DEST/VERSION"
echo "==> MathJax $VERSION copied to $DEST"
