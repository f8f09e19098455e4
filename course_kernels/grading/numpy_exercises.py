"""Tests of the NumPy exercises (notebooks 01-06): inputs, references and named mistakes.

Each exercise is a function ``build(params) -> Case``; ``params`` is a small dict (``kind`` plus
sizes and a seed) so that hidden tests can be written as JSON (grading/hidden_tests/). Inputs are
made here from the seed, references are computed here in float64: nothing a submission does can
change what it is compared with.
"""

from __future__ import annotations

import math

import numpy as np

from ..reference import attention_naive, attention_reference
from ..tiled_backward import attention_reference_backward
from .feedback import Case, Fail, as_array, compare, unpack
from .variants import lse_variants, naive_backward, tiled_variants


def _rng(params):
    return np.random.default_rng(int(params.get("seed", 0)))


def _name(params, default):
    return params.get("name", default)


# -- 01 stable softmax -----------------------------------------------------------------------
def _softmax64(x):
    x = np.asarray(x, dtype=np.float64)
    m = x.max(axis=-1, keepdims=True)
    e = np.exp(x - m)
    return e / e.sum(axis=-1, keepdims=True)


def _softmax_same_dtype(x):
    m = x.max(axis=-1, keepdims=True)
    e = np.exp(x - m)
    return e / e.sum(axis=-1, keepdims=True)


def _softmax_input(params):
    rng = _rng(params)
    shape = tuple(params.get("shape", (4, 9)))
    dtype = np.dtype(params.get("dtype", "float64"))
    x = rng.standard_normal(shape) * float(params.get("scale", 1.0)) + float(params.get("shift", 0))
    if params.get("masked"):
        x = np.where(rng.random(shape) < 0.3, -np.inf, x)
        x[..., 0] = 0.0  # every row keeps one visible score
    return x.astype(dtype)


def build_stable_softmax(params) -> Case:
    x = _softmax_input(params)

    def judge(out, outcome):
        y = as_array(out, "the result", x.shape)
        ref = _softmax64(x)
        with np.errstate(all="ignore"):
            xf = x.astype(np.float64)
            variants = [
                (lambda: np.exp(xf) / np.exp(xf).sum(-1, keepdims=True),
                 "exp overflowed: subtract the row max before exp (softmax(x) = softmax(x - max x))"),
                (lambda: np.exp(xf - xf.max(-1, keepdims=True)),
                 "the rows do not sum to 1: divide by the row sum"),
                (lambda: np.exp(xf - xf.max(0, keepdims=True)) / np.exp(
                    xf - xf.max(0, keepdims=True)).sum(0, keepdims=True),
                 "normalised over the wrong axis: softmax runs along the last axis (-1)"),
                (lambda: np.exp(xf - xf.max(-1, keepdims=True)) / np.exp(
                    xf - xf.max(-1, keepdims=True)).sum(0, keepdims=True),
                 "the sum runs over the wrong axis: use axis=-1, keepdims=True"),
            ]
        return compare(y, ref, _softmax_same_dtype(x), "softmax", variants,
                       hint="softmax(x)_i = exp(x_i - max x) / sum_j exp(x_j - max x) along axis -1")

    return Case("stable_softmax", _name(params, "softmax"), float(params.get("points", 1)),
                "stable_softmax", (x,), {}, judge)


def build_logsumexp(params) -> Case:
    x = _softmax_input(params)

    def judge(out, outcome):
        y = as_array(np.asarray(out) if np.isscalar(out) else out, "the result", x.shape[:-1])
        xf = x.astype(np.float64)
        m = xf.max(-1)
        ref = m + np.log(np.exp(xf - m[..., None]).sum(-1))
        naive = (x.max(-1) + np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1))).astype(x.dtype)
        with np.errstate(all="ignore"):
            variants = [
                (lambda: np.log(np.exp(xf).sum(-1)),
                 "exp overflowed: compute m + log(sum exp(x - m)) with m the row max"),
                (lambda: np.log(np.exp(xf - m[..., None]).sum(-1)),
                 "you subtracted the max but did not add it back: lse = m + log(sum exp(x - m))"),
                (lambda: ref / math.log(2), "that is log base 2; use the natural log"),
                (lambda: m, "that is the row max, not the logsumexp (add log of the sum)"),
            ]
        return compare(y, ref, naive, "logsumexp", variants)

    return Case("logsumexp", _name(params, "logsumexp"), float(params.get("points", 1)),
                "logsumexp", (x,), {}, judge)


