"""Exercise 09, tuning block sizes for a GPU: everything about it in one place.

What a spec module holds and how it is used: ``course_kernels/grading/specs/__init__.py``.
"""

from __future__ import annotations

import numpy as np

from ..builders import as_int
from ..feedback import Case, Fail
from . import source_of

NAME = "09_tuning"
TITLE = "Tuning block sizes for a GPU"
TIMEOUT = 20.0
TRITON = False  # graded as a NumPy exercise: pure functions
SETUP = "triton"  # the notebook's setup imports Triton for the (ungraded) measurement
NOTE = (
    "The GPU measurement in this notebook is practice and is not graded; the graded parts run on "
    "any machine."
)

INTRO = (
    "A kernel's block sizes and pipeline depth (`num_stages`) decide how much shared memory it "
    "asks for; a config that asks too much fails to launch ('out of resource: shared memory'). "
    "Colab's T4 allows 48 KB per block (64 KB opt-in), an A100 163 KB, an H100/H200 227 KB. In "
    "this exercise's model a config holds the Q tile once and the K and V tiles once per stage: "
    "(block_q d + num_stages 2 block_k d) x bytes per element, where `block_q` and `block_k` are "
    "the rows of a query tile and of a key/value tile (a Triton kernel's `BLOCK_M` and `BLOCK_N`). "
    "The graded functions run anywhere; the measurement at the end needs a GPU and is not graded "
    "(without one it says so)."
)


# -- the solution (real code: the notebook's solution cells are these functions' source) -------
# fmt: off
def smem_bytes(block_q: int, block_k: int, head_dim: int, num_stages: int,
               dtype_bytes: int = 2) -> int:
    """Bytes: the Q tile (block_q x d) once, K and V tiles (block_k x d) once per stage."""
    return (block_q * head_dim + num_stages * 2 * block_k * head_dim) * dtype_bytes


def configs_that_fit(head_dim: int, smem_limit: int) -> list:
    """[(block_q, block_k, num_stages), ...] over blocks (32, 64, 128), stages (1, 2, 3) that fit
    in smem_limit bytes with 2-byte (fp16) elements."""
    return [(bq, bk, st) for bq in (32, 64, 128) for bk in (32, 64, 128) for st in (1, 2, 3)
            if smem_bytes(bq, bk, head_dim, st) <= smem_limit]


def pick_fastest(configs: list, times_ms: list) -> tuple:
    """The config with the smallest time (the first one on a tie), as a tuple."""
    best = min(range(len(times_ms)), key=lambda i: (times_ms[i], i))
    return tuple(configs[best])
# fmt: on


def solution_source(name: str) -> str:
    return source_of(SOLUTIONS, name)


SOLUTIONS = [smem_bytes, configs_that_fit, pick_fastest]

EXERCISES = [
    {"name": "smem_bytes", "text": "Shared memory of one config, in bytes."},
    {
        "name": "configs_that_fit",
        "text": (
            "Every (block_q, block_k, num_stages) with blocks in (32, 64, 128) and stages in (1, "
            "2, 3) whose fp16 footprint is <= the limit."
        ),
    },
    {
        "name": "pick_fastest",
        "text": "Given configs and their measured times, return the fastest (the first on a tie).",
    },
]

VISIBLE = {
    "smem_bytes": [
        {"block_q": 64, "block_k": 64, "head_dim": 64, "num_stages": 2, "dtype_bytes": 2},
        {
            "block_q": 128,
            "block_k": 32,
            "head_dim": 128,
            "num_stages": 3,
            "dtype_bytes": 2,
            "points": 2,
        },
    ],
    "configs_that_fit": [
        {"name": "T4 (48 KB per block), d=64", "head_dim": 64, "smem_limit": 49152, "points": 2},
        {
            "name": "A100 (163 KB per block), d=128",
            "head_dim": 128,
            "smem_limit": 166912,
            "points": 1,
        },
    ],
    "pick_fastest": [{"seed": 80}, {"name": "a tie", "seed": 81, "tie": True}],
}

HIDDEN = {
    "configs_that_fit": [
        {"name": "hidden: H100 (227 KB), d=256", "head_dim": 256, "smem_limit": 232448, "points": 1}
    ],
    "pick_fastest": [{"name": "hidden: fastest last", "seed": 171, "k": 27, "points": 1}],
}

