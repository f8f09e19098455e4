"""The exercise notebooks' content: prose, stubs and solutions, one place for both versions.

``python grading/build_notebooks.py`` writes ``exercises/NN_*.ipynb`` (stubs) and
``solutions/NN_*.ipynb`` (solved and executed). Edit here, never the notebooks.
"""

import re

from course_kernels.colab import SETUP_CELL

# The one setup-cell template of chapters and exercises (install on Colab, report the device);
# the book build writes the repository URL into the Colab copies. Braces doubled: str.format below.
COLAB = SETUP_CELL.replace("{", "{{").replace("}", "}}")

NUMPY_SETUP = COLAB + '''
import math
from typing import Optional, Tuple

import numpy as np

from course_kernels.grading import check'''

TRITON_SETUP = COLAB + '''
import math
import os
from typing import Optional, Tuple

import numpy as np
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before any @triton.jit: run on the CPU
import triton
import triton.language as tl

from course_kernels.grading import check

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
print("Triton kernels run on", "the GPU" if DEVICE == "cuda" else "the CPU interpreter")'''

HOW = (
    "**How this notebook works.** Fill in each function in the cell marked `# YOUR CODE` (only "
    "those cells are graded: keep helpers there too), then run the check cell below it. The check "
    "runs the visible tests on your function and names the mistake when it recognises one. The "
    "instructor's grader runs the same checks plus hidden tests, in a sandbox, on your code "
    "cells only. Do not import `course_kernels` in your cells: the grader blocks it."
)

NOTEBOOKS = {}


def stub_from_solution(solution: str) -> str:
    """An exercise's stub: its solution's signature and docstring, then NotImplementedError.

    Exercises whose stub differs (a kernel skeleton to complete) give ``stub=`` explicitly.
    """
    end = re.search(r'\n    """.*?"""\n', solution, re.S).end()
    return solution[:end] + "    # YOUR CODE\n    raise NotImplementedError"

# --------------------------------------------------------------------------------------------
NOTEBOOKS["01_stable_softmax"] = dict(
    setup=NUMPY_SETUP,
    intro="Softmax turns a row of scores into probabilities. Computed naively, `exp` overflows "
    "at scores above ~88 in float32 (~709 in float64). The fix is the identity "
    "softmax(x) = softmax(x - c) for any constant c: with c = max(x) every exponent is <= 0. "
    "The logsumexp L = log sum exp(x) is the number FlashAttention saves for its backward pass.",
    exercises=[
        dict(
            name="stable_softmax",
            points=6,
            text="Write a softmax along the last axis that never overflows. Rows may contain "
            "`-inf` (masked scores, probability 0) but always at least one finite score.",
            solution='''def stable_softmax(x: np.ndarray) -> np.ndarray:
    """Row softmax along the last axis.

    Args:
        x: (..., N) scores, float32 or float64; may contain -inf (masked), never a row of only -inf.
    Returns:
        (..., N) probabilities in x's dtype; each row sums to 1.
    """
    m = x.max(axis=-1, keepdims=True)  # (..., 1) row max: every exponent below is <= 0
    e = np.exp(x - m)  # (..., N)
    return e / e.sum(axis=-1, keepdims=True)''',
        ),
        dict(
            name="logsumexp",
            points=4,
            text="Write the row logsumexp L = log sum_j exp(x_j), stable for large scores: "
            "L = m + log sum_j exp(x_j - m) with m the row max.",
            solution='''def logsumexp(x: np.ndarray) -> np.ndarray:
    """Row logsumexp along the last axis.

    Args:
        x: (..., N) scores; may contain -inf, never a row of only -inf.
    Returns:
        (...,) log(sum(exp(x), axis=-1)), natural log.
    """
    m = x.max(axis=-1, keepdims=True)  # (..., 1)
    return (m + np.log(np.exp(x - m).sum(axis=-1, keepdims=True)))[..., 0]''',
        ),
    ],
)