# -- 02 online softmax ------------------------------------------------------------------------
def _safe(m):
    return np.where(np.isneginf(m), 0.0, m)


def _update_ref(m, l, acc, s, v, bug=None):
    with np.errstate(all="ignore"):
        m_new = np.maximum(m, s.max(-1))
        ms = m_new if bug == "no_guard" else _safe(m_new)
        p = np.exp(s - ms[:, None])
        alpha = np.exp(m - ms) if bug != "inverted" else np.exp(ms - m)
        if bug == "no_rescale":
            return m_new, l + p.sum(-1), acc + p @ v
        if bug == "l_only":
            return m_new, alpha * l + p.sum(-1), acc + p @ v
        if bug == "normalize_block":
            return m_new, alpha * l + p.sum(-1), alpha[:, None] * acc + (p / p.sum(-1, keepdims=True)) @ v
        return m_new, alpha * l + p.sum(-1), alpha[:, None] * acc + p @ v


UPDATE_MESSAGES = {
    "no_rescale": "the old l and acc are not rescaled: when the max rises from m_old to m_new, "
    "multiply both by alpha = exp(m_old - m_new) before adding the new block",
    "l_only": "l is rescaled but acc (the output accumulator) is not: O must be multiplied by "
    "alpha = exp(m_old - m_new) too (FA2 Alg. 1 line 10)",
    "inverted": "alpha is upside down: it is exp(m_old - m_new) <= 1",
    "normalize_block": "each block's probabilities were normalised on their own; keep acc "
    "unnormalised and divide by l once at the end",
    "no_guard": "rows whose scores are all -inf (fully masked) give NaN: exp(-inf - (-inf)) = "
    "exp(NaN). Subtract m_safe = (m if m > -inf else 0) so that those rows keep l = 0, acc = 0",
}


def _update_inputs(params):
    rng = _rng(params)
    nq, bc, dv = params.get("nq", 5), params.get("bc", 6), params.get("dv", 3)
    kind = params.get("state", "random")
    s = rng.standard_normal((nq, bc)) * 2
    v = rng.standard_normal((bc, dv))
    if kind == "empty":
        m, l, acc = np.full(nq, -np.inf), np.zeros(nq), np.zeros((nq, dv))
    else:
        m = rng.standard_normal(nq) + float(params.get("m_shift", 0.0))
        l = rng.random(nq) * 3 + 0.5
        acc = rng.standard_normal((nq, dv)) * l[:, None]
    if params.get("masked_rows"):
        s[: params["masked_rows"]] = -np.inf
    return m, l, acc, s, v


def build_online_update(params) -> Case:
    m, l, acc, s, v = _update_inputs(params)

    def judge(out, outcome):
        m2, l2, a2 = unpack(out, 3, "(m_new, l_new, acc_new)")
        m2 = as_array(m2, "m_new", m.shape)
        l2 = as_array(l2, "l_new", l.shape)
        a2 = as_array(a2, "acc_new", acc.shape)
        ref = _update_ref(m, l, acc, s, v)
        scale = 1e-12 * (1 + np.abs(ref[2]).max())
        notes = []
        for i, (got, what) in enumerate(((m2, "m_new"), (l2, "l_new"), (a2, "acc_new"))):
            variants = [(_update_ref(m, l, acc, s, v, bug)[i], UPDATE_MESSAGES[bug])
                        for bug in ("no_guard", "l_only", "no_rescale", "inverted",
                                    "normalize_block")]
            if not np.array_equal(np.isneginf(got), np.isneginf(ref[i])):
                raise Fail(f"{what} should be -inf exactly where no score was seen yet "
                           "(a fully masked row keeps m = -inf)")
            notes.append(compare(np.where(np.isneginf(got), 0, got),
                                 np.where(np.isneginf(ref[i]), 0, ref[i]), None, what,
                                 [(np.where(np.isneginf(vv), 0, vv), msg) for vv, msg in variants],
                                 budget=scale * (1 + np.abs(np.nan_to_num(ref[i])).max())))
        return "m, l and acc are right"

    return Case("online_update", _name(params, "update"), float(params.get("points", 1)),
                "online_update", (m, l, acc, s, v), {}, judge)


