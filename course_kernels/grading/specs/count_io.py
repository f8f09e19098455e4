"""Exercise 05, counting your algorithm's HBM traffic: everything about it in one place.

What a spec module holds and how it is used: ``course_kernels/grading/specs/__init__.py``.
"""

from __future__ import annotations

import math

import numpy as np

from ...numpy.reference import attention_reference
from ..builders import as_int, name_of, seeded
from ..feedback import Case, Fail, as_array, compare, unpack
from ..variants import lse_variants, tiled_variants
from . import source_of

NAME = "05_count_io"
TITLE = "Counting your algorithm's HBM traffic"
TIMEOUT = 20.0
TRITON = False

INTRO = (
    "`course_kernels.iosim.TwoLevelMemory` is a two-level memory that counts traffic: HBM holds "
    "the arrays `Q, K, V, O, L`; `mem.load(name, slice(i0, i1))` copies rows on chip (and counts "
    "the elements read), `mem.store(name, rows, tile)` writes rows back (counted), "
    "`mem.alloc(shape)` reserves an on-chip accumulator, and `mem.free(*tiles)` releases SRAM. A "
    "load or alloc beyond M elements raises `SRAMOverflowError`. In this model the score tile S, "
    "and the per-row m and l, live in registers: keep them as plain NumPy arrays. "
    "FlashAttention-2 reads Q once and K, V once per query block: N d + ceil(N/block_q) N 2d "
    "elements (d = dv)."
)


# -- the solution (real code: the notebook's solution cells are these functions' source) -------
# fmt: off
def fa2_forward_io(mem, block_q: int, block_k: int) -> None:
    """FlashAttention-2 forward on a two-level memory.

    mem.hbm holds Q (N, d), K (N, d), V (N, dv), and the outputs O (N, dv), L (N,).
    Use only mem.load / mem.store / mem.alloc / mem.free to move data. Returns nothing.
    """
    n, d = mem.hbm["Q"].shape
    n_k, dv = mem.hbm["V"].shape
    scale = 1.0 / math.sqrt(d)
    for i0 in range(0, n, block_q):
        i1 = min(i0 + block_q, n)
        q_i = mem.load("Q", slice(i0, i1))  # (block_q, d): read once per query block
        acc = mem.alloc((i1 - i0, dv))  # (block_q, dv) on-chip accumulator
        m = np.full(i1 - i0, -np.inf)  # registers, not SRAM
        l = np.zeros(i1 - i0)
        for j0 in range(0, n_k, block_k):
            j1 = min(j0 + block_k, n_k)
            k_j, v_j = mem.load("K", slice(j0, j1)), mem.load("V", slice(j0, j1))
            s = scale * (q_i @ k_j.T)  # (block_q, block_k) in registers
            m_new = np.maximum(m, s.max(axis=-1))
            p = np.exp(s - m_new[:, None])
            alpha = np.exp(m - m_new)
            l = alpha * l + p.sum(axis=-1)
            acc *= alpha[:, None]  # in place: acc stays the allocated tile
            acc += p @ v_j
            m = m_new
            mem.free(k_j, v_j)
        mem.store("O", slice(i0, i1), acc / l[:, None])
        mem.store("L", slice(i0, i1), m + np.log(l))
        mem.free(q_i, acc)


