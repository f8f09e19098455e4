"""Run the Triton solutions' check cells and the tuning practice cell on a GPU (manual smoke test).

python grading/gpu_smoke.py
"""

import json
import linecache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

for name in ("07_triton_forward", "08_triton_causal_gqa", "09_tuning"):
    nb = json.loads((ROOT / "solutions" / f"{name}.ipynb").read_text())
    ns = {"__name__": "__main__"}
    for cell in nb["cells"]:
        if cell["cell_type"] != "code":
            continue
        src = "".join(cell["source"])
        print(f"--- {name}: {cell['metadata'].get('course_kernels', {}).get('role')}")
        filename = f"<{name} cell>"
        linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)
        exec(compile(src, filename, "exec"), ns)