def _partial(rng, nq, nk, dv, empty_rows=0):
    s = rng.standard_normal((nq, nk)) * 2
    v = rng.standard_normal((nk, dv))
    if empty_rows:
        s[:empty_rows] = -np.inf
    return _update_ref(np.full(nq, -np.inf), np.zeros(nq), np.zeros((nq, dv)), s, v)


def _merge_ref(a, b, bug=None):
    with np.errstate(all="ignore"):
        m = np.maximum(a[0], b[0])
        ms = m if bug == "no_guard" else _safe(m)
        wa, wb = np.exp(a[0] - ms), np.exp(b[0] - ms)
        if bug == "no_rescale":
            wa = wb = np.ones_like(m)
        return m, wa * a[1] + wb * b[1], wa[:, None] * a[2] + wb[:, None] * b[2]


MERGE_MESSAGES = {
    "no_rescale": "the two partial results were added without rescaling: bring both to the common "
    "max first, l = exp(m_a - m) l_a + exp(m_b - m) l_b (and the same for acc)",
    "no_guard": "a side that has seen no key (m = -inf) gives NaN: exp(-inf - (-inf)). Use "
    "m_safe = (m if m > -inf else 0) in the exponent",
}


def build_merge_partials(params) -> Case:
    rng = _rng(params)
    nq, dv = params.get("nq", 6), params.get("dv", 4)
    a = _partial(rng, nq, params.get("nk_a", 5), dv, params.get("empty_a", 0))
    b = _partial(rng, nq, params.get("nk_b", 7), dv, params.get("empty_b", 0))
    if params.get("shift_b"):
        b = (b[0] + params["shift_b"], b[1], b[2])

    def judge(out, outcome):
        got = unpack(out, 3, "(m, l, acc)")
        ref = _merge_ref(a, b)
        for i, what in enumerate(("m", "l", "acc")):
            g = as_array(got[i], what, ref[i].shape)
            if not np.array_equal(np.isneginf(g), np.isneginf(ref[i])):
                raise Fail(f"{what}: -inf must stay exactly where neither side saw a key")
            variants = [(np.where(np.isneginf(_merge_ref(a, b, bug)[i]), 0,
                                  _merge_ref(a, b, bug)[i]), MERGE_MESSAGES[bug])
                        for bug in ("no_guard", "no_rescale")]
            compare(np.where(np.isneginf(g), 0, g), np.where(np.isneginf(ref[i]), 0, ref[i]), None,
                    what, variants, budget=1e-12 * (1 + np.abs(np.nan_to_num(ref[i])).max()))
        return "the merge is exact"

    return Case("merge_partials", _name(params, "merge"), float(params.get("points", 1)),
                "merge_partials", (*a, *b), {}, judge)


# -- 03 tiled forward -------------------------------------------------------------------------
def _qkv(params):
    rng = _rng(params)
    lead = tuple(params.get("lead", (2,)))
    nq, nk = params.get("nq", 64), params.get("nk", params.get("nq", 64))
    d, dv = params.get("d", 16), params.get("dv", params.get("d", 16))
    dt = np.dtype(params.get("dtype", "float32"))
    q = rng.standard_normal((*lead, nq, d)).astype(dt)
    k = rng.standard_normal((*lead, nk, d)).astype(dt)
    v = rng.standard_normal((*lead, nk, dv)).astype(dt)
    if params.get("spread"):  # a growing max along the keys: rescaling matters
        k = (k * np.linspace(0.5, params["spread"], nk)[:, None]).astype(dt)
    return q, k, v