def fa2_reads(N: int, d: int, block_q: int) -> int:
    """Elements FA2 reads from HBM: Q once, K and V once per query block (dv = d)."""
    t_r = -(-N // block_q)  # ceil: the last, partial block reads K and V too
    return N * d + t_r * N * 2 * d
# fmt: on


def solution_source(name: str) -> str:
    return source_of(SOLUTIONS, name)


SOLUTIONS = [fa2_forward_io, fa2_reads]

EXERCISES = [
    {
        "name": "fa2_forward_io",
        "text": (
            "Write the FA2 forward against the memory: for each query block load Q_i, alloc O_i, "
            "stream K_j, V_j (free them after use), update acc **in place** (`acc *= ...; acc += "
            "...`, so that `mem.free(acc)` frees the tile you allocated), then store O_i and "
            "L_i. SRAM is exactly 2 block_q d + 2 block_k d elements. Non-causal, 2-D inputs."
        ),
    },
    {"name": "fa2_reads", "text": "Predict the elements your function reads, for N = Nk, dv = d."},
]

VISIBLE = {
    "fa2_forward_io": [
        {
            "name": "O and L are right",
            "check": "output",
            "n": 40,
            "d": 8,
            "block_q": 8,
            "block_k": 8,
            "seed": 40,
            "points": 2,
        },
        {
            "name": "traffic: N multiple of the blocks",
            "check": "io",
            "n": 40,
            "d": 8,
            "block_q": 8,
            "block_k": 8,
            "seed": 41,
            "points": 2,
        },
        {
            "name": "traffic: uneven blocks",
            "check": "io",
            "n": 45,
            "d": 8,
            "block_q": 12,
            "block_k": 10,
            "seed": 42,
            "points": 2,
        },
    ],
    "fa2_reads": [{"n": 1024, "d": 64, "block_q": 128}, {"n": 1000, "d": 64, "block_q": 128}],
}

HIDDEN = {
    "fa2_forward_io": [
        {
            "name": "hidden: traffic, prime N",
            "check": "io",
            "n": 53,
            "d": 4,
            "block_q": 7,
            "block_k": 11,
            "seed": 131,
            "points": 2,
        }
    ],
    "fa2_reads": [{"name": "hidden: N=8191", "n": 8191, "d": 128, "block_q": 64, "points": 1}],
}

PRACTICE = """# Not graded: count your own traffic with the simulator, and compare with your formula.
from course_kernels.iosim import count_io

rng = np.random.default_rng(0)
q, k, v = (rng.standard_normal((64, 8)) for _ in range(3))
try:
    io, O, L = count_io(fa2_forward_io, q, k, v, sram_elements=4 * 16 * 8, block_q=16, block_k=16)
    print(f"reads {io.reads}, writes {io.writes}, peak SRAM {io.peak_sram} elements")
    print("your formula:", fa2_reads(64, 8, 16))
except NotImplementedError:
    print("fill in fa2_forward_io and fa2_reads first")"""


# -- tests: builders and the mistakes they name ------------------------------------------------
def fa2_expected_io(n, d, dv, bq):
    t_r = math.ceil(n / bq)
    return n * d + t_r * n * (d + dv), n * dv + n


def replay(trace, shapes, sram):
    """Replay the child's log of load/store/alloc/free against the real two-level memory."""
    from ...iosim import SRAMOverflowError, TwoLevelMemory, Virtual

    mem = TwoLevelMemory(sram, **{k: Virtual(s) for k, s in shapes.items()})
    tiles = {}
    if not isinstance(trace, list):
        raise Fail("no memory log came back")
    try:
        for op in trace:
            kind = op[0]
            if kind == "load":
                _, name, a, b, reg, tid = op
                tiles[int(tid)] = mem.load(str(name), slice(int(a), int(b)), bool(reg))
            elif kind == "store":
                _, name, a, b = op
                mem.store(str(name), slice(int(a), int(b)))
            elif kind == "alloc":
                _, shape, tid = op
                tiles[int(tid)] = mem.alloc([int(s) for s in shape])
            elif kind == "free":
                t = tiles.pop(int(op[1]))
                if isinstance(t, Virtual):
                    mem.free(t)
            else:
                raise Fail("the memory log is malformed")
    except SRAMOverflowError as e:
        raise Fail(
            f"SRAM overflow: {e}. Free tiles you no longer need; keep S_ij, m and l out "
            "of SRAM (plain NumPy arrays: registers in this model)"
        ) from None
    except (KeyError, ValueError, TypeError, IndexError) as e:
        raise Fail(f"the memory log could not be replayed ({e})") from None
    return mem.count()


def build_fa2_forward_io(params) -> Case:
    rng = seeded(params)
    n, d = int(params.get("n", 40)), int(params.get("d", 8))
    bq, bk = int(params.get("block_q", 8)), int(params.get("block_k", 8))
    q, k, v = (rng.standard_normal((n, d)) for _ in range(3))
    sram = 2 * bq * d + 2 * bk * d
    what = params.get("check", "output")

    def judge(out, outcome):
        o, lse = unpack(out, 2, "(O, L)")
        o = as_array(o, "O", (n, d))
        lse = as_array(lse, "L", (n,))
        ref, ref_lse = attention_reference(q, k, v)
        msg = compare(
            o,
            ref,
            None,
            "O (stored in HBM)",
            tiled_variants(q, k, v, False, None, bq, bk),
            budget=1e-10,
            hint="did you mem.store every block of O?",
        )
        compare(
            lse, ref_lse, None, "L (stored in HBM)", lse_variants(q, k, False, None), budget=1e-10
        )
        if what == "output":
            return msg
        count = replay(
            outcome.trace, {"Q": (n, d), "K": (n, d), "V": (n, d), "O": (n, d), "L": (n,)}, sram
        )
        reads, writes = fa2_expected_io(n, d, d, bq)
        if count.reads == reads and count.writes == writes:
            return f"{reads} reads, {writes} writes: FlashAttention-2's count"
        if count.reads < reads:
            raise Fail(
                f"only {count.reads} elements read through mem.load, fewer than FA2 needs "
                f"({reads}): read Q, K, V with mem.load (mem.hbm is off-chip; reading it "
                "directly is not counted)"
            )
        if count.reads > reads:
            raise Fail(
                f"{count.reads} elements read; FA2 reads {reads} = N d (each Q_i once) + "
                "ceil(N / block_q) N (d + dv) (K_j and V_j once per query block). Load Q_i "
                "outside the inner loop and nothing else inside it"
            )
        raise Fail(
            f"{count.writes} elements written; FA2 writes {writes}: each O_i (block_q x dv) and "
            "L_i once, after the inner loop (write them through mem.store)"
        )

    return Case(
        "fa2_forward_io",
        name_of(params, what),
        float(params.get("points", 1)),
        "fa2_forward_io",
        (q, k, v),
        {"block_q": bq, "block_k": bk},
        judge,
        io_sram=sram,
    )


def build_fa2_reads(params) -> Case:
    n, d, bq = int(params["n"]), int(params["d"]), int(params["block_q"])

    def judge(out, outcome):
        r = as_int(out, "fa2_reads")
        want = fa2_expected_io(n, d, d, bq)[0]
        if r == want:
            return f"{r} elements"
        if r == n * d + (n // bq) * n * 2 * d:
            raise Fail(
                "ceil(N / block_q) query blocks: the last, partial query block also reads K and V"
            )
        raise Fail(f"got {r}; N d + ceil(N/block_q) N 2d = {want}")

    return Case(
        "fa2_reads",
        name_of(params, f"N={n}, d={d}, block_q={bq}"),
        float(params.get("points", 1)),
        "fa2_reads",
        (n, d, bq),
        {},
        judge,
    )


BUILDERS = {
    "fa2_forward_io": build_fa2_forward_io,
    "fa2_reads": build_fa2_reads,
}