# --------------------------------------------------------------------------------------------
NOTEBOOKS["02_online_softmax"] = dict(
    setup=NUMPY_SETUP,
    intro="Online softmax (Milakov & Gimelshein 2018) reads the scores block by block and keeps, "
    "per row, the running max m and the running sum l = sum exp(s - m). FlashAttention adds an "
    "unnormalised output accumulator acc = sum exp(s - m) v. When a block raises the max from "
    "m_old to m_new, everything accumulated so far is rescaled by alpha = exp(m_old - m_new) "
    "(FlashAttention-2, Alg. 1 lines 8-10). A row that has seen only masked scores has "
    "m = -inf, and exp(-inf - (-inf)) is NaN: guard it.",
    exercises=[
        dict(
            name="online_update",
            points=6,
            text="Absorb one block of scores `s` and values `v` into the running state. A fresh "
            "state is m = -inf, l = 0, acc = 0. Rows of `s` may be entirely `-inf`.",
            solution='''def online_update(
    m: np.ndarray, l: np.ndarray, acc: np.ndarray, s: np.ndarray, v: np.ndarray
) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One step of the online softmax with an output accumulator (FA2 Alg. 1 lines 8-10).

    Args:
        m: (Nq,) running row max (-inf: nothing seen yet).
        l: (Nq,) running sum of exp(s - m).
        acc: (Nq, dv) running sum of exp(s - m) @ v (not normalised).
        s: (Nq, Bc) this block's scores (-inf = masked).
        v: (Bc, dv) this block's values.
    Returns:
        (m_new, l_new, acc_new) with the same shapes. Do not modify the inputs.
    """
    m_new = np.maximum(m, s.max(axis=-1))  # (Nq,)
    m_safe = np.where(np.isneginf(m_new), 0.0, m_new)  # fully masked rows: no -inf - -inf
    p = np.exp(s - m_safe[:, None])  # (Nq, Bc), 0 where masked
    alpha = np.exp(m - m_safe)  # (Nq,) rescales what was accumulated so far
    l_new = alpha * l + p.sum(axis=-1)
    acc_new = alpha[:, None] * acc + p @ v  # (Nq, dv)
    return m_new, l_new, acc_new''',
        ),
        dict(
            name="merge_partials",
            points=5,
            text="Two partial results over disjoint sets of keys, (m_a, l_a, acc_a) and "
            "(m_b, l_b, acc_b), combine exactly: bring both to the common max. This is what "
            "split-KV decoding (Flash-Decoding) does. A side may have seen no key (m = -inf).",
            solution='''def merge_partials(
    m_a: np.ndarray, l_a: np.ndarray, acc_a: np.ndarray,
    m_b: np.ndarray, l_b: np.ndarray, acc_b: np.ndarray,
) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Merge two partial attention states over disjoint keys.

    Args:
        m_a, m_b: (Nq,) row maxima (-inf: that side saw no key).
        l_a, l_b: (Nq,) sums of exp(s - m).
        acc_a, acc_b: (Nq, dv) unnormalised outputs.
    Returns:
        (m, l, acc): the state over the union of the keys.
    """
    m = np.maximum(m_a, m_b)  # (Nq,)
    m_safe = np.where(np.isneginf(m), 0.0, m)
    w_a = np.exp(m_a - m_safe)  # (Nq,) 0 for a side that saw nothing
    w_b = np.exp(m_b - m_safe)
    return m, w_a * l_a + w_b * l_b, w_a[:, None] * acc_a + w_b[:, None] * acc_b''',
        ),
    ],
)

