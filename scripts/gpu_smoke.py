"""Run the Triton solutions' cells (check cells, tuning practice) on a GPU (manual smoke test).

    python scripts/gpu_smoke.py

Runs them in plain Python through scripts/run_notebooks_plain.py (the one notebook runner's
plain mode) and records the result in gpu_smoke.json in the working directory.
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import run_notebooks_plain  # noqa: E402

NAMES = ("07_triton_forward", "08_triton_causal_gqa", "09_tuning")

if __name__ == "__main__":
    paths = [str(ROOT / "solutions" / f"{name}.ipynb") for name in NAMES]
    sys.exit(run_notebooks_plain.main([*paths, "--out", "gpu_smoke.json", "--limit-s", "600"]))