PRACTICE = '''# Not graded: measure on a GPU. Without one, this cell only says so.
@triton.jit
def _scores_rowmax(Q, K, M, N, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr):
    """A tiled kernel to tune: the row max of Q K^T, streamed over key blocks."""
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + offs_m[:, None] * HEAD_DIM + offs_d[None, :], mask=offs_m[:, None] < N,
                other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    for start_n in range(0, N, BLOCK_N):
        cols = start_n + tl.arange(0, BLOCK_N)
        k = tl.load(K + cols[:, None] * HEAD_DIM + offs_d[None, :], mask=cols[:, None] < N,
                    other=0.0)
        s = tl.where(cols[None, :] < N, tl.dot(q, tl.trans(k)), float("-inf"))
        m_i = tl.maximum(m_i, tl.max(s, 1))
    tl.store(M + offs_m, m_i, mask=offs_m < N)


if not torch.cuda.is_available():
    print("No CUDA GPU here: the timing below needs one (on Colab: Runtime > Change runtime type "
          "> T4 GPU). Nothing in this cell is graded; the graded functions above run anywhere.")
else:
    try:
        n, d = 8192, 64
        q = torch.randn(n, d, device="cuda", dtype=torch.float16)
        k = torch.randn(n, d, device="cuda", dtype=torch.float16)
        m = torch.empty(n, device="cuda", dtype=torch.float32)
        limit = torch.cuda.get_device_properties(0).shared_memory_per_block_optin
        configs = configs_that_fit(d, limit)
        times = []
        for block_q, block_k, stages in configs:
            run = lambda: _scores_rowmax[(triton.cdiv(n, block_q),)](  # noqa: E731
                q, k, m, n, HEAD_DIM=d, BLOCK_M=block_q, BLOCK_N=block_k, num_stages=stages)
            times.append(triton.testing.do_bench(run))
        best = pick_fastest(configs, times)
        print(f"{len(configs)} configs fit in {limit} bytes; fastest {best}: {min(times):.3f} ms")
    except NotImplementedError:
        print("fill in configs_that_fit and pick_fastest first")'''


# -- tests: builders and the mistakes they name ------------------------------------------------
BLOCKS = (32, 64, 128)
STAGES = (1, 2, 3)


def model_bytes(block_q, block_k, head_dim, num_stages, dtype_bytes=2):
    """The judges' own copy of the model (independent of the solution above): the Q tile once,
    the K and V tiles once per pipeline stage."""
    return (block_q * head_dim + num_stages * 2 * block_k * head_dim) * dtype_bytes


def build_smem_bytes(params) -> Case:
    args = tuple(
        int(params[x]) for x in ("block_q", "block_k", "head_dim", "num_stages", "dtype_bytes")
    )

    def judge(out, outcome):
        out = as_int(out, "smem_bytes")
        want = model_bytes(*args)
        if out == want:
            return f"{want} bytes"
        if out == model_bytes(*args[:3], 1, args[4]):
            raise Fail(
                "every pipeline stage holds its own K and V tiles: multiply them by num_stages"
            )
        if out == want // args[4]:
            raise Fail("that is elements; multiply by dtype_bytes for bytes")
        raise Fail(
            f"got {out}; the model gives (block_q d + num_stages 2 block_k d) bytes = {want}"
        )

    return Case(
        "smem_bytes",
        params.get("name", str(args)),
        float(params.get("points", 1)),
        "smem_bytes",
        args,
        {},
        judge,
    )


def build_configs_that_fit(params) -> Case:
    d, limit = int(params["head_dim"]), int(params["smem_limit"])

    def judge(out, outcome):
        if not isinstance(out, tuple):
            raise Fail(
                f"should return a list of (block_q, block_k, num_stages); got {type(out).__name__}"
            )
        got = sorted(tuple(int(x) for x in c) for c in out)
        want = sorted(
            (m, n, s)
            for m in BLOCKS
            for n in BLOCKS
            for s in STAGES
            if model_bytes(m, n, d, s) <= limit
        )
        if got == want:
            return f"{len(want)} configs fit in {limit} bytes"
        over = [c for c in got if model_bytes(*c[:2], d, c[2]) > limit]
        if over:
            raise Fail(
                f"{over[0]} needs {model_bytes(*over[0][:2], d, over[0][2])} bytes > "
                f"{limit}: a launch with it fails ('out of resource: shared memory')"
            )
        raise Fail(f"{len(set(want) - set(got))} configs that fit are missing (<= is allowed)")

    return Case(
        "configs_that_fit",
        params.get("name", f"d={d}, {limit} B"),
        float(params.get("points", 1)),
        "configs_that_fit",
        (d, limit),
        {},
        judge,
    )


def build_pick_fastest(params) -> Case:
    rng = np.random.default_rng(int(params.get("seed", 0)))
    configs = [[m, n, s] for m in BLOCKS for n in BLOCKS for s in STAGES][: params.get("k", 12)]
    times = [round(float(t), 3) for t in rng.uniform(0.1, 2.0, len(configs))]
    if params.get("tie"):
        times[3] = times[7] = min(times) - 0.01

    def judge(out, outcome):
        if not isinstance(out, tuple) or len(out) != 3:
            raise Fail("should return one config (block_q, block_k, num_stages)")
        best = min(range(len(times)), key=lambda i: (times[i], i))
        if [int(x) for x in out] == configs[best]:
            return f"{tuple(configs[best])} at {times[best]} ms"
        worst = max(range(len(times)), key=lambda i: times[i])
        if [int(x) for x in out] == configs[worst]:
            raise Fail("that is the slowest config: pick the smallest time")
        raise Fail(
            f"the fastest is {tuple(configs[best])} ({times[best]} ms); on a tie keep the first one"
        )

    return Case(
        "pick_fastest",
        params.get("name", "fastest"),
        float(params.get("points", 1)),
        "pick_fastest",
        (configs, times),
        {},
        judge,
    )


BUILDERS = {
    "smem_bytes": build_smem_bytes,
    "configs_that_fit": build_configs_that_fit,
    "pick_fastest": build_pick_fastest,
}