# --------------------------------------------------------------------------------------------
NOTEBOOKS["03_tiled_forward"] = dict(
    setup=NUMPY_SETUP,
    intro="The article's NumPy demo, fixed. Flash Attention never forms the Nq x Nk score "
    "matrix: it walks over (block_q x block_k) tiles, keeps m, l and an output accumulator per "
    "query block, and divides by l once at the end (FlashAttention-2, Alg. 1). The demo this "
    "replaces took the key length from Q (cross-attention broke), forgot the 1/sqrt(d) scale "
    "and never tested uneven blocks. Your version must handle any Nq, Nk, dv, block sizes that "
    "do not divide N, causal masking (PyTorch's is_causal: query i sees keys j <= i), and return "
    "the logsumexp L = m + log(l) that the backward pass needs. The grader also measures memory: "
    "an implementation that forms the full N x N matrix fails the 'really tiled' test.",
    exercises=[
        dict(
            name="flash_forward",
            points=15,
            text="Write the tiled forward pass (outer loop over query blocks, inner loop over "
            "key blocks). Causal masks use `j <= i`; key blocks entirely above the diagonal "
            "can be skipped.",
            solution='''def flash_forward(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool = False,
    scale: Optional[float] = None, block_q: int = 64, block_k: int = 64,
) -> Tuple[np.ndarray, np.ndarray]:
    """Tiled Flash Attention forward (FlashAttention-2 loop order).

    Args:
        q: (..., Nq, d) queries, e.g. (batch, heads, seq, head_dim); float32 or float64.
        k: (..., Nk, d) keys.  v: (..., Nk, dv) values.
        causal: query i sees keys j <= i (top-left aligned, PyTorch is_causal).
        scale: multiplies Q K^T; None means 1/sqrt(d).
        block_q, block_k: tile sizes Br, Bc (need not divide Nq, Nk).
    Returns:
        out: (..., Nq, dv) in q's dtype;  lse: (..., Nq) logsumexp of each row's scaled scores.
    """
    n_q, d = q.shape[-2:]
    n_k, dv = k.shape[-2], v.shape[-1]  # from K and V, not from Q
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    out = np.empty((*q.shape[:-1], dv), dtype=q.dtype)  # (..., Nq, dv)
    lse = np.empty(q.shape[:-1], dtype=q.dtype)  # (..., Nq)
    for i0 in range(0, n_q, block_q):  # FA2 Alg. 1 line 3
        i1 = min(i0 + block_q, n_q)
        q_i = q[..., i0:i1, :]  # (..., Br, d)
        m = np.full(q_i.shape[:-1], -np.inf, dtype=q.dtype)  # (..., Br)
        l = np.zeros(q_i.shape[:-1], dtype=q.dtype)
        acc = np.zeros((*q_i.shape[:-1], dv), dtype=q.dtype)  # (..., Br, dv)
        key_end = min(n_k, i1) if causal else n_k  # later key blocks are fully masked
        for j0 in range(0, key_end, block_k):
            j1 = min(j0 + block_k, key_end)
            s = scale * (q_i @ np.swapaxes(k[..., j0:j1, :], -1, -2))  # (..., Br, Bc)
            if causal:
                visible = np.arange(j0, j1)[None, :] <= np.arange(i0, i1)[:, None]
                s = np.where(visible, s, -np.inf)
            m_new = np.maximum(m, s.max(axis=-1))  # line 9
            m_safe = np.where(np.isneginf(m_new), 0.0, m_new)
            p = np.exp(s - m_safe[..., None])  # (..., Br, Bc)
            alpha = np.exp(m - m_safe)  # rescale what is already in l and acc
            l = alpha * l + p.sum(axis=-1)
            acc = alpha[..., None] * acc + p @ v[..., j0:j1, :]  # line 10
            m = m_new
        l_safe = np.where(l == 0, 1.0, l)
        out[..., i0:i1, :] = acc / l_safe[..., None]  # line 12: normalise once
        lse[..., i0:i1] = np.where(l == 0, -np.inf, np.where(np.isneginf(m), 0, m) + np.log(l_safe))
    return out, lse''',
        ),
    ],
)

