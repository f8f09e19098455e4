#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the autograder image (Ubuntu).
# It installs Python, bubblewrap (the sandbox) and the course package from this bundle.
set -euo pipefail
SRC="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq python3 python3-venv python3-pip bubblewrap >/dev/null
python3 -m venv /autograder/venv
/autograder/venv/bin/python -m pip install -q --upgrade pip
if [ "$(cat "$SRC/triton.txt")" = 1 ]; then
  # a CPU build of torch (Triton runs in its interpreter): never a loose torch requirement
  /autograder/venv/bin/python -m pip install -q "torch==2.13.0" \
    --index-url https://download.pytorch.org/whl/cpu
  /autograder/venv/bin/python -m pip install -q -c "$SRC/course/requirements/constraints.txt" \
    "$SRC/course[kernel]"
else
  /autograder/venv/bin/python -m pip install -q -c "$SRC/course/requirements/constraints.txt" \
    "$SRC/course"
fi
