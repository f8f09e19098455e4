#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the autograder image (Ubuntu). It needs
# nothing but a bare system: it installs Python and bubblewrap with apt (skipped when both are
# there), makes a virtual environment and installs the course package from the wheel shipped in
# this bundle (wheels/), its dependencies from PyPI (for Triton exercises a CPU torch first).
#
# For tests and machines without the network (all optional):
#   AUTOGRADER_ROOT  where the venv goes (default /autograder: $AUTOGRADER_ROOT/venv)
#   PYTHON3          the Python that makes the venv (default python3)
#   AUTOGRADER_SITE  a folder of packages already installed (numpy, tqdm, nbformat, ...): the
#                    venv sees it, and pip installs the wheel offline (--no-index)
set -euo pipefail
SRC="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="${AUTOGRADER_ROOT:-/autograder}"
PY3="${PYTHON3:-python3}"
export DEBIAN_FRONTEND=noninteractive
if ! command -v bwrap >/dev/null || ! command -v "$PY3" >/dev/null \
  || ! "$PY3" -c "import venv, ensurepip" 2>/dev/null; then
  apt-get update -qq
  apt-get install -y -qq python3 python3-venv python3-pip bubblewrap >/dev/null
fi
"$PY3" -m venv "$ROOT/venv"
VPY="$ROOT/venv/bin/python"
WHEEL="$(ls "$SRC"/wheels/course_kernels-*.whl | head -n 1)"
if [ -n "${AUTOGRADER_SITE:-}" ]; then
  PURELIB="$("$VPY" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")"
  echo "$AUTOGRADER_SITE" > "$PURELIB/autograder_site.pth"
  "$VPY" -m pip install -q --no-index --disable-pip-version-check "$WHEEL"
else
  "$VPY" -m pip install -q --upgrade pip
  if [ "$(cat "$SRC/triton.txt")" = 1 ]; then
    # a CPU build of torch (Triton runs in its interpreter): never a loose torch requirement
    "$VPY" -m pip install -q "torch==2.13.0" --index-url https://download.pytorch.org/whl/cpu
    "$VPY" -m pip install -q "$WHEEL[kernel]"
  else
    "$VPY" -m pip install -q "$WHEEL"
  fi
fi
# fail the image build now (not every submission later) when the grader cannot start
"$VPY" -m course_kernels.grading --help >/dev/null