# --------------------------------------------------------------------------------------------
NOTEBOOKS["04_block_sizes"] = dict(
    setup=NUMPY_SETUP,
    intro="The SRAM holds M elements. The article's rule: the Q, K, V and O blocks of B rows "
    "(d columns each) must fit, 4 B d <= M, and it says to round B = M / 4d *up*. Rounding an "
    "upper bound up breaks it: M = 100000, d = 64 gives 391 rows and 4 x 391 x 64 = 100096 > M. "
    "The paper also has to fit the Br x Bc score tile S, which is why it sets Bc = M/4d and "
    "Br = min(Bc, d) (FlashAttention Alg. 1 line 1, with floor).",
    exercises=[
        dict(
            name="block_size", points=5,
            text="The largest B with 4 B d <= M; raise `ValueError` when not even one row fits.",
            solution='''def block_size(M: int, d: int) -> int:
    """The largest B with 4*B*d <= M (blocks of Q, K, V, O fit the SRAM).

    Args:
        M: SRAM capacity in elements.  d: head dim.
    Raises:
        ValueError: if M < 4*d.
    """
    if M < 4 * d:
        raise ValueError(f"M={M} is too small for one row of each block: need M >= 4d = {4 * d}")
    return M // (4 * d)  # floor: rounding an upper bound up breaks it''',
        ),
        dict(
            name="tile_sizes", points=3,
            text="The paper's tiles: Bc = floor(M / 4d), Br = min(Bc, d).",
            solution='''def tile_sizes(M: int, d: int) -> Tuple[int, int]:
    """(Br, Bc): Bc = floor(M / 4d), Br = min(Bc, d) (FlashAttention Alg. 1 line 1)."""
    b_c = block_size(M, d)
    return min(b_c, d), b_c''',
        ),
        dict(
            name="fits_in_sram", points=4,
            text="Do Q_i and O_i (Br x d), K_j and V_j (Bc x d) *and* the score tile S_ij "
            "(Br x Bc) fit in M elements?",
            solution='''def fits_in_sram(br: int, bc: int, d: int, M: int) -> bool:
    """True if 2*Br*d + 2*Bc*d + Br*Bc <= M (blocks plus the score tile)."""
    return 2 * br * d + 2 * bc * d + br * bc <= M''',
        ),
    ],
)

# --------------------------------------------------------------------------------------------
NOTEBOOKS["05_count_io"] = dict(
    setup=NUMPY_SETUP,
    intro="`course_kernels.iosim.TwoLevelMemory` is a two-level memory that counts traffic: HBM "
    "holds the arrays `Q, K, V, O, L`; `mem.load(name, slice(i0, i1))` copies rows on chip (and "
    "counts the elements read), `mem.store(name, rows, tile)` writes rows back (counted), "
    "`mem.alloc(shape)` reserves an on-chip accumulator, and `mem.free(*tiles)` releases SRAM. "
    "A load or alloc beyond M elements raises `SRAMOverflowError`. In this model the score tile "
    "S, and the per-row m and l, live in registers: keep them as plain NumPy arrays. "
    "FlashAttention-2 reads Q once and K, V once per query block: N d + ceil(N/Br) N 2d "
    "elements (d = dv).",
    exercises=[
        dict(
            name="fa2_forward_io", points=6,
            text="Write the FA2 forward against the memory: for each query block load Q_i, "
            "alloc O_i, stream K_j, V_j (free them after use), update acc **in place** "
            "(`acc *= ...; acc += ...`, so that `mem.free(acc)` frees the tile you allocated), then "
            "store O_i and L_i. SRAM is exactly 2 Br d + 2 Bc d elements. Non-causal, 2-D inputs.",
            solution='''def fa2_forward_io(mem, block_q: int, block_k: int) -> None:
    """FlashAttention-2 forward on a two-level memory.

    mem.hbm holds Q (N, d), K (N, d), V (N, dv), and the outputs O (N, dv), L (N,).
    Use only mem.load / mem.store / mem.alloc / mem.free to move data. Returns nothing.
    """
    n, d = mem.hbm["Q"].shape
    n_k, dv = mem.hbm["V"].shape
    scale = 1.0 / math.sqrt(d)
    for i0 in range(0, n, block_q):
        i1 = min(i0 + block_q, n)
        q_i = mem.load("Q", slice(i0, i1))  # (Br, d): read once per query block
        acc = mem.alloc((i1 - i0, dv))  # (Br, dv) on-chip accumulator
        m = np.full(i1 - i0, -np.inf)  # registers, not SRAM
        l = np.zeros(i1 - i0)
        for j0 in range(0, n_k, block_k):
            j1 = min(j0 + block_k, n_k)
            k_j, v_j = mem.load("K", slice(j0, j1)), mem.load("V", slice(j0, j1))
            s = scale * (q_i @ k_j.T)  # (Br, Bc) in registers
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
        mem.free(q_i, acc)''',
        ),
        dict(
            name="fa2_reads", points=2,
            text="Predict the elements your function reads, for N = Nk, dv = d.",
            solution='''def fa2_reads(N: int, d: int, block_q: int) -> int:
    """Elements FA2 reads from HBM: Q once, K and V once per query block (dv = d)."""
    t_r = -(-N // block_q)  # ceil: the last, partial block reads K and V too
    return N * d + t_r * N * 2 * d''',
        ),
    ],
    practice='''# Not graded: count your own traffic with the simulator, and compare with your formula.
from course_kernels.iosim import count_io

rng = np.random.default_rng(0)
q, k, v = (rng.standard_normal((64, 8)) for _ in range(3))
try:
    io, O, L = count_io(fa2_forward_io, q, k, v, sram_elements=4 * 16 * 8, block_q=16, block_k=16)
    print(f"reads {io.reads}, writes {io.writes}, peak SRAM {io.peak_sram} elements")
    print("your formula:", fa2_reads(64, 8, 16))
except NotImplementedError:
    print("fill in fa2_forward_io and fa2_reads first")''',
)

