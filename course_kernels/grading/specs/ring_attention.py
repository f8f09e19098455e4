"""Exercise 10, ring attention on simulated ranks: everything about it in one place.

What a spec module holds and how it is used: ``course_kernels/grading/specs/__init__.py``. The
truth here is ``course_kernels.attention_reference`` in float64 on the whole sequence.

The ranks are simulated in one process with NumPy: no ``course_kernels.distributed`` (another
chapter's library code) is used, so the exercise stands alone.
"""

# The solutions use the typing names the notebook's setup cell imports (Optional, Tuple).
# ruff: noqa: UP006, UP035, UP045

from __future__ import annotations

import inspect
import math
from typing import Optional, Tuple

import numpy as np

from ...numpy.reference import attention_reference
from ..feedback import Case, Fail, as_array, compare, unpack

NAME = "10_ring_attention"
TITLE = "Ring attention on simulated ranks"
TIMEOUT = 30.0
TRITON = False

INTRO = (
    "Ring attention (Liu et al. 2023) splits one long sequence over W ranks (GPUs). Each rank "
    "keeps its query rows and passes its K/V block around a ring: at step t, rank r holds the "
    "K/V block of rank (r - t) mod W, attends its queries to it and folds the partial result "
    "into a running state with the same rescaling as the online softmax. After W steps every "
    "query has seen every key, and no rank ever held more than two K/V blocks. With a causal "
    "mask a naive split is unbalanced (the last rank has the most work), so the sequence is cut "
    "into 2W chunks and rank r takes chunks r and 2W-1-r (the zigzag layout of "
    "ring-flash-attention / Llama 3's context parallelism): every rank gets one early and one "
    "late chunk. Here the W ranks are simulated in one process; the truth is ordinary attention "
    "on the whole sequence."
)


# -- the solution (real code: the notebook's solution cells are these functions' source) -------
# fmt: off
def zigzag_chunks(rank: int, world: int) -> Tuple[int, int]:
    """The two chunks rank ``rank`` of ``world`` holds in the zigzag layout.

    Args:
        rank: 0 <= rank < world; world: the number of ranks W (the sequence has 2W chunks).
    Returns:
        (early, late) = (rank, 2 * world - 1 - rank).
    """
    return rank, 2 * world - 1 - rank


def block_kind(q_chunk: int, k_chunk: int, causal: bool) -> str:
    """How the queries of chunk ``q_chunk`` attend to the keys of chunk ``k_chunk``.

    Returns:
        "full" (every key visible), "diagonal" (the same chunk: key j visible to query i iff
        j <= i) or "skip" (every key is in the future: nothing to compute). Without a causal
        mask every block is "full".
    """
    if not causal or k_chunk < q_chunk:
        return "full"
    if k_chunk == q_chunk:
        return "diagonal"
    return "skip"


