"""The course's exercises: which notebook holds which function, its points, its visible tests.

Hidden tests are *not* here: they are JSON files read only by the instructor's grader
(``grading/hidden_tests/<notebook>.json`` by default, or ``--hidden DIR``). Both kinds of test are
parameter dicts given to the same builders, so a hidden test is just another size or seed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from . import numpy_exercises, triton_exercises
from .specs import ring_attention as _ring

SPECS = {_ring.NAME: _ring}  # exercises kept in one spec module each (grading/specs/)
BUILDERS = {**numpy_exercises.BUILDERS, **triton_exercises.BUILDERS, **_ring.BUILDERS}

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
    "flash_forward": (
        "def flash_forward(q, k, v, *args, **kwargs):\n"
        "    out = np.ones((*q.shape[:-1], v.shape[-1]), q.dtype)\n"
        "    return out, np.ones(q.shape[:-1], q.dtype)\n"),
    "flash_backward": (
        "def flash_backward(q, k, v, *args, **kwargs):\n"
        "    return np.ones_like(q), np.ones_like(k), np.ones_like(v)\n"),
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
    nb.name: nb
    for nb in (
        Notebook("01_stable_softmax", "Stable softmax and logsumexp",
                 ("stable_softmax", "logsumexp")),
        Notebook("02_online_softmax", "Online softmax: the update and the merge",
                 ("online_update", "merge_partials")),
        Notebook("03_tiled_forward", "The tiled forward pass in NumPy", ("flash_forward",),
                 timeout=30.0),
        Notebook("04_block_sizes", "Block sizes and the SRAM budget",
                 ("block_size", "tile_sizes", "fits_in_sram")),
        Notebook("05_count_io", "Counting your algorithm's HBM traffic",
                 ("fa2_forward_io", "fa2_reads")),
        Notebook("06_tiled_backward", "The tiled backward pass", ("flash_backward",),
                 timeout=60.0),
        Notebook("07_triton_forward", "A Flash Attention forward kernel in Triton",
                 ("attention_triton",), triton=True, timeout=30.0),
        Notebook("08_triton_causal_gqa", "Kernel features: causal masking and GQA",
                 ("attention_triton_gqa",), triton=True, timeout=30.0),
        Notebook("09_tuning", "Tuning block sizes for a GPU",
                 ("smem_bytes", "configs_that_fit", "pick_fastest"),
                 note="The GPU measurement in this notebook is practice and is not graded; the "
                 "graded parts run on any machine."),
        *(Notebook(spec.NAME, spec.TITLE, tuple(e["name"] for e in spec.EXERCISES),
                   timeout=spec.TIMEOUT) for spec in SPECS.values()),
    )
}

_V = {
    "stable_softmax": [
        dict(name="small rows", shape=[4, 9], seed=1, points=2),
        dict(name="large scores (overflow)", shape=[3, 8], scale=1000, seed=2, points=2),
        dict(name="masked scores (-inf)", shape=[4, 10], masked=True, seed=3, points=1),
        dict(name="batched (..., N), float32", shape=[2, 3, 5, 7], dtype="float32", scale=5,
             seed=4, points=1),
    ],
    "logsumexp": [
        dict(name="small rows", shape=[4, 9], seed=5, points=1),
        dict(name="large scores (overflow)", shape=[3, 8], scale=10, shift=1000, seed=6, points=2),
        dict(name="masked scores (-inf)", shape=[4, 10], masked=True, seed=7, points=1),
    ],
    "online_update": [
        dict(name="first block (empty state)", state="empty", seed=10, points=1),
        dict(name="the max rises: rescale", m_shift=-3.0, seed=11, points=2),
        dict(name="the max stays", m_shift=4.0, seed=12, points=1),
        dict(name="fully masked rows", state="empty", masked_rows=2, seed=13, points=2),
    ],
    "merge_partials": [
        dict(name="two halves of the keys", seed=20, points=2),
        dict(name="very different maxima", shift_b=8.0, seed=21, points=1),
        dict(name="a side that saw no key", empty_a=2, seed=22, points=2),
    ],
    "flash_forward": [
        dict(name="blocks divide N", lead=[2, 3], nq=64, block_q=16, block_k=16, seed=30,
             points=2),
        dict(name="uneven N and blocks", nq=77, block_q=16, block_k=24, spread=4, seed=31,
             points=2),
        dict(name="cross-attention: Nq != Nk, dv != d", nq=50, nk=83, d=16, dv=24, block_q=16,
             block_k=32, seed=32, points=2),
        dict(name="causal, uneven N", nq=70, block_q=16, block_k=24, causal=True, seed=33,
             points=2),
        dict(name="causal with Nq < Nk", nq=40, nk=72, block_q=16, block_k=16, causal=True,
             seed=34, points=1),
        dict(name="blocks of 1 and longer than N", nq=9, block_q=1, block_k=64, seed=35, points=1),
        dict(name="custom scale", nq=33, scale=0.3, seed=36, points=1),
        dict(name="logsumexp saved for backward", check="lse", nq=45, causal=True, seed=37,
             points=2),
        dict(name="really tiled: no N x N matrix", check="memory", lead=[1], nq=2048, d=16,
             dtype="float64", block_q=64, block_k=64, seed=38, points=2),
    ],
    "block_size": [
        dict(M=100000, d=64, points=2),
        dict(M=96000, d=64, points=1),
        dict(M=1000, d=64, points=1),
        dict(name="M < 4d raises ValueError", M=100, d=64, points=1),
    ],
    "tile_sizes": [dict(M=100000, d=64), dict(M=2048, d=64), dict(M=65536, d=128)],
    "fits_in_sram": [
        dict(br=64, bc=390, d=64, M=100000),
        dict(name="the article's B=375 at d=64", br=375, bc=375, d=64, M=96000, points=2),
        dict(name="exactly full", br=8, bc=8, d=8, M=320),
    ],
    "fa2_forward_io": [
        dict(name="O and L are right", check="output", n=40, d=8, block_q=8, block_k=8, seed=40,
             points=2),
        dict(name="traffic: N multiple of the blocks", check="io", n=40, d=8, block_q=8,
             block_k=8, seed=41, points=2),
        dict(name="traffic: uneven blocks", check="io", n=45, d=8, block_q=12, block_k=10,
             seed=42, points=2),
    ],
    "fa2_reads": [dict(n=1024, d=64, block_q=128), dict(n=1000, d=64, block_q=128)],
    "flash_backward": [
        dict(name="non-causal, uneven N", lead=[2], nq=45, block_q=16, block_k=16, seed=50,
             points=3),
        dict(name="causal", nq=50, block_q=16, block_k=8, causal=True, seed=51, points=3),
        dict(name="cross-attention: Nq != Nk, dv != d", nq=30, nk=47, dv=24, seed=52, points=2),
        dict(name="really tiled: no N x N matrix", check="memory", lead=[1], nq=2048, d=16,
             dtype="float64", block_q=64, block_k=64, seed=53, points=2),
    ],
    "attention_triton": [
        dict(name="N a multiple of the block", n=32, d=16, seed=60, points=2),
        dict(name="uneven N (masked loads)", n=50, d=16, seed=61, points=2),
        dict(name="logsumexp", check="lse", n=40, d=32, seed=62, points=2),
    ],
    "attention_triton_gqa": [
        dict(name="causal, one kv head per head", heads=2, heads_kv=2, n=40, causal=True,
             seed=70, points=2),
        dict(name="GQA: 4 query heads, 2 kv heads", heads=4, heads_kv=2, n=32, seed=71, points=2),
        dict(name="GQA and causal, uneven N", heads=6, heads_kv=2, n=37, causal=True, seed=72,
             points=2),
    ],
    "smem_bytes": [
        dict(block_m=64, block_n=64, head_dim=64, num_stages=2, dtype_bytes=2),
        dict(block_m=128, block_n=32, head_dim=128, num_stages=3, dtype_bytes=2, points=2),
    ],
    "configs_that_fit": [
        dict(name="T4 (48 KB per block), d=64", head_dim=64, smem_limit=49152, points=2),
        dict(name="A100 (163 KB per block), d=128", head_dim=128, smem_limit=166912, points=1),
    ],
    "pick_fastest": [dict(seed=80), dict(name="a tie", seed=81, tie=True)],
}

for _spec in SPECS.values():
    _V.update(_spec.VISIBLE)

EXERCISES = {
    name: Exercise(name, nb.name, _V[name], torch_rules=nb.triton)
    for nb in NOTEBOOKS.values()
    for name in nb.exercises
}

DEFAULT_HIDDEN = Path(__file__).resolve().parents[2] / "grading" / "hidden_tests"


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