# --------------------------------------------------------------------------------------------
NOTEBOOKS["06_tiled_backward"] = dict(
    setup=NUMPY_SETUP,
    intro="The backward pass recomputes the score tiles instead of storing P (FlashAttention "
    "Alg. 4; FlashAttention-2 Alg. 2). With the saved L = m + log l, P_ij = exp(S_ij - L_i) "
    "exactly. Per tile: dV_j += P^T dO_i, dP = dO_i V_j^T, dS = P * (dP - D_i) with "
    "D = rowsum(dO * O), dQ_i += scale dS K_j, dK_j += scale dS^T Q_i. Loop over key blocks "
    "outside (dK_j, dV_j stay on chip) and query blocks inside.",
    exercises=[
        dict(
            name="flash_backward", points=10,
            text="Write the tiled backward. Causal as in the forward (query i sees keys "
            "j <= i). Never form an Nq x Nk matrix.",
            solution='''def flash_backward(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, out: np.ndarray, lse: np.ndarray,
    dout: np.ndarray, causal: bool = False, scale: Optional[float] = None,
    block_q: int = 64, block_k: int = 64,
) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Tiled Flash Attention backward from the saved logsumexp.

    Args:
        q: (..., Nq, d); k: (..., Nk, d); v: (..., Nk, dv); out, dout: (..., Nq, dv);
        lse: (..., Nq) the forward's logsumexp; causal, scale, block_q, block_k as in the forward.
    Returns:
        (dq, dk, dv) with the shapes of q, k, v.
    """
    n_q, d = q.shape[-2:]
    n_k = k.shape[-2]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    big_d = (dout * out).sum(axis=-1)  # (..., Nq) D = rowsum(dO * O)
    dq = np.zeros(q.shape, dtype=q.dtype)
    dk = np.zeros(k.shape, dtype=q.dtype)
    dv = np.zeros(v.shape, dtype=q.dtype)
    for j0 in range(0, n_k, block_k):  # outer loop over key blocks
        j1 = min(j0 + block_k, n_k)
        k_j, v_j = k[..., j0:j1, :], v[..., j0:j1, :]  # (..., Bc, d), (..., Bc, dv)
        first = (j0 // block_q) * block_q if causal else 0  # earlier rows cannot see key j0
        for i0 in range(first, n_q, block_q):
            i1 = min(i0 + block_q, n_q)
            s = scale * (q[..., i0:i1, :] @ np.swapaxes(k_j, -1, -2))  # (..., Br, Bc)
            if causal:
                visible = np.arange(j0, j1)[None, :] <= np.arange(i0, i1)[:, None]
                s = np.where(visible, s, -np.inf)
            p = np.exp(s - lse[..., i0:i1, None])  # P recomputed from L
            do_i = dout[..., i0:i1, :]  # (..., Br, dv)
            dv[..., j0:j1, :] += np.swapaxes(p, -1, -2) @ do_i
            dp = do_i @ np.swapaxes(v_j, -1, -2)  # (..., Br, Bc)
            ds = p * (dp - big_d[..., i0:i1, None])
            dq[..., i0:i1, :] += scale * (ds @ k_j)
            dk[..., j0:j1, :] += scale * (np.swapaxes(ds, -1, -2) @ q[..., i0:i1, :])
    return dq, dk, dv''',
        ),
    ],
)