def _fwd_kwargs(params):
    kw = {"causal": bool(params.get("causal", False)), "block_q": int(params.get("block_q", 16)),
          "block_k": int(params.get("block_k", 16))}
    if params.get("scale") is not None:
        kw["scale"] = float(params["scale"])
    return kw


def build_flash_forward(params) -> Case:
    q, k, v = _qkv(params)
    kw = _fwd_kwargs(params)
    what = params.get("check", "out")
    memory = what == "memory"

    def judge(out, outcome):
        o, lse = unpack(out, 2, "(out, lse)")
        o = as_array(o, "out", (*q.shape[:-1], v.shape[-1]))
        lse = as_array(lse, "lse", q.shape[:-1])
        ref, ref_lse = attention_reference(q, k, v, kw["causal"], kw.get("scale"))
        naive = attention_naive(q, k, v, kw["causal"], kw.get("scale"))
        msg = compare(o, ref, naive, "out", tiled_variants(q, k, v, **kw),
                      hint="check the running max, the rescaling and the final division by l")
        if what in ("lse", "memory"):
            naive_lse = ref_lse.astype(np.float32)
            compare(lse, ref_lse, None, "lse (saved for the backward pass)",
                    lse_variants(q, k, kw["causal"], kw.get("scale")),
                    budget=max(4e-6 * (1 + np.abs(naive_lse).max()), 1e-12))
            msg += "; lse right"
        if memory:
            msg += structure_message(outcome, q, k, v, kw)
        return msg

    return Case("flash_forward", _name(params, what), float(params.get("points", 1)),
                "flash_forward", (q, k, v), kw, judge, probe="memory" if memory else None,
                timeout=params.get("timeout"))


TILING_SLACK = 8 << 20  # bytes: interpreter and NumPy noise allowed on top of the tiles


