#!/usr/bin/env bash
# Run Colab copies of notebooks on a GPU machine from an installed wheel, as a student would
# (no repository next to them). Usage, from the repository root:
#
#   WHEEL=dist/course_kernels-*.whl OUT=/some/dir scripts/gpu_wheel_notebooks.sh NOTEBOOK.ipynb...
#
# The wheel is installed without dependencies into a fresh folder (the machine's torch and
# Triton are used, as on Colab); each notebook is copied into an empty folder and run there by
# scripts/run_notebooks_plain.py (a machine without Jupyter); $OUT/wheel_notebooks.json records
# each notebook's result with GPU, versions, date and the command. Make the Colab copies with
# the book build (_build/html/_colab/) and the wheel with `pip wheel --no-deps -w dist .`.
set -uo pipefail
OUT="${OUT:?set OUT}"
WHEEL="${WHEEL:?set WHEEL to the wheel file}"
PY="${PY:-python3}"
mkdir -p "$OUT"
SITE="$(mktemp -d)/site"
"$PY" -m pip install -q --no-index --no-deps --no-compile --target "$SITE" $WHEEL || exit 1
RUNNER="$(cd "$(dirname "$0")" && pwd)/run_notebooks_plain.py"
WORK="$(mktemp -d)"
for nb in "$@"; do
  mkdir -p "$WORK/$(basename "$nb" .ipynb)"
  cp "$nb" "$WORK/$(basename "$nb" .ipynb)/"
done
cd "$WORK" || exit 1
# Only the wheel on the path: the repository is not importable from here.
PYTHONPATH="$SITE" PYTHONUNBUFFERED=1 "$PY" "$RUNNER" --installed ./*/*.ipynb --out "$OUT/wheel_notebooks.json" \
  --limit-s "${LIMIT_S:-150}"