# --------------------------------------------------------------------------------------------
TRITON_FWD_SOLUTION = '''@triton.jit
def _attn_fwd(Q, K, V, O, L, N, scale,
              HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    pid_m = tl.program_id(0)  # which block of queries
    pid_bh = tl.program_id(1)  # which (batch, head)
    base = pid_bh * N * HEAD_DIM  # contiguous (B, H, N, d): one head is N * d elements
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + base + offs_m[:, None] * HEAD_DIM + offs_d[None, :],
                mask=offs_m[:, None] < N, other=0.0)  # (BLOCK_M, d)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    for start_n in range(0, N, BLOCK_N):
        cols = start_n + offs_n
        kv_mask = cols[:, None] < N
        k = tl.load(K + base + cols[:, None] * HEAD_DIM + offs_d[None, :], mask=kv_mask, other=0.0)
        v = tl.load(V + base + cols[:, None] * HEAD_DIM + offs_d[None, :], mask=kv_mask, other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale  # (BLOCK_M, BLOCK_N)
        s = tl.where(cols[None, :] < N, s, float("-inf"))  # keys past N do not exist
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp(s - m_new[:, None])
        alpha = tl.exp(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
        m_i = m_new
    acc = acc / l_i[:, None]
    tl.store(O + base + offs_m[:, None] * HEAD_DIM + offs_d[None, :], acc,
             mask=offs_m[:, None] < N)
    tl.store(L + pid_bh * N + offs_m, m_i + tl.log(l_i), mask=offs_m < N)


def attention_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     scale: Optional[float] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """Non-causal attention forward with your Triton kernel.

    Args:
        q, k, v: (batch, heads, N, d) float32 tensors (any device), d a power of two >= 16.
        scale: None means 1/sqrt(d).
    Returns:
        out: (batch, heads, N, d) float32;  lse: (batch, heads, N) natural-log logsumexp.
    """
    b, h, n, d = q.shape
    scale = d ** -0.5 if scale is None else scale
    q, k, v = (x.to(DEVICE, torch.float32).contiguous() for x in (q, k, v))
    out = torch.empty_like(q)
    lse = torch.empty((b, h, n), device=q.device, dtype=torch.float32)
    BLOCK = 16
    grid = (triton.cdiv(n, BLOCK), b * h)
    _attn_fwd[grid](q, k, v, out, lse, n, scale, HEAD_DIM=d, BLOCK_M=BLOCK, BLOCK_N=BLOCK)
    return out, lse'''

TRITON_FWD_STUB = '''@triton.jit
def _attn_fwd(Q, K, V, O, L, N, scale,
              HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # YOUR CODE: one program per (query block, batch*head); online softmax over key blocks
    pass


def attention_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     scale: Optional[float] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """Non-causal attention forward with your Triton kernel.

    Args:
        q, k, v: (batch, heads, N, d) float32 tensors (any device), d a power of two >= 16.
        scale: None means 1/sqrt(d).
    Returns:
        out: (batch, heads, N, d) float32;  lse: (batch, heads, N) natural-log logsumexp.
    """
    # YOUR CODE: allocate out and lse, launch _attn_fwd[grid](...), return (out, lse)
    raise NotImplementedError'''

NOTEBOOKS["07_triton_forward"] = dict(
    setup=TRITON_SETUP,
    intro="Now the tiled forward as a Triton kernel: one program per (query block, batch x "
    "head), the running `m_i`, `l_i`, `acc` in registers, a loop over key blocks. Without a GPU "
    "the kernel runs in Triton's interpreter (set up above), which is exact in fp32. On a GPU, "
    "`tl.dot` rounds fp32 inputs to TF32 unless you pass `input_precision=\"ieee\"`: compare a "
    "TF32 kernel with an exact reference and it fails at ~1e-3. Masks: N need not be a multiple "
    "of the block; loads past N must be masked and their scores set to -inf. Use `tl.dot` for "
    "the products: torch's matmul/softmax/attention outside the kernel is not accepted.",
    exercises=[dict(name="attention_triton", points=6,
                    text="Write `_attn_fwd` and its wrapper.",
                    stub=TRITON_FWD_STUB, solution=TRITON_FWD_SOLUTION)],
)

