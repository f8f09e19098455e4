"""The tables the grader and the check cell read, built from the spec modules (``specs/``, one
per exercise): which notebook holds which function, its visible tests and builders, its points.

The grader reads hidden tests from JSON (``course_kernels/grading/hidden_tests/<notebook>.json``, package data, written from
the specs' ``HIDDEN`` by ``scripts/build_notebooks.py``, or ``--hidden DIR``). Both kinds of test
are parameter dicts given to the same builders, so a hidden test is just another size or seed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from .specs import (
    block_sizes,
    count_io,
    online_softmax,
    ring_attention,
    serving_maps,
    stable_softmax,
    tiled_backward,
    tiled_forward,
    triton_causal_gqa,
    triton_forward,
    tuning,
)

# Every exercise is one spec module (course_kernels/grading/specs/), in notebook order.
SPECS = {
    spec.NAME: spec
    for spec in (
        stable_softmax,
        online_softmax,
        tiled_forward,
        block_sizes,
        count_io,
        tiled_backward,
        triton_forward,
        triton_causal_gqa,
        tuning,
        ring_attention,
        serving_maps,
    )
}
BUILDERS = {name: build for spec in SPECS.values() for name, build in spec.BUILDERS.items()}

NUMPY_PREAMBLE = "import math\nfrom typing import Optional, Tuple\n\nimport numpy as np\n"
TRITON_PREAMBLE = NUMPY_PREAMBLE + (
    "import torch\nimport triton\nimport triton.language as tl\n\n"
    'DEVICE = "cuda" if torch.cuda.is_available() else "cpu"\n'
)

# Names a solution cell may not use: the library's answers, other libraries' answers, and the
# tools of an escape (they are flagged by reading the code, before and independently of running it).
FORBIDDEN_ALWAYS = {
    "course_kernels": "imports the course's own implementation",
    "flash_attn": "imports the flash-attn library",
    "scipy": "uses SciPy (scipy.special.softmax / logsumexp do the exercise for you)",
    "importlib": "uses importlib",
    "__import__": "uses __import__",
    "ctypes": "uses ctypes",
    "subprocess": "starts processes",
    "multiprocessing": "starts processes",
    "fork": "forks processes",
    "system": "runs shell commands",
    "exec": "uses exec",
    "eval": "uses eval",
    "compile": "uses compile",
    "builtins": "modifies builtins",
    "sys": "uses sys (sys.exit, sys.modules)",
    "_exit": "calls os._exit",
    "kill": "sends signals to processes",
    "killpg": "sends signals to processes",
    "open": "opens files",
    "setattr": "patches objects with setattr",
    "globals": "uses globals()",
    "signal": "uses signals",
    "gc": "walks the garbage collector",
    "inspect": "inspects frames",
    "tracemalloc": "tampers with the memory measurement",
    "resource": "changes resource limits",
}
# NumPy exercises: no other array library may do the work (the sandbox also hides torch, Triton,
# SciPy and JAX from NumPy notebooks: the import fails even where this lint is dodged).
FORBIDDEN_NUMPY = {
    "torch": "uses PyTorch in a NumPy exercise (torch.softmax / torch's attention do it for you)",
    "triton": "uses Triton in a NumPy exercise",
    "jax": "uses JAX in a NumPy exercise",
    "tensorflow": "uses TensorFlow in a NumPy exercise",
    "numba": "uses numba in a NumPy exercise",
}
FORBIDDEN_NUMPY_ATTRS = {
    "softmax": "calls a library softmax",
    "log_softmax": "calls a library log_softmax",
    "logsumexp": "calls a library logsumexp",
    "scaled_dot_product_attention": "calls a library attention",
}
FORBIDDEN_TORCH = {
    "scaled_dot_product_attention": "calls PyTorch's attention instead of a Triton kernel",
    "softmax": "calls a library softmax outside a Triton kernel",
    "matmul": "calls torch.matmul outside a Triton kernel",
    "bmm": "calls torch.bmm outside a Triton kernel",
    "einsum": "calls einsum outside a Triton kernel",
    "baddbmm": "calls baddbmm outside a Triton kernel",
    "logsumexp": "calls a library logsumexp outside a Triton kernel",
}


# What the tiling check subtracts: a child running the same calls on these stubs (the inputs,
# the interpreter, and outputs of the right size, which an honest solution must return too).
BASELINE_STUBS = {
    name: stub
    for spec in SPECS.values()
    for name, stub in getattr(spec, "BASELINE_STUBS", {}).items()
}


@dataclass(frozen=True)
class Notebook:
    name: str  # file stem, e.g. "01_stable_softmax"
    title: str
    exercises: tuple  # function names, in order
    triton: bool = False
    timeout: float = 20.0  # seconds per call
    note: str = ""


@dataclass
class Exercise:
    name: str
    notebook: str
    visible: list = field(default_factory=list)
    torch_rules: bool = False

    def cases(self, params_list=None, hidden=False):
        out = []
        for p in self.visible if params_list is None else params_list:
            case = BUILDERS[self.name](p)
            case.hidden = hidden
            out.append(case)
        return out


NOTEBOOKS = {
    spec.NAME: Notebook(
        spec.NAME,
        spec.TITLE,
        tuple(e["name"] for e in spec.EXERCISES),
        triton=spec.TRITON,
        timeout=spec.TIMEOUT,
        note=getattr(spec, "NOTE", ""),
    )
    for spec in SPECS.values()
}

_V = {name: cases for spec in SPECS.values() for name, cases in spec.VISIBLE.items()}

EXERCISES = {
    name: Exercise(name, nb.name, _V[name], torch_rules=nb.triton)
    for nb in NOTEBOOKS.values()
    for name in nb.exercises
}

# Package data (pyproject.toml): every install carries the hidden tests; --hidden DIR adds secret ones.
DEFAULT_HIDDEN = Path(__file__).resolve().parent / "hidden_tests"


def notebook_of(stem: str) -> Notebook:
    """The notebook spec for a file stem, matched by its number prefix ("03_..." -> 03)."""
    if stem in NOTEBOOKS:
        return NOTEBOOKS[stem]
    prefix = stem.split("_", 1)[0]
    for nb in NOTEBOOKS.values():
        if nb.name.split("_", 1)[0] == prefix:
            return nb
    raise KeyError(f"no exercise notebook matches {stem!r}; known: {sorted(NOTEBOOKS)}")


def hidden_params(notebook: str, hidden_dir=None) -> dict:
    """exercise -> list of parameter dicts from ``<hidden_dir>/<notebook>.json`` (may be absent)."""
    d = Path(hidden_dir) if hidden_dir is not None else DEFAULT_HIDDEN
    path = d / f"{notebook}.json"
    if not path.is_file():
        return {}
    data = json.loads(path.read_text())
    out: dict = {}
    for item in data.get("tests", []):
        out.setdefault(item["exercise"], []).append(item)
    return out


def preamble(nb: Notebook) -> str:
    return TRITON_PREAMBLE if nb.triton else NUMPY_PREAMBLE