def tiling_limit(nq, nk, d, dv, block_q, block_k) -> int:
    """Extra memory a tiled forward/backward may use: a few (block_q x block_k) and (block x d)
    tiles plus a fixed slack, and never more than half the Nq x Nk float64 matrix. The cap does
    not grow with Nk, so a score matrix built in row chunks is caught once Nk is long."""
    tiles = 16 * 8 * (block_q * block_k + (block_q + block_k) * max(d, dv))
    return min(nq * nk * 8 // 2, TILING_SLACK + tiles)


def structure_message(outcome, q, k, v, kw) -> str:
    """Judge the memory measurement attached by the runner (the peak of the whole process tree,
    measured by the kernel) or by the notebook's check cell (tracemalloc)."""
    nq, nk = q.shape[-2], k.shape[-2]
    limit = tiling_limit(nq, nk, q.shape[-1], v.shape[-1], kw.get("block_q", 64),
                         kw.get("block_k", 64))
    extra = getattr(outcome, "memory", None)
    if extra is None:  # a memory test whose measurement failed earns nothing (fail closed)
        raise Fail("the memory of this run could not be measured, so 'really tiled' is not "
                   "established; grade it again (if it persists, tell the instructor)")
    peak, how = extra[0], extra[-1]
    if peak > limit:
        raise Fail(
            f"not tiled: it used {peak / 2**20:.0f} MiB of extra memory at Nq={nq}, Nk={nk} "
            f"(limit {limit / 2**20:.1f} MiB, measured {how}); a {nq} x {nk} float64 matrix is "
            f"{nq * nk * 8 / 2**20:.0f} MiB. Never form the full score matrix, not even in row "
            "chunks: work on (block_q x block_k) tiles"
        )
    return f"; tiled (extra memory {peak / 2**20:.1f} MiB)"


# -- 04 block sizes ---------------------------------------------------------------------------
def _as_int(x, what):
    if isinstance(x, bool) or not (isinstance(x, int) or (isinstance(x, np.ndarray) and x.ndim == 0
                                                          and x.dtype.kind in "iu")):
        raise Fail(f"{what} should be an int; got {type(x).__name__}")
    return int(x)


def build_block_size(params) -> Case:
    M, d = int(params["M"]), int(params["d"])

    def judge(out, outcome):
        if M < 4 * d:
            raise Fail(f"M={M} < 4d={4 * d}: no block fits; raise ValueError")
        b = _as_int(out, "block_size")
        want = M // (4 * d)
        if b == want:
            return f"B = {b}, 4*B*d = {4 * b * d} <= M = {M}"
        if b == math.ceil(M / (4 * d)):
            raise Fail(f"B = {b} was rounded up: 4*B*d = {4 * b * d} > M = {M}. B is an upper "
                       "bound, so round down (floor)")
        raise Fail(f"B = {b}; the largest B with 4*B*d <= M is {want}")

    raises = "ValueError" if M < 4 * int(d) else None
    return Case("block_size", _name(params, f"M={M}, d={d}"), float(params.get("points", 1)),
                "block_size", (M, d), {}, judge, raises=raises)


def build_tile_sizes(params) -> Case:
    M, d = int(params["M"]), int(params["d"])

    def judge(out, outcome):
        br, bc = unpack(out, 2, "(Br, Bc)")
        br, bc = _as_int(br, "Br"), _as_int(bc, "Bc")
        want_bc = M // (4 * d)
        want = (min(want_bc, d), want_bc)
        if (br, bc) == want:
            return f"(Br, Bc) = {want}"
        if bc == math.ceil(M / (4 * d)) and bc != want_bc:
            raise Fail("Bc was rounded up; use floor(M / 4d)")
        if (br, bc) == (want_bc, want_bc):
            raise Fail("Br must also keep the Br x Bc score tile small: Br = min(Bc, d)")
        raise Fail(f"got (Br, Bc) = ({br}, {bc}); expected {want}")

    return Case("tile_sizes", _name(params, f"M={M}, d={d}"), float(params.get("points", 1)),
                "tile_sizes", (M, d), {}, judge)


def build_fits_in_sram(params) -> Case:
    br, bc, d, M = (int(params[x]) for x in ("br", "bc", "d", "M"))
    need = 2 * br * d + 2 * bc * d + br * bc

    def judge(out, outcome):
        if not isinstance(out, bool) and not (isinstance(out, np.ndarray) and out.dtype == bool):
            raise Fail(f"should return a bool; got {type(out).__name__}")
        want = need <= M
        if bool(out) == want:
            return f"{need} elements {'<=' if want else '>'} M = {M}"
        if bool(out) == (2 * br * d + 2 * bc * d <= M):
            raise Fail(f"the Br x Bc = {br * bc}-element score tile S must fit too ({need} > {M})")
        raise Fail(f"Q_i, O_i (Br x d), K_j, V_j (Bc x d) and S_ij (Br x Bc) take {need} "
                   f"elements; M = {M}")

    return Case("fits_in_sram", _name(params, f"Br={br}, Bc={bc}, d={d}, M={M}"),
                float(params.get("points", 1)), "fits_in_sram", (br, bc, d, M), {}, judge)


# -- 05 counting IO ---------------------------------------------------------------------------
def fa2_expected_io(n, d, dv, bq):
    t_r = math.ceil(n / bq)
    return n * d + t_r * n * (d + dv), n * dv + n


def replay(trace, shapes, sram):
    """Replay the child's log of load/store/alloc/free against the real two-level memory."""
    from ..iosim import SRAMOverflowError, TwoLevelMemory, Virtual

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
        raise Fail(f"SRAM overflow: {e}. Free tiles you no longer need; keep S_ij, m and l out "
                   "of SRAM (plain NumPy arrays: registers in this model)") from None
    except (KeyError, ValueError, TypeError, IndexError) as e:
        raise Fail(f"the memory log could not be replayed ({e})") from None
    return mem.count()


def build_fa2_forward_io(params) -> Case:
    rng = _rng(params)
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
        msg = compare(o, ref, None, "O (stored in HBM)", tiled_variants(q, k, v, False, None, bq, bk),
                      budget=1e-10, hint="did you mem.store every block of O?")
        compare(lse, ref_lse, None, "L (stored in HBM)", lse_variants(q, k, False, None),
                budget=1e-10)
        if what == "output":
            return msg
        count = replay(outcome.trace, {"Q": (n, d), "K": (n, d), "V": (n, d), "O": (n, d),
                                       "L": (n,)}, sram)
        reads, writes = fa2_expected_io(n, d, d, bq)
        if count.reads == reads and count.writes == writes:
            return f"{reads} reads, {writes} writes: FlashAttention-2's count"
        if count.reads < reads:
            raise Fail(f"only {count.reads} elements read through mem.load, fewer than FA2 needs "
                       f"({reads}): read Q, K, V with mem.load (mem.hbm is off-chip; reading it "
                       "directly is not counted)")
        if count.reads > reads:
            raise Fail(f"{count.reads} elements read; FA2 reads {reads} = N d (each Q_i once) + "
                       "Tr N (d + dv) (K_j and V_j once per query block). Load Q_i outside the "
                       "inner loop and nothing else inside it")
        raise Fail(f"{count.writes} elements written; FA2 writes {writes}: each O_i (Br x dv) and "
                   "L_i once, after the inner loop (write them through mem.store)")

    return Case("fa2_forward_io", _name(params, what), float(params.get("points", 1)),
                "fa2_forward_io", (q, k, v), {"block_q": bq, "block_k": bk}, judge, io_sram=sram)


def build_fa2_reads(params) -> Case:
    n, d, bq = int(params["n"]), int(params["d"]), int(params["block_q"])

    def judge(out, outcome):
        r = _as_int(out, "fa2_reads")
        want = fa2_expected_io(n, d, d, bq)[0]
        if r == want:
            return f"{r} elements"
        if r == n * d + (n // bq) * n * 2 * d:
            raise Fail("Tr = ceil(N / Br): the last, partial query block also reads K and V")
        raise Fail(f"got {r}; N d + ceil(N/Br) N 2d = {want}")

    return Case("fa2_reads", _name(params, f"N={n}, d={d}, Br={bq}"),
                float(params.get("points", 1)), "fa2_reads", (n, d, bq), {}, judge)


# -- 06 tiled backward ------------------------------------------------------------------------
def build_flash_backward(params) -> Case:
    q, k, v = _qkv(params)
    kw = _fwd_kwargs(params)
    rng = np.random.default_rng(int(params.get("seed", 0)) + 1)
    dout = rng.standard_normal((*q.shape[:-1], v.shape[-1])).astype(q.dtype)
    out, lse = attention_reference(q, k, v, kw["causal"], kw.get("scale"))
    out, lse = out.astype(q.dtype), lse.astype(np.float32 if q.dtype == np.float16 else q.dtype)
    memory = params.get("check") == "memory"

    def judge(res, outcome):
        dq, dk, dv = unpack(res, 3, "(dq, dk, dv)")
        refs = attention_reference_backward(q, k, v, dout, kw["causal"], kw.get("scale"))
        naive = naive_backward(q, k, v, dout, kw["causal"], kw.get("scale"))
        variants = tiled_variants(q, k, v, **kw, dout=dout)
        msgs = []
        for i, (g, what, x) in enumerate(zip((dq, dk, dv), ("dq", "dk", "dv"), (q, k, v))):
            g = as_array(g, what, x.shape)
            msgs.append(compare(g, refs[i], naive[i], what,
                                [(lambda vv=vv, i=i: vv()[i], m) for vv, m in variants],
                                factor=3.0))
        msg = "dq, dk, dv right"
        if memory:
            msg += structure_message(outcome, q, k, v, kw)
        return msg

    return Case("flash_backward", _name(params, "grads"), float(params.get("points", 1)),
                "flash_backward", (q, k, v, out, lse, dout), kw, judge,
                probe="memory" if memory else None, timeout=params.get("timeout"))


BUILDERS = {
    "stable_softmax": build_stable_softmax,
    "logsumexp": build_logsumexp,
    "online_update": build_online_update,
    "merge_partials": build_merge_partials,
    "flash_forward": build_flash_forward,
    "block_size": build_block_size,
    "tile_sizes": build_tile_sizes,
    "fits_in_sram": build_fits_in_sram,
    "fa2_forward_io": build_fa2_forward_io,
    "fa2_reads": build_fa2_reads,
    "flash_backward": build_flash_backward,
}