TRITON_GQA_SOLUTION = '''@triton.jit
def _attn_fwd_gqa(Q, K, V, O, N, scale, H, H_KV,
                  HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  CAUSAL: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    h_kv = h // (H // H_KV)  # consecutive query heads share one kv head
    q_base = pid_bh * N * HEAD_DIM
    kv_base = (b * H_KV + h_kv) * N * HEAD_DIM
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + q_base + offs_m[:, None] * HEAD_DIM + offs_d[None, :],
                mask=offs_m[:, None] < N, other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    end = N
    if CAUSAL:
        end = tl.minimum(N, (pid_m + 1) * BLOCK_M)  # later key blocks are fully masked
    for start_n in range(0, end, BLOCK_N):
        cols = start_n + offs_n
        kv_mask = cols[:, None] < N
        k = tl.load(K + kv_base + cols[:, None] * HEAD_DIM + offs_d[None, :], mask=kv_mask,
                    other=0.0)
        v = tl.load(V + kv_base + cols[:, None] * HEAD_DIM + offs_d[None, :], mask=kv_mask,
                    other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale
        visible = cols[None, :] < N
        if CAUSAL:
            visible = visible & (offs_m[:, None] >= cols[None, :])  # key j <= query i
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp(s - m_new[:, None])
        alpha = tl.exp(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
        m_i = m_new
    acc = acc / l_i[:, None]
    tl.store(O + q_base + offs_m[:, None] * HEAD_DIM + offs_d[None, :], acc,
             mask=offs_m[:, None] < N)


def attention_triton_gqa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                         causal: bool = False) -> torch.Tensor:
    """Attention forward with grouped-query heads and an optional causal mask.

    Args:
        q: (batch, H, N, d); k, v: (batch, H_kv, N, d) with H % H_kv == 0; float32.
        causal: query i sees keys j <= i.
    Returns:
        out: (batch, H, N, d) float32.
    """
    b, h, n, d = q.shape
    h_kv = k.shape[1]
    q, k, v = (x.to(DEVICE, torch.float32).contiguous() for x in (q, k, v))
    out = torch.empty_like(q)
    BLOCK = 16
    grid = (triton.cdiv(n, BLOCK), b * h)
    _attn_fwd_gqa[grid](q, k, v, out, n, d ** -0.5, h, h_kv, HEAD_DIM=d, BLOCK_M=BLOCK,
                        BLOCK_N=BLOCK, CAUSAL=causal)
    return out'''

TRITON_GQA_STUB = '''@triton.jit
def _attn_fwd_gqa(Q, K, V, O, N, scale, H, H_KV,
                  HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  CAUSAL: tl.constexpr):
    # YOUR CODE: like _attn_fwd, plus the kv head of query head h, plus the causal mask
    pass


def attention_triton_gqa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                         causal: bool = False) -> torch.Tensor:
    """Attention forward with grouped-query heads and an optional causal mask.

    Args:
        q: (batch, H, N, d); k, v: (batch, H_kv, N, d) with H % H_kv == 0; float32.
        causal: query i sees keys j <= i.
    Returns:
        out: (batch, H, N, d) float32.
    """
    # YOUR CODE
    raise NotImplementedError'''

NOTEBOOKS["08_triton_causal_gqa"] = dict(
    setup=TRITON_SETUP,
    intro="Two features of real kernels. **Causal**: query i sees keys j <= i; key blocks "
    "entirely above the diagonal are skipped, the diagonal block is masked with "
    "`offs_m[:, None] >= offs_n[None, :]`. **GQA** (grouped-query attention): H query heads "
    "share H_kv < H key/value heads; query head h reads kv head h // (H / H_kv). The kernel "
    "never copies K and V per query head.",
    exercises=[dict(name="attention_triton_gqa", points=6,
                    text="Write the kernel and its wrapper.",
                    stub=TRITON_GQA_STUB, solution=TRITON_GQA_SOLUTION)],
)

# --------------------------------------------------------------------------------------------
TUNING_SETUP = TRITON_SETUP