def merge_step(
    m: np.ndarray, l: np.ndarray, o: np.ndarray,
    m_b: np.ndarray, l_b: np.ndarray, o_b: np.ndarray,
) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Fold one partial result (m_b, l_b, o_b) into the running state (m, l, o).

    Args:
        m, m_b: (..., Nq) row maxima of the scores seen (-inf: no key seen yet).
        l, l_b: (..., Nq) sums of exp(s - m) over those keys.
        o, o_b: (..., Nq, dv) *normalised* outputs over those keys (0 where no key was seen).
    Returns:
        (m, l, o) over the union of the keys. Do not modify the inputs.
    """
    m_new = np.maximum(m, m_b)
    safe = np.where(np.isneginf(m_new), 0.0, m_new)  # rows that saw nothing yet stay -inf
    a = np.exp(m - safe) * l  # each side's weight at the common max
    b = np.exp(m_b - safe) * l_b
    l_new = a + b
    denom = np.where(l_new == 0, 1.0, l_new)
    o_new = (a[..., None] * o + b[..., None] * o_b) / denom[..., None]
    return m_new, l_new, o_new


def ring_attention(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, world: int, causal: bool = False,
    scale: Optional[float] = None,
) -> np.ndarray:
    """Attention of the whole sequence, computed by ``world`` simulated ranks in a ring.

    Args:
        q, k: (..., N, d); v: (..., N, dv); N divisible by 2 * world (else ValueError).
        world: the number of ranks W; causal: query i sees keys j <= i; scale: default 1/sqrt(d).
    Returns:
        out (..., N, dv), rows in the sequence's own order.
    """
    n, d = q.shape[-2:]
    if world < 1 or n % (2 * world):
        raise ValueError(f"N = {n} must split into 2 * world = {2 * world} equal chunks")
    c = n // (2 * world)
    scale = 1.0 / math.sqrt(d) if scale is None else scale

    def chunk(x, i):
        return x[..., i * c:(i + 1) * c, :]

    held = [zigzag_chunks(r, world) for r in range(world)]
    out = np.zeros((*q.shape[:-1], v.shape[-1]), dtype=q.dtype)
    for r in range(world):  # each rank, one after the other (simulated)
        state = {qc: (np.full((*q.shape[:-2], c), -np.inf), np.zeros((*q.shape[:-2], c)),
                      np.zeros((*q.shape[:-2], c, v.shape[-1]))) for qc in held[r]}
        for step in range(world):
            src = (r - step) % world  # the rank whose K/V block arrives at this step
            for kc in held[src]:
                for qc in held[r]:
                    kind = block_kind(qc, kc, causal)
                    if kind == "skip":
                        continue
                    s = scale * (chunk(q, qc).astype(np.float64)
                                 @ np.swapaxes(chunk(k, kc), -1, -2))
                    if kind == "diagonal":
                        s = np.where(np.tri(c, dtype=bool), s, -np.inf)
                    m_b = s.max(axis=-1)
                    p = np.exp(s - np.where(np.isneginf(m_b), 0.0, m_b)[..., None])
                    l_b = p.sum(axis=-1)
                    o_b = (p @ chunk(v, kc)) / np.where(l_b == 0, 1.0, l_b)[..., None]
                    state[qc] = merge_step(*state[qc], m_b, l_b, o_b)
        for qc in held[r]:
            out[..., qc * c:(qc + 1) * c, :] = state[qc][2]
    return out

# fmt: on


SOLUTIONS = [zigzag_chunks, block_kind, merge_step, ring_attention]

EXERCISES = [
    dict(
        name="zigzag_chunks",
        text="Which two of the 2W chunks rank r holds in the zigzag layout: (r, 2W-1-r).",
    ),
    dict(
        name="block_kind",
        text="With a causal mask, a block pair (query chunk, key chunk) is computed in full, "
        'with the causal mask on its diagonal, or skipped. Return "full", "diagonal" or '
        '"skip".',
    ),
    dict(
        name="merge_step",
        text="The ring's merge: fold a partial (m_b, l_b, o_b) over new keys into the running "
        "(m, l, o). Here o is the *normalised* output over the keys seen (what FlashAttention "
        "returns), so each side is weighted by exp(m_side - m_new) * l_side. A state that has "
        "seen no key is m = -inf, l = 0, o = 0.",
    ),
    dict(
        name="ring_attention",
        text="The whole ring, simulated: split the sequence into 2W chunks, give rank r chunks "
        "zigzag_chunks(r, W), and for W steps let rank r attend its two query chunks to the "
        "two K/V chunks of rank (r - step) mod W, using your zigzag_chunks, block_kind and "
        "merge_step (the cells above). Put each output chunk back where it belongs in the "
        "sequence.",
    ),
]

VISIBLE = {
    "zigzag_chunks": [
        dict(name="rank 0 of 4", rank=0, world=4),
        dict(name="rank 3 of 4 (the middle pair)", rank=3, world=4),
    ],
    "block_kind": [
        dict(name="earlier key chunk: full", q_chunk=5, k_chunk=2, causal=True),
        dict(name="same chunk: diagonal", q_chunk=3, k_chunk=3, causal=True),
        dict(name="later key chunk: skip", q_chunk=1, k_chunk=6, causal=True),
        dict(name="not causal: always full", q_chunk=1, k_chunk=6, causal=False),
    ],
    "merge_step": [
        dict(name="two halves of the keys", seed=1, points=2),
        dict(name="very different maxima", shift_b=30.0, seed=2, points=2),
        dict(name="a running state that saw no key yet", empty=True, seed=3, points=1),
    ],
    "ring_attention": [
        dict(name="two ranks, not causal", world=2, n=32, seed=10, points=3),
        dict(name="four ranks, causal", world=4, n=64, causal=True, seed=11, points=4),
        dict(
            name="custom scale, dv != d",
            world=2,
            n=24,
            dv=12,
            scale=0.4,
            causal=True,
            seed=12,
            points=2,
        ),
        dict(name="N not divisible by 2W raises ValueError", world=3, n=20, raises=True, points=1),
    ],
}

HIDDEN = {
    "zigzag_chunks": [
        dict(name="hidden: rank 5 of 8", rank=5, world=8),
        dict(name="hidden: one rank", rank=0, world=1),
    ],
    "block_kind": [
        dict(name="hidden: chunk 0 against chunk 0", q_chunk=0, k_chunk=0, causal=True),
        dict(name="hidden: last chunk against the first", q_chunk=7, k_chunk=0, causal=True),
    ],
    "merge_step": [dict(name="hidden: batched heads", lead=[2, 3], seed=21, points=2)],
    "ring_attention": [
        dict(
            name="hidden: eight ranks, causal, batched heads",
            world=8,
            n=64,
            lead=[2, 2],
            causal=True,
            seed=31,
            points=3,
        ),
        dict(
            name="hidden: one rank is plain attention",
            world=1,
            n=10,
            causal=True,
            seed=32,
            points=1,
        ),
    ],
}


def solution_source(name: str) -> str:
    return inspect.getsource({f.__name__: f for f in SOLUTIONS}[name]).rstrip() + "\n"


# -- tests: builders and the mistakes they name ------------------------------------------------
def _pts(params, default=1.0):
    return float(params.get("points", default))


def _int(x):
    if isinstance(x, np.ndarray) and x.ndim == 0 and x.dtype.kind in "iu":
        return int(x)
    if isinstance(x, int) and not isinstance(x, bool):
        return x
    raise Fail(f"chunk indices should be ints; got {type(x).__name__}")


def build_zigzag_chunks(params) -> Case:
    r, w = int(params["rank"]), int(params["world"])

    def judge(out, outcome):
        got = tuple(_int(x) for x in unpack(out, 2, "(early, late)"))
        want = (r, 2 * w - 1 - r)
        if got == want:
            return f"rank {r} of {w} holds chunks {want}"
        if got == want[::-1]:
            raise Fail(f"chunks {got}: right pair, wrong order; return (early, late) = {want}")
        if got == (2 * r, 2 * r + 1):
            raise Fail(
                f"chunks {got} are the contiguous layout: with a causal mask the last "
                f"rank would do the most work. Zigzag: rank r takes r and 2W-1-r = {want}"
            )
        if got == (r, w + r):
            raise Fail(
                f"chunks {got} are a striped layout (r, W+r); zigzag mirrors the second "
                f"chunk: 2W-1-r, so rank {r} holds {want}"
            )
        raise Fail(f"got {got}; rank {r} of W={w} holds chunks (r, 2W-1-r) = {want}")

    return Case(
        "zigzag_chunks",
        params.get("name", f"rank {r} of {w}"),
        _pts(params),
        "zigzag_chunks",
        (r, w),
        {},
        judge,
    )


def build_block_kind(params) -> Case:
    qc, kc, causal = int(params["q_chunk"]), int(params["k_chunk"]), bool(params["causal"])
    want = block_kind(qc, kc, causal)

    def judge(out, outcome):
        if not isinstance(out, str):
            raise Fail(
                f'should return the string "full", "diagonal" or "skip"; got {type(out).__name__}'
            )
        if out == want:
            return f"({qc}, {kc}): {want}"
        if not causal:
            raise Fail('without a causal mask every key is visible: "full"')
        if want == "diagonal" and out == "skip":
            raise Fail(
                "the diagonal block is not empty: key j of the chunk is visible to query "
                "i when j <= i (mask it, do not skip it)"
            )
        if want == "diagonal" and out == "full":
            raise Fail(
                "the diagonal block needs the causal mask: query i must not see the "
                "later keys of its own chunk"
            )
        if want == "skip":
            raise Fail(
                f"key chunk {kc} comes after query chunk {qc}: every key is in the "
                "future, skip the block"
            )
        raise Fail(f'key chunk {kc} comes before query chunk {qc}: every key is visible, "full"')

    return Case(
        "block_kind",
        params.get("name", f"({qc}, {kc})"),
        _pts(params, 0.5),
        "block_kind",
        (qc, kc, causal),
        {},
        judge,
    )


def _partial(rng, lead, nq, nk, dv, shift=0.0):
    s = rng.standard_normal((*lead, nq, nk)) * 2 + shift
    v = rng.standard_normal((*lead, nk, dv))
    m = s.max(-1)
    p = np.exp(s - m[..., None])
    l = p.sum(-1)
    return m, l, (p @ v) / l[..., None], s, v


def _merge_no_rescale(m, l, o, m_b, l_b, o_b):
    den = np.where(l + l_b == 0, 1.0, l + l_b)
    return np.maximum(m, m_b), l + l_b, (l[..., None] * o + l_b[..., None] * o_b) / den[..., None]


def build_merge_step(params) -> Case:
    rng = np.random.default_rng(int(params.get("seed", 0)))
    lead = tuple(params.get("lead", ()))
    nq, dv = 6, 4
    m, l, o, s_a, v_a = _partial(rng, lead, nq, 5, dv)
    m_b, l_b, o_b, s_b, v_b = _partial(rng, lead, nq, 7, dv, float(params.get("shift_b", 0.0)))
    if params.get("empty"):
        m, l, o = np.full_like(m, -np.inf), np.zeros_like(l), np.zeros_like(o)
        s, v = s_b, v_b
    else:
        s, v = np.concatenate([s_a, s_b], -1), np.concatenate([v_a, v_b], -2)
    ref_m = s.max(-1)
    p = np.exp(s - ref_m[..., None])
    ref_l, ref_o = p.sum(-1), (p @ v) / p.sum(-1)[..., None]

    def judge(out, outcome):
        gm, gl, go = unpack(out, 3, "(m, l, o)")
        gm, gl, go = (
            as_array(x, w, r.shape)
            for x, w, r in ((gm, "m", ref_m), (gl, "l", ref_l), (go, "o", ref_o))
        )
        wrong = _merge_no_rescale(m, l, o, m_b, l_b, o_b)
        hint = (
            "each side's weight at the new max is exp(m_side - m_new) * l_side; o is "
            "normalised, so o_new = (w_a o_a + w_b o_b) / (w_a + w_b)"
        )
        compare(gm, ref_m, None, "m", budget=1e-12 * (1 + np.abs(ref_m).max()))
        compare(
            gl,
            ref_l,
            None,
            "l",
            [
                (
                    wrong[1],
                    "l was not rescaled: multiply each side's l by "
                    "exp(m_side - m_new) before adding",
                )
            ],
            budget=1e-10 * (1 + np.abs(ref_l).max()),
            hint=hint,
        )
        msg = compare(
            go,
            ref_o,
            None,
            "o",
            [(wrong[2], "the outputs were weighted by l without the exp(m_side - m_new) rescale")],
            budget=1e-10 * (1 + np.abs(ref_o).max()),
            hint=hint,
        )
        return msg

    return Case(
        "merge_step",
        params.get("name", "merge"),
        _pts(params),
        "merge_step",
        (m, l, o, m_b, l_b, o_b),
        {},
        judge,
    )


def _masked(q, k, v, scale, mask):
    """float64 attention with an explicit (N, N) mask; rows with no visible key give 0."""
    s = scale * (q.astype(np.float64) @ np.swapaxes(k.astype(np.float64), -1, -2))
    s = np.where(mask, s, -np.inf)
    m = s.max(-1, keepdims=True)
    p = np.exp(s - np.where(np.isneginf(m), 0.0, m))
    den = p.sum(-1, keepdims=True)
    return (p @ v.astype(np.float64)) / np.where(den == 0, 1.0, den)


def ring_variants(q, k, v, world, causal, scale):
    """The classic mistakes, as outputs: (callable, message)."""
    n = q.shape[-2]
    c = n // (2 * world)
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    ref = attention_reference(q, k, v, causal, scale)[0]
    order = [ch for r in range(world) for ch in zigzag_chunks(r, world)]
    out = []
    out.append(
        (
            lambda: np.concatenate([ref[..., ch * c : (ch + 1) * c, :] for ch in order], -2),
            "the output chunks are in rank order (r0's two chunks, then r1's, ...); put "
            "chunk ch back at rows ch*C:(ch+1)*C of the sequence",
        )
    )
    if causal:
        out.append(
            (
                lambda: _masked(q, k, v, scale, j < i),
                "causal mask off by one on the diagonal blocks: query i sees key j when "
                "j <= i (itself included)",
            )
        )
        out.append(
            (
                lambda: _masked(q, k, v, scale, j <= i + 1),
                "causal mask off by one on the diagonal blocks: key i+1 is in the future",
            )
        )
        out.append(
            (
                lambda: _masked(q, k, v, scale, (j // c) <= (i // c)),
                "the diagonal blocks were computed in full: mask key j > query i inside them",
            )
        )
        out.append(
            (
                lambda: _masked(q, k, v, scale, (j // c) < (i // c)),
                "the diagonal blocks were skipped: they hold each query's nearest keys",
            )
        )
    out.append(
        (
            lambda: _ring_no_rescale(q, k, v, world, causal, scale),
            "the partial results were merged without rescaling to the common max: weight "
            "each side by exp(m_side - m_new) * l_side",
        )
    )
    return out


def _ring_no_rescale(q, k, v, world, causal, scale):
    """The ring with a merge that forgets the exp(m - m_new) factors."""
    g = dict(globals())
    g["merge_step"] = _merge_no_rescale
    fn = type(ring_attention)(ring_attention.__code__, g)
    return fn(q.astype(np.float64), k, v, world, causal, scale)


def build_ring_attention(params) -> Case:
    rng = np.random.default_rng(int(params.get("seed", 0)))
    world, n = int(params["world"]), int(params["n"])
    lead = tuple(params.get("lead", (2,)))
    d, dv = int(params.get("d", 8)), int(params.get("dv", params.get("d", 8)))
    causal = bool(params.get("causal", False))
    scale = params.get("scale")
    q = rng.standard_normal((*lead, n, d)).astype(np.float32)
    k = (rng.standard_normal((*lead, n, d)) * np.linspace(0.5, 3, n)[:, None]).astype(np.float32)
    v = rng.standard_normal((*lead, n, dv)).astype(np.float32)
    kw = {"world": world, "causal": causal}
    if scale is not None:
        kw["scale"] = float(scale)
    raises = "ValueError" if params.get("raises") else None
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)

    def judge(out, outcome):
        if raises:
            raise Fail(f"N = {n} does not split into 2W = {2 * world} chunks: raise ValueError")
        got = as_array(out, "out", (*lead, n, dv))
        ref = attention_reference(q, k, v, causal, scale)[0]
        naive = attention_reference(q, k, v, causal, scale)[0].astype(np.float32)
        return compare(
            got,
            ref,
            None,
            "out",
            ring_variants(q, k, v, world, causal, scale),
            budget=max(2e-6, 4 * float(np.abs(naive - ref).max())) * (1 + float(np.abs(ref).max())),
            hint="check the ring order (rank r receives rank (r - step) mod W), "
            "the chunk layout and the merge",
        )

    return Case(
        "ring_attention",
        params.get("name", "ring"),
        _pts(params),
        "ring_attention",
        (q, k, v),
        kw,
        judge,
        raises=raises,
        timeout=params.get("timeout"),
    )


BUILDERS = {
    "zigzag_chunks": build_zigzag_chunks,
    "block_kind": build_block_kind,
    "merge_step": build_merge_step,
    "ring_attention": build_ring_attention,
}