TUNING_PRACTICE = '''# Not graded: measure on a GPU. Without one, this cell only says so.
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
        for bm, bn, stages in configs:
            run = lambda: _scores_rowmax[(triton.cdiv(n, bm),)](  # noqa: E731
                q, k, m, n, HEAD_DIM=d, BLOCK_M=bm, BLOCK_N=bn, num_stages=stages)
            times.append(triton.testing.do_bench(run))
        best = pick_fastest(configs, times)
        print(f"{len(configs)} configs fit in {limit} bytes; fastest {best}: {min(times):.3f} ms")
    except NotImplementedError:
        print("fill in configs_that_fit and pick_fastest first")'''

NOTEBOOKS["09_tuning"] = dict(
    setup=TUNING_SETUP,
    intro="A kernel's block sizes and pipeline depth (`num_stages`) decide how much shared "
    "memory it asks for; a config that asks too much fails to launch ('out of resource: shared "
    "memory'). Colab's T4 allows 48 KB per block (64 KB opt-in), an A100 163 KB, an H100/H200 "
    "227 KB. In this exercise's model a config holds the Q tile once and the K and V tiles once "
    "per stage: (BLOCK_M d + num_stages 2 BLOCK_N d) x bytes per element. The graded functions "
    "run anywhere; the measurement at the end needs a GPU and is not graded (without one it "
    "says so).",
    exercises=[
        dict(name="smem_bytes", points=3, text="Shared memory of one config, in bytes.",
             solution='''def smem_bytes(block_m: int, block_n: int, head_dim: int, num_stages: int,
               dtype_bytes: int = 2) -> int:
    """Bytes: the Q tile (BLOCK_M x d) once, K and V tiles (BLOCK_N x d) once per stage."""
    return (block_m * head_dim + num_stages * 2 * block_n * head_dim) * dtype_bytes'''),
        dict(name="configs_that_fit", points=3,
             text="Every (BLOCK_M, BLOCK_N, num_stages) with blocks in (32, 64, 128) and stages "
             "in (1, 2, 3) whose fp16 footprint is <= the limit.",
             solution='''def configs_that_fit(head_dim: int, smem_limit: int) -> list:
    """[(BLOCK_M, BLOCK_N, num_stages), ...] over blocks (32, 64, 128), stages (1, 2, 3) that fit
    in smem_limit bytes with 2-byte (fp16) elements."""
    return [(bm, bn, st) for bm in (32, 64, 128) for bn in (32, 64, 128) for st in (1, 2, 3)
            if smem_bytes(bm, bn, head_dim, st) <= smem_limit]'''),
        dict(name="pick_fastest", points=2,
             text="Given configs and their measured times, return the fastest (the first on a "
             "tie).",
             solution='''def pick_fastest(configs: list, times_ms: list) -> tuple:
    """The config with the smallest time (the first one on a tie), as a tuple."""
    best = min(range(len(times_ms)), key=lambda i: (times_ms[i], i))
    return tuple(configs[best])'''),
    ],
    practice=TUNING_PRACTICE,
)


# --------------------------------------------------------------------------------------------
# Exercises kept in one spec module each (course_kernels/grading/specs/): prose, points, the
# solution as real code, visible and hidden tests, feedback. Only the notebook setup is added here.
def _from_spec(spec, exercises):
    def points(name):  # the visible tests' points, as the grader counts them
        total = sum(c.points for c in exercises[name].cases())
        return int(total) if total == int(total) else total

    return dict(
        setup=NUMPY_SETUP,
        intro=spec.INTRO,
        exercises=[dict(e, points=points(e["name"]),
                        solution=spec.solution_source(e["name"]).rstrip("\n"))
                   for e in spec.EXERCISES],
    )


def _add_specs():
    from course_kernels.grading.exercises import EXERCISES, SPECS

    for name, spec in SPECS.items():
        NOTEBOOKS[name] = _from_spec(spec, EXERCISES)


def hidden_json(spec) -> str:
    """grading/hidden_tests/<notebook>.json of a spec module (written by build_notebooks.py)."""
    import json

    tests = [dict(p, exercise=ex) for ex, ps in spec.HIDDEN.items() for p in ps]
    return json.dumps({"about": f"Hidden tests of exercises/{spec.NAME}.ipynb, generated from "
                       f"course_kernels/grading/specs/ by grading/build_notebooks.py: edit the "
                       "spec, not this file.", "tests": tests}, indent=1) + "\n"


_add_specs()
